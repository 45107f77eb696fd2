"""Elastic consumer groups: any stream, sourced into a work-queue stream ``<stream>-<group>`` whose
subject transform prepends the partition; members can be added, dropped or remapped at any time.

A membership change touches only members whose partitions changed. A member giving up partitions
drains first (stops pulling, lets delivered messages finish) and only then shrinks its consumer, so
the new owner never works on a partition while the old one still holds a message of it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass, replace
from collections.abc import Callable, Sequence, Set as AbstractSet
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.kv import KeyValue

from .config import (ElasticConfig, MemberMapping, PartitioningFilter, parse_elastic_config, validate_name,
                     validate_partition_count)
from .errors import (ConfigChangedError, ConfigError, ConsumerGoneError, GroupExistsError, JetStreamAPIError,
                     NotFoundError, PCGroupsError, PermissionDeniedError)
from . import flavour
from .events import EventCallback, PartitionsHook
from .flavour import ELASTIC, api_of, check_names, consumer_stream_info, work_queue_name
from .sticky import sticky_change
from .instance import (ConsumerGone, ConsumerInstance, ControlEvent, PinChanged, Reconcile,
                       member_template, startable, with_priority_group)
from .jsapi import (ERR_CONSUMER_EXISTS, ERR_NO_MESSAGE_FOUND, ERR_STREAM_NAME_IN_USE, ERR_WQ_CONSUMER_NOT_UNIQUE,
                    ConsumerConfig, JetStreamApi, StreamConfig, pinned_client_id)
from .loop import CONTINUE, Outcome
from .membership import AutoInstance, auto_member_name, check_joinable, check_lease_ttl, join
from .partitions import elastic_member_filters, member_partitions, unmatched_filters
from .scheduler import KeyFunc, RetryPolicy, key_by_partitioning
from .session import DEFAULT_BATCH, Handler, PullSession
from .sources import (Layout, SourceStream, Start, assign_filters, explicit_start, layout_of, resolve_start,
                      source_config, starts_by_stream)
from .store import (ELASTIC_BUCKET, Entry, flavour_hint, group_entry, group_key, kv_call, open_bucket,
                    open_or_create_bucket, read, update)

log = logging.getLogger("pcgroups")

RETRY_FAST = 0.1   # while a change is under way (waiting for another member to release partitions)
# Sourcing watchdog (clustered work queues): nats-server retries a failed source after 10 s, 20 s, 30 s ...
# (up to 2 min). After a node failure that failed the source's consumer that leaves the work queue empty for
# 20-60 s while the origin has new messages. A work-queue leader step-down sets the source up again at once.
SOURCE_STALL = 3.0       # a source inactive this long (after the origin answers again) is stalled
SOURCE_CHECK = 1.0       # how often to look while it may be stalled
SOURCE_CHECK_TIMEOUT = 1.0   # the checks' requests: during an election JetStream does not answer at all
STEPDOWN_COOLDOWN = 20.0 # at most one step-down per instance in this time


def stored_config(stream: str, group: str, value: bytes) -> ElasticConfig:
    """A stored config, decoded and validated; a ConfigError naming the group when it is not valid."""
    return flavour.stored_config(ELASTIC, stream, group, value)


async def get_elastic_config(nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None) -> ElasticConfig:
    """The group's config, validated."""
    return await flavour.get_config(ELASTIC, nc, stream, group, api=api)


def work_queue_config(stream: str, group: str, cfg: ElasticConfig, *, replicas: int, storage: str,
                      layout: Layout | None = None) -> StreamConfig:
    """The work-queue stream as the reference creates it (docs/DESIGN.md, *Wire contract*), with one
    source per stream of ``layout`` (default: the group's own stream, as the reference has it)."""
    layout = layout or Layout((SourceStream(stream, tuple(cfg.partitioning_filters or ())),))
    return StreamConfig(name=work_queue_name(stream, group), retention="workqueue", max_msgs=cfg.max_buffered_msgs,
                        max_bytes=cfg.max_buffered_bytes, discard="new", storage=storage, num_replicas=replicas,
                        sources=[source_config(s, cfg.max_members) for s in layout.streams], allow_direct=True)


def _shape_differences(now: ElasticConfig, asked: ElasticConfig) -> list[str]:
    out = []
    if now.max_members != asked.max_members:
        out.append(f"partitions: {now.max_members} now, {asked.max_members} asked")
    if (now.partitioning_filters or []) != (asked.partitioning_filters or []):
        out.append(f"partitioning filters: {_show_filters(now)} now, {_show_filters(asked)} asked")
    if now.max_buffered_msgs != asked.max_buffered_msgs:
        out.append(f"buffered messages: {now.max_buffered_msgs} now, {asked.max_buffered_msgs} asked")
    if now.max_buffered_bytes != asked.max_buffered_bytes:
        out.append(f"buffered bytes: {now.max_buffered_bytes} now, {asked.max_buffered_bytes} asked")
    return out


def _show_filters(cfg: ElasticConfig) -> str:
    pfs = cfg.partitioning_filters or []
    if not pfs:
        return "none"
    return "[" + ", ".join(pf.filter + (f" by {','.join(map(str, pf.partitioning_wildcards))}"
                                        if pf.partitioning_wildcards else "") for pf in pfs) + "]"


