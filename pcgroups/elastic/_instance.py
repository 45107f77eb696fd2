"""A running elastic member instance: ``elastic_consume`` and :class:`ElasticInstance`.

A membership change touches only members whose partitions changed. A member giving up partitions
drains first (stops pulling, lets delivered messages finish) and only then shrinks its consumer, so
the new owner never works on a partition while the old one still holds a message of it. The instance
also watches its work queue's sourcing (a source that stopped after a node failure is set up again).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.kv import KeyValue

from .. import flavour
from ..config import ElasticConfig, parse_elastic_config, validate_name
from ..consume._dispatchers import Handler
from ..consume._instance import (
    KEPT_SETTINGS,
    ConsumerGone,
    ConsumerInstance,
    ControlEvent,
    PinChanged,
    Reconcile,
    setting_differences,
    startable,
    with_priority_group,
)
from ..consume._keys import KeyFunc, key_by_partitioning
from ..consume._loop import CONTINUE, ConsumeContext, Outcome
from ..consume._options import DEFAULT_BATCH, ConsumeOptions, consume_options
from ..consume._retry import RetryPolicy
from ..consume._session import PullSession
from ..errors import (
    ConfigChangedError,
    ConfigError,
    ConsumerGoneError,
    JetStreamAPIError,
    NotFoundError,
    PermissionDeniedError,
)
from ..events import EventCallback, PartitionsHook
from ..flavour import ELASTIC, api_of, check_names, stream_gone, work_queue_name
from ..jetstream._api import (
    ERR_CONSUMER_EXISTS,
    ERR_NO_MESSAGE_FOUND,
    ERR_WQ_CONSUMER_NOT_UNIQUE,
    ConsumerConfig,
    ConsumerTemplate,
    JetStreamApi,
    pinned_client_id,
)
from ..jetstream._store import ELASTIC_BUCKET, Watch, group_entry, group_key, open_bucket, read
from ..partitions import elastic_member_filters, member_partitions
from ..pool._dispatcher import WorkerPool
from ..tracing import Tracing
from ._admin import ElasticSpec, stored_config
from ._intake import STUCK_AFTER, GapWatch, Origins, SourceGap, SourceWatch, stuck_sources
from ._membership import auto_member_name, check_joinable, check_lease_ttl, join

log = logging.getLogger("pcgroups")

RETRY_FAST = 0.1  # while a change is under way (waiting for another member to release partitions)
# Sourcing watchdog (clustered work queues): nats-server retries a failed source after 10 s, 20 s, 30 s ...
# (up to 2 min). After a node failure that failed the source's consumer that leaves the work queue empty for
# 20-60 s while the origin has new messages. A work-queue leader step-down sets the source up again at once.
SOURCE_STALL = 3.0  # a source inactive this long (after the origin answers again) is stalled
SOURCE_CHECK = 1.0  # how often to look while it may be stalled
SOURCE_CHECK_TIMEOUT = 1.0  # the checks' requests: during an election JetStream does not answer at all
STEPDOWN_COOLDOWN = 20.0  # at most one step-down per instance in this time


@startable
async def elastic_consume(
    nc: Client,
    stream: str,
    group: str,
    member: str,
    handler: Handler | None = None,
    *,
    config: ConsumerTemplate | None = None,
    batch: int = DEFAULT_BATCH,
    auto_in_progress: bool = True,
    concurrency: int = 1,
    key: KeyFunc | None = None,
    retry: RetryPolicy | None = None,
    api: JetStreamApi | None = None,
    auto: bool = False,
    lease_ttl: float = 5.0,
    create: ElasticSpec | None = None,
    on_assigned: PartitionsHook | None = None,
    on_revoked: PartitionsHook | None = None,
    on_event: EventCallback | None = None,
    dispatch: bool = False,
    max_in_flight: int = 0,
    tracing: Tracing | None = None,
    options: ConsumeOptions | None = None,
) -> ConsumeContext:
    """Run an instance of ``member``; it may start before the member is added and waits until then.

    Acks must be explicit (the work-queue stream deletes what is acked). AckWait defaults to 5 s and
    is also the consumer's inactive threshold, so dead instances' consumers are reaped. With
    ``auto=True`` the membership follows the instances' leases (see :mod:`pcgroups.elastic`);
    ``member`` may then be empty for a generated name, and ``create`` (an :class:`ElasticSpec`)
    joins the group by name: it is created with that shape if it does not exist (an existing group
    of another shape is a ``GroupExistsError``). ``on_assigned``, ``on_revoked`` and ``on_event``: see
    :mod:`pcgroups.events`; ``tracing``: OpenTelemetry spans (:mod:`pcgroups.tracing`). Without a
    ``handler`` the instance is iterated: ``async for msg in instance``.
    ``dispatch=True`` (no handler): the pinned instance hands the messages to the group's workers
    (:func:`pcgroups.serve_worker`), at most ``max_in_flight`` at once (0: the workers' capacities), one per
    key, keys in turn (:mod:`pcgroups.pool`). ``options``: the consume options at once, as a
    :class:`~pcgroups.consume.ConsumeOptions` (then give none of them apart). Await the result for the
    instance (an :class:`ElasticInstance`, or an :class:`AutoInstance` with ``auto``), or use it directly:
    ``async with elastic_consume(...) as inst``.
    """
    options = consume_options(
        options,
        handler=handler,
        config=config,
        batch=batch,
        auto_in_progress=auto_in_progress,
        concurrency=concurrency,
        key=key,
        retry=retry,
        on_assigned=on_assigned,
        on_revoked=on_revoked,
        on_event=on_event,
        tracing=tracing,
        dispatch=dispatch,
        max_in_flight=max_in_flight,
    )
    if create is not None and not auto:
        raise ConfigError(
            "creating the group on joining (create=...) needs automatic membership (auto=True): "
            "a named member of a new group would wait forever to be added"
        )
    api = api_of(nc, api)
    check_names(stream, group)
    user_named = bool(member)
    if auto and not member:
        member = auto_member_name()
    validate_name("member", member)
    if auto:
        check_lease_ttl(lease_ttl)
    template = options.template()
    if template.ack_policy != "explicit":
        raise ConfigError("the ack policy when consuming from elastic consumer groups must be explicit")
    template.inactive_threshold = template.ack_wait
    if create is not None:
        await create.create(nc, stream, group, api=api)
    if auto:
        await check_joinable(nc, stream, group, await flavour.get_config(ELASTIC, nc, stream, group, api=api), api=api)
    inst = ElasticInstance(
        nc,
        api,
        stream=stream,
        group=group,
        member=member,
        options=options,
        template=template,
        remote=WorkerPool(options.max_in_flight) if options.dispatch else None,
    )
    await inst._setup()
    return await join(inst, user_named=user_named, lease_ttl=lease_ttl) if auto else inst


class ElasticInstance(ConsumerInstance):
    """An elastic member instance (see :func:`elastic_consume`).

    Its control loop reconciles: the member's consumer should exist with the filters the current
    membership gives it. Who changes an existing consumer: its pinned instance (after draining), or
    any instance when nobody is pinned; standbys wait for that.
    """

    flavour = "elastic"

    async def _setup(self) -> None:
        self.work_queue = work_queue_name(self.stream_name, self.group_name)
        try:
            await self.api.stream_info(self.work_queue)
        except NotFoundError:
            # no such group (named as the user gave it), else the group's work queue is missing
            await group_entry(self.api, ELASTIC_BUCKET, "elastic", self.stream_name, self.group_name)
            raise stream_gone(ELASTIC, self.stream_name, self.group_name) from None
        kv = await open_bucket(self.api, ELASTIC_BUCKET, kind="elastic")
        self._kv = kv
        self._key = group_key(self.stream_name, self.group_name)
        entry = await read(kv, self._key)
        if entry is None:
            raise NotFoundError(
                f"can not get the current elastic consumer group's config: "
                f"{self.group_name} on stream {self.stream_name} not found"
            )
        self.config = stored_config(self.stream_name, self.group_name, entry.value)
        self.desired = elastic_member_filters(self.config, self.member_name)
        self._membership: tuple[bool, list[int]] = self._member_state(self.config)
        if not self._membership[0]:
            self._reporter.emit("not-a-member")
        self._partition_key = _partitioning_key(self.config)
        self.current: list[str] | None = None  # the filters our consumer has, when attached
        self._retry_at = 0.0
        self._reconcile_at: float | None = None  # when a quiet control loop reconciles (_next_event)
        self._source_stalled_since: float | None = None
        self._next_stepdown = 0.0
        self._stall_limit = SOURCE_STALL + random.uniform(0, 1.5)  # instances of a group do not all act at once
        self.source_stepdowns = 0  # work-queue leader step-downs this instance asked for (sourcing stalled)
        self._sources = SourceWatch()  # how long each source has copied nothing (a source stuck on a message)
        self._intake_due = 0.0
        self._stuck_said: set[tuple[str, int]] = set()
        self._gaps = GapWatch()  # origin messages removed before their source copied them
        self._losing: dict[str, tuple[SourceGap, int]] = {}  # by source, the loss going on, and how much was said
        watcher = await Watch.start(kv, self._key)
        self._start(watcher)
        self._post(Reconcile())

    @property
    def _consume_stream(self) -> str:  # type: ignore[override]
        return self.work_queue

    def _default_key(self) -> KeyFunc:
        return lambda msg: self._partition_key(msg)  # follows the filters when a stream is added or removed

    @property
    def partitions(self) -> list[int]:
        """The partitions this instance's member owns under the current config."""
        c = self.config
        return member_partitions(
            max_members=c.max_members, members=c.members, member_mappings=c.member_mappings, member=self.member_name
        )

    async def _next_event(self) -> ControlEvent:
        """The next event, or :class:`Reconcile` after a quiet while; the pin's checks (every half PinnedTTL while
        the instance is neither pinned nor a standby) do not count as events here, or they would put
        the periodic reconcile off for good."""
        timeout = RETRY_FAST if self._unsettled() else self.template.ack_wait + 0.5
        if self._source_stalled_since is not None:
            timeout = min(timeout, SOURCE_CHECK)
        now = time.monotonic()
        if self._reconcile_at is None or self._reconcile_at > now + timeout:
            self._reconcile_at = now + timeout
        event: ControlEvent
        try:
            event = await asyncio.wait_for(self._events.get(), self._reconcile_at - now)
        except TimeoutError:
            event = Reconcile()
        if not isinstance(event, PinChanged):
            self._reconcile_at = None
        return event

    def _unsettled(self) -> bool:
        return (self.current or []) != self.desired

    async def _handle_flavour(self, event: ControlEvent) -> Outcome:
        if isinstance(event, Reconcile):
            await self._reconcile()
        return CONTINUE

    async def _config_update(self, entry: KeyValue.Entry) -> Outcome:
        """Follow a new config (members and mappings change; the group's shape may not)."""
        if entry.operation in ("DEL", "PURGE"):
            await self._stop_session(drain=True)
            return None  # the group was deleted (its stream goes with it)
        try:
            cfg = parse_elastic_config(entry.value or b"")
        except ConfigError as e:
            await self._stop_session(drain=True)
            return ConfigError(
                f"the config of elastic consumer group {self.group_name} on stream "
                f"{self.stream_name} is no longer valid: {e}"
            )
        if not _followable(self.config, cfg):
            await self._stop_session(drain=True)
            return ConfigChangedError(
                f"elastic consumer group {self.group_name} member {self.member_name} received a bad change in "
                "the configuration: max number of members, buffered messages, filter or partitioning "
                "wildcards changed"
            )
        if cfg.partitioning_filters != self.config.partitioning_filters:
            self._partition_key = _partitioning_key(cfg)  # a stream was added or removed
        self.config = cfg
        self._note_membership(cfg)
        desired = elastic_member_filters(cfg, self.member_name)
        if desired == self.desired and (self.current == desired or not desired):
            return CONTINUE  # our partitions did not change: keep consuming without a pause
        self.trace.rebalance_started(_partitions_of(self.current or []), _partitions_of(desired))
        self.desired = desired
        await self._reconcile()
        return CONTINUE

    async def _consumer_gone(self, reason: str) -> Outcome:
        """The consumer went away: the group was deleted (None), its work queue too (the error), else
        join again."""
        await self._stop_session(drain=False)
        self.current = None
        try:
            if await read(self._kv, self._key) is None:
                return None
            await self.api.stream_info(self.work_queue)
        except NotFoundError:
            return stream_gone(ELASTIC, self.stream_name, self.group_name, ConsumerGoneError)
        except (JetStreamAPIError, nats.errors.Error) as e:  # no leader for now (cluster failover)
            log.warning(
                "%s: consumer went away (%s) and JetStream is not answering (%s); joining again later",
                self.member_name,
                reason,
                e,
            )
            return CONTINUE  # not joined: the next reconcile (RETRY_FAST) tries again
        log.info("%s: consumer went away (%s), joining again", self.member_name, reason)
        self.recovered_errors += 1
        await self._reconcile()
        return CONTINUE

    def _member_state(self, cfg: ElasticConfig) -> tuple[bool, list[int]]:
        return cfg.is_in_membership(self.member_name), member_partitions(
            max_members=cfg.max_members,
            members=cfg.members,
            member_mappings=cfg.member_mappings,
            member=self.member_name,
        )

    def _note_membership(self, cfg: ElasticConfig) -> None:
        """The membership event of a new config: added, dropped, or the member's partitions changed."""
        (was_in, had), (is_in, has) = self._membership, self._member_state(cfg)
        self._membership = (is_in, has)
        if is_in and not was_in:
            self._reporter.emit("added", has)
        elif was_in and not is_in and not self._leaving:
            self._reporter.emit("dropped")
        elif is_in and has != had:
            self._reporter.emit("partitions", has)

    # --- reconciliation ---------------------------------------------------------------------
    async def _reconcile(self) -> None:
        try:
            if not self.desired:
                if self.session is None:
                    await self.api.stream_info(self.work_queue)  # waiting to be added: is the group still there?
                await self._release_all()
            elif self.session is None:
                await self._join()
            elif self.current != self.desired:
                await self._change_filters()
            else:
                await self._check_alive()
        except NotFoundError as e:
            # The work queue was deleted: the group is being deleted (the KV event follows) or gone.
            log.info("%s: %s", self.member_name, e)
            self._post(ConsumerGone(str(e)))
        except JetStreamAPIError as e:
            # Disconnected: the instance event said so already; tried again at the next reconcile.
            what = "membership change not applied yet" if self._unsettled() else "consumer check failed"
            log.log(logging.WARNING if self.nc.is_connected else logging.DEBUG, "%s: %s: %s", self.member_name, what, e)
        if not self._unsettled():
            self.trace.rebalance_done()

    async def _consumer_info(self) -> dict[str, Any] | None:
        try:
            return await self.api.consumer_info(self.work_queue, self.member_name)
        except NotFoundError:
            return None

    def _may_change(self, info: dict[str, Any], session: PullSession | None = None) -> bool:
        """The pinned instance changes the consumer; anyone may when nobody is pinned."""
        session = session or self.session
        pin = pinned_client_id(info)
        return pin is None or (session is not None and pin == session.pin_id)

    async def _acks_applied(self, session: PullSession) -> None:
        """Wait (bounded by AckWait) until the server has applied the last ack ``session`` sent.

        The server applies acks asynchronously: a consumer update, RESET or delete sent right after
        an ack can overtake it, and the acked message then comes back (as a first delivery to the
        partition's next owner). In a work queue an applied ack removes the message.
        """
        seq = session.last_acked()
        if seq is None:
            return
        deadline = time.monotonic() + self.template.ack_wait
        while True:
            try:
                await self.api.request(f"STREAM.MSG.GET.{self.work_queue}", {"seq": seq})
            except JetStreamAPIError as e:
                if e.err_code != ERR_NO_MESSAGE_FOUND:
                    log.debug("%s: checking ack of %d: %s", self.member_name, seq, e)
                return
            if time.monotonic() > deadline:
                log.warning(
                    "%s: ack of work-queue message %d not applied after %.1fs",
                    self.member_name,
                    seq,
                    self.template.ack_wait,
                )
                return
            await asyncio.sleep(0.002)

    async def _join(self) -> None:
        cfg = self._consumer_config(self.desired)
        try:
            await self.api.create_consumer(self.work_queue, cfg)
        except JetStreamAPIError as e:
            if e.err_code == ERR_WQ_CONSUMER_NOT_UNIQUE:
                return  # another member still holds some of our partitions: retry shortly
            if e.err_code != ERR_CONSUMER_EXISTS:
                raise
            info = await self._consumer_info()
            if info is None:
                return
            if (info["config"].get("filter_subjects") or []) == self.desired:
                # Set up by another instance of ours with other settings (the max_ack_pending of another
                # --concurrency): the member's instances share one consumer as it is, so attach to it.
                self._say_settings_kept(info["config"], cfg.to_wire())
            else:
                # Our consumer exists with other filters: another instance of ours is changing it, or it is stale.
                if not self._may_change(info) or not await self._partitions_free(self.desired):
                    return
                await self.api.delete_consumer(self.work_queue, self.member_name)
                try:
                    await self.api.create_consumer(self.work_queue, cfg)
                except JetStreamAPIError as e2:
                    if e2.err_code in (ERR_WQ_CONSUMER_NOT_UNIQUE, ERR_CONSUMER_EXISTS):
                        return
                    raise
        self.current = list(self.desired)
        session = await self._start_session(self.member_name)
        session.partitions = set(self.partitions)

    def _say_settings_kept(self, have: dict[str, Any], want: dict[str, Any]) -> None:
        """One warning when this instance attaches to its member's consumer as another instance made it: with
        the pin it works by that consumer's settings, not by its own."""
        differences = setting_differences(have, want, only=set(want) - KEPT_SETTINGS)
        if not differences:
            return
        said = ", ".join(f"{key} {now}, this instance asked {asked}" for key, now, asked in differences)
        log.warning(
            "member %s's consumer: %s: this instance uses the consumer as another instance of %s made it "
            "(the member's instances share it; stop them all to change it)",
            self.member_name,
            said,
            self.member_name,
        )

    def _consumer_config(self, filters: list[str]) -> ConsumerConfig:
        cfg = with_priority_group(self.template, filters)
        cfg.name = self.member_name
        cfg.durable_name = ""
        return cfg

    async def _partitions_free(self, filters: list[str]) -> bool:
        """No other consumer on the work queue holds any partition of ``filters``."""
        wanted = {f.split(".", 1)[0] for f in filters}
        for c in await self.api.list_consumers(self.work_queue):
            if c["name"] == self.member_name:
                continue
            conf = c.get("config", {})
            theirs = conf.get("filter_subjects") or ([conf["filter_subject"]] if conf.get("filter_subject") else [">"])
            for f in theirs:
                token = f.split(".", 1)[0]
                if token in wanted or token in (">", "*"):
                    return False
        return True

    async def _change_filters(self) -> None:
        """Shrink and/or grow our consumer in place: drain, update, RESET to the first message."""
        info = await self._consumer_info()
        if info is None:
            await self._stop_session(drain=False)
            self.current = None
            await self._join()
            return
        have = info["config"].get("filter_subjects") or []
        if have == self.desired:  # another instance of ours did it already
            self.current = list(self.desired)
            owned, session = set(self.partitions), self.session
            if session is not None and self._reporter.assigned - owned:
                session.partitions = self._handed_out(session) & owned  # hand out no more of what we lose
                await session.idle()  # and let its handlers finish
            await self._settle_pinned(owned)
            if session is not None:
                session.partitions = owned
            return
        if not self._may_change(info):
            return  # the pinned instance (maybe not this process) does it; check again shortly
        gained = [f for f in self.desired if f not in have]
        target = (
            self.desired
            if not gained or await self._partitions_free(gained)
            else [f for f in have if f in self.desired]
        )
        if target == have:
            return  # wait for the partitions we gain to be released
        if not target:
            # We keep none of our partitions and those we gain are still held elsewhere. An update to
            # no filter subjects would make the consumer match the whole work queue: release it.
            await self._release_all()
            return
        started = time.monotonic()
        session = self.session
        if session is None:
            raise RuntimeError(f"{self.member_name}: the consumer's filters change while it consumes only")
        # Hand out nothing more of what we give up; let running handlers finish (their acks applied).
        # Pulls go on meanwhile, so the pin stays with us and nothing waits for a pull to expire.
        session.partitions = set(self.partitions) & _partitions_of(have)
        await session.quiesce()
        await self._acks_applied(session)
        stream = await self.api.stream_info(self.work_queue)
        first = stream.get("state", {}).get("first_seq", 0)

        async def update() -> None:
            # Nothing runs (quiesced) and nothing is handed out until the RESET: the hooks' moment.
            kept = _partitions_of(target)
            await self._settle_pinned(self._reporter.assigned & kept)
            await self.api.create_consumer(self.work_queue, self._consumer_config(target), action="update")
            await self._settle_pinned(kept)

        # Update the filters, then RESET to the first message: what was buffered is dropped and comes
        # again in stream order (to us for kept partitions, to the new owner for the others), and the
        # older messages of gained partitions are delivered too.
        session.partitions = _partitions_of(target)
        await session.reset_and_resume(first, before_reset=update)
        self.current = list(target)
        log.info(
            "%s: consumer filters changed to %s (paused %.3fs)", self.member_name, target, time.monotonic() - started
        )

    async def _release_all(self) -> None:
        """Our member owns nothing now: drain and delete its consumer (when it is ours to delete)."""
        session = self.session
        if session is None:
            return
        # Start no new handler first: PullSession.stop(drain=True) stops pulling but still dispatches
        # what the open pull delivers meanwhile, and then cancels that handler mid-run (unacked, so
        # the partition's next owner gets the message again).
        await session.quiesce()
        await self._stop_session(drain=True)
        self.current = None
        await self._acks_applied(session)
        # Decided after the drain: the pin may have moved to another instance of ours meanwhile.
        info = await self._consumer_info()
        if info is not None and self._may_change(info, session):
            await self.api.delete_consumer(self.work_queue, self.member_name)

    async def _check_alive(self) -> None:
        """Periodic: the sourcing must work; our consumer must still exist (a deleted one is re-created)."""
        info = await self._quick_info(self.work_queue)
        if info is not None:
            await self._check_sourcing(info)
            await self._check_intake(info)
        if await self._consumer_info() is None:
            self._post(ConsumerGone("consumer not found"))

    async def _check_intake(self, info: dict[str, Any]) -> None:
        """Say once per message when a source is stuck on it (pcgroups.elastic._intake), and when it moves again; once
        when a source loses origin messages before copying them, and the total once no more go."""
        self._sources.update(info)
        now = time.monotonic()
        if now < self._intake_due:
            return
        self._intake_due = now + STUCK_AFTER
        origins = Origins(self.api)
        try:
            stuck = {(s.stream, s.seq): s for s in await stuck_sources(self.api, info, self._sources.still, origins)}
            gaps = await self._gaps.update(self.api, info, origins)
        except PermissionDeniedError as e:  # optional (docs/SECURITY.md): asked no more, so no server log per check
            log.info("%s: the intake of %s is not watched by this instance: %s", self.member_name, self.work_queue, e)
            self._intake_due = float("inf")
            return
        except JetStreamAPIError as e:
            log.debug("%s: intake check of %s: %s", self.member_name, self.work_queue, e)
            return
        for key in stuck.keys() - self._stuck_said:
            log.warning(
                "%s: the intake of elastic consumer group %s on stream %s stopped: %s",
                self.member_name,
                self.group_name,
                self.stream_name,
                stuck[key].describe(),
            )
        for stream, seq in self._stuck_said - stuck.keys():
            log.warning("%s: sourcing from %s moves again (past its message %d)", self.member_name, stream, seq)
        self._stuck_said = set(stuck)
        self._say_losses(gaps)

    def _say_losses(self, gaps: list[SourceGap]) -> None:
        """A loss is said when it starts; if it went on past that look, its total once a look finds no more."""
        new: dict[str, SourceGap] = {}
        for g in gaps:
            had = new.get(g.stream)
            new[g.stream] = g if had is None else SourceGap(g.stream, had.first, g.last, had.count + g.count)
        for stream, g in new.items():
            had, said = self._losing.get(stream, (None, 0))
            if had is None:
                log.warning(
                    "%s: elastic consumer group %s on stream %s lost messages: %s",
                    self.member_name,
                    self.group_name,
                    self.stream_name,
                    g.describe(),
                )
                self._losing[stream] = (g, g.count)
            else:
                self._losing[stream] = (SourceGap(stream, had.first, g.last, had.count + g.count), said)
        for stream in [s for s in self._losing if s not in new]:
            g, said = self._losing.pop(stream)
            if g.count > said:
                log.warning(
                    "%s: sourcing from %s loses no more messages: %d lost in all (sequences %d-%d)",
                    self.member_name,
                    stream,
                    g.count,
                    g.first,
                    g.last,
                )

    async def _quick_info(self, stream: str, external_api: str = "") -> dict[str, Any] | None:
        """Stream info (of a stream in another JetStream: ``external_api``) with a short timeout; None when
        JetStream does not answer (an election) or the user may not ask (the watchdog's permissions are
        optional: docs/SECURITY.md)."""
        try:
            return await self.api.at(external_api).request(f"STREAM.INFO.{stream}", timeout=SOURCE_CHECK_TIMEOUT)
        except (JetStreamAPIError, PermissionDeniedError) as e:
            log.debug("%s: stream info of %s: %s", self.member_name, stream, e)
            return None

    async def _check_sourcing(self, info: dict[str, Any]) -> None:
        """Step the work queue's leader down when its source from the origin stays inactive (see SOURCE_STALL).

        Only for a replicated work queue, and only once the origin answers (while the origin has no leader a
        new source could not start either). A healthy source reports activity well under a second old.
        """
        sources = info.get("sources") or []
        if not (info.get("cluster") or {}).get("replicas") or not sources:
            self._source_stalled_since = None
            return
        now = time.monotonic()
        if not _source_stalled(info):
            self._source_stalled_since = None
            return
        if self._source_stalled_since is None:
            inactive = max(src.get("active", 0) for src in sources) / 1e9  # -1 ns: no source consumer at all
            self._source_stalled_since = now - max(inactive, 0.0)
        stalled = now - self._source_stalled_since
        if stalled < self._stall_limit or now < self._next_stepdown:
            return
        for origin, external in {(src.get("name", ""), (src.get("external") or {}).get("api", "")) for src in sources}:
            if await self._quick_info(origin, external) is None:
                return  # an origin does not answer yet: a new source could not start either
        self._next_stepdown = now + STEPDOWN_COOLDOWN
        # Other instances of the group may act at the same moment: wait a little, and step down only if the
        # leader is still the one with the stalled source.
        leader = (info.get("cluster") or {}).get("leader")
        await asyncio.sleep(random.uniform(0, 1.0))
        again = await self._quick_info(self.work_queue)
        if again is None or (again.get("cluster") or {}).get("leader") != leader or not _source_stalled(again):
            self._source_stalled_since = None
            return
        log.warning(
            "%s: sourcing into %s has been inactive for %.1fs; asking its leader to step down so that "
            "the source starts again",
            self.member_name,
            self.work_queue,
            stalled,
        )
        self._source_stalled_since = None
        try:
            await self.api.request(f"STREAM.LEADER.STEPDOWN.{self.work_queue}", timeout=SOURCE_CHECK_TIMEOUT)
        except (JetStreamAPIError, PermissionDeniedError) as e:
            log.warning("%s: step-down of %s not done: %s", self.member_name, self.work_queue, e)
            return
        self.source_stepdowns += 1


def _followable(old: ElasticConfig, new: ElasticConfig) -> bool:
    """A change a running instance follows: the membership, or whole partitioning filters added or
    removed (a stream added to or removed from the group); any other change of shape ends it."""
    if (old.max_members, old.max_buffered_msgs, old.max_buffered_bytes) != (
        new.max_members,
        new.max_buffered_msgs,
        new.max_buffered_bytes,
    ):
        return False
    before = {pf.filter: pf.partitioning_wildcards or [] for pf in old.partitioning_filters or []}
    after = {pf.filter: pf.partitioning_wildcards or [] for pf in new.partitioning_filters or []}
    return bool(before) == bool(after) and all(after[f] == w for f, w in before.items() if f in after)


def _partitioning_key(cfg: ElasticConfig) -> KeyFunc:
    return key_by_partitioning([(pf.filter, pf.partitioning_wildcards) for pf in cfg.partitioning_filters or []])


def _source_stalled(info: dict[str, Any]) -> bool:
    """A source of this stream info has no consumer (active -1) or nothing from it for SOURCE_STALL."""
    return any(
        src.get("active", 0) < 0 or src.get("active", 0) > SOURCE_STALL * 1e9 for src in info.get("sources") or []
    )


def _partitions_of(filters: list[str]) -> set[int]:
    return {int(f.split(".", 1)[0]) for f in filters}
