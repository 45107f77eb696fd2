"""NATS I/O for the ``pcgroups`` Spark data source (asyncio + nats-py; no pyspark).

Everything here runs inside a private event loop: the driver-side planner keeps one connection per
stream reader, and every Spark task opens (and closes) its own.

Reading never touches the group: it uses **batched direct gets** (``$JS.API.DIRECT.GET.<stream>`` with
``next_by_subj`` and ``batch``: no consumer, no state on the server), or, for a stream without
``allow_direct``, an **ephemeral** pull consumer (ack none, memory storage, inactive threshold) that is
deleted when the task ends. No durable consumer is ever created and nothing is acked.
"""

from __future__ import annotations

import asyncio
import base64
import calendar
import json
import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from ..connect import ResolvedConnection
from ..errors import ConfigError, JetStreamAPIError, NotFoundError, PCGroupsError
from ..flavour import ELASTIC, STATIC, work_queue_name
from ..jetstream._api import ERR_NO_MESSAGE_FOUND, ERR_STREAM_NOT_FOUND
from ..jetstream._compat import tolerate_undecodable
from ..jetstream._connection import Connection
from ..partitions import tokens_match
from ._offsets import Layout, StreamState
from ._options import DEFAULT_FETCH_MAX_BYTES, ConnectionOptions, SourceOptions

#: headers the server adds to direct-get replies; not part of the stored message
BOOKKEEPING_HEADERS = frozenset(
    {
        "Nats-Stream",
        "Nats-Subject",
        "Nats-Sequence",
        "Nats-Time-Stamp",
        "Nats-Num-Pending",
        "Nats-Last-Sequence",
        "Status",
        "Description",
    }
)


_WHITESPACE = re.compile(r"\s")


class Client(NATS):
    """nats-py's client with a faster header parser that gives the same result.

    Direct-get replies carry about eight headers per message, and nats-py 2.16's parser checks every
    character of every header name in a Python generator: half of a direct read's time, measured."""

    @staticmethod
    def _parse_header_lines(raw: bytes) -> dict[str, str]:
        out: dict[str, str] = {}
        for line in raw.decode("utf-8", "replace").split("\r\n"):
            name, sep, value = line.partition(":")
            if not sep:
                continue
            key = name.strip()
            # same rules as nats-py: names must be ASCII without whitespace, values decode with "replace"
            if not key.isascii() or _WHITESPACE.search(key):
                continue
            out[key] = value.strip()
        return out


async def connect(conn: ConnectionOptions, *, name: str = "pcgroups-spark", reconnect: bool = True) -> NATS:
    """A connection with the library's credentials and TLS handling (:mod:`pcgroups.connect`), quiet and with
    few reconnects: errors surface through the calls that fail, not in executor logs."""
    rc = ResolvedConnection(
        servers=list(conn.servers),
        user=conn.user,
        password=conn.password,
        token=conn.token,
        creds=conn.creds,
        nkey=conn.nkey,
        tls_ca=conn.tls_ca,
        tls_cert=conn.tls_cert,
        tls_key=conn.tls_key,
        name=name,
        # at least 1: nats-py's first connect retries a refusing server forever with 0
        timeout=max(1, int(conn.timeout)),
    )

    async def quiet(*_args: object) -> None:
        pass

    kwargs = rc.connect_kwargs()
    kwargs.update(
        allow_reconnect=reconnect,
        max_reconnect_attempts=3 if reconnect else 1,
        reconnect_time_wait=0.5,
        error_cb=quiet,
        disconnected_cb=quiet,
        reconnected_cb=quiet,
        closed_cb=quiet,
    )
    try:
        nc = Client()
        tolerate_undecodable(nc)
        await nc.connect(**kwargs)
        return nc
    except Exception as e:  # nats-py raises several unrelated types here
        raise PCGroupsError(f"cannot connect to NATS at {rc.display_servers}: {e or type(e).__name__}") from e


class _NoResponders(PCGroupsError):
    pass


