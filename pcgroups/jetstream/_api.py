"""The JetStream API requests nats-py lacks or reshapes, sent as the Go reference sends them.

nats-py has no priority groups (no ``priority_*`` consumer fields, no ``group``/``id`` in pulls, no
unpin) and serialises configs in its own field order; pcgroups speaks those requests itself so Go and
Python instances of one member create byte-identical consumers.

Which JetStream a :class:`JetStreamApi` talks to is its API prefix: ``$JS.API`` (the connection's own
account and domain), ``$JS.<domain>.API`` for a JetStream domain (across a leaf node connection), or an
API prefix an account imports. Every pcgroups call takes ``api=``; one without it uses the prefix
bound to its connection (:meth:`JetStreamApi.bind`, which :func:`pcgroups.connect.connect` does with
the options' or the context's domain), else ``$JS.API``.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import re
import time
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

import nats.errors
import nats.js.api
from nats.aio.client import Client

from ..config import go_json
from ..errors import ConfigError, JetStreamAPIError, NotFoundError, PermissionDeniedError
from ._connection import Connection, domain_of, prefix_of

log = logging.getLogger("pcgroups")

PRIORITY_GROUP = "PCG"
PINNED_CLIENT = "pinned_client"

# JetStream API error codes pcgroups branches on (named here once; nowhere else a number).
ERR_CONSUMER_NOT_FOUND = 10014
ERR_NO_MESSAGE_FOUND = 10037
ERR_STREAM_NOT_FOUND = 10059
ERR_NO_STREAM_MATCHES = 10060  # no stream takes the subject (a publish)
ERR_WRONG_LAST_SEQUENCE = 10071  # a KV compare-and-set lost to another writer
ERR_STREAM_NAME_IN_USE = 10058
ERR_WQ_CONSUMER_NOT_UNIQUE = 10100
ERR_WQ_MULTIPLE_UNFILTERED = 10099
ERR_CONSUMER_EXISTS = 10148
ERR_CONSUMER_OVERLAP = 10138
ERR_SOURCE_OVERLAP = 10147
ERR_JETSTREAM_UNAVAILABLE = 10008  # "JetStream system temporarily unavailable"
ERR_NOT_EMPTY_REQUEST = 10038  # "expected an empty request payload" (a delete request with a body)
ERR_MAXIMUM_CONSUMERS = 10026  # the stream has as many consumers as its limit allows

# Seconds without an answer from JetStream through the connection's server (requests timing out, finding no
# responders or "temporarily unavailable"; pulls unanswered) before reconnecting to another server. Longer than a
# leader election (5-9 s when a node dies, docs/DEPLOYMENT.md): a server cut off from the rest of its cluster by a
# partition stays up, and its clients stay connected to it unless they leave.
SILENT_SERVER = 10.0


def ns(seconds: float) -> int:
    """Seconds as the integer nanoseconds JetStream's JSON carries."""
    return round(seconds * 1_000_000_000)


