"""Replay and skip: move a group's position in its stream(s), planned first, applied on request.

A :class:`Target` says where to go: ``earliest`` (the stream's first message), ``latest`` (past its last:
everything pending is skipped), ``seq:N``, ``time:RFC3339`` (the first message at or after that time) or
``duration`` (that long before now). :func:`plan_static_reset` / :func:`plan_elastic_reset` read the
group and say, per member, where it is and where it would be, and how many messages of *its* partitions
would be replayed or skipped; they change nothing. :func:`execute_reset` applies a plan.

**Static groups.** Each member's consumer ``<group>-<member>`` is RESET (``$JS.API.CONSUMER.RESET``) to the
target sequence. The position *now* is the consumer's ack floor + 1 (the next message to be handled); the
counts come from ephemeral consumers on the member's filter subjects (``num_pending`` from a sequence on:
exact, one request pair each). Running instances pick the reset up without a restart: the pinned one's
deliveries restart at consumer sequence 1 and its :class:`~pcgroups.consume._delivery.Delivery` starts a new epoch
(invariant 6: old buffered messages dropped, old acks forgotten). A member that never ran has no consumer:
the plan says so and nothing is done for it (its consumer is created by its first instance, with that
instance's AckWait and window, and starts at the stream's first message).

**Elastic groups.** Members consume a work queue that *sources* the origin stream(s); what a member has
handled is gone from it. So:

- *skip* (``latest``): the queued messages of the named members' partitions (all, when none is named) are
  purged (``$JS.API.STREAM.PURGE`` with a ``<p>.>`` filter). The server drops purged messages from the
  member consumers' pending lists, so the next message goes out at once.
- *replay* (``earliest``, ``seq:N``, ``time:``, ``duration``): the work queue stops sourcing (its sources
  are removed), is purged, and sources again from the target (``opt_start_seq``, removed from the config
  once the source runs, as a new source's start is). nats-server ignores a changed start of a running
  source, and resumes a re-added one after the last of its messages still queued: hence the purge, which
  also keeps the queued messages from being delivered twice. Replay is for the whole group: partitions
  are computed by the source's transform, so one member's partitions cannot be sourced alone.

In both, a handler running on a purged message is not waited for: its ack is ignored, and (replay) the
message comes again. ``seq:N`` needs a group over one stream (sequences are per stream).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.aio.client import Client

from ..config import validate_name
from ..connect import parse_duration as go_duration
from ..elastic._admin import get_elastic_config, get_elastic_layout, settle_starts
from ..errors import ConfigError, JetStreamAPIError, NotFoundError, PCGroupsError
from ..flavour import ELASTIC, STATIC, static_consumer_name, stream_gone, work_queue_name
from ..jetstream._api import JetStreamApi
from ..partitions import member_partitions, static_member_filters
from ..static._admin import get_static_config

ERR_NO_MESSAGE_FOUND = 10037


@dataclass(frozen=True)
class Target:
    """Where a reset goes: ``earliest``, ``latest``, ``seq`` (``seq``), ``time`` (``time``)."""

    kind: str
    seq: int = 0
    time: datetime | None = None

    @classmethod
    def of(
        cls,
        *,
        earliest: bool = False,
        latest: bool = False,
        seq: int | None = None,
        time: str | None = None,
        duration: str | None = None,
    ) -> Target:
        """The one target given (the CLI's ``--to-*``/``--by-duration``); anything else is a ConfigError."""
        given = [
            n
            for n, v in (
                ("--to-earliest", earliest),
                ("--to-latest", latest),
                ("--to-seq", seq is not None),
                ("--to-time", time is not None),
                ("--by-duration", duration is not None),
            )
            if v
        ]
        allowed = "--to-earliest, --to-latest, --to-seq N, --to-time RFC3339 or --by-duration D"
        if len(given) != 1:
            what = "no position given" if not given else f"{' and '.join(given)} given together"
            raise ConfigError(f"{what}: give exactly one of {allowed}")
        if earliest:
            return cls("earliest")
        if latest:
            return cls("latest")
        if seq is not None:
            if seq < 1:
                raise ConfigError(f"invalid --to-seq {seq}: a stream sequence is 1 or more")
            return cls("seq", seq=seq)
        if time is not None:
            return cls("time", time=parse_time(time))
        return cls("time", time=datetime.now(UTC) - timedelta(seconds=parse_duration(str(duration))))

    def __str__(self) -> str:
        if self.kind == "seq":
            return f"seq {self.seq}"
        if self.kind == "time" and self.time is not None:
            return f"time {rfc3339(self.time)}"
        return self.kind


def parse_time(text: str) -> datetime:
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise ConfigError(f"invalid --to-time {text!r}: use RFC3339 with a zone, e.g. 2026-11-25T08:00:00Z")
    return when


def parse_duration(text: str) -> float:
    """A positive Go duration (``1h``, ``90m``, ``1h30m``)."""

    try:
        seconds = go_duration(text)
    except PCGroupsError as e:
        raise ConfigError(f"invalid --by-duration: {e}") from None
    if seconds <= 0:
        raise ConfigError(f"invalid --by-duration {text!r}: use a positive Go duration, e.g. 90s, 30m or 1h30m")
    return seconds


def rfc3339(when: datetime) -> str:
    return when.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class MemberMove:
    """One member's part of a plan. ``now``/``after``: the next stream sequence it handles (static), and
    that message's time when there is one. ``replay``/``skip``: messages of its partitions handled again /
    never handled (elastic skip: ``skip`` is its queued messages purged)."""

    member: str
    partitions: list[int]
    exists: bool = True
    now: int = 0
    after: int = 0
    now_time: str | None = None
    after_time: str | None = None
    replay: int = 0
    skip: int = 0
    note: str = ""


@dataclass
class SourceMove:
    """Elastic replay: an origin stream sourced again from ``start`` (``messages`` of the group's from there)."""

    stream: str
    start: int
    start_time: str | None = None
    messages: int = 0


@dataclass
class ResetPlan:
    """What a reset does (:func:`execute_reset` applies it). ``queued``: elastic messages purged."""

    flavour: str
    stream: str
    group: str
    target: str
    members: list[MemberMove] = field(default_factory=list)
    sources: list[SourceMove] = field(default_factory=list)
    purge_partitions: list[int] | None = None
    queued: int = 0
    executed: bool = False

    @property
    def replay(self) -> bool:
        return bool(self.sources)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- reading the streams


async def _between(api: JetStreamApi, stream: str, subjects: list[str], a: int, b: int) -> int:
    """Messages on ``subjects`` with ``min(a,b) <= seq < max(a,b)``."""
    if a == b:
        return 0
    lo, hi = min(a, b), max(a, b)
    return await api.count_messages(stream, subjects, lo) - await api.count_messages(stream, subjects, hi)


async def _msg_time(api: JetStreamApi, stream: str, seq: int) -> str | None:
    """The time of the message at ``seq`` (None when there is none)."""
    try:
        time: str | None = (await api.request(f"STREAM.MSG.GET.{stream}", {"seq": seq}))["message"].get("time")
        return time
    except JetStreamAPIError as e:
        if e.err_code == ERR_NO_MESSAGE_FOUND:
            return None
        raise


async def _seq_at(api: JetStreamApi, stream: str, info: dict[str, Any], target: Target) -> int:
    """The stream sequence ``target`` lands on in ``stream`` (last + 1 when past its end)."""
    state = info.get("state") or {}
    first, last = max(int(state.get("first_seq") or 1), 1), int(state.get("last_seq") or 0)
    if target.kind == "earliest":
        return first
    if target.kind == "latest":
        return last + 1
    if target.kind == "seq":
        if target.seq > last + 1:
            raise ConfigError(
                f"--to-seq {target.seq} is past the end of stream {stream} (its last sequence is "
                f"{last}; allowed: 1 to {last + 1})"
            )
        return max(target.seq, first)
    assert target.time is not None
    try:
        reply = await api.request(f"STREAM.MSG.GET.{stream}", {"start_time": rfc3339_nano(target.time)})
        return int(reply["message"]["seq"])
    except JetStreamAPIError as e:
        if e.err_code == ERR_NO_MESSAGE_FOUND:
            return last + 1
        raise


def rfc3339_nano(when: datetime) -> str:
    return when.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


async def _stream_info(api: JetStreamApi, stream: str) -> dict[str, Any]:
    try:
        return await api.stream_info(stream)
    except NotFoundError:
        raise NotFoundError(f"stream {stream} does not exist") from None


def _chosen(membership: list[str], members: list[str] | None, kind: str, group: str) -> list[str]:
    for m in members or []:
        validate_name("member", m)
    unknown = [m for m in members or [] if m not in membership]
    if unknown:
        raise ConfigError(
            f"{unknown[0]} is not a member of {kind} consumer group {group} (members: "
            f"{', '.join(membership) or 'none'})"
        )
    return list(dict.fromkeys(members)) if members else membership


def _membership(cfg: Any) -> list[str]:
    return list(dict.fromkeys(list(cfg.members) + [m.member for m in cfg.member_mappings]))


# ---------------------------------------------------------------- static groups


async def plan_static_reset(
    nc: Client,
    stream: str,
    group: str,
    target: Target,
    members: list[str] | None = None,
    *,
    api: JetStreamApi | None = None,
) -> ResetPlan:
    """Where each member (all when ``members`` is empty) is and would be; changes nothing."""
    api = api if api is not None else JetStreamApi(nc)
    cfg = await get_static_config(nc, stream, group, api=api)
    chosen = _chosen(_membership(cfg), members, "static", group)
    try:
        info = await api.stream_info(stream)
    except NotFoundError:
        raise stream_gone(STATIC, stream, group) from None
    after = await _seq_at(api, stream, info, target)
    first = max(int((info.get("state") or {}).get("first_seq") or 1), 1)
    plan = ResetPlan("static", stream, group, str(target))
    after_time = await _msg_time(api, stream, after)
    for name in chosen:
        move = MemberMove(
            name,
            member_partitions(
                max_members=cfg.max_members, members=cfg.members, member_mappings=cfg.member_mappings, member=name
            ),
        )
        try:
            cinfo = await api.consumer_info(stream, static_consumer_name(group, name))
        except NotFoundError:
            move.exists = False
            move.note = "no consumer yet (never started): it starts at the first message; nothing to reset"
            plan.members.append(move)
            continue
        move.now = max(int((cinfo.get("ack_floor") or {}).get("stream_seq") or 0) + 1, first)
        move.after = after
        move.now_time, move.after_time = await _msg_time(api, stream, move.now), after_time
        filters = static_member_filters(cfg, name)
        counted = await _between(api, stream, filters, move.now, move.after)
        if move.after < move.now:
            move.replay = counted
        else:
            move.skip = counted
        plan.members.append(move)
    return plan


# ---------------------------------------------------------------- elastic groups


async def plan_elastic_reset(
    nc: Client,
    stream: str,
    group: str,
    target: Target,
    members: list[str] | None = None,
    *,
    api: JetStreamApi | None = None,
) -> ResetPlan:
    """Skip (``latest``: the queued messages of ``members``' partitions, all when none) or replay (any
    other target: the whole group, sourced again from there); changes nothing."""
    api = api if api is not None else JetStreamApi(nc)
    cfg = await get_elastic_config(nc, stream, group, api=api)
    chosen = _chosen(_membership(cfg), members, "elastic", group)
    queued = await _queued_by_partition(api, stream, group)
    plan = ResetPlan("elastic", stream, group, str(target))
    for name in chosen:
        parts = member_partitions(
            max_members=cfg.max_members, members=cfg.members, member_mappings=cfg.member_mappings, member=name
        )
        plan.members.append(MemberMove(name, parts, skip=sum(queued.get(p, 0) for p in parts)))
    if target.kind == "latest":
        plan.purge_partitions = sorted({p for m in plan.members for p in m.partitions}) if members else None
        plan.queued = sum(queued.values()) if not members else sum(m.skip for m in plan.members)
        return plan
    if members:
        raise ConfigError(
            "replay in an elastic group is for the whole group: name no member (--to-latest skips one member's queue)"
        )
    layout = await get_elastic_layout(nc, stream, group, api=api)
    if target.kind == "seq" and len(layout.streams) > 1:
        raise ConfigError(
            f"--to-seq needs a group over one stream, and {group} consumes "
            f"{', '.join(layout.names)}: use --to-time or --to-earliest"
        )
    plan.queued = sum(queued.values())
    for src in layout.streams:
        origin = api.at(src.external_api)  # a stream of another domain is asked there
        info = await _stream_info(origin, src.name)
        start = await _seq_at(origin, src.name, info, target)
        subjects = [f.filter for f in src.filters] or [">"]
        plan.sources.append(
            SourceMove(
                src.name,
                start,
                await _msg_time(origin, src.name, start),
                await origin.count_messages(src.name, subjects, start),
            )
        )
    return plan


async def _queued_by_partition(api: JetStreamApi, stream: str, group: str) -> dict[int, int]:
    """The work queue's messages by partition (its subjects' first token)."""
    wq = work_queue_name(stream, group)
    try:
        info = await api.request(f"STREAM.INFO.{wq}", {"subjects_filter": ">"})
    except JetStreamAPIError as e:
        if e.err_code == 10059:
            raise stream_gone(ELASTIC, stream, group) from None
        raise
    subjects = dict((info.get("state") or {}).get("subjects") or {})
    total = int(info.get("total") or 0)
    while subjects and len(subjects) < total:
        page = await api.request(f"STREAM.INFO.{wq}", {"subjects_filter": ">", "offset": len(subjects)})
        more = (page.get("state") or {}).get("subjects") or {}
        if not more:
            break
        subjects.update(more)
    out: dict[int, int] = {}
    for subject, count in subjects.items():
        token = subject.split(".", 1)[0]
        if token.isdigit():
            out[int(token)] = out.get(int(token), 0) + int(count)
    return out


# ---------------------------------------------------------------- applying a plan


async def execute_reset(nc: Client, plan: ResetPlan, *, api: JetStreamApi | None = None) -> ResetPlan:
    """Apply ``plan`` (from :func:`plan_static_reset` or :func:`plan_elastic_reset`); returns it, executed."""
    api = api if api is not None else JetStreamApi(nc)
    if plan.flavour == "static":
        for move in plan.members:
            if move.exists:
                await _reset_consumer(api, plan.stream, static_consumer_name(plan.group, move.member), move.after)
    elif plan.replay:
        await _resource(api, work_queue_name(plan.stream, plan.group), plan.sources)
    else:
        await _purge(api, work_queue_name(plan.stream, plan.group), plan.purge_partitions)
    plan.executed = True
    return plan


async def _reset_consumer(api: JetStreamApi, stream: str, consumer: str, seq: int) -> None:
    try:
        await api.reset(stream, consumer, seq)
    except JetStreamAPIError as e:
        raise PCGroupsError(f"can't reset consumer {consumer} to {seq}: {e.description}") from None


async def _purge(api: JetStreamApi, wq: str, partitions: list[int] | None) -> None:
    if partitions is None:
        await api.request(f"STREAM.PURGE.{wq}", {})
        return
    for p in partitions:
        await api.request(f"STREAM.PURGE.{wq}", {"filter": f"{p}.>"})


async def _resource(api: JetStreamApi, wq: str, moves: list[SourceMove]) -> None:
    """Stop sourcing, purge the work queue, source again from each move's start, then drop the starts."""
    config = (await api.stream_info(wq))["config"]
    sources = config.get("sources") or []
    starts = {m.stream: m.start for m in moves}
    await _update(api, dict(config, sources=[]))
    try:
        await _purge(api, wq, None)
    finally:
        fresh = [_starting(src, starts.get(str(src.get("name")), 1)) for src in sources]
        try:
            await _update(api, dict(config, sources=fresh))
        except PCGroupsError as e:
            raise PCGroupsError(
                f"{e}; the work queue {wq} is left without its sources, which were: {json.dumps(fresh)}"
            ) from None
    await settle_starts(api, wq, [m.stream for m in moves])


def _starting(source: dict[str, Any], seq: int) -> dict[str, Any]:
    """A work queue's source entry starting at ``seq`` (name and start first, as pcgroups writes them)."""
    rest = {k: v for k, v in source.items() if k not in ("name", "opt_start_seq", "opt_start_time")}
    return {"name": source.get("name"), "opt_start_seq": seq, **rest}


async def _update(api: JetStreamApi, config: dict[str, Any]) -> None:
    try:
        await api.request(f"STREAM.UPDATE.{config['name']}", config)
    except JetStreamAPIError as e:
        raise PCGroupsError(f"can't update the elastic consumer group's stream: {e}") from None


__all__ = [
    "MemberMove",
    "ResetPlan",
    "SourceMove",
    "Target",
    "execute_reset",
    "plan_elastic_reset",
    "plan_static_reset",
]
