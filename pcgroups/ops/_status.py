"""A group's live state, per partition, like Kafka's ``kafka-consumer-groups --describe``.

:func:`static_status` and :func:`elastic_status` read the group's config, list the member
consumers once and, for an elastic group, count the work queue's messages per partition, then say
for every partition: its owner member, the member consumer's pinned instance (pin id and since
when), pending and ack-pending messages, redeliveries and the last acked sequence (the ack floor).

What is counted per partition and what per member:

- **static**: a member consumer's counters cover all its partitions. When a member owns exactly one
  partition they are that partition's; otherwise ``pending`` is the member's total
  (``pending_exact=False``), unless ``per_partition=True`` asks the server to count each partition
  (an ephemeral, memory-stored consumer per partition on the member's filter subjects of that
  partition, created and deleted at once: two requests per partition, and it needs permission to
  create consumers on the stream). A member with no consumer yet has everything pending.
- **elastic**: the work-queue stream keeps exactly the messages not yet acked, so one stream-info
  request counts them per partition (``pending``: not yet acked, the one in flight included). Each
  source's origin is asked for its info too, and a source stuck on one origin message is named
  (``stuck_sources``, :mod:`pcgroups.elastic._intake`): nothing after it reaches the group, pending or not. So are
  origin messages removed before their source copied them (``source_gaps``, the same module).

A member's running instances are counted from its consumer: a pcgroups instance keeps exactly one
pull request waiting on it (pcgroups/session.py), so ``instances`` is the consumer's waiting pulls, and
at least 1 while an instance holds the pin (between two of its pulls none waits for a moment). A pinned
instance with key-level concurrency (or dispatching) that holds a full window of its own keeps no pull
waiting: when the server has messages it would deliver and does not (some pending, the consumer's
``max_ack_pending`` not reached), the pin counts on top of the waiting pulls. A Go reference instance may
keep two pulls waiting when busy, and counts twice then.

Each member's dead letters (those of the partitions it owns now, :mod:`pcgroups.deadletters`) are counted by
lane, with the keys they park: ``dead_letters`` wait for an operator, ``replaying`` were given back by a replay.

The request count is small and fixed: the config (two requests), one consumer list of the stream
that holds the member consumers, and for elastic one stream info of the work queue, one of each
origin stream whose source has copied nothing for a while or is behind (its lag, a full work queue), and one
message read per filter of a source whose origin holds messages it has not copied yet; one stream info of the
group's dead-letter stream (and one message read per parked key too long to be named in a subject).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from nats.aio.client import Client

from ..config import ElasticConfig, StaticConfig
from ..deadletters import dead_letter_stream, dead_letter_summary
from ..elastic._intake import GapWatch, Origins, stuck_sources
from ..elastic._membership import list_leases
from ..errors import NotFoundError, PermissionDeniedError
from ..flavour import ELASTIC, STATIC, get_config, static_consumer_name, stream_gone, work_queue_name
from ..jetstream._api import PRIORITY_GROUP, JetStreamApi, parse_timestamp
from ..partitions import member_partitions, static_member_filters
from ..pool._dispatcher import pool_status

__all__ = ["GroupStatus", "MemberStatus", "PartitionStatus", "elastic_status", "parse_timestamp", "static_status"]


@dataclass
class MemberStatus:
    """One member and its consumer."""

    member: str
    consumer: str
    partitions: list[int] = field(default_factory=list)
    exists: bool = False  # its consumer exists
    active: bool = False  # an instance is pulling (waiting pulls > 0)
    waiting: int = 0  # pull requests waiting on its consumer
    instances: int = 0  # running instances, pinned or standby (see the module doc)
    pinned_id: str | None = None  # the pinned instance's pin id
    pinned_since: datetime | None = None
    pending: int | None = None  # messages of its partitions not yet delivered
    ack_pending: int | None = None  # delivered, not yet acked
    redelivered: int | None = None  # messages delivered more than once and not yet acked
    ack_floor: int | None = None  # the stream sequence acked in order up to (last acked)
    delivered: int | None = None  # the last stream sequence delivered
    last_active: datetime | None = None
    filters: list[str] = field(default_factory=list)
    dead_letters: int | None = None  # dead letters of its partitions waiting for an operator (None: not known)
    replaying: int | None = None  # dead letters of its partitions a replay gave back to it (lane R)
    parked_keys: list[str] = field(default_factory=list)  # keys of its partitions with a dead letter


@dataclass
class PartitionStatus:
    """One partition: its owner and the owner consumer's state."""

    partition: int
    member: str | None = None  # None: no member owns it
    consumer: str | None = None
    active: bool = False
    pinned_id: str | None = None
    pinned_since: datetime | None = None
    pending: int | None = None
    pending_exact: bool = False  # False: ``pending`` is the owner's total over its partitions
    ack_pending: int | None = None  # the owner consumer's (per member)
    redelivered: int | None = None  # the owner consumer's (per member)
    ack_floor: int | None = None  # the owner consumer's (per member)
    delivered: int | None = None  # the owner consumer's (per member)