def _layout_differences(now: Layout, asked: Layout) -> list[str]:
    if now.shape() == asked.shape():
        return []
    return [f"streams: [{', '.join(s.describe() for s in now.streams)}] now, "
            f"[{', '.join(s.describe() for s in asked.streams)}] asked"]


def _exists_error(differences: list[str]) -> GroupExistsError:
    return GroupExistsError("the existing elastic consumer group config can not be updated to the requested one ("
                            + "; ".join(differences) + "), please delete the existing elastic consumer group and "
                            "create a new one")


async def _stream_infos(api: JetStreamApi, names: list[str], roles: dict[str, str]) -> dict[str, dict[str, Any]]:
    infos = {}
    for name in names:
        try:
            infos[name] = await api.stream_info(name)
        except NotFoundError:
            raise NotFoundError(f"the elastic consumer group's {roles[name]} does not exist: {name}") from None
    return infos


def _plan_streams(stream: str, cfg: ElasticConfig, sources: list[str], partition_streams: list[str]
                  ) -> tuple[list[str], dict[str, str]]:
    """The streams a create asks for, with the role each plays (for messages); checks their count and names."""
    if partition_streams:
        if cfg.partitioning_filters:
            raise ConfigError("a group of partition streams takes no partitioning filters: each stream is one "
                              "partition, sourced whole")
        if sources:
            raise ConfigError("a group of partition streams takes no other sources: list every stream as a "
                              "partition stream")
        if len(partition_streams) != cfg.max_members:
            raise ConfigError(f"{len(partition_streams)} partition streams given for {cfg.max_members} partitions: "
                              "give exactly one stream per partition, in partition order")
        names = list(partition_streams)
        roles = {n: f"partition stream {i}" for i, n in enumerate(names)}
    else:
        names = [stream, *sources]
        roles = {stream: "origin stream", **{s: "source stream" for s in sources}}
    for n in names:
        validate_name("stream", n)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"stream {repeated[0]} is listed more than once: each stream can be sourced once")
    return names, roles


@dataclass
class ElasticSpec:
    """The shape of an elastic group, as :func:`create_elastic` takes it (for joining by name:
    ``elastic_consume(..., auto=True, create=ElasticSpec(...))``)."""

    max_members: int
    partitioning_filters: list[PartitioningFilter] | None = None
    max_buffered_msgs: int = 0
    max_buffered_bytes: int = 0
    sources: list[str] | None = None
    partition_streams: list[str] | None = None
    start: "str | Start | dict[str, str | Start] | None" = None

    async def create(self, nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None) -> ElasticConfig:
        return await create_elastic(nc, stream, group, self.max_members, partitioning_filters=self.partitioning_filters,
                                    max_buffered_msgs=self.max_buffered_msgs, max_buffered_bytes=self.max_buffered_bytes,
                                    sources=self.sources, partition_streams=self.partition_streams, start=self.start,
                                    api=api)


async def create_elastic(nc: Client, stream: str, group: str, max_members: int, *,
                         partitioning_filters: list[PartitioningFilter] | None = None,
                         max_buffered_msgs: int = 0, max_buffered_bytes: int = 0,
                         sources: list[str] | None = None, partition_streams: list[str] | None = None,
                         start: "str | Start | dict[str, str | Start] | None" = None,
                         api: JetStreamApi | None = None) -> ElasticConfig:
    """Create an elastic group and its work-queue stream (idempotent; a failed create leaves nothing).

    ``sources``: further streams the group consumes besides ``stream`` (an aggregate group); each
    partitioning filter must match subjects of exactly one of the streams. ``partition_streams``:
    stream *i* is partition *i* (their count is ``max_members``; ``stream`` is then only the group's
    name and need not exist). ``start``: where sourcing begins, ``all`` (default), ``new``, ``seq:N``
    or ``time:RFC3339``, for every stream or as a dict by stream name. See :mod:`pcgroups.sources`.
    """
    api = api_of(nc, api)
    check_names(stream, group)
    cfg = ElasticConfig(max_members=max_members, partitioning_filters=partitioning_filters,
                        max_buffered_msgs=max_buffered_msgs, max_buffered_bytes=max_buffered_bytes)
    try:
        validate_partition_count(max_members)
        cfg.validate()
        names, roles = _plan_streams(stream, cfg, list(sources or []), list(partition_streams or []))
        starts = starts_by_stream(start, names)
    except ConfigError as e:
        raise ConfigError(f"invalid elastic consumer group config: {e}") from None
    infos = await _stream_infos(api, names, roles)
    layout = _layout(stream, cfg, names, infos, starts, partition_streams=bool(partition_streams))
    first = infos[names[0]]["config"]
    replicas = max(i["config"].get("num_replicas", 1) for i in infos.values())
    kv = await open_or_create_bucket(api, ELASTIC_BUCKET, group_key(stream, group), replicas=replicas)
    key = group_key(stream, group)
    existing = await read(kv, key)
    if existing is not None:
        try:
            current = parse_elastic_config(existing.value)
        except ConfigError as e:
            raise GroupExistsError(f"elastic consumer group {group} on stream {stream} already exists with an invalid "
                                   f"config ({e}): delete it first") from None
        differences = _shape_differences(current, cfg)
        if differences:
            raise _exists_error(differences)
        cfg = current
    wq = work_queue_config(stream, group, cfg, replicas=replicas, storage=first.get("storage", "file"), layout=layout)
    created_stream = await _ensure_work_queue(api, wq, cfg, layout)
    if created_stream:
        await settle_starts(api, wq.name, [src.name for src in layout.streams if src.start_seq or src.start_time])
    if existing is None:
        try:
            await kv_call(kv, kv.create(key, cfg.to_json()), key)
        except nats.js.errors.BadRequestError:
            if await read(kv, key) is None:
                if created_stream:
                    await api.delete_stream(wq.name)
                raise
            # Created concurrently (instances joining by name at once): compare with theirs.
            return await create_elastic(nc, stream, group, max_members, partitioning_filters=partitioning_filters,
                                        max_buffered_msgs=max_buffered_msgs, max_buffered_bytes=max_buffered_bytes,
                                        sources=sources, partition_streams=partition_streams, start=start, api=api)
        except BaseException:
            if created_stream:
                await api.delete_stream(wq.name)
            raise
    return cfg


