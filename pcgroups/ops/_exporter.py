"""The groups' state as Prometheus metrics: the collector behind ``cg metrics`` (docs/OPERATIONS.md).

:class:`GroupsExporter` refreshes a snapshot of every static and elastic group it finds (or those of
the given streams) with :meth:`GroupsExporter.refresh`, and :meth:`GroupsExporter.run` does so every
``interval`` seconds, one refresh at a time, whatever the scrape rate: a scrape
(:meth:`GroupsExporter.collect`, the ``prometheus_client`` Collector protocol, called on the HTTP
server's thread) only reads the last snapshot and never talks to NATS.

A refresh reuses the status view (:mod:`pcgroups.ops._status`, what ``cg ... status`` shows):

- the groups: one KV snapshot per config bucket (``>``, or ``<stream>.*`` per given stream): an
  ephemeral consumer created, drained with ``no_wait`` pulls, deleted (3 requests while a bucket
  holds fewer than 256 groups), and the configs come with it;
- the static groups of a stream: one consumer list of the stream (one request per 256 consumers) and one
  stream info, shared by its groups (a list per group read every group's consumers for each: quadratic);
- an elastic group: one consumer list of its work queue, one stream info of the work queue with
  its per-subject counts (one request per 100,000 subjects) and its sources' lag (not the leases:
  the instances are counted from the consumers), and one stream info of each origin stream, to tell
  a source stuck on one message (:mod:`pcgroups.elastic._intake`; plus a message read while a source is behind) or
  losing origin messages before it copies them (an origin's info only while a source is behind, or moved on
  by more than the work queue stored: a :class:`~pcgroups.elastic._intake.GapWatch` per group, kept between refreshes).

The groups' dead letters (:mod:`pcgroups.deadletters`): one list of the streams whose subjects are the
dead-letter subjects (``$PCG.DLQ.>``, their message counts), then a stream info with per-subject counts of each
one that holds dead letters (a user who may not list streams: a stream info per group).

A last request (core NATS, not JetStream: ``$PCG.POOL.STATUS``) gathers every dispatching instance's
pool (:mod:`pcgroups.pool._dispatcher`), answered at once when there is none. So a refresh takes
``8 + 2 T + 3 E + D`` requests for ``E`` elastic groups over one stream each, static groups on ``T`` streams and
``D`` groups with dead letters (each consumer list and subject count in one page; with streams given, 6 per
stream instead of 6, plus the two), whatever the partitions and members. The exporter
counts what it really sends: its connection's outgoing messages (every one a JetStream API request
or a pull of a KV snapshot), so the connection must be the exporter's own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..deadletters._names import DLQ_ROOT
from ..elastic._admin import stored_config as elastic_config
from ..elastic._intake import GapWatch
from ..errors import JetStreamAPIError, NotFoundError, PCGroupsError, PermissionDeniedError
from ..jetstream._api import JetStreamApi
from ..jetstream._store import ELASTIC_BUCKET, STATIC_BUCKET, snapshot
from ..pool._dispatcher import pool_status
from ..static._admin import stored_config as static_config
from ._metrics import pool_families
from ._status import GroupStatus, MemberStatus, elastic_status, static_status

if TYPE_CHECKING:
    from nats.aio.client import Client

__all__ = ["EXPORTER_METRICS", "GROUP_METRICS", "GroupsExporter", "group_families"]

#: name -> help of the metrics about the groups (one sample per partition, member or group).
GROUP_METRICS: dict[str, str] = {
    "pcgroups_partition_pending_messages": "Messages of the partition not yet handled: elastic, not yet acked (counted per partition from the work "
    "queue); static, not yet delivered, counted by the server per member consumer, so a member owning several "
    "partitions has one sample whose partition label lists them (0,3,6); a member with no consumer has none",
    "pcgroups_partition_ack_pending_messages": "Messages delivered and not yet acked, counted per member consumer: the partition label lists the "
    "member's partitions",
    "pcgroups_member_redelivered_messages": "Messages of the member delivered more than once and not yet acked",
    "pcgroups_member_active_instances": "Running instances of the member, pinned or standby (each keeps one pull waiting on the member's consumer)",
    "pcgroups_member_pinned_seconds": "How long the member's pinned instance has held the pin (0: nobody holds it)",
    "pcgroups_member_partitions": "Partitions the member owns",
    "pcgroups_group_members": "Members of the group",
    "pcgroups_group_partitions": "Partitions of the group",
    "pcgroups_elastic_source_lag_messages": "Messages of a source stream not yet sourced into an elastic group's work queue",
    "pcgroups_elastic_source_stuck_seconds": "How long the source's next origin message has waited while the source copied nothing (0: not stuck; "
    "stuck from 5 s on): nothing after it reaches the group (cg elastic skip-stuck)",
    "pcgroups_elastic_source_stuck_sequence": "The origin stream sequence the source is stuck on (0: not stuck)",
    "pcgroups_elastic_source_lost_messages": "Origin messages removed from the source stream (its max messages, bytes or age, or a purge) before the "
    "group's source copied them, seen since the exporter started: they never reach the group",
    "pcgroups_member_dead_letters": "Dead letters of the partitions the member owns, by lane: dead (waiting for an operator: cg ... "
    'dead-letters) or replaying (a replay gave them back to the member, one of its instances runs them); member "" for '
    "partitions no member owns",
    "pcgroups_member_parked_keys": "Keys of the member's partitions with a dead letter: parked where its instances park keys "
    "(park_keys, --park-keys), their later messages following them into the dead-letter stream",
}

#: name -> help of the metrics about the exporter itself (counters without their ``_total``).
EXPORTER_METRICS: dict[str, str] = {
    "pcgroups_exporter_up": "1 when the last refresh reached JetStream, else 0",
    "pcgroups_exporter_refreshes": "Refreshes of the snapshot",
    "pcgroups_exporter_refresh_seconds": "How long the last refresh took",
    "pcgroups_exporter_api_requests": "JetStream API requests (and KV snapshot pulls) sent by the exporter",
    "pcgroups_exporter_last_refresh_api_requests": "JetStream API requests the last refresh sent",
    "pcgroups_exporter_errors": "Failed refreshes (kind=refresh), groups or a stream's groups that could not be "
    "read (kind=group), and reads the user's permissions refuse (kind=refused: each "
    "counted once)",
    "pcgroups_exporter_groups": "Groups in the last snapshot",
    "pcgroups_exporter_last_refresh_timestamp_seconds": "When the last refresh ended (Unix time)",
}

FLAVOURS = (("static", STATIC_BUCKET), ("elastic", ELASTIC_BUCKET))


class GroupsExporter:
    """A snapshot of the groups' metrics, refreshed by :meth:`run`, read by :meth:`collect`.

    ``streams``: only the groups of these streams (all groups when empty). ``nc`` must be the
    exporter's own connection: the requests it sends are counted from its statistics.
    """

    def __init__(
        self, nc: Client, api: JetStreamApi | None = None, *, streams: Sequence[str] = (), interval: float = 5.0
    ) -> None:
        self.nc = nc
        self.api = api if api is not None else JetStreamApi(nc)
        self.streams = list(dict.fromkeys(streams))
        self.interval = interval
        self.families: list[Any] = []  # the last snapshot's group metrics
        self.statuses: list[GroupStatus] = []
        self.up = 0
        self.refreshes = 0
        self.requests = 0
        self.last_requests = 0
        self.last_seconds = 0.0
        self.last_time = 0.0
        self.errors = {"refresh": 0, "group": 0, "refused": 0}
        self.refused: set[str] = set()  # the refused reads seen (each counted once)
        self.last_error: str | None = None  # the last refresh's error (None: it worked)
        self._due = 0.0  # when the next refresh is due (monotonic)
        self._gaps: dict[tuple[str, str], Any] = {}  # an elastic group's GapWatch, kept between refreshes

    # ------------------------------------------------------------ refreshing

    def _sent(self) -> int:
        return int(self.nc.stats.get("out_msgs", 0))

    async def refresh(self) -> None:
        """Take a new snapshot. A failure is counted, sets ``up`` to 0 and empties the snapshot (stale
        numbers would look live); a group that can not be read is counted and left out."""
        started, sent = time.monotonic(), self._sent()
        self._due = started + self.interval
        try:
            statuses, failures, refused = await self._read_all()
        except (TimeoutError, PCGroupsError, JetStreamAPIError, OSError) as e:
            self.up, self.families, self.statuses = 0, [], []
            self.errors["refresh"] += 1
            self.last_error = str(e) or type(e).__name__
        except Exception as e:
            self.up, self.families, self.statuses = 0, [], []
            self.errors["refresh"] += 1
            self.last_error = f"{type(e).__name__}: {e}"
        else:
            self.up, self.statuses = 1, statuses
            self._gaps = {k: w for k, w in self._gaps.items() if k in {(s.stream, s.group) for s in statuses}}
            self.families = list(group_families(statuses, datetime.now(UTC)))
            self.errors["group"] += len(failures)
            self.errors["refused"] += len(set(refused) - self.refused)  # a role's scope, not an incident: once each
            self.refused |= set(refused)
            self.last_error = "; ".join(failures + refused) or None
        finally:
            self.refreshes += 1
            self.last_requests = self._sent() - sent
            self.requests += self.last_requests
            self.last_seconds = time.monotonic() - started
            self.last_time = time.time()

    async def run(self, stop: asyncio.Event, on_refresh: Callable[[], None] | None = None) -> None:
        """Refresh every ``interval`` seconds (from the start of one refresh to the start of the next,
        never two at once; at once when none was done yet) until ``stop`` is set; ``on_refresh`` is
        called after each."""
        while not stop.is_set():
            left = self._due - time.monotonic()
            if left <= 0:
                await self.refresh()
                if on_refresh is not None:
                    on_refresh()
                continue
            try:
                await asyncio.wait_for(stop.wait(), left)
            except TimeoutError:
                pass

    async def _groups(self, bucket: str, refused: list[str]) -> list[tuple[str, str, bytes]]:
        """(stream, group, stored config) of the bucket's groups, of the chosen streams. A read the
        user's permissions refuse (a role scoped to some streams) is added to ``refused``, the other
        streams' groups are still read."""
        patterns = [f"{s}.*" for s in self.streams] or [">"]
        out = []
        for pattern in patterns:
            try:
                entries = await snapshot(self.api, bucket, pattern)
            except NotFoundError:
                return []  # no bucket: no group of this flavour yet
            except PermissionDeniedError as e:
                refused.append(f"{bucket} {pattern}: {e}")
                continue
            for entry in entries:
                stream, _, group = entry.key.partition(".")
                out.append((stream, group, entry.value or b""))
        return out

    async def _read_all(self) -> tuple[list[GroupStatus], list[str], list[str]]:
        """The statuses, the groups that could not be read, and the reads refused by permissions."""

        statuses: list[GroupStatus] = []
        failures: list[str] = []
        refused: list[str] = []
        views: dict[str, Any] = {}  # a stream's consumers and info, read once for all its static groups
        dead = await self._dead_letter_streams()
        for flavour, bucket in FLAVOURS:
            for stream, group, value in await self._groups(bucket, refused):
                try:
                    if flavour == "static":
                        status = await static_status(
                            self.nc,
                            stream,
                            group,
                            api=self.api,
                            pools=False,
                            config=static_config(stream, group, value),
                            stream_view=await self._stream_view(stream, views),
                            dead_letter_view=dead,
                        )
                    else:
                        gaps = self._gaps.setdefault((stream, group), GapWatch())
                        status = await elastic_status(
                            self.nc,
                            stream,
                            group,
                            api=self.api,
                            leases=False,
                            pools=False,
                            config=elastic_config(stream, group, value),
                            gaps=gaps,
                            dead_letter_view=dead,
                        )
                except PermissionDeniedError as e:
                    refused.append(f"{flavour} consumer group {group} on stream {stream}: {e}")
                    continue
                except (PCGroupsError, JetStreamAPIError) as e:
                    failures.append(f"{flavour} consumer group {group} on stream {stream}: {e}")
                    continue
                statuses.append(status)
        await self._pools(statuses)
        return statuses, failures, refused

    async def _pools(self, statuses: list[GroupStatus]) -> None:
        """Every dispatching instance's pool, in one request (:func:`pcgroups.pool._dispatcher.pool_status`), given to
        the groups read: per member, the pinned instance's view (another's when none is pinned)."""

        by_group = {(s.flavour, s.stream, s.group): s for s in statuses}
        answers = sorted(await pool_status(self.nc), key=lambda a: not a.get("pinned"))
        seen: set[tuple[str, ...]] = set()
        for a in answers:
            member = (str(a.get("flavour")), str(a.get("stream")), str(a.get("group")), str(a.get("member")))
            status = by_group.get(member[:3])
            if status is not None and member not in seen:
                seen.add(member)
                status.pools.append(a)

    async def _dead_letter_streams(self) -> dict[str, int] | None:
        """Every dead-letter stream and the dead letters it holds (``STREAM.LIST`` of the streams on ``$PCG.DLQ.>``,
        256 a page); None when the user may not list streams (each group then asks for its own)."""
        found: dict[str, int] = {}
        try:
            while True:
                page = await self.api.request("STREAM.LIST", {"offset": len(found), "subject": f"{DLQ_ROOT}.>"})
                infos = page.get("streams") or []
                for info in infos:
                    found[info["config"]["name"]] = int((info.get("state") or {}).get("messages") or 0)
                if not infos or len(found) >= int(page.get("total") or 0):
                    return found
        except (PermissionDeniedError, JetStreamAPIError):
            return None

    async def _stream_view(self, stream: str, views: dict[str, Any]) -> Any:
        """The stream's consumer infos and info, read on its first static group (None when that failed: each
        group then reads them itself, and says why it could not)."""
        if stream not in views:
            try:
                views[stream] = (await self.api.list_consumers(stream), await self.api.stream_info(stream))
            except (PCGroupsError, JetStreamAPIError):
                views[stream] = None
        return views[stream]

    # ------------------------------------------------------------ scraping

    def describe(self) -> list[Any]:
        """Nothing: the registry must not call :meth:`collect` when it is registered (that would
        read a snapshot that does not exist yet)."""
        return []

    def collect(self) -> Iterator[Any]:
        """The last snapshot and the exporter's own metrics (a scrape; no request to NATS)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        yield from self.families
        m = EXPORTER_METRICS
        yield GaugeMetricFamily("pcgroups_exporter_up", m["pcgroups_exporter_up"], value=self.up)
        yield CounterMetricFamily("pcgroups_exporter_refreshes", m["pcgroups_exporter_refreshes"], value=self.refreshes)
        yield GaugeMetricFamily(
            "pcgroups_exporter_refresh_seconds", m["pcgroups_exporter_refresh_seconds"], value=self.last_seconds
        )
        yield CounterMetricFamily(
            "pcgroups_exporter_api_requests", m["pcgroups_exporter_api_requests"], value=self.requests
        )
        yield GaugeMetricFamily(
            "pcgroups_exporter_last_refresh_api_requests",
            m["pcgroups_exporter_last_refresh_api_requests"],
            value=self.last_requests,
        )
        errors = CounterMetricFamily("pcgroups_exporter_errors", m["pcgroups_exporter_errors"], labels=["kind"])
        for kind, n in self.errors.items():
            errors.add_metric([kind], n)
        yield errors
        yield GaugeMetricFamily("pcgroups_exporter_groups", m["pcgroups_exporter_groups"], value=len(self.statuses))
        yield GaugeMetricFamily(
            "pcgroups_exporter_last_refresh_timestamp_seconds",
            m["pcgroups_exporter_last_refresh_timestamp_seconds"],
            value=self.last_time,
        )


def _partitions_label(partitions: Iterable[int]) -> str:
    return ",".join(str(p) for p in sorted(partitions))


def _member_rows(status: GroupStatus) -> Iterator[tuple[list[str], MemberStatus]]:
    for m in status.members:
        yield [status.flavour, status.stream, status.group, m.member], m


def _dead_letter_samples(s: GroupStatus, dead: Any, parked: Any) -> None:
    """A group's dead letters per member and lane, and its parked keys (none when they could not be read)."""
    if s.dead_letters is None:
        return
    group = [s.flavour, s.stream, s.group]
    owned = 0
    for m in s.members:
        owned += (m.dead_letters or 0) + (m.replaying or 0)
        dead.add_metric([*group, m.member, "dead"], m.dead_letters or 0)
        dead.add_metric([*group, m.member, "replaying"], m.replaying or 0)
        parked.add_metric([*group, m.member], len(m.parked_keys))
    if s.dead_letters > owned:
        dead.add_metric([*group, "", "dead"], s.dead_letters - owned)