async def _request(nc: NATS, conn: ConnectionOptions, full: str, payload: bytes = b"") -> Msg:
    """One request; refused permissions raise PermissionDeniedError at once (pcgroups.jetstream._permissions)."""
    try:
        return await Connection.of(nc).permissions.call(nc.request(full, payload, timeout=conn.timeout), [full])
    except nats.errors.NoRespondersError:
        raise _NoResponders(f"JetStream is not enabled or not reachable ({full}: no responders)") from None
    except nats.errors.TimeoutError:
        raise PCGroupsError(f"JetStream request {full} timed out after {conn.timeout}s") from None


async def api(nc: NATS, conn: ConnectionOptions, subject: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JetStream API request; an error reply raises :class:`JetStreamAPIError`."""
    full = f"{conn.api_prefix}.{subject}"
    msg = await _request(nc, conn, full, json.dumps(body).encode() if body is not None else b"")
    resp: dict[str, Any] = json.loads(msg.data)
    err = resp.get("error")
    if err:
        raise JetStreamAPIError(
            err.get("description", "error"), code=err.get("code", 0), err_code=err.get("err_code", 0), subject=full
        )
    return resp


async def stream_info(nc: NATS, conn: ConnectionOptions, stream: str) -> dict[str, Any]:
    try:
        return await api(nc, conn, f"STREAM.INFO.{stream}")
    except JetStreamAPIError as e:
        if e.err_code == ERR_STREAM_NOT_FOUND:
            raise NotFoundError(f"stream {stream!r} not found") from None
        raise


async def kv_get_json(nc: NATS, conn: ConnectionOptions, bucket: str, key: str) -> dict[str, Any] | None:
    """The latest value of a KV key as JSON, or None when the key (or bucket) does not exist.

    A direct get of the key's own subject, which a permission can allow for that key alone
    (docs/SECURITY.md); a bucket without direct gets is read with ``STREAM.MSG.GET``."""
    try:
        msg = await _request(nc, conn, f"{conn.api_prefix}.DIRECT.GET.KV_{bucket}.$KV.{bucket}.{key}")
    except _NoResponders:  # no such bucket, or one without direct gets
        return await _kv_get_json_by_msg_get(nc, conn, bucket, key)
    headers = msg.headers or {}
    if headers.get("Status") == "404" or headers.get("KV-Operation") in ("DEL", "PURGE"):
        return None
    return _config_json(bucket, key, msg.data)


async def _kv_get_json_by_msg_get(nc: NATS, conn: ConnectionOptions, bucket: str, key: str) -> dict[str, Any] | None:
    try:
        resp = await api(nc, conn, f"STREAM.MSG.GET.KV_{bucket}", {"last_by_subj": f"$KV.{bucket}.{key}"})
    except JetStreamAPIError as e:
        if e.err_code in (ERR_NO_MESSAGE_FOUND, ERR_STREAM_NOT_FOUND):  # no message / no bucket
            return None
        raise
    m = resp["message"]
    hdrs = base64.b64decode(m["hdrs"]).decode(errors="replace") if m.get("hdrs") else ""
    if "KV-Operation: DEL" in hdrs or "KV-Operation: PURGE" in hdrs:
        return None
    return _config_json(bucket, key, base64.b64decode(m.get("data") or ""))


def _config_json(bucket: str, key: str, data: bytes) -> dict[str, Any]:
    try:
        config: dict[str, Any] = json.loads(data)
    except ValueError:
        raise ConfigError(f"KV {bucket}/{key} does not hold a JSON group config") from None
    return config


@dataclass(frozen=True)
class ReadPlan:
    """The resolved read: layout, read mode and the stream's state when it was resolved."""

    layout: Layout
    mode: str  # "direct" | "consumer"
    state: StreamState


async def resolve(nc: NATS, opts: SourceOptions) -> ReadPlan:
    """Resolve partitions (from the group's config or ``partitionCount``), filters and read mode."""
    stream, count, filters = opts.stream, opts.partition_count, ()
    if opts.group:
        bucket = (STATIC if opts.group_type == "static" else ELASTIC).bucket
        cfg = await kv_get_json(nc, opts.conn, bucket, f"{opts.stream}.{opts.group}")
        if cfg is None:
            raise NotFoundError(
                f"{opts.group_type} consumer group {opts.group!r} of stream {opts.stream!r} not "
                f"found (no key {opts.stream}.{opts.group} in KV bucket {bucket})"
            )
        n = cfg.get("max_members")
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"group {opts.group!r}: invalid max_members {n!r} in its config")
        if count is not None and count != n:
            raise ConfigError(
                f"option partitionCount={count} disagrees with group {opts.group!r}, which has {n} partitions"
            )
        count = n
        if opts.group_type == "static":
            # what the group's members see (docs/DESIGN.md, *Wire contract*): balanced members filter on <p>.<filter>,
            # mapped members on <p>.>
            if cfg.get("filters") and not cfg.get("member_mappings"):
                filters = tuple(cfg["filters"])
        else:
            stream = work_queue_name(opts.stream, opts.group)
    assert count is not None
    parts = opts.assign if opts.assign is not None else tuple(range(count))
    bad = [p for p in parts if p >= count]
    if bad:
        raise ConfigError(
            f"option assign names partitions {bad}, but the stream has {count} partitions (0..{count - 1})"
        )
    info = await stream_info(nc, opts.conn, stream)
    state = StreamState.from_info(info)
    if state.retention != "limits" and opts.fail_on_data_loss:
        raise ConfigError(
            f"stream {stream!r} has {state.retention} retention: messages disappear once consumers ack them, "
            f"so Spark ranges are not replayable and messages may be gone before Spark reads them. "
            f"Set failOnDataLoss=false to read it anyway (best effort: rows that are still stored)"
        )
    mode = opts.read_mode
    if mode == "auto":
        mode = "direct" if state.allow_direct else "consumer"
    if mode == "direct" and not state.allow_direct:
        raise ConfigError(
            f"readMode=direct needs allow_direct on stream {stream!r}; use readMode=consumer "
            f"(an ephemeral consumer per task) or enable allow_direct"
        )
    if mode == "consumer" and state.retention == "workqueue":
        raise ConfigError(
            f"stream {stream!r} is a work-queue: a reader consumer would take messages from the "
            f"group; use readMode=direct (the stream needs allow_direct)"
        )
    return ReadPlan(Layout(stream, count, tuple(parts), filters), mode, state)


