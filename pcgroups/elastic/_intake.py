"""An elastic group's intake: a source stuck on one origin message, and stepping past it; origin messages
removed before their source copied them.

nats-server copies an origin message into the work queue with a ``Nats-Stream-Source`` header added
(``<stream> <seq> <filter> <transform> <subject> <id>``, 70-110 bytes). A message whose header block is within
that of the server's 64 KiB header limit is stored by the origin, but its copy is refused ("maximum payload
exceeded"), and the server tries the same message again every 2 s, for good: nothing after it, on any
partition, reaches the group, and the source's ``lag`` and ``active`` in the work queue's info look healthy.

1. A source is **stuck** when the first origin message it has not copied (after the last sequence it copied,
   on one of its filters) was stored more than :data:`STUCK_AFTER` seconds before the time of the work
   queue's info (the server's clock), and the source has copied nothing for as long: a caller that watches
   the source says how long its last copied sequence has stayed the same (``still``); otherwise the time
   since the work queue last stored a message stands for it (so in a group over several streams, a stuck
   source goes unseen while another one copies: running instances watch each source). A source copying a
   backlog of old messages is not stuck. :func:`stuck_sources` reads the origin's info per source, and that
   message (``STREAM.MSG.GET``) only when the origin holds messages past the last one copied.
2. The cause is named: ``too-big`` when the copy's header block would pass the server's limit (or the copy
   the connection's max payload), ``full`` when the work queue holds its ``max_buffered_*`` (the members must
   ack first; nothing to step past), else ``unknown`` (after a node failure the server restarts a source
   after 10-60 s; the sourcing watchdog of :mod:`pcgroups.elastic._instance` steps in there).
3. Without the permission to read the origin's info and messages nothing can be said about its source (the
   origin may hold later messages the source does not take, and a false alarm would page someone):
   :func:`stuck_sources` raises the :class:`~pcgroups.errors.PermissionDeniedError`, and each caller decides (the status
   leaves the stuck sources out; a running instance stops looking).
4. :func:`skip_stuck` steps past the message of a stuck source whose cause is not ``full``: once the work
   queue holds none of that source's messages (the members handle them first; waited for up to
   ``timeout``) the source is removed and added back starting after the message, then its start is dropped
   from the config once it runs. The message stays in the origin stream (it is reported, as a dead letter,
   by its stream and sequence); the other sources and everything queued are untouched.
5. Origin messages are **lost before sourcing** when the origin removes them (its ``max_msgs``, ``max_bytes`` or
   ``max_age`` with ``discard old``, or a purge) before the source copied them (a full work queue, a source
   down): the source then goes on from the origin's first message, and its lag says nothing of those. The
   gap is seen two ways, by :class:`GapWatch`: the origin's first sequence past the next one the source would
   copy (lost now, each sequence between them), and, for a caller that looks again and again, the sources'
   sequences moving on by more than the work queue stored, over sequences the origin no longer holds (the
   loss happened between two looks). Each gap is said once (:class:`SourceGap`). Only a source whose filters
   take every subject of its origin is watched: otherwise a message the origin removed may never have been
   the group's, and nothing tells them apart. The origin is asked only when a source is behind (its lag, a
   full work queue) and copies nothing, or moved on by more than the work queue stored.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client

from ..errors import ConfigError, JetStreamAPIError, NotFoundError, PCGroupsError
from ..flavour import work_queue_name
from ..jetstream._api import ERR_NO_MESSAGE_FOUND, JetStreamApi, parse_timestamp
from ..jetstream._store import ELASTIC_BUCKET, group_entry
from ..partitions import tokens_match
from ._admin import _drained as queue_drained
from ._admin import settle_starts

__all__ = [
    "HEADER_LIMIT",
    "STUCK_AFTER",
    "GapWatch",
    "Origins",
    "SkipResult",
    "SourceGap",
    "SourceWatch",
    "StuckSource",
    "intake_of",
    "skip_stuck",
    "source_gaps_of",
    "stuck_sources",
    "stuck_sources_of",
]

STUCK_AFTER = 5.0  # seconds a source may copy nothing while an origin message waits before it counts as stuck
HEADER_LIMIT = 65535  # the largest header block nats-server stores
_SOURCE_HEADER = "Nats-Stream-Source"
_SOURCE_ID = 8  # the length of the id that ends the header's value


@dataclass
class StuckSource:
    """A source of a work queue that does not copy origin message ``seq`` of ``stream``."""

    stream: str
    seq: int
    waiting: float  # seconds since the message was stored
    cause: str  # too-big, full or unknown
    subject: str = ""
    header_bytes: int = 0  # its header block
    copy_header_bytes: int = 0  # the copy's, with the Nats-Stream-Source header
    size: int = 0  # headers and data

    def describe(self) -> str:
        """One line: which message, since when, and why."""
        what = (
            f"sourcing from {self.stream} is stuck at its message {self.seq} ({self.subject}) for {self.waiting:.0f}s"
        )
        if self.cause == "too-big":
            return (
                f"{what}: its header block is {self.header_bytes} bytes, and the copy's {_SOURCE_HEADER} header "
                f"makes it {self.copy_header_bytes}, over the server's limit of {HEADER_LIMIT}"
            )
        if self.cause == "full":
            return f"{what}: the work queue is full (max buffered messages or bytes): it takes more as members ack"
        return f"{what}: the server does not copy it into the work queue (see its log)"


@dataclass
class SourceGap:
    """``count`` messages of origin ``stream``, between its sequences ``first`` and ``last``, were removed from it
    before the group's source copied them (invariant 5): they never reach the group."""

    stream: str
    first: int
    last: int
    count: int

    def describe(self) -> str:
        span = f"sequence {self.first}" if self.first == self.last else f"sequences {self.first}-{self.last}"
        return (
            f"{self.count} message(s) of {self.stream} ({span}) were removed from it (its max messages, bytes "
            f"or age, or a purge) before the group's source copied them: they never reach the group"
        )