def _layout(stream: str, cfg: ElasticConfig, names: list[str], infos: dict[str, dict[str, Any]],
            starts: dict[str, Start], *, partition_streams: bool) -> Layout:
    """The layout a create asks for: each stream with its filters (or partition) and resolved start.

    With several streams every start is explicit (``all`` is the stream's first sequence): nats-server
    sets each source up 100-200 ms after the next, and one set up after the members consumed what an
    earlier one brought would start at the work queue's last message time, skipping its backlog.
    """
    resolve = explicit_start if len(names) > 1 else resolve_start
    if partition_streams:
        return Layout(tuple(SourceStream(n, (), i, *resolve(starts[n], infos[n])) for i, n in enumerate(names)))
    filters = list(cfg.partitioning_filters or [])
    if len(names) == 1:
        unmatched = unmatched_filters([pf.filter for pf in filters], infos[stream]["config"])
        if unmatched:
            raise ConfigError(f"invalid elastic consumer group config: partitioning filter {unmatched[0]} matches "
                              f"none of the subjects of stream {stream} "
                              f"({', '.join(infos[stream]['config']['subjects'])}); a filter must match some of them")
    try:
        assigned = assign_filters(filters, {n: infos[n]["config"] for n in names})
    except ConfigError as e:
        raise ConfigError(f"invalid elastic consumer group config: {e}") from None
    return Layout(tuple(SourceStream(n, tuple(assigned[n]), None, *resolve(starts[n], infos[n])) for n in names))


async def _ensure_work_queue(api: JetStreamApi, wq: StreamConfig, cfg: ElasticConfig, layout: Layout) -> bool:
    """Create the work queue unless it exists with the same layout; True when this call created it."""
    for _ in range(2):
        try:
            info = await api.stream_info(wq.name)
        except NotFoundError:
            try:
                await api.create_stream(wq)
                return True
            except JetStreamAPIError as e:
                if e.err_code != ERR_STREAM_NAME_IN_USE:
                    raise PCGroupsError(f"can't create the elastic consumer group's stream: {e}") from None
                continue   # created concurrently with another start position: compare with theirs
        differences = _layout_differences(layout_of(info["config"], cfg.partitioning_filters), layout)
        if differences:
            raise _exists_error(differences)
        return False
    raise PCGroupsError(f"can't create the elastic consumer group's stream {wq.name}: it keeps changing")


async def settle_starts(api: JetStreamApi, work_queue: str, names: list[str], timeout: float = 10.0) -> None:
    """Once the sources ``names`` have started (at their explicit start), drop their start from the
    work queue's config: the start is history, and a kept ``opt_start_seq`` would make nats-server
    source the stream again from there whenever it restarts the source with none of its messages
    left in the work queue (after a restart or a leader change). Without it, the work queue's config
    is the reference's. A source that does not start in time keeps its start (logged)."""
    if not names:
        return
    info = await _sources_active(api, work_queue, names, timeout)
    active = {src.get("name") for src in info.get("sources") or [] if src.get("active", -1) >= 0}
    late = [n for n in names if n not in active]
    if late:
        log.warning("%s: sourcing of %s has not started yet; its start position stays in the work queue's config",
                    work_queue, ", ".join(late))
    cfg = info["config"]
    sources = [{k: v for k, v in src.items() if k not in ("opt_start_seq", "opt_start_time")}
               if src.get("name") in active and src.get("name") in names else src for src in cfg.get("sources", [])]
    if sources != cfg.get("sources"):
        await _update_stream(api, dict(cfg, sources=sources))


async def _sources_active(api: JetStreamApi, work_queue: str, names: list[str], timeout: float) -> dict[str, Any]:
    """The work queue's info once each of the sources ``names`` has its source consumer (active >= 0),
    or when ``timeout`` ran out."""
    deadline = time.monotonic() + timeout
    while True:
        info = await api.stream_info(work_queue)
        started = {src.get("name") for src in info.get("sources") or [] if src.get("active", -1) >= 0}
        if set(names) <= started or time.monotonic() >= deadline:
            return info
        await asyncio.sleep(0.05)