async def seq_at_time(nc: NATS, conn: ConnectionOptions, stream: str, ts_ms: int, allow_direct: bool) -> int:
    """The first sequence stored at or after ``ts_ms`` (ms since epoch), or ``last + 1`` if none."""
    secs, ms = divmod(ts_ms, 1000)
    import time as _time

    start = _time.strftime("%Y-%m-%dT%H:%M:%S", _time.gmtime(secs)) + f".{ms:03d}Z"
    try:
        resp = await api(nc, conn, f"STREAM.MSG.GET.{stream}", {"start_time": start, "next_by_subj": ">"})
        return int(resp["message"]["seq"])
    except JetStreamAPIError as e:
        if e.err_code == ERR_NO_MESSAGE_FOUND:
            info = await stream_info(nc, conn, stream)
            return int(info["state"]["last_seq"]) + 1
        raise


# ---------------------------------------------------------------------------------------------
# messages -> columns


_epoch_cache: dict[str, int] = {}


def parse_ts_micros(ts: str) -> int:
    """``2026-11-22T05:39:55.114802273Z`` (RFC 3339, UTC, trailing zeros trimmed) → µs since epoch."""
    base = ts[:19]
    secs = _epoch_cache.get(base)
    if secs is None:
        secs = calendar.timegm(
            (int(ts[0:4]), int(ts[5:7]), int(ts[8:10]), int(ts[11:13]), int(ts[14:16]), int(ts[17:19]), 0, 0, 0)
        )
        if len(_epoch_cache) > 4096:
            _epoch_cache.clear()
        _epoch_cache[base] = secs
    rest = ts[19:]
    micros = 0
    if rest.startswith("."):
        i = 1
        while i < len(rest) and rest[i].isdigit():
            i += 1
        micros = int((rest[1:i] + "000000")[:6])
        rest = rest[i:]
    if rest not in ("Z", "", "+00:00"):
        # not UTC: fall back to the general parser
        import datetime as _dt

        d = _dt.datetime.fromisoformat(ts[:26] + rest if len(ts) > 26 else ts)
        return int(d.timestamp()) * 1_000_000 + d.microsecond
    return secs * 1_000_000 + micros