class Origins:
    """The origin streams' info, asked at most once per look at a work queue (the stuck and gap checks share it)."""

    def __init__(self, api: JetStreamApi) -> None:
        self.api = api
        self._infos: dict[str, dict[str, Any] | None] = {}

    async def info(self, source: dict[str, Any]) -> dict[str, Any] | None:
        """The info of ``source``'s origin (through its JetStream), None when it does not answer or is gone;
        :class:`~pcgroups.errors.PermissionDeniedError` when the user may not ask (invariant 3)."""
        name = str(source.get("name") or "")
        if name not in self._infos:
            try:
                self._infos[name] = await self.api.at((source.get("external") or {}).get("api")).stream_info(name)
            except (NotFoundError, JetStreamAPIError):
                self._infos[name] = None
        return self._infos[name]

    def asked(self, name: str) -> bool:
        return name in self._infos


@dataclass
class SkipResult:
    """What :func:`skip_stuck` found and did: the message stepped past (``skipped``, a dead letter left in its
    origin stream), or why not (``reason``)."""

    stream: str
    group: str
    stuck: list[StuckSource] = field(default_factory=list)
    skipped: StuckSource | None = None
    reason: str = ""
    executed: bool = False


Still = Callable[[str, int], float]
"""``still(source, seq)``: for how many seconds ``source``'s last copied sequence has been ``seq``."""


class SourceWatch:
    """For a caller that reads a work queue's info again and again (a running instance): how long each source's
    last copied sequence has stayed the same (its :meth:`still` is a :data:`Still`)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, float]] = {}

    def update(self, wq_info: dict[str, Any]) -> None:
        now = time.monotonic()
        for source in wq_info.get("sources") or []:
            name, seq = str(source.get("name") or ""), int(source.get("seq") or 0)
            if self._seen.get(name, (None, 0.0))[0] != seq:
                self._seen[name] = (seq, now)

    def still(self, source: str, seq: int) -> float:
        last, since = self._seen.get(source, (None, 0.0))
        return time.monotonic() - since if last == seq else 0.0


async def stuck_sources(
    api: JetStreamApi, wq_info: dict[str, Any], still: Still | None = None, origins: Origins | None = None
) -> list[StuckSource]:
    """The stuck sources of a work queue, from its stream info (invariants 1-3)."""
    origins = origins if origins is not None else Origins(api)
    now = parse_timestamp(wq_info.get("ts"))
    if now is None:
        return []
    state = wq_info.get("state") or {}
    if still is None:
        stored = parse_timestamp(state.get("last_ts"))
        quiet = now.timestamp() - stored.timestamp() if stored is not None else float("inf")

        def still(_source: str, _seq: int) -> float:
            return quiet

    config = wq_info.get("config") or {}
    out = []
    for source in wq_info.get("sources") or []:
        if still(str(source.get("name") or ""), int(source.get("seq") or 0)) < STUCK_AFTER:
            continue  # copying: nothing to ask
        stuck = await _stuck(
            api.at((source.get("external") or {}).get("api")),
            await origins.info(source),
            source,
            config,
            state,
            now.timestamp(),
        )
        if stuck is not None:
            out.append(stuck)
    return out


async def stuck_sources_of(
    nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None
) -> list[StuckSource]:
    """:func:`stuck_sources` of an elastic group's work queue."""
    api = api if api is not None else JetStreamApi(nc)
    return await stuck_sources(api, await api.stream_info(work_queue_name(stream, group)))