@dataclass
class ConsumerConfig:
    """A pull consumer config, serialised in Go's ``jetstream.ConsumerConfig`` field order.

    Durations are in seconds. The zero values are Go's: explicit acks, deliver all, replay instant.
    This is also the *template* users pass to ``static_consume``/``elastic_consume``, which take nats-py's
    ``nats.js.api.ConsumerConfig`` too (:meth:`of`).
    """

    name: str = ""
    durable_name: str = ""
    description: str = ""
    deliver_policy: str = "all"
    opt_start_seq: int = 0
    ack_policy: str = "explicit"
    ack_wait: float = 0.0
    max_deliver: int = 0
    backoff: list[float] = field(default_factory=list)
    filter_subject: str = ""
    replay_policy: str = "instant"
    rate_limit_bps: int = 0
    sample_freq: str = ""
    max_waiting: int = 0
    max_ack_pending: int = 0
    headers_only: bool = False
    max_batch: int = 0
    max_expires: float = 0.0
    max_bytes: int = 0
    inactive_threshold: float = 0.0
    num_replicas: int = 0
    mem_storage: bool = False
    filter_subjects: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    priority_policy: str = ""
    priority_timeout: float = 0.0
    priority_groups: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, config: ConsumerTemplate) -> ConsumerConfig:
        """A copy of ``config`` as this type. nats-py's ``nats.js.api.ConsumerConfig`` is converted (its enums
        to their values); a field left None (nats-py's "unset") takes the default. A nats-py field this type
        lacks (a push consumer's ``deliver_subject``, ``opt_start_time``, ...) is a :class:`ConfigError`, any
        other type a TypeError naming the types to use."""
        if not isinstance(config, (cls, nats.js.api.ConsumerConfig)):
            raise TypeError(
                f"config must be a pcgroups.ConsumerConfig (or nats-py's nats.js.api.ConsumerConfig), "
                f"not {type(config).__module__}.{type(config).__qualname__}"
            )
        given = {f.name: getattr(config, f.name) for f in fields(config)}
        ours = {f.name for f in fields(cls)}
        lacking = sorted(name for name, value in given.items() if name not in ours and value not in (None, False))
        if lacking:
            raise ConfigError(
                f"config sets {', '.join(lacking)}, which a member's consumer (a pull consumer with "
                "a priority group) does not take: leave it unset (pcgroups.ConsumerConfig lists "
                "the settings)"
            )
        values: dict[str, Any] = {}
        for name in ours:
            value = given.get(name)
            if value is None:
                continue  # the default
            if isinstance(value, enum.Enum):
                value = value.value
            elif isinstance(value, (list, dict)):
                value = type(value)(value)
            values[name] = value
        return cls(**values)

    def to_wire(self) -> dict[str, Any]:
        """The JSON object Go's encoder writes (omitempty fields left out, durations in ns)."""
        out: dict[str, Any] = {}

        def put(key: str, value: Any, always: bool = False) -> None:
            if always or value:
                out[key] = value

        put("name", self.name)
        put("durable_name", self.durable_name)
        put("description", self.description)
        put("deliver_policy", self.deliver_policy, always=True)
        put("opt_start_seq", self.opt_start_seq)
        put("ack_policy", self.ack_policy, always=True)
        put("ack_wait", ns(self.ack_wait))
        put("max_deliver", self.max_deliver)
        put("backoff", [ns(b) for b in self.backoff])
        put("filter_subject", self.filter_subject)
        put("replay_policy", self.replay_policy, always=True)
        put("rate_limit_bps", self.rate_limit_bps)
        put("sample_freq", self.sample_freq)
        put("max_waiting", self.max_waiting)
        put("max_ack_pending", self.max_ack_pending)
        put("headers_only", self.headers_only)
        put("max_batch", self.max_batch)
        put("max_expires", ns(self.max_expires))
        put("max_bytes", self.max_bytes)
        put("inactive_threshold", ns(self.inactive_threshold))
        put("num_replicas", self.num_replicas, always=True)
        put("mem_storage", self.mem_storage)
        put("filter_subjects", list(self.filter_subjects))
        put("metadata", dict(self.metadata))
        put("priority_policy", self.priority_policy)
        put("priority_timeout", ns(self.priority_timeout))
        put("priority_groups", list(self.priority_groups))
        return out


#: What ``config=`` of the consume entry points takes: pcgroups' :class:`ConsumerConfig` or nats-py's.
ConsumerTemplate = ConsumerConfig | nats.js.api.ConsumerConfig


@dataclass
class StreamConfig:
    """The stream configs pcgroups creates (KV buckets, elastic work queues), in Go's field order."""

    name: str
    subjects: list[str] = field(default_factory=list)
    retention: str = "limits"
    max_consumers: int = 0
    max_msgs: int = 0
    max_bytes: int = 0
    discard: str = "old"
    max_age: int = 0
    max_msgs_per_subject: int = 0
    max_msg_size: int = 0
    storage: str = "file"
    num_replicas: int = 1
    duplicate_window: int = 0
    sources: list[dict[str, Any]] = field(default_factory=list)
    deny_delete: bool = False
    allow_rollup_hdrs: bool = False
    allow_direct: bool = False

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.subjects:
            out["subjects"] = list(self.subjects)
        out.update(
            retention=self.retention,
            max_consumers=self.max_consumers,
            max_msgs=self.max_msgs,
            max_bytes=self.max_bytes,
            discard=self.discard,
            max_age=self.max_age,
            max_msgs_per_subject=self.max_msgs_per_subject,
        )
        if self.max_msg_size:
            out["max_msg_size"] = self.max_msg_size
        out.update(storage=self.storage, num_replicas=self.num_replicas)
        if self.duplicate_window:
            out["duplicate_window"] = self.duplicate_window
        if self.sources:
            out["sources"] = self.sources
        if self.deny_delete:
            out["deny_delete"] = True
        if self.allow_rollup_hdrs:
            out["allow_rollup_hdrs"] = True
        out.update(compression="none", allow_direct=self.allow_direct, mirror_direct=False, consumer_limits={})
        return out