def subject_matches(subject: str, filters: tuple[str, ...]) -> bool:
    """NATS subject matching (``*`` one token, ``>`` the rest) against any of ``filters``."""
    tokens = subject.split(".")
    return any(tokens_match(f.split("."), tokens) for f in filters)


class Columns:
    """Rows of one partition, column by column (cheap to turn into an Arrow record batch)."""

    __slots__ = ("data", "headers", "sequence", "subject", "timestamp")

    def __init__(self) -> None:
        self.subject: list[str] = []
        self.data: list[bytes] = []
        self.headers: list[list[tuple[str, str]] | None] = []
        self.sequence: list[int] = []
        self.timestamp: list[int] = []

    def __len__(self) -> int:
        return len(self.sequence)


# ---------------------------------------------------------------------------------------------
# range readers (run in Spark tasks)


class RangeReader:
    """Reads one partition's messages with sequences in ``[start, end)``, in stream order."""

    def __init__(
        self,
        nc: NATS,
        conn: ConnectionOptions,
        stream: str,
        partition: int,
        start: int,
        end: int,
        filter_subjects: tuple[str, ...],
        *,
        batch: int,
        include_headers: bool,
    ):
        self.nc, self.conn, self.stream = nc, conn, stream
        self.partition, self.next, self.end = partition, start, end
        self.filter_subjects = filter_subjects
        self.batch, self.include_headers = batch, include_headers
        self.done = start >= end

    async def open(self) -> None: ...

    async def next_batch(self) -> Columns | None: ...

    async def close(self) -> None: ...


class DirectRangeReader(RangeReader):
    """Batched direct gets: ``{"seq": next, "next_by_subj": "<p>.>", "batch": k}``, one request in flight.

    The next request is sent as soon as a batch is complete, before the batch is handed to Spark, so the
    server prepares batch N+1 while Spark converts batch N."""

    async def open(self) -> None:
        # One filter subject: the server filters. Several (a group with several filters): read <p>.> and
        # match client-side, which keeps the stream order without merging.
        if len(self.filter_subjects) == 1:
            self.next_by_subj, self.client_filters = self.filter_subjects[0], None
        else:
            self.next_by_subj = f"{self.partition}.>"
            self.client_filters = tuple(s.split(".", 1)[1] for s in self.filter_subjects)
        self.inbox = self.nc.new_inbox()
        self.msgs: list[Msg] = []
        self.waiter: asyncio.Future[dict[str, str]] | None = None
        self.sub = await self.nc.subscribe(self.inbox, cb=self._on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1)
        self.subject = f"{self.conn.api_prefix}.DIRECT.GET.{self.stream}"
        await self._request()

    async def _on_msg(self, msg: Msg) -> None:
        h = msg.headers
        if h is not None and "Nats-Sequence" not in h and "Status" in h:
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(h)
            return
        self.msgs.append(msg)

    async def _request(self) -> None:
        if self.done:
            self.waiter = None
            return
        k = min(self.batch, self.end - self.next)
        body = {"seq": self.next, "next_by_subj": self.next_by_subj, "batch": k, "max_bytes": DEFAULT_FETCH_MAX_BYTES}
        self.msgs = []
        self.waiter = asyncio.get_running_loop().create_future()
        await self.nc.publish(self.subject, json.dumps(body).encode(), reply=self.inbox)

    async def next_batch(self) -> Columns | None:
        if self.waiter is None:
            return None
        try:
            status = await asyncio.wait_for(self.waiter, self.conn.timeout)
        except TimeoutError:
            raise PCGroupsError(
                f"direct get on stream {self.stream!r} ({self.next_by_subj} from sequence "
                f"{self.next}) timed out after {self.conn.timeout}s"
            ) from None
        msgs, code = self.msgs, status.get("Status")
        out = Columns()
        last = None
        for m in msgs:
            h = m.headers or {}
            seq = int(h["Nats-Sequence"])
            if seq >= self.end:
                self.done = True
                break
            last = seq
            full = h["Nats-Subject"]
            subject = full.split(".", 1)[1] if "." in full else ""
            if self.client_filters is not None and not subject_matches(subject, self.client_filters):
                continue
            out.subject.append(subject)
            out.data.append(m.data)
            out.sequence.append(seq)
            out.timestamp.append(parse_ts_micros(h["Nats-Time-Stamp"]))
            if self.include_headers:
                user = [(k, v) for k, v in h.items() if k not in BOOKKEEPING_HEADERS]
                out.headers.append(user)
            else:
                out.headers.append(None)
        if code == "204":
            if status.get("Nats-Num-Pending") == "0":
                self.done = True  # nothing more for this filter in the whole stream
        elif code == "404":
            self.done = True  # no message at or after `next`
        else:
            raise PCGroupsError(
                f"direct get on stream {self.stream!r} failed: status {code} {status.get('Description', '')}".strip()
            )
        if last is not None:
            self.next = last + 1
        elif not self.done and not msgs:
            self.done = True
        if self.next >= self.end:
            self.done = True
        await self._request()  # prefetch the next batch while Spark handles this one
        return out

    async def close(self) -> None:
        try:
            await self.sub.unsubscribe()
        except Exception:
            pass