async def _stuck(
    api: JetStreamApi,
    origin: dict[str, Any] | None,
    source: dict[str, Any],
    config: dict[str, Any],
    state: dict[str, Any],
    now: float,
) -> StuckSource | None:
    name = str(source.get("name") or "")
    copied = int(source.get("seq") or 0)
    start = next((int(s.get("opt_start_seq") or 0) for s in config.get("sources") or [] if s.get("name") == name), 0)
    after = max(copied + 1, start)
    if origin is None:
        return None
    if int((origin.get("state") or {}).get("last_seq") or 0) < after:
        return None  # nothing left to copy
    transforms = source.get("subject_transforms") or []
    filters = _filters(source)
    found = [m for m in [await _next_message(api, name, after, f) for f in filters] if m is not None]
    if not found:
        return None
    msg = min(found, key=lambda m: int(m["seq"]))
    stored = parse_timestamp(msg.get("time"))
    waiting = now - stored.timestamp() if stored is not None else 0.0
    if waiting < STUCK_AFTER:
        return None
    seq, subject = int(msg["seq"]), str(msg.get("subject") or "")
    header = base64.b64decode(msg.get("hdrs") or "")
    data = base64.b64decode(msg.get("data") or "")
    transform = _transform_of(transforms, subject)
    line = f"{_SOURCE_HEADER}: {name} {seq} {transform[0]} {transform[1]} {subject} {'x' * _SOURCE_ID}\r\n"
    copy_header = (len(header) or len(b"NATS/1.0\r\n\r\n")) + len(line)
    stuck = StuckSource(name, seq, waiting, "unknown", subject, len(header), copy_header, len(header) + len(data))
    if copy_header > HEADER_LIMIT or copy_header + len(data) > (api.nc.max_payload or 1 << 20):
        stuck.cause = "too-big"
    elif _full(config, state):
        stuck.cause = "full"
    return stuck


async def _next_message(api: JetStreamApi, stream: str, seq: int, subject: str) -> dict[str, Any] | None:
    """The first message of ``stream`` at or after ``seq`` on ``subject``; None when there is none."""
    try:
        reply = await api.request(f"STREAM.MSG.GET.{stream}", {"seq": seq, "next_by_subj": subject})
    except JetStreamAPIError as e:
        if e.err_code == ERR_NO_MESSAGE_FOUND:
            return None
        raise
    message: dict[str, Any] | None = reply.get("message")
    return message


def _filters(source: dict[str, Any]) -> list[str]:
    """The origin subjects a source takes."""
    return [t.get("src") or ">" for t in source.get("subject_transforms") or []] or [
        source.get("filter_subject") or ">"
    ]


def takes_every_subject(source: dict[str, Any], origin_config: dict[str, Any]) -> bool:
    """``source``'s filters take every subject its origin stores (invariant 5)."""
    filters = _filters(source)
    if ">" in filters:
        return True
    subjects = origin_config.get("subjects") or []
    if not subjects or origin_config.get("subject_transform"):
        return False  # what it stores is not named by its subjects
    return all(any(_within(subject, f) for f in filters) for subject in subjects)


def _within(subject: str, filter_: str) -> bool:
    """Every subject that ``subject`` (a pattern) matches, ``filter_`` matches too."""
    s, f = subject.split("."), filter_.split(".")
    for i, token in enumerate(f):
        if token == ">":
            return i < len(s)
        if i >= len(s) or s[i] == ">" or (token != "*" and token != s[i]):
            return False
    return len(s) == len(f)