async def get_elastic_layout(nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None) -> Layout:
    """The streams the group consumes, as its work queue sources them (see :mod:`pcgroups.sources`)."""
    api = api_of(nc, api)
    cfg = await get_elastic_config(nc, stream, group, api=api)
    return layout_of((await _work_queue_info(api, stream, group))["config"], cfg.partitioning_filters)


async def _work_queue_info(api: JetStreamApi, stream: str, group: str) -> dict[str, Any]:
    return await consumer_stream_info(ELASTIC, api, stream, group)


async def delete_elastic(nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None) -> None:
    """Delete the config (instances end normally), then the work-queue stream."""
    api = api_of(nc, api)
    check_names(stream, group)
    try:
        kv = await open_bucket(api, ELASTIC_BUCKET, kind="elastic")
    except NotFoundError:
        kv = None
    key = group_key(stream, group)
    had_key = False
    if kv is not None and await read(kv, key) is not None:
        await kv_call(kv, kv.delete(key), key)
        had_key = True
    try:
        had_stream = await api.delete_stream(work_queue_name(stream, group))
    except JetStreamAPIError as e:
        raise PCGroupsError(f"could not delete the elastic consumer group's stream: {e}") from None
    if not had_key and not had_stream:
        raise NotFoundError(f"elastic consumer group {group} on stream {stream} not found"
                            + await flavour_hint(api, "elastic", stream, group))


async def list_elastic_groups(nc: Client, stream: str, *, api: JetStreamApi | None = None) -> list[str]:
    """Names of the elastic groups defined on ``stream`` (empty when there is no bucket yet)."""
    return await flavour.list_groups(ELASTIC, nc, stream, api=api)


async def _modify(nc: Client, stream: str, group: str, api: JetStreamApi | None,
                  change: Callable[[ElasticConfig], ElasticConfig]) -> ElasticConfig:
    """Compare-and-set ``change(cfg) -> cfg`` on the group's config, retrying on conflicts."""
    check_names(stream, group)
    kv, _ = await group_entry(api_of(nc, api), ELASTIC.bucket, ELASTIC.name, stream, group)
    result: list[ElasticConfig] = []

    async def apply(entry: Entry | None) -> bytes:
        if entry is None:
            raise NotFoundError(f"elastic consumer group {group} on stream {stream} not found")
        new = change(stored_config(stream, group, entry.value))
        try:
            new.validate()
        except ConfigError as e:
            raise ConfigError(f"invalid elastic consumer group config: {e}") from None
        result[:] = [new]
        return new.to_json()

    await update(kv, group_key(stream, group), apply)
    return result[0]


# --- the group's streams ------------------------------------------------------------------------
async def add_source(nc: Client, stream: str, group: str, source: str, *,
                     partitioning_filters: list[PartitioningFilter] | None = None,
                     start: "str | Start" = "all", api: JetStreamApi | None = None) -> Layout:
    """Add ``source`` to an elastic group's streams (an aggregate group); returns the new layout.

    Running members follow without a restart: the filters of the new stream's subjects are added to
    the config first (each member updates its consumer and restarts delivery at the work queue's first
    message, so nothing queued is skipped or repeated), then the work queue starts sourcing it from
    ``start``. Go members end with their config-change error (restart them). Re-running a partly done
    call completes it.
    """
    api = api_of(nc, api)
    cfg, wq, layout = await _group_streams(nc, api, stream, group, source, "added to")
    if source in layout.names:
        raise ConfigError(f"stream {source} is already a stream of elastic consumer group {group}")
    infos = await _stream_infos(api, [*layout.names, source], {**{n: "stream" for n in layout.names},
                                                               source: "stream to add"})
    new = [pf for pf in partitioning_filters or [] if pf not in (cfg.partitioning_filters or [])]
    _check_added_filters(cfg, group, source, new, partitioning_filters or [], infos)
    seq, when = explicit_start(Start.parse(start), infos[source])
    # A source the work queue has not set up yet would, once our source's messages were handled, start at the
    # work queue's last message time (see _layout): let every source start first.
    wq = await _sources_active(api, wq["config"]["name"], layout.names, 10.0)
    if new:
        await _modify(nc, stream, group, api, lambda c: replace(c, partitioning_filters=[
            *(c.partitioning_filters or []), *(pf for pf in new if pf not in (c.partitioning_filters or []))]))
    added = SourceStream(source, tuple(partitioning_filters or ()), None, seq, when)
    body = dict(wq["config"], sources=[*wq["config"].get("sources", []), source_config(added, cfg.max_members)])
    await _update_stream(api, body)
    await settle_starts(api, body["name"], [source])
    return layout_of((await api.stream_info(body["name"]))["config"], [*(cfg.partitioning_filters or []), *new])