class ConsumerRangeReader(RangeReader):
    """An ephemeral pull consumer (ack none, memory storage, inactive threshold) from ``start``, filtered
    on the partition; deleted when the task ends (the inactive threshold reaps it after a crash)."""

    async def open(self) -> None:
        cfg = {
            "deliver_policy": "by_start_sequence",
            "opt_start_seq": self.next,
            "ack_policy": "none",
            "mem_storage": True,
            "num_replicas": 1,
            "inactive_threshold": int(60e9),
            "max_waiting": 8,
            "description": "pcgroups spark reader (ephemeral)",
        }
        if len(self.filter_subjects) == 1:
            cfg["filter_subject"] = self.filter_subjects[0]
        else:
            cfg["filter_subjects"] = list(self.filter_subjects)
        self.name = None
        try:
            resp = await api(
                self.nc,
                self.conn,
                f"CONSUMER.CREATE.{self.stream}",
                {"stream_name": self.stream, "config": cfg, "action": "create"},
            )
        except JetStreamAPIError as e:
            raise PCGroupsError(f"cannot create a reader consumer on stream {self.stream!r}: {e}") from None
        self.name = resp["name"]
        self.inbox = self.nc.new_inbox()
        self.msgs: list[tuple[Msg, int, int, int]] = []  # (message, stream sequence, time ns, pending)
        self.waiter: asyncio.Future[str | None] | None = None
        self.sub = await self.nc.subscribe(self.inbox, cb=self._on_msg, pending_msgs_limit=-1, pending_bytes_limit=-1)
        if resp.get("num_pending", 0) == 0:
            self.done = True
        await self._pull()

    async def _on_msg(self, msg: Msg) -> None:
        h = msg.headers
        if not msg.reply:  # a status: 404 no messages, 408 pull expired, 409 ...
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_result(h.get("Status") if h else "?")
            return
        t = msg.reply.split(".")
        if len(t) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
            seq, ts, pending = int(t[5]), int(t[7]), int(t[8])
        else:  # $JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>.…
            seq, ts, pending = int(t[7]), int(t[9]), int(t[10])
        self.msgs.append((msg, seq, ts, pending))
        if (
            (len(self.msgs) >= self.want or pending == 0 or seq >= self.end - 1)
            and self.waiter is not None
            and not self.waiter.done()
        ):
            self.waiter.set_result("full" if len(self.msgs) >= self.want else "caught-up")

    async def _pull(self) -> None:
        if self.done:
            self.waiter = None
            return
        self.want = min(self.batch, self.end - self.next)
        self.msgs = []
        self.waiter = asyncio.get_running_loop().create_future()
        expires = max(0.5, self.conn.timeout / 2)
        await self.nc.publish(
            f"{self.conn.api_prefix}.CONSUMER.MSG.NEXT.{self.stream}.{self.name}",
            json.dumps({"batch": self.want, "expires": int(expires * 1e9)}).encode(),
            reply=self.inbox,
        )

    async def next_batch(self) -> Columns | None:
        if self.waiter is None:
            return None
        try:
            status = await asyncio.wait_for(self.waiter, self.conn.timeout)
        except TimeoutError:
            raise PCGroupsError(f"reading stream {self.stream!r} partition {self.partition} timed out") from None
        if status not in ("full", "caught-up", "404", "408"):
            raise PCGroupsError(f"pull from reader consumer on stream {self.stream!r} failed: status {status}")
        out = Columns()
        last = None
        pending = None  # the pending count of the last message looked at
        for m, seq, ts, left in self.msgs:
            pending = left
            if seq >= self.end:
                self.done = True
                break
            last = seq
            subject = m.subject.split(".", 1)[1] if "." in m.subject else ""
            out.subject.append(subject)
            out.data.append(m.data)
            out.sequence.append(seq)
            out.timestamp.append(ts // 1000)
            if self.include_headers:
                out.headers.append(list(m.headers.items()) if m.headers else [])
            else:
                out.headers.append(None)
        if last is not None:
            self.next = last + 1
        if pending == 0 or self.next >= self.end or (status in ("404", "408") and not self.msgs):
            self.done = True
        await self._pull()
        return out

    async def close(self) -> None:
        try:
            await self.sub.unsubscribe()
        except Exception:
            pass
        if self.name:
            try:
                await api(self.nc, self.conn, f"CONSUMER.DELETE.{self.stream}.{self.name}")
            except Exception:
                pass  # the inactive threshold removes it


# ---------------------------------------------------------------------------------------------
# publishing (run in Spark tasks)


async def publish_all(
    js: JetStreamContext,
    rows: Iterable[tuple[str, bytes, dict[str, str] | None]],
    *,
    window: int,
    timeout: float,
    expected_stream: str | None,
) -> tuple[int, int]:
    """Publish ``(subject, data, headers)`` rows with acks, at most ``window`` un-acked at a time.

    Returns ``(published, duplicates)``: duplicates are messages the stream dropped because their
    ``Nats-Msg-Id`` was already stored within its duplicate window. A publish the user's permissions refuse
    (never acked) raises :class:`~pcgroups.errors.PermissionDeniedError` at once, naming its subject."""
    # the subjects published last (a refusal comes within a window of publishes after its own): it names one
    subjects: deque[str] = deque(maxlen=4 * max(window, 1) + 64)

    def seen(
        rows: Iterable[tuple[str, bytes, dict[str, str] | None]],
    ) -> Iterator[tuple[str, bytes, dict[str, str] | None]]:
        for row in rows:
            subjects.append(row[0])
            yield row

    return await Connection.of(js._nc).permissions.call(
        _publish_all(js, seen(rows), window=window, timeout=timeout, expected_stream=expected_stream), subjects
    )


async def _publish_all(
    js: JetStreamContext,
    rows: Iterable[tuple[str, bytes, dict[str, str] | None]],
    *,
    window: int,
    timeout: float,
    expected_stream: str | None,
) -> tuple[int, int]:
    sent = dups = 0
    if window <= 1:
        for subject, data, headers in rows:
            ack = await js.publish(subject, data, timeout=timeout, stream=expected_stream, headers=headers)
            sent += 1
            dups += bool(ack.duplicate)
        return sent, dups
    # When the window is full, wait until half of it is acked: yielding to the event loop once per
    # message (a sliding window) makes nats-py write every message in its own syscall, ~5x slower.
    inflight: deque[asyncio.Future[Any]] = deque()
    low = window // 2
    for subject, data, headers in rows:
        # no wait_stall: with one, nats-py wraps every publish in a task (a yield per message); our own
        # window keeps the pending count below the semaphore's size anyway
        inflight.append(await js.publish_async(subject, data, stream=expected_stream, headers=headers))
        sent += 1
        if len(inflight) < window:
            continue
        while len(inflight) > low:
            fut = inflight[0]
            if not fut.done():
                await asyncio.wait_for(fut, timeout)
            dups += bool(inflight.popleft().result().duplicate)
    while inflight:
        fut = inflight.popleft()
        if not fut.done():
            await asyncio.wait_for(fut, timeout)
        dups += bool(fut.result().duplicate)
    return sent, dups