def kv_bucket_config(bucket: str, *, replicas: int) -> StreamConfig:
    """The stream nats.go's ``CreateKeyValue`` makes for a config bucket (history 1, file storage)."""
    return StreamConfig(
        name=f"KV_{bucket}",
        subjects=[f"$KV.{bucket}.>"],
        max_consumers=-1,
        max_msgs=-1,
        max_bytes=-1,
        discard="new",
        max_msgs_per_subject=1,
        max_msg_size=-1,
        storage="file",
        num_replicas=replicas,
        duplicate_window=120_000_000_000,
        deny_delete=True,
        allow_rollup_hdrs=True,
        allow_direct=True,
    )


def pull_request(
    *, batch: int, expires: float, heartbeat: float, pin_id: str | None, group: str = PRIORITY_GROUP
) -> bytes:
    """A priority-group pull request body, fields in nats.go's order."""
    body: dict[str, Any] = {"expires": ns(expires), "batch": batch, "idle_heartbeat": ns(heartbeat)}
    if pin_id:
        body["id"] = pin_id
    body["group"] = group
    return go_json(body)


def consumer_limit_error(stream: str, *, subject: str = "") -> JetStreamAPIError:
    """A consumer the server refused because ``stream`` has as many as its limit allows: which stream, and what
    to raise (docs/SCALE.md, *Limits*: member consumers, work-queue sources and every instance's watches count)."""
    return JetStreamAPIError(
        f"stream {stream} has as many consumers as it may have (maximum consumers limit reached): raise the "
        "stream's max_consumers (a stream update) or the server's JetStream limit default_max_consumers "
        "(1000 when not set, since nats-server 2.15)",
        code=400,
        err_code=ERR_MAXIMUM_CONSUMERS,
        subject=subject,
    )


#: A keep-alive pull's ``expires``: the pull renews the pin when it arrives and is gone a millisecond later.
#: (A ``no_wait`` pull would not do: when the consumer's window is full and no other pull waits, the server
#: keeps it until its next heartbeat tick.)
KEEPALIVE_EXPIRES = 0.001


def keepalive_request(pin_id: str, group: str = PRIORITY_GROUP) -> bytes:
    """A pull of one message carrying the pin id that expires at once (:data:`KEEPALIVE_EXPIRES`): it
    renews the pin and hardly ever counts among the consumer's waiting pulls (fields in nats.go's order)."""
    return go_json({"expires": ns(KEEPALIVE_EXPIRES), "batch": 1, "id": pin_id, "group": group})