class GapWatch:
    """The origin messages a work queue's sources lost before copying them (invariant 5), over successive looks at
    the work queue's info (:meth:`update`); ``once``: one look (a status), which sees only the gaps there are now.
    ``lost`` is the count by source since the first look.

    A watch that looks again and again asks the origin of a source that has copied nothing yet for its first
    sequence, once: from there on the origin's messages are the group's (a source starting at a time excepted),
    so the ones it removes before the source's first copy count too."""

    def __init__(self, *, once: bool = False) -> None:
        self.once = once
        self.lost: dict[str, int] = {}
        self._seen: tuple[dict[str, int], int] | None = None  # the sources' sequences, the work queue's last
        self._through: dict[str, int] = {}  # by source, the origin sequence up to which gaps were counted
        self._floor: dict[str, int | None] = {}  # by source that had copied nothing, the origin's first seq - 1

    async def update(
        self, api: JetStreamApi, wq_info: dict[str, Any], origins: Origins | None = None
    ) -> list[SourceGap]:
        """The gaps seen since the last look (invariant 5)."""
        origins = origins if origins is not None else Origins(api)
        config = wq_info.get("config") or {}
        starts = {str(c.get("name") or ""): c for c in config.get("sources") or []}
        sources = [s for s in wq_info.get("sources") or [] if s.get("seq") is not None]  # copied one at least
        if not self.once:
            await self._floors(wq_info, starts, origins)
        seqs = {str(s.get("name") or ""): int(s.get("seq") or 0) for s in sources}
        stored = int((wq_info.get("state") or {}).get("last_seq") or 0)
        seen, self._seen = self._seen, (seqs, stored)
        if seen is not None and (
            stored < seen[1]
            or any(seqs.get(n, 0) < q for n, q in seen[0].items())
            or any(n not in seen[0] and self._floor.get(n) is None for n in seqs)
        ):
            seen = None  # the work queue or a source started over, or one copied its first from no known floor
        floors = {n: f for n, f in self._floor.items() if f is not None}
        before = {n: seen[0].get(n, floors.get(n, q)) for n, q in seqs.items()} if seen is not None else seqs
        counted = sum(max(min(self._through.get(n, 0), q) - before[n], 0) for n, q in seqs.items())
        # origin sequences the sources moved past without a copy, not counted yet (in-flight copies aside)
        unstored = sum(q - before[n] for n, q in seqs.items()) - (stored - seen[1]) - counted if seen else 0
        full = _full(config, wq_info.get("state") or {})
        gaps: list[SourceGap] = []
        for source in sources:
            name = str(source.get("name") or "")
            seq, was = seqs[name], before[name]
            behind = seq == was and (int(source.get("lag") or 0) > 0 or full)
            if not (behind or (unstored > 0 and seq > was) or origins.asked(name)):
                continue
            origin = await origins.info(source)
            if origin is None or not takes_every_subject(source, origin.get("config") or {}):
                continue
            first = int((origin.get("state") or {}).get("first_seq") or 0)
            start = int(starts.get(name, {}).get("opt_start_seq") or 0)
            through = max(self._through.get(name, 0), start - 1)  # a start skips what is before it
            low, gone = max(was, through), min(first - 1, seq)
            passed = min(gone - low, unstored)  # moved past while gone: lost between the looks
            if passed > 0:
                unstored -= passed
                gaps.append(SourceGap(name, low + 1, gone, passed))
            low = max(seq, through)
            if first - 1 > low:  # gone before the source got to them: lost now
                gaps.append(SourceGap(name, low + 1, first - 1, first - 1 - low))
            self._through[name] = max(through, first - 1)
        for gap in gaps:
            self.lost[gap.stream] = self.lost.get(gap.stream, 0) + gap.count
        return gaps

    async def _floors(self, wq_info: dict[str, Any], starts: dict[str, dict[str, Any]], origins: Origins) -> None:
        """The floor of each source that has copied nothing yet, asked once (see the class doc)."""
        for source in wq_info.get("sources") or []:
            name = str(source.get("name") or "")
            if source.get("seq") is not None or name in self._floor:
                continue
            if starts.get(name, {}).get("opt_start_time"):
                self._floor[name] = None  # starts at a time: at which sequence is unknown
                continue
            origin = await origins.info(source)
            if origin is not None:
                first = int((origin.get("state") or {}).get("first_seq") or 1)
                self._floor[name] = max(first, int(starts.get(name, {}).get("opt_start_seq") or 0)) - 1


async def source_gaps_of(nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None) -> list[SourceGap]:
    """The gaps an elastic group's sources show now (one look: :class:`GapWatch`)."""
    api = api if api is not None else JetStreamApi(nc)
    return await GapWatch(once=True).update(api, await api.stream_info(work_queue_name(stream, group)))


async def intake_of(
    nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None
) -> list[StuckSource | SourceGap]:
    """What stops or loses an elastic group's intake now: its stuck sources, then its gaps (one look)."""
    api = api if api is not None else JetStreamApi(nc)
    info, origins = await api.stream_info(work_queue_name(stream, group)), Origins(api)
    stuck: list[StuckSource | SourceGap] = [*await stuck_sources(api, info, origins=origins)]
    return stuck + await GapWatch(once=True).update(api, info, origins)