async def _group_streams(nc: Client, api: JetStreamApi, stream: str, group: str, source: str, verb: str
                         ) -> tuple[ElasticConfig, dict[str, Any], Layout]:
    """The config, work-queue info and layout of a group whose streams change (not a partition-stream group)."""
    check_names(stream, group)
    validate_name("stream", source)
    cfg = await get_elastic_config(nc, stream, group, api=api)
    wq = await _work_queue_info(api, stream, group)
    layout = layout_of(wq["config"], cfg.partitioning_filters)
    if layout.kind == "partition-streams":
        raise ConfigError(f"elastic consumer group {group} on {stream} is a group of partition streams (one stream "
                          f"per partition): streams cannot be {verb} it")
    return cfg, wq, layout


def _check_added_filters(cfg: ElasticConfig, group: str, source: str, new: list[PartitioningFilter],
                         given: list[PartitioningFilter], infos: dict[str, dict[str, Any]]) -> None:
    """The filters given for an added stream: present when the group partitions by filters, matching its subjects
    and no other stream's, and valid together with the group's."""
    if cfg.partitioning_filters and not given:
        raise ConfigError(f"elastic consumer group {group} partitions by filters ({_show_filters(cfg)}): give the "
                          f"filters of {source}'s subjects (--filter, with --wildcards)")
    if given and not cfg.partitioning_filters:
        raise ConfigError(f"elastic consumer group {group} partitions whole subjects (it has no partitioning filters): "
                          f"a stream added to it takes no --filter")
    try:
        assigned = assign_filters(given, {n: i["config"] for n, i in infos.items()}, every_stream=False)
        wrong = [pf.filter for n, pfs in assigned.items() if n != source for pf in pfs]
        if wrong:
            raise ConfigError(f"partitioning filter {wrong[0]} matches subjects of another stream of the group, "
                              f"not of {source}")
        replace(cfg, partitioning_filters=[*(cfg.partitioning_filters or []), *new]).validate()
    except ConfigError as e:
        raise ConfigError(f"invalid elastic consumer group config: {e}") from None


async def remove_source(nc: Client, stream: str, group: str, source: str, *, discard: bool = False,
                        timeout: float = 30.0, api: JetStreamApi | None = None) -> Layout:
    """Remove ``source`` from an elastic group's streams; returns the new layout.

    The work queue stops sourcing it first. Its messages already queued are then handled by the
    running members (waited for up to ``timeout`` seconds) or, with ``discard=True``, purged; only
    then are its filters taken out of the config (members follow without a restart). The other
    streams' messages are neither lost nor repeated. A call that timed out can be re-run.
    """
    api = api_of(nc, api)
    cfg, wq, layout = await _group_streams(nc, api, stream, group, source, "removed from")
    leaving = layout.stream(source) or _removed_earlier(layout, cfg, source)
    if leaving is None:
        raise NotFoundError(f"stream {source} is not a stream of elastic consumer group {group} (its streams: "
                            f"{', '.join(layout.names)})")
    rest = Layout(tuple(s for s in layout.streams if s.name != source))
    if not rest.streams:
        raise ConfigError(f"stream {source} is the only stream of elastic consumer group {group}: delete the group "
                          "instead")
    if source in layout.names:
        body = dict(wq["config"], sources=[s for s in wq["config"].get("sources", []) if s.get("name") != source])
        await _update_stream(api, body)
    subjects = [f"*.{pf.filter}" for pf in leaving.filters] or await _whole_subjects(api, source)
    wq_name = work_queue_name(stream, group)
    if discard:
        for subject in subjects:
            await api.request(f"STREAM.PURGE.{wq_name}", {"filter": subject})
    elif not await _drained(api, wq_name, subjects, timeout):
        raise PCGroupsError(f"stream {source} is no longer sourced, but messages of it are still queued for elastic "
                            f"consumer group {group} after {timeout:g}s (are its members running?): run the removal "
                            "again to wait longer, or discard them")
    if leaving.filters:
        await _modify(nc, stream, group, api, lambda c: replace(c, partitioning_filters=[
            pf for pf in c.partitioning_filters or [] if pf not in leaving.filters]))
    return rest


def _removed_earlier(layout: Layout, cfg: ElasticConfig, source: str) -> SourceStream | None:
    """A stream a timed-out removal took out of the work queue already: the filters no stream has any more."""
    kept = {pf.filter for s in layout.streams for pf in s.filters}
    orphans = tuple(pf for pf in cfg.partitioning_filters or [] if pf.filter not in kept)
    return SourceStream(source, orphans) if orphans else None


async def _whole_subjects(api: JetStreamApi, source: str) -> list[str]:
    try:
        subjects = (await api.stream_info(source))["config"].get("subjects") or []
    except NotFoundError:
        subjects = []
    if not subjects:
        raise ConfigError(f"stream {source} has no subjects to tell its queued messages apart: remove it while "
                          "its messages are all handled, or delete the group")
    return [f"*.{s}" for s in subjects]


async def _drained(api: JetStreamApi, work_queue: str, subjects: list[str], timeout: float) -> bool:
    """Wait until no message of ``subjects`` is left in the work queue."""
    deadline = time.monotonic() + timeout
    while True:
        left = False
        for subject in subjects:
            try:
                await api.request(f"STREAM.MSG.GET.{work_queue}", {"seq": 1, "next_by_subj": subject})
                left = True
                break
            except JetStreamAPIError as e:
                if e.err_code != ERR_NO_MESSAGE_FOUND:
                    raise
        if not left:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.1)


