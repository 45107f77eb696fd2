"""Option parsing for the ``pcgroups`` Spark data source (plain Python: no pyspark, no network).

Spark hands a data source its options as a case-insensitive string map. These helpers turn that map
into typed, picklable dataclasses once, on the driver, and refuse unknown options with a message that
lists the allowed ones (a misspelt option silently ignored is a wrong result later).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..connect import parse_duration as go_duration
from ..errors import ConfigError, PCGroupsError

DEFAULT_SERVER = "nats://127.0.0.1:4222"
DEFAULT_FETCH_BATCH = 500
DEFAULT_FETCH_MAX_BYTES = 8 * 1024 * 1024
DEFAULT_TIMEOUT = 10.0

#: option names as documented (Spark lower-cases keys; we match case-insensitively)
CONNECTION_OPTIONS = (
    "servers",
    "user",
    "password",
    "token",
    "creds",
    "nkey",
    "tlsCa",
    "tlsCert",
    "tlsKey",
    "jsDomain",
    "requestTimeout",
)
SOURCE_OPTIONS = (
    *CONNECTION_OPTIONS,
    "stream",
    "group",
    "groupType",
    "partitionCount",
    "assign",
    "startingOffsets",
    "startingTimestamp",
    "endingOffsets",
    "maxOffsetsPerTrigger",
    "failOnDataLoss",
    "includeHeaders",
    "fetchBatchSize",
    "readMode",
)
SINK_OPTIONS = (*CONNECTION_OPTIONS, "subject", "includeHeaders", "maxPendingAcks", "msgIdPrefix", "expectedStream")
#: keys Spark itself may put into a data source's options
SPARK_INTERNAL_OPTIONS = ("path", "paths", "checkpointLocation", "queryName")

EARLIEST = -2
LATEST = -1


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): ("" if v is None else str(v)) for k, v in dict(options).items()}


def _check_known(opts: dict[str, str], allowed: tuple[str, ...], what: str) -> None:
    known = {a.lower() for a in allowed} | {a.lower() for a in SPARK_INTERNAL_OPTIONS}
    unknown = sorted(k for k in opts if k not in known)
    if unknown:
        raise ConfigError(
            f"unknown {what} option(s) {', '.join(unknown)}; the {what} options are: {', '.join(allowed)}"
        )


def parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes", "on"):
        return True
    if v in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"option {name} must be true or false, got {value!r}")


def parse_int(name: str, value: str, minimum: int | None = None) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise ConfigError(f"option {name} must be an integer, got {value!r}") from None
    if minimum is not None and n < minimum:
        raise ConfigError(f"option {name} must be >= {minimum}, got {n}")
    return n


def parse_duration(name: str, value: str) -> float:
    """Seconds from ``"10s"``, ``"2.5s"``, ``"500ms"``, ``"1m30s"`` (a Go duration, as everywhere in pcgroups: a
    number without a unit is an error)."""
    try:
        seconds = go_duration(value)
    except PCGroupsError as e:
        raise ConfigError(f"option {name}: {e}") from None
    if not math.isfinite(seconds):
        raise ConfigError(f"option {name} must be a duration like 10s or 500ms, got {value!r}")
    if seconds <= 0:
        raise ConfigError(f"option {name} must be positive, got {value!r}")
    return seconds


@dataclass(frozen=True)
class ConnectionOptions:
    """How to reach NATS; resolved on the driver (``NATS_URL`` is read there) and shipped to executors."""

    servers: tuple[str, ...] = (DEFAULT_SERVER,)
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds: str | None = None
    nkey: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    js_domain: str | None = None
    timeout: float = DEFAULT_TIMEOUT

    @property
    def api_prefix(self) -> str:
        return f"$JS.{self.js_domain}.API" if self.js_domain else "$JS.API"

    @classmethod
    def parse(cls, opts: dict[str, str]) -> ConnectionOptions:
        servers = opts.get("servers") or os.environ.get("NATS_URL") or DEFAULT_SERVER
        urls = tuple(s.strip() for s in servers.split(",") if s.strip())
        if not urls:
            raise ConfigError("option servers is empty")
        timeout = (
            parse_duration("requestTimeout", opts["requesttimeout"]) if opts.get("requesttimeout") else DEFAULT_TIMEOUT
        )
        if bool(opts.get("tlscert")) != bool(opts.get("tlskey")):
            raise ConfigError("options tlsCert and tlsKey go together")
        return cls(
            servers=urls,
            user=opts.get("user") or None,
            password=opts.get("password") or None,
            token=opts.get("token") or None,
            creds=opts.get("creds") or None,
            nkey=opts.get("nkey") or None,
            tls_ca=opts.get("tlsca") or None,
            tls_cert=opts.get("tlscert") or None,
            tls_key=opts.get("tlskey") or None,
            js_domain=opts.get("jsdomain") or None,
            timeout=timeout,
        )

    def __repr__(self) -> str:  # never print secrets in Spark plans or logs
        return f"ConnectionOptions(servers={self.servers!r}, js_domain={self.js_domain!r})"


def parse_offsets(name: str, value: str, stream: str) -> str | dict[int, int]:
    """``earliest``, ``latest``, or JSON per partition: ``{"0": 12, "3": -2}`` or, as Spark's Kafka
    source writes it, keyed by the stream first: ``{"ORDERS": {"0": 12}}``."""
    v = value.strip()
    if v.lower() in ("earliest", "latest"):
        return v.lower()
    try:
        data = json.loads(v)
    except ValueError:
        raise ConfigError(f"option {name} must be earliest, latest or JSON per partition, got {value!r}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"option {name}: JSON must be an object, got {value!r}")
    if len(data) == 1 and isinstance(next(iter(data.values())), dict):
        ((key, inner),) = data.items()
        if key != stream:
            raise ConfigError(f"option {name} names stream {key!r}, but the source reads stream {stream!r}")
        data = inner
    out: dict[int, int] = {}
    for k, seq in data.items():
        try:
            p = int(k)
        except ValueError:
            raise ConfigError(f"option {name}: partition keys must be numbers, got {k!r}") from None
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < -2:
            raise ConfigError(
                f"option {name}: partition {p} needs a stream sequence, -2 (earliest) or -1 (latest), got {seq!r}"
            )
        out[p] = seq
    return out


@dataclass(frozen=True)
class SourceOptions:
    conn: ConnectionOptions
    stream: str
    group: str | None = None
    group_type: str = "static"
    partition_count: int | None = None
    assign: tuple[int, ...] | None = None
    starting: str | dict[int, int] | None = None  # None: the mode's default
    starting_timestamp_ms: int | None = None
    ending: str | dict[int, int] = "latest"
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = True
    fetch_batch: int = DEFAULT_FETCH_BATCH
    read_mode: str = "auto"
    ending_given: bool = False
    raw: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        opts = _lower(options)
        _check_known(opts, SOURCE_OPTIONS, "source")
        stream = opts.get("stream", "").strip()
        if not stream:
            raise ConfigError("option stream is required (the partitioned stream to read)")
        if any(c in stream for c in ". *>\t"):
            raise ConfigError(f"invalid stream name {stream!r}")
        group = opts.get("group", "").strip() or None
        group_type = (opts.get("grouptype") or "static").strip().lower()
        if group_type not in ("static", "elastic"):
            raise ConfigError(f"option groupType must be static or elastic, got {group_type!r}")
        if opts.get("grouptype") and not group:
            raise ConfigError("option groupType needs option group")
        count = parse_int("partitionCount", opts["partitioncount"], 1) if opts.get("partitioncount") else None
        if group is None and count is None:
            raise ConfigError(
                "give option group (a consumer group of the stream, whose config holds the "
                "partition count) or option partitionCount"
            )
        assign = None
        if opts.get("assign", "").strip():
            assign = _parse_assign(opts["assign"])
        starting = (
            parse_offsets("startingOffsets", opts["startingoffsets"], stream) if opts.get("startingoffsets") else None
        )
        ts = parse_int("startingTimestamp", opts["startingtimestamp"], 0) if opts.get("startingtimestamp") else None
        if ts is not None and starting is not None:
            raise ConfigError("give startingOffsets or startingTimestamp, not both")
        ending = (
            parse_offsets("endingOffsets", opts["endingoffsets"], stream) if opts.get("endingoffsets") else "latest"
        )
        if ending == "earliest" or (isinstance(ending, dict) and EARLIEST in ending.values()):
            raise ConfigError("endingOffsets cannot be earliest")
        mopt = (
            parse_int("maxOffsetsPerTrigger", opts["maxoffsetspertrigger"], 1)
            if opts.get("maxoffsetspertrigger")
            else None
        )
        read_mode = (opts.get("readmode") or "auto").strip().lower()
        if read_mode not in ("auto", "direct", "consumer"):
            raise ConfigError(f"option readMode must be auto, direct or consumer, got {read_mode!r}")
        return cls(
            conn=ConnectionOptions.parse(opts),
            stream=stream,
            group=group,
            group_type=group_type,
            partition_count=count,
            assign=assign,
            starting=starting,
            starting_timestamp_ms=ts,
            ending=ending,
            max_offsets_per_trigger=mopt,
            fail_on_data_loss=parse_bool("failOnDataLoss", opts["failondataloss"])
            if opts.get("failondataloss")
            else True,
            include_headers=parse_bool("includeHeaders", opts["includeheaders"])
            if opts.get("includeheaders")
            else True,
            fetch_batch=parse_int("fetchBatchSize", opts["fetchbatchsize"], 1)
            if opts.get("fetchbatchsize")
            else DEFAULT_FETCH_BATCH,
            read_mode=read_mode,
            ending_given=bool(opts.get("endingoffsets")),
        )


def _parse_assign(value: str) -> tuple[int, ...]:
    v = value.strip()
    try:
        if v.startswith("{") or v.startswith("["):
            data = json.loads(v)
            if isinstance(data, dict):  # Kafka style {"STREAM": [0, 2]}
                (data,) = data.values()
            parts = [int(x) for x in data]
        else:
            parts = [int(x) for x in v.split(",") if x.strip()]
    except (ValueError, TypeError):
        raise ConfigError(f"option assign must list partitions like 0,2,5, got {value!r}") from None
    if not parts or any(p < 0 for p in parts):
        raise ConfigError(f"option assign must list partitions like 0,2,5, got {value!r}")
    return tuple(sorted(set(parts)))


@dataclass(frozen=True)
class SinkOptions:
    conn: ConnectionOptions
    subject: str | None = None
    include_headers: bool = True
    max_pending_acks: int = 1
    msg_id_prefix: str | None = None
    expected_stream: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        opts = _lower(options)
        _check_known(opts, SINK_OPTIONS, "sink")
        subject = opts.get("subject", "").strip() or None
        if subject is not None and ("*" in subject.split(".") or ">" in subject.split(".") or " " in subject):
            raise ConfigError(f"option subject must be a literal subject, got {subject!r}")
        prefix = opts.get("msgidprefix", "").strip() or None
        return cls(
            conn=ConnectionOptions.parse(opts),
            subject=subject,
            include_headers=parse_bool("includeHeaders", opts["includeheaders"])
            if opts.get("includeheaders")
            else True,
            max_pending_acks=parse_int("maxPendingAcks", opts["maxpendingacks"], 1)
            if opts.get("maxpendingacks")
            else 1,
            msg_id_prefix=prefix,
            expected_stream=opts.get("expectedstream", "").strip() or None,
        )