class JetStreamApi:
    """Raw JetStream API requests on one connection, to the JetStream of ``domain`` or ``api_prefix``
    (neither: the prefix bound to the connection, else ``$JS.API``; see the module docs)."""

    def __init__(self, nc: Client, *, domain: str | None = None, api_prefix: str | None = None, timeout: float = 5.0):
        self.nc = nc
        connection = Connection.of(nc)  # the client's one owner: its bound JetStream, listeners, patches
        self.prefix = prefix_of(domain, api_prefix) if domain or api_prefix else connection.prefix
        self.timeout = timeout
        self.permissions = connection.permissions
        self._answered = time.monotonic()  # JetStream's last answer to a request
        self._reconnected = 0.0  # the last reconnect away from a silent server
        self._reconnecting: set[asyncio.Future[None]] = set()  # held until done (the loop keeps weak references)

    @classmethod
    def bind(
        cls, nc: Client, *, domain: str | None = None, api_prefix: str | None = None, timeout: float = 5.0
    ) -> JetStreamApi:
        """Make ``domain`` (or ``api_prefix``; neither: ``$JS.API``) the JetStream of every pcgroups call on
        ``nc`` made without ``api=`` (:meth:`Connection.bind`), and return an API for it."""
        Connection.of(nc).bind(domain=domain, api_prefix=api_prefix)
        return cls(nc, timeout=timeout)

    @property
    def domain(self) -> str | None:
        """The JetStream domain this API talks to (None: the connection's own, or an API prefix)."""
        return domain_of(self.prefix)

    async def own_prefixes(self) -> set[str]:
        """The API prefixes of this API's JetStream: its own, and its domain's (asked of the account info; left
        out when the server does not say, or the user may not ask)."""
        try:
            domain = (await self.request("INFO")).get("domain")
        except (JetStreamAPIError, PermissionDeniedError):
            domain = None
        return {self.prefix, prefix_of(domain)} if domain else {self.prefix}

    def at(self, prefix: str | None) -> JetStreamApi:
        """The API of another JetStream on the same connection (``prefix``; None or "": this one)."""
        if not prefix or prefix == self.prefix:
            return self
        return JetStreamApi(self.nc, api_prefix=prefix, timeout=self.timeout)

    def reconnect_if_silent(self, answered: float, limit: float = SILENT_SERVER) -> bool:
        """JetStream last answered at ``answered`` (monotonic). When that is more than ``limit`` seconds ago, and
        so is the last such reconnect, reconnect: nats-py tries the connection's other servers first. True if it
        did."""
        now = time.monotonic()
        if now - max(answered, self._reconnected) <= limit or not self.nc.is_connected:
            return False
        self._reconnected = now
        url = self.nc.connected_url
        log.warning(
            "JetStream%s has not answered through %s for %.1fs; reconnecting",
            f" (domain {self.domain})" if self.domain else "",
            f"{url.hostname}:{url.port}" if url else "the server",
            now - answered,
        )
        reconnect = asyncio.ensure_future(self.nc.force_reconnect())
        self._reconnecting.add(reconnect)
        reconnect.add_done_callback(self._reconnecting.discard)
        return True

    async def request(
        self, subject: str, body: bytes | dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Send ``<prefix>.<subject>`` and return the parsed reply; an API error raises, and so does a request
        the user's permissions refuse, at once (:class:`PermissionDeniedError`, see pcgroups.jetstream._permissions)."""
        payload = go_json(body) if isinstance(body, dict) else (body or b"")
        full = f"{self.prefix}.{subject}"
        try:
            msg = await self.permissions.call(self.nc.request(full, payload, timeout=timeout or self.timeout), [full])
        except nats.errors.NoRespondersError:
            self.reconnect_if_silent(self._answered)
            raise JetStreamAPIError("JetStream is not available (no responders)", code=503, subject=full) from None
        except nats.errors.TimeoutError:
            self.reconnect_if_silent(self._answered)
            raise JetStreamAPIError("JetStream API request timed out", code=408, subject=full) from None
        reply = json.loads(msg.data) if msg.data else {}
        err = reply.get("error")
        if err and err.get("err_code") == ERR_JETSTREAM_UNAVAILABLE:
            self.reconnect_if_silent(self._answered)
        else:
            self._answered = time.monotonic()
        if err:
            if err.get("err_code") == ERR_MAXIMUM_CONSUMERS and subject.startswith("CONSUMER.CREATE."):
                raise consumer_limit_error(subject.split(".")[2], subject=full)
            raise JetStreamAPIError(
                err.get("description", "unknown error"),
                code=err.get("code", 0),
                err_code=err.get("err_code", 0),
                subject=full,
            )
        return reply

    async def publish(self, subject: str, data: bytes, headers: dict[str, str] | None = None) -> dict[str, Any]:
        """Publish to JetStream and return the stream's PubAck: :class:`JetStreamAPIError` when no stream takes
        ``subject`` (503), none answers in time (408), the answer is not a PubAck, or the stream refuses the
        message (the server's reason and error code); :class:`PermissionDeniedError` when the user may not."""
        try:
            msg = await self.permissions.call(
                self.nc.request(subject, data, timeout=self.timeout, headers=headers), [subject]
            )
        except nats.errors.NoRespondersError:
            raise JetStreamAPIError("no stream takes the subject (no responders)", code=503, subject=subject) from None
        except nats.errors.TimeoutError:
            raise JetStreamAPIError(
                f"no stream acknowledged it within {self.timeout:g}s", code=408, subject=subject
            ) from None
        try:
            ack = json.loads(msg.data)
        except ValueError:
            ack = None
        if not isinstance(ack, dict) or not ("stream" in ack or "error" in ack):
            raise JetStreamAPIError("the answer was not a stream's acknowledgement", subject=subject)
        err = ack.get("error")
        if err:
            raise JetStreamAPIError(
                err.get("description", "unknown error"),
                code=err.get("code", 0),
                err_code=err.get("err_code", 0),
                subject=subject,
            )
        return ack

    # --- streams -------------------------------------------------------------------------
    async def stream_info(self, stream: str, subjects_filter: str | None = None) -> dict[str, Any]:
        """Stream info; with ``subjects_filter`` also every matching subject's count (all pages)."""
        body = {"subjects_filter": subjects_filter} if subjects_filter else None
        try:
            info = await self.request(f"STREAM.INFO.{stream}", body)
        except JetStreamAPIError as e:
            if e.err_code == ERR_STREAM_NOT_FOUND:
                raise NotFoundError(f"stream {stream} not found") from None
            raise
        if subjects_filter:
            subjects = dict(info.get("state", {}).get("subjects") or {})
            while subjects and len(subjects) < info.get("total", 0):
                page = await self.request(
                    f"STREAM.INFO.{stream}", {"subjects_filter": subjects_filter, "offset": len(subjects)}
                )
                more = page.get("state", {}).get("subjects") or {}
                if not more:
                    break
                subjects.update(more)
            info.setdefault("state", {})["subjects"] = subjects
        return info

    async def check_delete(self, subject: str) -> None:
        """Raise :class:`PermissionDeniedError` now if the user may not send the delete request ``subject``
        (``STREAM.DELETE.<stream>``, ``CONSUMER.DELETE.<stream>.<consumer>``), deleting nothing: JetStream answers
        a delete request that has a body with "expected an empty request payload" before it looks at what the
        request names. A change made of several deletes checks them all first, so that a refused one leaves
        nothing half done."""
        try:
            await self.request(subject, b"?")
        except JetStreamAPIError as e:
            if e.err_code != ERR_NOT_EMPTY_REQUEST:
                raise

    async def create_stream(self, config: StreamConfig) -> dict[str, Any]:
        return await self.request(f"STREAM.CREATE.{config.name}", config.to_wire())

    async def delete_stream(self, stream: str) -> bool:
        """Delete a stream; False if it did not exist."""
        try:
            await self.request(f"STREAM.DELETE.{stream}")
            return True
        except JetStreamAPIError as e:
            if e.err_code == ERR_STREAM_NOT_FOUND:
                return False
            raise

    # --- consumers -----------------------------------------------------------------------
    async def create_consumer(self, stream: str, config: ConsumerConfig, *, action: str = "create") -> dict[str, Any]:
        """``CONSUMER.CREATE`` with ``action`` (``create`` fails on a different existing config).

        A config with one ``filter_subject`` is created on ``CONSUMER.CREATE.<stream>.<name>.<filter>``, as
        nats.go does, so that permissions can allow it for one filter (docs/SECURITY.md); member consumers
        (``filter_subjects``) on ``CONSUMER.CREATE.<stream>.<name>``, as the reference does.
        """
        name = config.durable_name or config.name
        body = {"stream_name": stream, "config": config.to_wire()}
        if action:
            body["action"] = action
        subject = f"CONSUMER.CREATE.{stream}.{name}"
        if config.filter_subject and not config.filter_subjects:
            subject += f".{config.filter_subject}"
        return await self.request(subject, body)

    async def consumer_info(self, stream: str, consumer: str) -> dict[str, Any]:
        """Raw consumer info, including the ``priority_groups`` pin state nats-py drops."""
        try:
            return await self.request(f"CONSUMER.INFO.{stream}.{consumer}")
        except JetStreamAPIError as e:
            if e.err_code in (ERR_CONSUMER_NOT_FOUND, ERR_STREAM_NOT_FOUND):
                raise NotFoundError(f"consumer {consumer} on stream {stream} not found") from None
            raise

    async def count_messages(self, stream: str, subjects: list[str], start_seq: int) -> int:
        """Messages of ``stream`` on ``subjects`` at or after ``start_seq``: the pending count of an
        ephemeral consumer made for the question and deleted after it (2 requests; 0 without subjects)."""
        if not subjects:
            return 0
        cfg = ConsumerConfig(
            deliver_policy="by_start_sequence",
            opt_start_seq=max(start_seq, 1),
            ack_policy="none",
            inactive_threshold=5.0,
            mem_storage=True,
            num_replicas=1,
        )
        if len(subjects) == 1:
            cfg.filter_subject = subjects[0]
        else:
            cfg.filter_subjects = list(subjects)
        info = await self.request(f"CONSUMER.CREATE.{stream}", {"stream_name": stream, "config": cfg.to_wire()})
        try:
            return int(info.get("num_pending") or 0)
        finally:
            try:
                await self.request(f"CONSUMER.DELETE.{stream}.{info.get('name')}")
            except JetStreamAPIError:
                pass  # it goes away after its inactive threshold anyway

    async def delete_consumer(self, stream: str, consumer: str) -> bool:
        """Delete a consumer; False if it (or its stream) did not exist."""
        try:
            await self.request(f"CONSUMER.DELETE.{stream}.{consumer}")
            return True
        except JetStreamAPIError as e:
            if e.err_code in (ERR_CONSUMER_NOT_FOUND, ERR_STREAM_NOT_FOUND):
                return False
            raise

    async def list_consumers(self, stream: str) -> list[dict[str, Any]]:
        """Every consumer info of a stream (all pages)."""
        out: list[dict[str, Any]] = []
        while True:
            try:
                page = await self.request(f"CONSUMER.LIST.{stream}", {"offset": len(out)})
            except JetStreamAPIError as e:
                if e.err_code == ERR_STREAM_NOT_FOUND:
                    raise NotFoundError(f"stream {stream} not found") from None
                raise
            infos = page.get("consumers") or []
            out.extend(infos)
            if not infos or len(out) >= page.get("total", 0):
                return out

    async def unpin(self, stream: str, consumer: str, group: str = PRIORITY_GROUP) -> None:
        """Clear the pin of a priority group: the next waiting pull gets a new pin (step-down)."""
        try:
            await self.request(f"CONSUMER.UNPIN.{stream}.{consumer}", {"group": group})
        except JetStreamAPIError as e:
            if e.err_code in (ERR_CONSUMER_NOT_FOUND, ERR_STREAM_NOT_FOUND):
                raise NotFoundError(f"consumer {consumer} on stream {stream} not found") from None
            raise

    async def reset(self, stream: str, consumer: str, seq: int = 0) -> dict[str, Any]:
        """RESET a consumer to stream sequence ``seq`` (0: its ack floor); redelivers in order at once."""
        return await self.request(f"CONSUMER.RESET.{stream}.{consumer}", {"seq": seq} if seq else b"")

    def pull_subject(self, stream: str, consumer: str) -> str:
        return f"{self.prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"


def pinned_client_id(info: dict[str, Any], group: str = PRIORITY_GROUP) -> str | None:
    """The pin id a consumer info reports for ``group``, or None when nobody is pinned."""
    for state in info.get("priority_groups") or []:
        if state.get("group") == group:
            return state.get("pinned_client_id") or None
    return None


_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")


def parse_timestamp(text: str | None) -> datetime | None:
    """An RFC 3339 time as the server writes it (nanoseconds); Go's zero time and junk give None."""
    if not text:
        return None
    m = _TS.match(text)
    if not m:
        return None
    base, frac, zone = m.groups()
    if base.startswith("0001-"):
        return None
    micro = (frac or "0")[:6].ljust(6, "0")
    zone = "+00:00" if zone == "Z" else zone
    try:
        return datetime.fromisoformat(f"{base}.{micro}{zone}")
    except ValueError:
        return None