async def _update_stream(api: JetStreamApi, config: dict[str, Any]) -> None:
    try:
        await api.request(f"STREAM.UPDATE.{config['name']}", config)
    except JetStreamAPIError as e:
        raise PCGroupsError(f"can't update the elastic consumer group's stream: {e}") from None


async def add_members(nc: Client, stream: str, group: str, names: list[str], *, sticky: bool = False,
                      api: JetStreamApi | None = None) -> list[str]:
    """Add members (existing order kept, new names appended as given); returns the new membership.

    ``sticky=True`` writes the result as ``member_mappings`` that move the fewest partitions (only to
    the new members; see :mod:`pcgroups.sticky`); it also works on a group that already uses mappings.
    """
    return await _change_members(nc, stream, group, api, add=_member_names(names), sticky=sticky)


async def delete_members(nc: Client, stream: str, group: str, names: list[str], *, sticky: bool = False,
                         api: JetStreamApi | None = None) -> list[str]:
    """Drop members; returns the remaining membership.

    ``sticky=True`` hands only the dropped members' partitions to the others, written as
    ``member_mappings`` (see :func:`add_members`).
    """
    return await _change_members(nc, stream, group, api, drop=set(_member_names(names)), sticky=sticky)


async def _change_members(nc: Client, stream: str, group: str, api: JetStreamApi | None, *,
                          add: Sequence[str] = (), drop: AbstractSet[str] = frozenset(), sticky: bool) -> list[str]:
    """Add the members ``add`` and drop those in ``drop`` (compare-and-set); the membership after."""
    def change(cfg: ElasticConfig) -> ElasticConfig:
        if sticky:
            return _sticky(cfg, add=add, drop=drop)
        if cfg.member_mappings:
            verb, where = ("add", "to") if add else ("drop", "from")
            raise ConfigError(f"can't {verb} members {where} an elastic consumer group that uses member mappings "
                              f"({verb} them with sticky mappings instead: --sticky)")
        members = list(dict.fromkeys([*cfg.members, *add])) if add else cfg.members
        return replace(cfg, members=[m for m in members if m not in drop], automatic=False)

    return (await _modify(nc, stream, group, api, change)).membership()


def _member_names(names: list[str]) -> list[str]:
    names = [n for n in names if n]
    if not names:
        raise ConfigError("no member names given")
    for n in names:
        validate_name("member", n)
    return names


def _sticky(cfg: ElasticConfig, *, add: Sequence[str] = (), drop: AbstractSet[str] = frozenset()) -> ElasticConfig:
    """The config after a sticky add/drop: the membership as mappings moving the fewest partitions."""
    live = [m for m in dict.fromkeys([*cfg.membership(), *add]) if m not in drop]
    if len(live) > cfg.max_members:
        raise ConfigError(f"can't have {len(live)} members with sticky mappings: the group has "
                          f"{cfg.max_members} partitions, so at most {cfg.max_members} members can own one")
    return replace(cfg, members=[], member_mappings=sticky_change(cfg, add=add, drop=drop), automatic=False)


async def set_member_mappings(nc: Client, stream: str, group: str, mappings: list[MemberMapping], *,
                              api: JetStreamApi | None = None) -> None:
    """Replace the membership by explicit partition mappings (compare-and-set)."""
    if not mappings:
        raise ConfigError("no member mappings given")
    for m in mappings:
        validate_name("member", m.member)
    await _modify(nc, stream, group, api, lambda cfg: replace(cfg, members=[], member_mappings=list(mappings),
                                                                  automatic=False))


async def delete_member_mappings(nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None) -> None:
    """Remove the mappings (the group is left with no members)."""
    await _modify(nc, stream, group, api, lambda cfg: replace(cfg, member_mappings=[], automatic=False))


async def list_elastic_active_members(nc: Client, stream: str, group: str, *,
                                      api: JetStreamApi | None = None) -> list[str]:
    """Members whose consumer exists and has an instance pulling, in membership order."""
    return await flavour.list_active_members(ELASTIC, nc, stream, group, api=api)


async def elastic_is_in_membership_and_active(nc: Client, stream: str, group: str, member: str, *,
                                              api: JetStreamApi | None = None) -> tuple[bool, bool]:
    """Whether ``member`` is in the membership, and whether *its* consumer has an instance pulling."""
    return await flavour.is_in_membership_and_active(ELASTIC, nc, stream, group, member, api=api)


async def elastic_member_step_down(nc: Client, stream: str, group: str, member: str, *,
                                   api: JetStreamApi | None = None) -> None:
    """Unpin the member's consumer: another of its instances takes over at once."""
    await flavour.member_step_down(ELASTIC, nc, stream, group, member, api=api)