def group_families(statuses: Sequence[GroupStatus], now: datetime) -> Iterator[Any]:
    """The group metrics (:data:`GROUP_METRICS`) of some groups' status, pins aged at ``now``."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    group_labels = ["flavour", "stream", "group"]
    member_labels = [*group_labels, "member"]
    partition_labels = [*group_labels, "partition", "member"]

    def family(name: str, labels: list[str]) -> Any:
        return GaugeMetricFamily(name, GROUP_METRICS[name], labels=labels)

    pending = family("pcgroups_partition_pending_messages", partition_labels)
    ack_pending = family("pcgroups_partition_ack_pending_messages", partition_labels)
    redelivered = family("pcgroups_member_redelivered_messages", member_labels)
    active = family("pcgroups_member_active_instances", member_labels)
    pinned = family("pcgroups_member_pinned_seconds", member_labels)
    owned = family("pcgroups_member_partitions", member_labels)
    members = family("pcgroups_group_members", group_labels)
    partitions = family("pcgroups_group_partitions", group_labels)
    source_lag = family("pcgroups_elastic_source_lag_messages", ["stream", "group", "source"])
    stuck_for = family("pcgroups_elastic_source_stuck_seconds", ["stream", "group", "source"])
    stuck_at = family("pcgroups_elastic_source_stuck_sequence", ["stream", "group", "source"])
    lost = CounterMetricFamily(
        "pcgroups_elastic_source_lost_messages",
        GROUP_METRICS["pcgroups_elastic_source_lost_messages"],
        labels=["stream", "group", "source"],
    )
    dead = family("pcgroups_member_dead_letters", [*member_labels, "lane"])
    parked = family("pcgroups_member_parked_keys", member_labels)
    for s in statuses:
        _dead_letter_samples(s, dead, parked)
        group = [s.flavour, s.stream, s.group]
        members.add_metric(group, len(s.members))
        partitions.add_metric(group, s.max_members)
        for labels, m in _member_rows(s):
            active.add_metric(labels, m.instances)
            owned.add_metric(labels, len(m.partitions))
            held = (now - m.pinned_since).total_seconds() if m.pinned_id and m.pinned_since else 0.0
            pinned.add_metric(labels, max(held, 0.0))
            if m.exists:
                redelivered.add_metric(labels, m.redelivered or 0)
                ack_pending.add_metric([*group, _partitions_label(m.partitions), m.member], m.ack_pending or 0)
                if s.flavour == "static" and m.partitions:
                    pending.add_metric([*group, _partitions_label(m.partitions), m.member], m.pending or 0)
        if s.flavour == "elastic":
            for p in s.partitions:
                pending.add_metric([*group, str(p.partition), p.member or ""], p.pending or 0)
            stuck = {x.stream: x for x in s.stuck_sources}
            for source, lag in sorted(s.source_lags.items()):
                source_lag.add_metric([s.stream, s.group, source], lag)
                stuck_for.add_metric([s.stream, s.group, source], stuck[source].waiting if source in stuck else 0)
                stuck_at.add_metric([s.stream, s.group, source], stuck[source].seq if source in stuck else 0)
                lost.add_metric([s.stream, s.group, source], s.source_lost.get(source, 0))
    yield from (
        pending,
        ack_pending,
        redelivered,
        active,
        pinned,
        owned,
        members,
        partitions,
        source_lag,
        stuck_for,
        stuck_at,
        lost,
        dead,
        parked,
    )
    yield from pool_families([a for s in statuses for a in s.pools])
