"""Static consumer groups: the partition is already the stream's first subject token, and the
membership is fixed at creation (any config change ends every instance).

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

from . import flavour
from .config import MemberMapping, StaticConfig, parse_static_config, validate_name, validate_partition_count
from .errors import (ConfigChangedError, ConfigError, ConsumerGoneError, GroupExistsError, JetStreamAPIError,
                     NotAMemberError, NotFoundError)
from .events import EventCallback, PartitionsHook
from .flavour import STATIC, api_of, check_names, consumer_stream_info, static_consumer_name, stream_gone
from .instance import (KEPT_SETTINGS, ConsumerInstance, member_template, setting_differences, startable,
                       with_priority_group)
from .jsapi import ERR_CONSUMER_EXISTS, ConsumerConfig, ConsumerTemplate, JetStreamApi, pinned_client_id
from .loop import CONTINUE, Outcome
from .partitions import check_member_filters, member_partitions, static_member_filters
from .scheduler import KeyFunc, RetryPolicy
from .session import DEFAULT_BATCH, Handler
from .store import Watch, group_entry, group_key, kv_call, open_or_create_bucket, read, stop_watch
from .tracing import Tracing

log = logging.getLogger("pcgroups")


def stored_config(stream: str, group: str, value: bytes) -> StaticConfig:
    """A stored config, decoded and validated; a ConfigError naming the group when it is not valid."""
    return flavour.stored_config(STATIC, stream, group, value)


async def get_static_config(nc: Client, stream: str, group: str, *,
                            api: JetStreamApi | None = None) -> StaticConfig:
    """The group's config, validated."""
    return await flavour.get_config(STATIC, nc, stream, group, api=api)


async def create_static(nc: Client, stream: str, group: str, max_members: int, *,
                        filters: list[str] | None = None, members: list[str] | None = None,
                        member_mappings: list[MemberMapping] | None = None,
                        api: JetStreamApi | None = None) -> StaticConfig:
    """Create a static group (idempotent: the same config again succeeds; a different one fails).

    No consumers are created here: each member instance creates its own when it joins.
    """
    api = api_of(nc, api)
    check_names(stream, group)
    for m in list(members or []) + [mm.member for mm in member_mappings or []]:
        validate_name("member", m)
    cfg = StaticConfig(max_members=max_members, filters=list(filters or []), members=list(members or []),
                       member_mappings=list(member_mappings or []))
    try:
        validate_partition_count(max_members)
        cfg.validate()
        check_member_filters(cfg)
    except ConfigError as e:
        raise ConfigError(f"invalid static consumer group config: {e}") from None
    info = await consumer_stream_info(STATIC, api, stream, group)
    kv = await open_or_create_bucket(api, STATIC.bucket, group_key(stream, group),
                                     replicas=info["config"].get("num_replicas", 1))
    key = group_key(stream, group)
    existing = await read(kv, key)
    if existing is None:
        try:
            await kv_call(kv, kv.create(key, cfg.to_json()), key)
            return cfg
        except Exception:  # created concurrently: compare with theirs below
            existing = await read(kv, key)
            if existing is None:
                raise
    try:
        current = parse_static_config(existing.value)
    except ConfigError as e:
        raise GroupExistsError(f"static consumer group {group} on stream {stream} already exists with an invalid "
                               f"config ({e}): delete it first") from None
    if current != cfg:
        raise GroupExistsError("the existing static consumer group config doesn't match ours ("
                               + "; ".join(_differences(current, cfg)) + "), please delete the existing static "
                               "consumer group and create a new one")
    return current


async def create_static_consumers(nc: Client, stream: str, group: str, *, config: ConsumerTemplate | None = None,
                                  api: JetStreamApi | None = None) -> list[str]:
    """Create every member's consumer as its first instance would with the consumer template ``config`` (give
    the one the instances will use: AckWait, max_ack_pending); returns their names. Idempotent; a consumer
    that exists with other settings is a :class:`ConfigError` naming them. Instances then attach without
    creating anything: their users need no permission to create or delete consumers."""
    api = api_of(nc, api)
    cfg = await get_static_config(nc, stream, group, api=api)
    names = []
    for member in cfg.membership():
        filters = static_member_filters(cfg, member)
        if not filters:
            continue
        wanted = _member_consumer(group, member, member_template(config), filters)
        try:
            await api.create_consumer(stream, wanted)
        except JetStreamAPIError as e:
            if e.err_code != ERR_CONSUMER_EXISTS:
                raise
            have = (await api.consumer_info(stream, wanted.durable_name)).get("config", {})
            differences = setting_differences(have, wanted.to_wire(), only=set(wanted.to_wire()) - KEPT_SETTINGS)
            raise ConfigError(f"member {member}'s consumer {wanted.durable_name} exists with other settings "
                              f"({_there_asked(differences)}): give the settings it has, or delete it first "
                              "(its position is lost)") from None
        names.append(wanted.durable_name)
    return names