def _transform_of(transforms: list[dict[str, Any]], subject: str) -> tuple[str, str]:
    """The (source, destination) of the transform that takes ``subject`` (its lengths count in the header)."""

    for t in transforms:
        if tokens_match(str(t.get("src") or ">").split("."), subject.split(".")):
            return str(t.get("src") or ">"), str(t.get("dest") or "")
    return ">", ""


def _full(config: dict[str, Any], state: dict[str, Any]) -> bool:
    max_msgs, max_bytes = int(config.get("max_msgs") or -1), int(config.get("max_bytes") or -1)
    return (0 < max_msgs <= int(state.get("messages") or 0)) or (0 < max_bytes <= int(state.get("bytes") or 0))


async def skip_stuck(
    nc: Client,
    stream: str,
    group: str,
    *,
    source: str | None = None,
    execute: bool = False,
    timeout: float = 30.0,
    api: JetStreamApi | None = None,
) -> SkipResult:
    """Step past the message a source of elastic group ``group`` is stuck on (invariant 4); ``source``: the
    origin stream when several are stuck. Without ``execute`` it only says what it would do."""

    api = api if api is not None else JetStreamApi(nc)
    wq = work_queue_name(stream, group)
    try:
        info = await api.stream_info(wq)
    except NotFoundError:
        await group_entry(api, ELASTIC_BUCKET, "elastic", stream, group)  # no such group (with a wrong-flavour hint)
        raise NotFoundError(f"the elastic consumer group's stream does not exist: {wq}") from None
    result = SkipResult(stream, group, await stuck_sources(api, info))
    candidates = [s for s in result.stuck if source is None or s.stream == source]
    if not candidates:
        result.reason = (
            f"no source of {wq} is stuck"
            + (f" on stream {source}" if source else "")
            + f" (a source counts as stuck once its next message has waited {STUCK_AFTER:g}s)"
        )
        return result
    if len(candidates) > 1:
        names = ", ".join(s.stream for s in candidates)
        raise ConfigError(f"sources {names} of {wq} are stuck: name the one to step past")
    stuck = candidates[0]
    if stuck.cause == "full":
        result.reason = f"{stuck.describe()}; nothing to step past"
        return result
    result.skipped = stuck
    if not execute:
        return result
    await _drained(api, wq, info, stuck.stream, timeout)
    await _restart_source(api, wq, stuck.stream, stuck.seq + 1)
    await settle_starts(api, wq, [stuck.stream])
    result.executed = True
    return result


async def _drained(api: JetStreamApi, wq: str, info: dict[str, Any], origin: str, timeout: float) -> None:
    """Until the work queue holds no message of ``origin``'s source (the members handled them): re-adding the
    source would otherwise resume after the last of them, at the stuck message again."""
    source = next(s for s in info.get("sources") or [] if s.get("name") == origin)
    patterns = [f"*.{t.get('src') or '>'}" for t in source.get("subject_transforms") or []] or ["*.>"]
    if not await queue_drained(api, wq, patterns, timeout):
        queued = 0
        for pattern in patterns:
            state = (await api.stream_info(wq, subjects_filter=pattern)).get("state") or {}
            queued += sum(int(n) for n in (state.get("subjects") or {}).values())
        raise PCGroupsError(
            f"the work queue {wq} still holds {queued} message(s) from {origin} after "
            f"{timeout:g}s: the members handle them first (are they running?); nothing changed"
        )


async def _restart_source(api: JetStreamApi, wq: str, origin: str, start: int) -> None:
    """Remove ``origin``'s source from the work queue and add it back starting at ``start``."""
    config = (await api.stream_info(wq))["config"]
    sources = config.get("sources") or []
    at = next(i for i, s in enumerate(sources) if s.get("name") == origin)
    again = {
        "name": origin,
        "opt_start_seq": start,
        **{k: v for k, v in sources[at].items() if k not in ("name", "opt_start_seq", "opt_start_time")},
    }
    await api.request(f"STREAM.UPDATE.{wq}", dict(config, sources=sources[:at] + sources[at + 1 :]))
    try:
        await api.request(f"STREAM.UPDATE.{wq}", dict(config, sources=[*sources[:at], again, *sources[at + 1 :]]))
    except PCGroupsError as e:
        raise PCGroupsError(
            f"{e}; the work queue {wq} is left without its source {origin}, which was: {again}"
        ) from None