@dataclass
class GroupStatus:
    """A group's state at ``taken_at``."""

    flavour: str  # static or elastic
    stream: str
    group: str
    consumer_stream: str  # the stream holding the member consumers
    max_members: int
    mode: str  # balanced, mapped or empty
    filters: list[str]
    members: list[MemberStatus]
    partitions: list[PartitionStatus]
    last_seq: int = 0  # the consumer stream's last sequence
    messages: int = 0  # messages in the consumer stream
    source_lag: int | None = None  # elastic: origin messages not yet sourced into the work queue (all streams)
    source_lags: dict[str, int] = field(default_factory=dict)  # elastic: the same, by stream
    leases: list[Any] = field(default_factory=list)  # elastic: live instance leases (automatic membership)
    pools: list[dict[str, Any]] = field(default_factory=list)  # each dispatching instance's workers (dispatch.py)
    stuck_sources: list[Any] = field(default_factory=list)  # elastic: pcgroups.elastic._intake.StuckSource, by source
    source_gaps: list[Any] = field(default_factory=list)  # elastic: pcgroups.elastic._intake.SourceGap, messages lost
    source_lost: dict[str, int] = field(default_factory=dict)  # elastic: messages lost before sourcing, by stream
    dead_letter_stream: str | None = None  # the group's dead-letter stream (None: it has none, or may not read it)
    dead_letters: int | None = None  # dead letters in both lanes, of all partitions (None: not known)
    taken_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    requests: int = 0  # JetStream API requests it took

    @property
    def pending(self) -> int:
        """Messages not yet delivered (static) / not yet acked (elastic), over all owned partitions."""
        if self.flavour == "elastic":
            return sum(p.pending or 0 for p in self.partitions)
        return sum(m.pending or 0 for m in self.members)

    def member(self, name: str) -> MemberStatus | None:
        return next((m for m in self.members if m.member == name), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (times as RFC 3339 strings)."""
        jsonable: dict[str, Any] = _jsonable(asdict(self))
        return jsonable


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    return value


class _Counting(JetStreamApi):
    """A JetStreamApi on the caller's connection and API prefix that counts the requests a status takes."""

    def __init__(self, api: JetStreamApi):
        super().__init__(api.nc, timeout=api.timeout)
        self.prefix = api.prefix
        self.n = 0

    async def request(
        self, subject: str, body: bytes | dict[str, Any] | None = None, *, timeout: float | None = None
    ) -> dict[str, Any]:
        self.n += 1
        return await super().request(subject, body, timeout=timeout)


def _member_status(
    cfg: StaticConfig | ElasticConfig, member: str, consumer: str, info: dict[str, Any] | None
) -> MemberStatus:
    ms = MemberStatus(
        member=member,
        consumer=consumer,
        partitions=member_partitions(
            max_members=cfg.max_members, members=cfg.members, member_mappings=cfg.member_mappings, member=member
        ),
    )
    if info is None:
        return ms
    ms.exists = True
    ms.waiting = int(info.get("num_waiting") or 0)
    ms.active = ms.waiting > 0
    ms.pending = int(info.get("num_pending") or 0)
    ms.ack_pending = int(info.get("num_ack_pending") or 0)
    ms.redelivered = int(info.get("num_redelivered") or 0)
    ms.ack_floor = int((info.get("ack_floor") or {}).get("stream_seq") or 0)
    ms.delivered = int((info.get("delivered") or {}).get("stream_seq") or 0)
    ms.last_active = parse_timestamp((info.get("delivered") or {}).get("last_active"))
    conf = info.get("config") or {}
    ms.filters = list(conf.get("filter_subjects") or ([conf["filter_subject"]] if conf.get("filter_subject") else []))
    for state in info.get("priority_groups") or []:
        if state.get("group") == PRIORITY_GROUP:
            ms.pinned_id = state.get("pinned_client_id") or None
            ms.pinned_since = parse_timestamp(state.get("pinned_ts")) if ms.pinned_id else None
    ms.instances = _instances(ms, int(conf.get("max_ack_pending") or 0))
    return ms


def _instances(ms: MemberStatus, window: int) -> int:
    """The member's running instances (see the module doc): its waiting pulls, and the pinned one's. That one
    has no pull waiting while it holds a full window of its own (key-level concurrency, a dispatcher: it pulls
    what it has room for), told by messages the server would deliver to it and does not (some pending, the
    consumer's window not full): it counts on top of the standbys' pulls then."""
    if not ms.pinned_id:
        return ms.waiting
    held_back = (ms.pending or 0) > 0 and (ms.ack_pending or 0) < window
    return ms.waiting + 1 if held_back else max(ms.waiting, 1)


def _partition_rows(cfg: StaticConfig | ElasticConfig, members: list[MemberStatus]) -> list[PartitionStatus]:
    owner: dict[int, MemberStatus] = {}
    for ms in members:
        for p in ms.partitions:
            owner.setdefault(p, ms)
    rows = []
    for p in range(cfg.max_members):
        o = owner.get(p)
        if o is None:
            rows.append(PartitionStatus(partition=p))
            continue
        rows.append(
            PartitionStatus(
                partition=p,
                member=o.member,
                consumer=o.consumer if o.exists else None,
                active=o.active,
                pinned_id=o.pinned_id,
                pinned_since=o.pinned_since,
                pending=o.pending,
                pending_exact=o.exists and len(o.partitions) == 1,
                ack_pending=o.ack_pending,
                redelivered=o.redelivered,
                ack_floor=o.ack_floor,
                delivered=o.delivered,
            )
        )
    return rows


async def static_status(
    nc: Client,
    stream: str,
    group: str,
    *,
    api: JetStreamApi | None = None,
    per_partition: bool = False,
    config: StaticConfig | None = None,
    stream_view: tuple[list[dict[str, Any]], dict[str, Any]] | None = None,
    pools: bool = True,
    dead_letter_view: Mapping[str, int] | None = None,
) -> GroupStatus:
    """The state of static group ``group`` on ``stream`` (see the module doc).

    ``per_partition``: count each partition's undelivered messages exactly, with an ephemeral
    consumer per partition of members that own several (two extra requests each). ``config``: the
    group's config when the caller has already read it (the two config requests are saved).
    ``stream_view``: the stream's consumer infos and its info, when the caller has read them (the groups
    of one stream share them: the exporter lists a stream's consumers once, not once per group). ``pools``: ask
    the group's dispatching instances for their workers (a core NATS request, answered at once when there are
    none). ``dead_letter_view``: every dead-letter stream and the messages it holds, when the caller has listed
    them (the exporter, once for all groups): a group whose stream is not there, or empty, costs no request.
    """
    api = api if api is not None else JetStreamApi(nc)
    counting = _Counting(api)
    cfg = config if config is not None else await get_config(STATIC, nc, stream, group, api=api)
    config_requests = 0 if config is not None else 2  # the bucket lookup and the KV get
    try:
        consumers = stream_view[0] if stream_view is not None else await counting.list_consumers(stream)
    except NotFoundError:
        raise stream_gone(STATIC, stream, group) from None
    infos = {c["name"]: c for c in consumers}
    members = [
        _member_status(cfg, m, static_consumer_name(group, m), infos.get(static_consumer_name(group, m)))
        for m in cfg.membership()
    ]
    rows = _partition_rows(cfg, members)
    if per_partition:
        by_name = {m.member: m for m in members}
        for row in rows:
            ms = by_name.get(row.member or "")
            if ms is None or row.pending_exact:
                continue
            # the member's filter subjects of this partition (a group's filters leave other subjects out)
            subjects = [f for f in static_member_filters(cfg, ms.member) if f.split(".", 1)[0] == str(row.partition)]
            row.pending = await counting.count_messages(stream, subjects, (ms.delivered or 0) + 1)
            row.pending_exact = True
    try:
        state = (stream_view[1] if stream_view is not None else await counting.stream_info(stream)).get("state", {})
    except NotFoundError:
        raise stream_gone(STATIC, stream, group) from None
    dead_stream, dead = await _dead_letters(nc, counting, "static", stream, group, cfg, members, dead_letter_view)
    return GroupStatus(
        flavour="static",
        stream=stream,
        group=group,
        consumer_stream=stream,
        max_members=cfg.max_members,
        mode=cfg.mode,
        filters=list(cfg.filters),
        members=members,
        partitions=rows,
        last_seq=int(state.get("last_seq") or 0),
        messages=int(state.get("messages") or 0),
        dead_letter_stream=dead_stream,
        dead_letters=dead,
        requests=counting.n + config_requests,
        pools=await _pools(nc, "static", stream, group) if pools else [],
    )


async def elastic_status(
    nc: Client,
    stream: str,
    group: str,
    *,
    api: JetStreamApi | None = None,
    config: ElasticConfig | None = None,
    leases: bool = True,
    pools: bool = True,
    gaps: Any = None,
    dead_letter_view: Mapping[str, int] | None = None,
) -> GroupStatus:
    """The state of elastic group ``group`` on ``stream`` (see the module doc); ``config`` as for
    :func:`static_status`; ``leases=False`` leaves the leases out (saves a snapshot of their bucket). ``gaps``: a
    :class:`pcgroups.elastic.GapWatch` kept between calls (it sees the losses between them too; ``source_lost``
    then counts since its first call), else the gaps there are now. ``dead_letter_view`` as for
    :func:`static_status`."""
    api = api if api is not None else JetStreamApi(nc)
    counting = _Counting(api)
    cfg = config if config is not None else await get_config(ELASTIC, nc, stream, group, api=api)
    config_requests = 0 if config is not None else 2
    wq = work_queue_name(stream, group)
    try:
        infos = {c["name"]: c for c in await counting.list_consumers(wq)}
        wq_info = await counting.stream_info(wq, subjects_filter=">")
    except NotFoundError:
        raise stream_gone(ELASTIC, stream, group) from None
    members = [_member_status(cfg, m, m, infos.get(m)) for m in cfg.membership()]
    rows = _partition_rows(cfg, members)
    per_partition: dict[int, int] = {}
    state = wq_info.get("state", {})
    for subject, count in (state.get("subjects") or {}).items():
        token = subject.split(".", 1)[0]
        if token.isdigit():
            per_partition[int(token)] = per_partition.get(int(token), 0) + int(count)
    for row in rows:
        row.pending = per_partition.get(row.partition, 0)
        row.pending_exact = True
    source_lags = {source.get("name", ""): int(source.get("lag") or 0) for source in wq_info.get("sources") or []}

    origins, watch = Origins(counting), gaps if gaps is not None else GapWatch(once=True)
    try:
        stuck = await stuck_sources(counting, wq_info, origins=origins)
        lost = await watch.update(counting, wq_info, origins)
    except PermissionDeniedError:
        stuck, lost = (
            [],
            [],
        )  # the user may not read an origin's info or messages: nothing can be said (docs/SECURITY.md)
    held = await list_leases(nc, stream, group, api=api) if leases else []
    dead_stream, dead = await _dead_letters(nc, counting, "elastic", stream, group, cfg, members, dead_letter_view)
    return GroupStatus(
        flavour="elastic",
        stream=stream,
        group=group,
        consumer_stream=wq,
        max_members=cfg.max_members,
        mode=cfg.mode,
        filters=[pf.filter for pf in cfg.partitioning_filters or []],
        members=members,
        partitions=rows,
        last_seq=int(state.get("last_seq") or 0),
        messages=int(state.get("messages") or 0),
        source_lag=sum(source_lags.values()) if source_lags else None,
        source_lags=source_lags,
        leases=held,
        stuck_sources=stuck,
        source_gaps=lost,
        source_lost=dict(watch.lost),
        dead_letter_stream=dead_stream,
        dead_letters=dead,
        requests=counting.n + config_requests,
        pools=await _pools(nc, "elastic", stream, group) if pools else [],
    )


async def _dead_letters(
    nc: Client,
    api: JetStreamApi,
    flavour: str,
    stream: str,
    group: str,
    cfg: StaticConfig | ElasticConfig,
    members: list[MemberStatus],
    view: Mapping[str, int] | None,
) -> tuple[str | None, int | None]:
    """The group's dead letters given to the members that own their partitions now (one stream info of the
    dead-letter stream): (the stream, the total); (None, 0) without one, (None, None) when the user may not
    read it (docs/SECURITY.md: the observer may). ``view``: the dead-letter streams' counts, when known."""
    name = dead_letter_stream(flavour, stream, group)
    if view is not None and not view.get(name):
        for ms in members:
            ms.dead_letters, ms.replaying, ms.parked_keys = 0, 0, []
        return (name if name in view else None), 0
    try:
        summary = await dead_letter_summary(nc, flavour, stream, group, config=cfg, api=api)
    except PermissionDeniedError:
        return None, None
    for ms in members:
        mine = summary.of(ms.member)
        ms.dead_letters, ms.replaying, ms.parked_keys = mine.dead, mine.replaying, mine.parked_keys
    return (summary.stream if summary.exists else None), summary.total


async def _pools(nc: Client, flavour: str, stream: str, group: str) -> list[dict[str, Any]]:
    """The group's dispatching instances' pools, the pinned one's first (none without dispatching instances)."""

    answers = await pool_status(nc, flavour, stream, group)
    return sorted(answers, key=lambda a: (not a.get("pinned"), str(a.get("member")), str(a.get("d"))))