def _member_consumer(group: str, member: str, template: ConsumerConfig, filters: list[str]) -> ConsumerConfig:
    """A static member's consumer: the template, its filters, the ``PCG`` priority group, durable ``<group>-<member>``."""
    cfg = with_priority_group(template, filters)
    cfg.durable_name = static_consumer_name(group, member)
    return cfg


def _differences(now: StaticConfig, asked: StaticConfig) -> list[str]:
    """What differs between two static configs, as ``what: <now> now, <asked> asked``."""
    def words(items: list[str]) -> str:
        return " ".join(items) or "none"

    def mappings(cfg: StaticConfig) -> str:
        return words([f"{m.member}:{','.join(map(str, m.partitions))}" for m in cfg.member_mappings])

    shown = {"partitions": lambda c: str(c.max_members), "filters": lambda c: words(c.filters),
             "members": lambda c: words(c.members), "member mappings": mappings}
    return [f"{what}: {show(now)} now, {show(asked)} asked" for what, show in shown.items() if show(now) != show(asked)]


async def delete_static(nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None) -> None:
    """Delete the group's config, then exactly its members' consumers (running instances end); a user who may
    delete the config but not every member's consumer is refused before anything is deleted. A group whose
    stream was deleted is deleted too (its consumers went with the stream)."""
    api = api_of(nc, api)
    check_names(stream, group)
    try:
        await consumer_stream_info(STATIC, api, stream, group)
        no_stream = None
    except NotFoundError as e:
        no_stream = e
    try:
        kv, entry = await group_entry(api, STATIC.bucket, STATIC.name, stream, group)
    except NotFoundError:
        if no_stream is not None:
            raise no_stream from None
        raise
    key = group_key(stream, group)
    try:
        names = StaticConfig.from_json(entry.value).membership()
    except ConfigError as e:
        names = []  # nothing says which consumers are its members': running instances delete their own
        log.warning("static consumer group %s on stream %s has an invalid config (%s): deleting it without its "
                    "members' consumers", group, stream, e)
    for member in names:
        await api.check_delete(f"CONSUMER.DELETE.{stream}.{static_consumer_name(group, member)}")
    await kv_call(kv, kv.delete(key), key)
    for member in names if no_stream is None else []:
        await api.delete_consumer(stream, static_consumer_name(group, member))


async def list_static_groups(nc: Client, stream: str, *, api: JetStreamApi | None = None) -> list[str]:
    """Names of the static groups defined on ``stream`` (empty when there is no bucket yet)."""
    return await flavour.list_groups(STATIC, nc, stream, api=api)


async def list_static_active_members(nc: Client, stream: str, group: str, *,
                                     api: JetStreamApi | None = None) -> list[str]:
    """Members whose consumer exists and has an instance pulling, in membership order."""
    return await flavour.list_active_members(STATIC, nc, stream, group, api=api)


async def static_member_step_down(nc: Client, stream: str, group: str, member: str, *,
                                  api: JetStreamApi | None = None) -> None:
    """Unpin the member's consumer: another of its instances takes over at once."""
    await flavour.member_step_down(STATIC, nc, stream, group, member, api=api)


