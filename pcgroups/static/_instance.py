"""A running static member instance: :func:`static_consume` and :class:`StaticInstance`.

A member's consumer (``<group>-<member>``) is created by its first instance with that instance's
settings (max_ack_pending, ack_wait, ...), or beforehand by an admin (:func:`create_static_consumers`):
an instance that finds its consumer as it would create it attaches to it without a create request, so a
member may then be denied the permission to create or delete consumers, and so to give its consumer
other partitions' filters (docs/SECURITY.md). An instance that asks other settings updates the consumer
in place (name, filters, priority group and PinnedTTL rule unchanged, so Go instances see the same
consumer) when no other instance of the member is running (no waiting pull, no pin: an instance that
just ended shows neither within a PinnedTTL, which is waited for), and logs what changed; while one is
running it is refused with a :class:`ConfigError` naming the differences, the consumer left as it was.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from nats.aio.client import Client
from nats.js.kv import KeyValue

from ..config import parse_static_config
from ..consume._dispatchers import Handler
from ..consume._instance import KEPT_SETTINGS, ConsumerInstance, setting_differences, startable
from ..consume._keys import KeyFunc
from ..consume._loop import CONTINUE, ConsumeContext, Outcome
from ..consume._options import DEFAULT_BATCH, ConsumeOptions, consume_options
from ..consume._retry import RetryPolicy
from ..errors import (
    ConfigChangedError,
    ConfigError,
    ConsumerGoneError,
    JetStreamAPIError,
    NotAMemberError,
    NotFoundError,
)
from ..events import EventCallback, PartitionsHook
from ..flavour import STATIC, api_of, check_names, consumer_stream_info, static_consumer_name, stream_gone
from ..jetstream._api import ERR_CONSUMER_EXISTS, ConsumerConfig, ConsumerTemplate, JetStreamApi, pinned_client_id
from ..jetstream._store import Watch, group_entry, group_key, read, stop_watch
from ..partitions import member_partitions, static_member_filters
from ..pool._dispatcher import WorkerPool
from ..tracing import Tracing
from ._admin import member_consumer, stored_config, there_asked

log = logging.getLogger("pcgroups")


@startable
async def static_consume(
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
    on_assigned: PartitionsHook | None = None,
    on_revoked: PartitionsHook | None = None,
    on_event: EventCallback | None = None,
    dispatch: bool = False,
    max_in_flight: int = 0,
    tracing: Tracing | None = None,
    options: ConsumeOptions | None = None,
) -> ConsumeContext:
    """Join a static group as ``member``: only the pinned instance of a member gets messages.

    ``config`` is the consumer template (max_ack_pending=1 for strict order); AckWait defaults to 5 s.
    ``dispatch=True`` (no handler): the pinned instance hands the messages to the group's workers
    (:func:`pcgroups.serve_worker`), at most ``max_in_flight`` at once (0: the workers' capacities), one
    per key (``key``), keys in turn (:mod:`pcgroups.pool`).
    ``on_assigned``, ``on_revoked`` and ``on_event``: see :mod:`pcgroups.events`; ``tracing``: OpenTelemetry
    spans (:mod:`pcgroups.tracing`). Without a ``handler`` the instance is iterated: ``async for msg in
    instance``. ``options``: all of these at once, as a :class:`~pcgroups.consume.ConsumeOptions` (then give
    none of them apart). Await the result for the instance (a :class:`StaticInstance`), or use it
    directly: ``async with static_consume(...) as inst``.
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
    api = api_of(nc, api)
    check_names(stream, group, member)
    inst = StaticInstance(
        nc,
        api,
        stream=stream,
        group=group,
        member=member,
        options=options,
        remote=WorkerPool(options.max_in_flight) if options.dispatch else None,
    )
    await inst._setup()
    return inst


class StaticInstance(ConsumerInstance):
    """A static member instance (see :func:`static_consume`)."""

    flavour = "static"

    async def _setup(self) -> None:
        try:
            await consumer_stream_info(STATIC, self.api, self.stream_name, self.group_name)
        except NotFoundError as e:
            try:
                await group_entry(self.api, STATIC.bucket, STATIC.name, self.stream_name, self.group_name)
            except NotFoundError:
                raise e from None  # no stream, no group: the stream is what is missing first
            raise stream_gone(STATIC, self.stream_name, self.group_name) from None
        kv, entry = await group_entry(self.api, STATIC.bucket, STATIC.name, self.stream_name, self.group_name)
        self._kv = kv
        self._key = group_key(self.stream_name, self.group_name)
        self.config = stored_config(self.stream_name, self.group_name, entry.value)
        watcher = await Watch.start(kv, self._key)
        try:
            if not self.config.is_in_membership(self.member_name):
                raise NotAMemberError(
                    f"{self.member_name} is not a member of static consumer group {self.group_name} "
                    f"(members: {', '.join(self.config.membership()) or 'none'})"
                )
            self.consumer_name = static_consumer_name(self.group_name, self.member_name)
            filters = static_member_filters(self.config, self.member_name)
            if filters:
                await self._join(filters)
        except BaseException:
            await stop_watch(watcher)
            raise
        self._start(watcher)

    @property
    def _consume_stream(self) -> str:  # type: ignore[override]
        return self.stream_name

    @property
    def partitions(self) -> list[int]:
        """The partitions this instance's member owns (fixed: the membership of a static group is)."""
        c = self.config
        return member_partitions(
            max_members=c.max_members, members=c.members, member_mappings=c.member_mappings, member=self.member_name
        )

    async def _join(self, filters: list[str]) -> None:
        cfg = member_consumer(self.group_name, self.member_name, self.template, filters)
        if not await self._as_created(cfg):
            try:
                await self.api.create_consumer(self.stream_name, cfg)
            except JetStreamAPIError as e:
                if e.err_code != ERR_CONSUMER_EXISTS:
                    raise JetStreamAPIError(
                        f"error creating our member's consumer: {e.description}",
                        code=e.code,
                        err_code=e.err_code,
                        subject=e.subject,
                    ) from None
                await self._adopt(cfg)
        await self._start_session(self.consumer_name)

    async def _as_created(self, cfg: ConsumerConfig) -> bool:
        """Our consumer exists as this instance would create it (by another instance, or by an admin:
        :func:`create_static_consumers`): attach without a create request."""
        try:
            have = (await self.api.consumer_info(self.stream_name, self.consumer_name)).get("config", {})
        except NotFoundError:
            return False
        want = cfg.to_wire()
        return have.get("filter_subjects") == want["filter_subjects"] and not setting_differences(
            have, want, only=set(want) - KEPT_SETTINGS
        )

    async def _adopt(self, cfg: ConsumerConfig) -> None:
        """Our consumer exists with other settings: update it to ours when no other instance runs."""
        try:
            info = await self._unused_consumer()
        except NotFoundError:  # deleted meanwhile (the group changed): create it as the first instance
            await self.api.create_consumer(self.stream_name, cfg)
            return
        have, want = info.get("config", {}), cfg.to_wire()
        member, name = self.member_name, self.consumer_name
        if have.get("filter_subjects") != want["filter_subjects"]:
            theirs, ours = " ".join(have.get("filter_subjects") or []), " ".join(want["filter_subjects"])
            raise ConsumerGoneError(
                f"member {member}'s consumer {name} exists with other filters ({theirs}, not "
                f"{ours}): it is not this group's, delete it from stream {self.stream_name}"
            )
        differences = setting_differences(have, want, only=set(want) - KEPT_SETTINGS)
        if info.get("num_waiting") or pinned_client_id(info):
            said = there_asked(differences) or "settings the server shows differently"
            raise ConfigError(
                f"another instance of member {member} is running with other consumer settings "
                f"({said}): stop the other instances of {member}, or start this one with the "
                "same settings (cg: the same --concurrency and --max-ack-pending)"
            )
        try:
            updated = await self.api.create_consumer(self.stream_name, cfg, action="update")
        except JetStreamAPIError as e:
            raise JetStreamAPIError(
                f"error updating our member's consumer {name} to this instance's settings "
                f"({_changes(differences)}): {e.description}; start this one with the same "
                "settings, or delete the consumer first (its position is lost)",
                code=e.code,
                err_code=e.err_code,
                subject=e.subject,
            ) from None
        changed = setting_differences(have, updated.get("config", {})) or differences
        log.warning("member %s's consumer: %s (updated: no other instance was running)", member, _changes(changed))

    async def _unused_consumer(self) -> dict[str, Any]:
        """Our consumer's info once nothing pulls from it and nobody holds its pin, or at the latest
        when an instance that just ended would show neither (PinnedTTL and a pull expiry after its last
        pull): an instance still running then keeps pulling and pinned."""
        info = await self.api.consumer_info(self.stream_name, self.consumer_name)
        ttl = (info.get("config", {}).get("priority_timeout") or 0) / 1e9
        deadline = time.monotonic() + max(ttl, 1.0) + 0.5
        while (info.get("num_waiting") or pinned_client_id(info)) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            info = await self.api.consumer_info(self.stream_name, self.consumer_name)
        return info

    async def _config_update(self, entry: KeyValue.Entry) -> Outcome:
        """Any change of a static group's config ends its instances: deleted (None), invalid or changed."""
        if entry.operation in ("DEL", "PURGE"):
            await self._leave()
            return None
        error = self._changed(entry.value or b"")
        if error is None:
            return CONTINUE
        await self._leave()
        return error

    async def _consumer_gone(self, reason: str) -> Outcome:
        """The consumer went away: the group was deleted (None), else the cause."""
        await self._stop_session(drain=False)
        entry = await read(self._kv, self._key)
        if entry is None:
            return None  # the group was deleted: its consumers go with it
        # Another instance of ours may have seen a config change first and deleted the consumer: report
        # the cause, as the watch event (maybe still queued) would.
        changed = self._changed(entry.value)
        if changed is not None:
            return changed
        try:
            await self.api.stream_info(self.stream_name)
        except NotFoundError:
            return stream_gone(STATIC, self.stream_name, self.group_name, ConsumerGoneError)
        return ConsumerGoneError(f"the member's consumer {self.consumer_name} went away: {reason}")

    def _changed(self, value: bytes) -> BaseException | None:
        """The error a stored config ends the instance with (not valid, or not ours); None when unchanged."""
        try:
            cfg = parse_static_config(value)
        except ConfigError as e:
            return ConfigError(
                f"the config of static consumer group {self.group_name} on stream "
                f"{self.stream_name} is no longer valid: {e}"
            )
        if cfg != self.config:
            return ConfigChangedError(
                "static consumer group config watcher received a change in the configuration, terminating"
            )
        return None

    async def _leave(self) -> None:
        """Stop consuming (in-flight work finishes), then delete this member's consumer."""
        await self._stop_session(drain=True)
        try:
            await self.api.delete_consumer(self.stream_name, self.consumer_name)
        except Exception as e:
            log.warning("%s: could not delete consumer %s: %s", self.member_name, self.consumer_name, e)


#: consumer config keys an update keeps as the reference sets them (identity, filters, priority group)
def _changes(differences: list[tuple[str, str, str]]) -> str:
    return ", ".join(f"{k} {now} -> {asked}" for k, now, asked in differences)