@startable
async def elastic_consume(nc: Client, stream: str, group: str, member: str, handler: Handler | None = None, *,
                          config: ConsumerConfig | None = None, batch: int = DEFAULT_BATCH,
                          auto_in_progress: bool = True, concurrency: int = 1, key: KeyFunc | None = None,
                          retry: RetryPolicy | None = None, api: JetStreamApi | None = None,
                          auto: bool = False, lease_ttl: float = 5.0,
                          create: ElasticSpec | None = None, on_assigned: PartitionsHook | None = None,
                          on_revoked: PartitionsHook | None = None,
                          on_event: EventCallback | None = None) -> ElasticInstance | AutoInstance:
    """Run an instance of ``member``; it may start before the member is added and waits until then.

    Acks must be explicit (the work-queue stream deletes what is acked). AckWait defaults to 5 s and
    is also the consumer's inactive threshold, so dead instances' consumers are reaped. With
    ``auto=True`` the membership follows the instances' leases (see :mod:`pcgroups.membership`);
    ``member`` may then be empty for a generated name, and ``create`` (an :class:`ElasticSpec`)
    joins the group by name: it is created with that shape if it does not exist (an existing group
    of another shape is a ``GroupExistsError``). ``on_assigned``, ``on_revoked`` and ``on_event``: see
    :mod:`pcgroups.events`. Without a ``handler`` the instance is iterated: ``async for msg in instance``.
    Await the result for the instance, or use it directly: ``async with elastic_consume(...) as inst``.
    """
    if create is not None and not auto:
        raise ConfigError("creating the group on joining (create=...) needs automatic membership (auto=True): "
                          "a named member of a new group would wait forever to be added")
    api = api_of(nc, api)
    check_names(stream, group)
    user_named = bool(member)
    if auto and not member:
        member = auto_member_name()
    validate_name("member", member)
    if auto:
        check_lease_ttl(lease_ttl)
    template = member_template(config)
    if template.ack_policy != "explicit":
        raise ConfigError("the ack policy when consuming from elastic consumer groups must be explicit")
    template.inactive_threshold = template.ack_wait
    if create is not None:
        await create.create(nc, stream, group, api=api)
    if auto:
        await check_joinable(nc, stream, group, await flavour.get_config(ELASTIC, nc, stream, group, api=api),
                             api=api)
    inst = ElasticInstance(nc, api, stream=stream, group=group, member=member, handler=handler,
                           template=template, batch=batch, auto_in_progress=auto_in_progress,
                           concurrency=concurrency, key=key, retry=retry, on_assigned=on_assigned,
                           on_revoked=on_revoked, on_event=on_event)
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
            raise NotFoundError(f"the elastic consumer group's stream does not exist: {self.work_queue}") from None
        kv = await open_bucket(self.api, ELASTIC_BUCKET, kind="elastic")
        self._kv = kv
        self._key = group_key(self.stream_name, self.group_name)
        entry = await read(kv, self._key)
        if entry is None:
            raise NotFoundError(f"can not get the current elastic consumer group's config: "
                                f"{self.group_name} on stream {self.stream_name} not found")
        self.config = stored_config(self.stream_name, self.group_name, entry.value)
        self.desired = elastic_member_filters(self.config, self.member_name)
        self._membership: tuple[bool, list[int]] = self._member_state(self.config)
        if not self._membership[0]:
            self._reporter.emit("not-a-member")
        self._partition_key = _partitioning_key(self.config)
        self.current: list[str] | None = None    # the filters our consumer has, when attached
        self._retry_at = 0.0
        self._reconcile_at: float | None = None   # when a quiet control loop reconciles (_next_event)
        self._source_stalled_since: float | None = None
        self._next_stepdown = 0.0
        self._stall_limit = SOURCE_STALL + random.uniform(0, 1.5)   # instances of a group do not all act at once
        self.source_stepdowns = 0   # work-queue leader step-downs this instance asked for (sourcing stalled)
        watcher = await kv_call(kv, kv.watch(self._key), self._key)
        self._start(watcher)
        self._post(Reconcile())

    @property
    def _consume_stream(self) -> str:  # type: ignore[override]
        return self.work_queue

    def _default_key(self) -> KeyFunc:
        return lambda msg: self._partition_key(msg)   # follows the filters when a stream is added or removed

    @property
    def partitions(self) -> list[int]:
        """The partitions this instance's member owns under the current config."""
        c = self.config
        return member_partitions(max_members=c.max_members, members=c.members, member_mappings=c.member_mappings,
                                 member=self.member_name)

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
        except asyncio.TimeoutError:
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
            return ConfigError(f"the config of elastic consumer group {self.group_name} on stream "
                               f"{self.stream_name} is no longer valid: {e}")
        if not _followable(self.config, cfg):
            await self._stop_session(drain=True)
            return ConfigChangedError(
                f"elastic consumer group {self.group_name} member {self.member_name} received a bad change in "
                "the configuration: max number of members, buffered messages, filter or partitioning "
                "wildcards changed")
        if cfg.partitioning_filters != self.config.partitioning_filters:
            self._partition_key = _partitioning_key(cfg)   # a stream was added or removed
        self.config = cfg
        self._note_membership(cfg)
        desired = elastic_member_filters(cfg, self.member_name)
        if desired == self.desired and (self.current == desired or not desired):
            return CONTINUE  # our partitions did not change: keep consuming without a pause
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
            return ConsumerGoneError(f"the elastic consumer group's stream {self.work_queue} was deleted")
        except (JetStreamAPIError, nats.errors.Error) as e:  # no leader for now (cluster failover)
            log.warning("%s: consumer went away (%s) and JetStream is not answering (%s); "
                        "joining again later", self.member_name, reason, e)
            return CONTINUE  # not joined: the next reconcile (RETRY_FAST) tries again
        log.info("%s: consumer went away (%s), joining again", self.member_name, reason)
        self.recovered_errors += 1
        await self._reconcile()
        return CONTINUE

    def _member_state(self, cfg: ElasticConfig) -> tuple[bool, list[int]]:
        return cfg.is_in_membership(self.member_name), member_partitions(
            max_members=cfg.max_members, members=cfg.members, member_mappings=cfg.member_mappings,
            member=self.member_name)

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
            log.log(logging.WARNING if self.nc.is_connected else logging.DEBUG, "%s: %s: %s",
                    self.member_name, what, e)

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
                log.warning("%s: ack of work-queue message %d not applied after %.1fs", self.member_name, seq,
                            self.template.ack_wait)
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
                log.info("%s: the member's consumer exists with other settings: using it as it is",
                         self.member_name)
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
                session.partitions = self._handed_out(session) & owned   # hand out no more of what we lose
                await session.idle()                                      # and let its handlers finish
            await self._settle_pinned(owned)
            if session is not None:
                session.partitions = owned
            return
        if not self._may_change(info):
            return  # the pinned instance (maybe not this process) does it; check again shortly
        gained = [f for f in self.desired if f not in have]
        target = self.desired if not gained or await self._partitions_free(gained) else \
            [f for f in have if f in self.desired]
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
        log.info("%s: consumer filters changed to %s (paused %.3fs)", self.member_name, target,
                 time.monotonic() - started)

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
        await self._check_sourcing()
        if await self._consumer_info() is None:
            self._post(ConsumerGone("consumer not found"))

    async def _quick_info(self, stream: str) -> dict[str, Any] | None:
        """Stream info with a short timeout; None when JetStream does not answer (an election) or the user may
        not ask (the watchdog's permissions are optional: docs/SECURITY.md)."""
        try:
            return await self.api.request(f"STREAM.INFO.{stream}", timeout=SOURCE_CHECK_TIMEOUT)
        except (JetStreamAPIError, PermissionDeniedError) as e:
            log.debug("%s: stream info of %s: %s", self.member_name, stream, e)
            return None

    async def _check_sourcing(self) -> None:
        """Step the work queue's leader down when its source from the origin stays inactive (see SOURCE_STALL).

        Only for a replicated work queue, and only once the origin answers (while the origin has no leader a
        new source could not start either). A healthy source reports activity well under a second old.
        """
        info = await self._quick_info(self.work_queue)
        if info is None:
            return
        sources = info.get("sources") or []
        if not (info.get("cluster") or {}).get("replicas") or not sources:
            self._source_stalled_since = None
            return
        now = time.monotonic()
        if not _source_stalled(info):
            self._source_stalled_since = None
            return
        if self._source_stalled_since is None:
            inactive = max(src.get("active", 0) for src in sources) / 1e9   # -1 ns: no source consumer at all
            self._source_stalled_since = now - max(inactive, 0.0)
        stalled = now - self._source_stalled_since
        if stalled < self._stall_limit or now < self._next_stepdown:
            return
        for origin in {src.get("name", "") for src in sources}:
            if await self._quick_info(origin) is None:
                return   # an origin does not answer yet: a new source could not start either
        self._next_stepdown = now + STEPDOWN_COOLDOWN
        # Other instances of the group may act at the same moment: wait a little, and step down only if the
        # leader is still the one with the stalled source.
        leader = (info.get("cluster") or {}).get("leader")
        await asyncio.sleep(random.uniform(0, 1.0))
        again = await self._quick_info(self.work_queue)
        if again is None or (again.get("cluster") or {}).get("leader") != leader or not _source_stalled(again):
            self._source_stalled_since = None
            return
        log.warning("%s: sourcing into %s has been inactive for %.1fs; asking its leader to step down so that "
                    "the source starts again", self.member_name, self.work_queue, stalled)
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
    if (old.max_members, old.max_buffered_msgs, old.max_buffered_bytes) != \
            (new.max_members, new.max_buffered_msgs, new.max_buffered_bytes):
        return False
    before = {pf.filter: pf.partitioning_wildcards or [] for pf in old.partitioning_filters or []}
    after = {pf.filter: pf.partitioning_wildcards or [] for pf in new.partitioning_filters or []}
    return bool(before) == bool(after) and all(after[f] == w for f, w in before.items() if f in after)


def _partitioning_key(cfg: ElasticConfig) -> KeyFunc:
    return key_by_partitioning([(pf.filter, pf.partitioning_wildcards) for pf in cfg.partitioning_filters or []])


def _source_stalled(info: dict[str, Any]) -> bool:
    """A source of this stream info has no consumer (active -1) or nothing from it for SOURCE_STALL."""
    return any(src.get("active", 0) < 0 or src.get("active", 0) > SOURCE_STALL * 1e9
               for src in info.get("sources") or [])


def _partitions_of(filters: list[str]) -> set[int]:
    return {int(f.split(".", 1)[0]) for f in filters}