@startable
async def static_consume(nc: Client, stream: str, group: str, member: str, handler: Handler | None = None, *,
                         config: ConsumerTemplate | None = None, batch: int = DEFAULT_BATCH,
                         auto_in_progress: bool = True, concurrency: int = 1, key: KeyFunc | None = None,
                         retry: RetryPolicy | None = None, api: JetStreamApi | None = None,
                         on_assigned: PartitionsHook | None = None, on_revoked: PartitionsHook | None = None,
                         on_event: EventCallback | None = None, dispatch: bool = False,
                         max_in_flight: int = 0, tracing: Tracing | None = None) -> "StaticInstance":
    """Join a static group as ``member``: only the pinned instance of a member gets messages.

    ``config`` is the consumer template (max_ack_pending=1 for strict order); AckWait defaults to 5 s.
    ``dispatch=True`` (no handler): the pinned instance hands the messages to the group's workers
    (:func:`pcgroups.serve_worker`), at most ``max_in_flight`` at once (0: the workers' capacities), one
    per key (``key``), keys in turn (:mod:`pcgroups.dispatch`).
    ``on_assigned``, ``on_revoked`` and ``on_event``: see :mod:`pcgroups.events`; ``tracing``: OpenTelemetry
    spans (:mod:`pcgroups.tracing`). Without a ``handler`` the instance is iterated: ``async for msg in
    instance`` (:mod:`pcgroups.hooks`). Await the result for the instance, or use it directly:
    ``async with static_consume(...) as inst``.
    """
    api = api_of(nc, api)
    check_names(stream, group, member)
    inst = StaticInstance(nc, api, stream=stream, group=group, member=member, handler=handler,
                          template=member_template(config), batch=batch, auto_in_progress=auto_in_progress,
                          concurrency=concurrency, key=key, retry=retry, on_assigned=on_assigned,
                          on_revoked=on_revoked, on_event=on_event, dispatch=dispatch, max_in_flight=max_in_flight,
                          tracing=tracing)
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
                raise e from None   # no stream, no group: the stream is what is missing first
            raise stream_gone(STATIC, self.stream_name, self.group_name) from None
        kv, entry = await group_entry(self.api, STATIC.bucket, STATIC.name, self.stream_name, self.group_name)
        self._kv = kv
        self._key = group_key(self.stream_name, self.group_name)
        self.config = stored_config(self.stream_name, self.group_name, entry.value)
        watcher = await Watch.start(kv, self._key)
        try:
            if not self.config.is_in_membership(self.member_name):
                raise NotAMemberError(f"{self.member_name} is not a member of static consumer group {self.group_name} "
                                      f"(members: {', '.join(self.config.membership()) or 'none'})")
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
        return member_partitions(max_members=c.max_members, members=c.members, member_mappings=c.member_mappings,
                                 member=self.member_name)

    async def _join(self, filters: list[str]) -> None:
        cfg = _member_consumer(self.group_name, self.member_name, self.template, filters)
        if not await self._as_created(cfg):
            try:
                await self.api.create_consumer(self.stream_name, cfg)
            except JetStreamAPIError as e:
                if e.err_code != ERR_CONSUMER_EXISTS:
                    raise JetStreamAPIError(f"error creating our member's consumer: {e.description}", code=e.code,
                                            err_code=e.err_code, subject=e.subject) from None
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
            have, want, only=set(want) - KEPT_SETTINGS)

    async def _adopt(self, cfg: ConsumerConfig) -> None:
        """Our consumer exists with other settings: update it to ours when no other instance runs."""
        try:
            info = await self._unused_consumer()
        except NotFoundError:   # deleted meanwhile (the group changed): create it as the first instance
            await self.api.create_consumer(self.stream_name, cfg)
            return
        have, want = info.get("config", {}), cfg.to_wire()
        member, name = self.member_name, self.consumer_name
        if have.get("filter_subjects") != want["filter_subjects"]:
            theirs, ours = " ".join(have.get("filter_subjects") or []), " ".join(want["filter_subjects"])
            raise ConsumerGoneError(f"member {member}'s consumer {name} exists with other filters ({theirs}, not "
                                    f"{ours}): it is not this group's, delete it from stream {self.stream_name}")
        differences = setting_differences(have, want, only=set(want) - KEPT_SETTINGS)
        if info.get("num_waiting") or pinned_client_id(info):
            said = _there_asked(differences) or "settings the server shows differently"
            raise ConfigError(f"another instance of member {member} is running with other consumer settings "
                              f"({said}): stop the other instances of {member}, or start this one with the "
                              "same settings (cg: the same --concurrency and --max-ack-pending)")
        try:
            updated = await self.api.create_consumer(self.stream_name, cfg, action="update")
        except JetStreamAPIError as e:
            raise JetStreamAPIError(f"error updating our member's consumer {name} to this instance's settings "
                                    f"({_changes(differences)}): {e.description}; start this one with the same "
                                    "settings, or delete the consumer first (its position is lost)", code=e.code,
                                    err_code=e.err_code, subject=e.subject) from None
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
            return ConfigError(f"the config of static consumer group {self.group_name} on stream "
                               f"{self.stream_name} is no longer valid: {e}")
        if cfg != self.config:
            return ConfigChangedError("static consumer group config watcher received a change in the "
                                      "configuration, terminating")
        return None

    async def _leave(self) -> None:
        """Stop consuming (in-flight work finishes), then delete this member's consumer."""
        await self._stop_session(drain=True)
        try:
            await self.api.delete_consumer(self.stream_name, self.consumer_name)
        except Exception as e:
            log.warning("%s: could not delete consumer %s: %s", self.member_name, self.consumer_name, e)


#: consumer config keys an update keeps as the reference sets them (identity, filters, priority group)
def _there_asked(differences: list[tuple[str, str, str]]) -> str:
    return ", ".join(f"{k} {now} there, {asked} asked" for k, now, asked in differences)


def _changes(differences: list[tuple[str, str, str]]) -> str:
    return ", ".join(f"{k} {now} -> {asked}" for k, now, asked in differences)
