"""Elastic consumer groups, the admin side: any stream, sourced into a work-queue stream
``<stream>-<group>`` whose subject transform prepends the partition; members can be added, dropped or
remapped at any time, and streams added or removed (:mod:`pcgroups.elastic._sources`).

The reference's names (``create_elastic``, ``add_members``, ...) live here; the running member instance
(``elastic_consume``, :class:`~pcgroups.elastic._instance.ElasticInstance`) in :mod:`pcgroups.elastic._instance`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client

from .. import flavour
from ..config import (
    ElasticConfig,
    MemberMapping,
    PartitioningFilter,
    parse_elastic_config,
    validate_name,
    validate_partition_count,
)
from ..deadletters import delete_stream as delete_dead_letter_stream
from ..errors import ConfigError, GroupExistsError, JetStreamAPIError, NotFoundError, PCGroupsError
from ..flavour import (
    ELASTIC,
    api_of,
    check_delete_dead_letters,
    check_names,
    consumer_stream_info,
    make_dead_letters,
    warn_no_dead_letters,
    work_queue_name,
)
from ..jetstream._api import ERR_NO_MESSAGE_FOUND, ERR_STREAM_NAME_IN_USE, JetStreamApi, StreamConfig
from ..jetstream._store import (
    ELASTIC_BUCKET,
    Entry,
    flavour_hint,
    group_entry,
    group_key,
    kv_call,
    open_bucket,
    open_or_create_bucket,
    read,
    update,
)
from ..partitions import check_member_filters, unmatched_filters
from ._sources import (
    Layout,
    SourceStream,
    Start,
    assign_filters,
    explicit_start,
    external_prefixes,
    externals_by_stream,
    layout_of,
    resolve_start,
    source_config,
    starts_by_stream,
)
from ._sticky import sticky_change

log = logging.getLogger("pcgroups")


def stored_config(stream: str, group: str, value: bytes) -> ElasticConfig:
    """A stored config, decoded and validated; a ConfigError naming the group when it is not valid."""
    return flavour.stored_config(ELASTIC, stream, group, value)


async def get_elastic_config(nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None) -> ElasticConfig:
    """The group's config, validated."""
    return await flavour.get_config(ELASTIC, nc, stream, group, api=api)


def work_queue_config(
    stream: str, group: str, cfg: ElasticConfig, *, replicas: int, storage: str, layout: Layout | None = None
) -> StreamConfig:
    """The work-queue stream as the reference creates it (docs/DESIGN.md, *Wire contract*), with one
    source per stream of ``layout`` (default: the group's own stream, as the reference has it)."""
    layout = layout or Layout((SourceStream(stream, tuple(cfg.partitioning_filters or ())),))
    return StreamConfig(
        name=work_queue_name(stream, group),
        retention="workqueue",
        max_msgs=cfg.max_buffered_msgs,
        max_bytes=cfg.max_buffered_bytes,
        discard="new",
        storage=storage,
        num_replicas=replicas,
        sources=[source_config(s, cfg.max_members) for s in layout.streams],
        allow_direct=True,
    )


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
    return (
        "["
        + ", ".join(
            pf.filter + (f" by {','.join(map(str, pf.partitioning_wildcards))}" if pf.partitioning_wildcards else "")
            for pf in pfs
        )
        + "]"
    )


def _layout_differences(now: Layout, asked: Layout) -> list[str]:
    if now.shape() == asked.shape():
        return []
    return [
        f"streams: [{', '.join(s.describe() for s in now.streams)}] now, "
        f"[{', '.join(s.describe() for s in asked.streams)}] asked"
    ]


def _exists_error(differences: list[str]) -> GroupExistsError:
    return GroupExistsError(
        "the existing elastic consumer group config can not be updated to the requested one ("
        + "; ".join(differences)
        + "), please delete the existing elastic consumer group and "
        "create a new one"
    )


async def _stream_infos(
    api: JetStreamApi, names: list[str], roles: dict[str, str], externals: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """Each stream's info, asked of its own JetStream (``externals``: the API prefix of a stream elsewhere)."""
    infos = {}
    for name in names:
        where = api.at(externals.get(name))
        elsewhere = "" if where is api else f" (in domain {where.domain})" if where.domain else f" (via {where.prefix})"
        what = f"the elastic consumer group's {roles[name]}"
        try:
            infos[name] = await where.stream_info(name)
        except NotFoundError:
            raise NotFoundError(f"{what} does not exist: {name}{elsewhere}") from None
        except JetStreamAPIError as e:
            if where is api or e.code != 503:
                raise
            raise PCGroupsError(
                f"no JetStream answers for {what} {name}{elsewhere}: is the domain right, and its leaf node connected?"
            ) from None
    return infos


def _plan_streams(
    stream: str, cfg: ElasticConfig, sources: list[str], partition_streams: list[str]
) -> tuple[list[str], dict[str, str]]:
    """The streams a create asks for, with the role each plays (for messages); checks their count and names."""
    if partition_streams:
        if cfg.partitioning_filters:
            raise ConfigError(
                "a group of partition streams takes no partitioning filters: each stream is one "
                "partition, sourced whole"
            )
        if sources:
            raise ConfigError(
                "a group of partition streams takes no other sources: list every stream as a partition stream"
            )
        if len(partition_streams) != cfg.max_members:
            raise ConfigError(
                f"{len(partition_streams)} partition streams given for {cfg.max_members} partitions: "
                "give exactly one stream per partition, in partition order"
            )
        names = list(partition_streams)
        roles = {n: f"partition stream {i}" for i, n in enumerate(names)}
    else:
        names = [stream, *sources]
        roles = {stream: "origin stream", **dict.fromkeys(sources, "source stream")}
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
    start: str | Start | dict[str, str | Start] | None = None
    source_domain: str | dict[str, str] | None = None
    source_api: str | dict[str, str] | None = None

    async def create(self, nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None) -> ElasticConfig:
        return await create_elastic(
            nc,
            stream,
            group,
            self.max_members,
            partitioning_filters=self.partitioning_filters,
            max_buffered_msgs=self.max_buffered_msgs,
            max_buffered_bytes=self.max_buffered_bytes,
            sources=self.sources,
            partition_streams=self.partition_streams,
            start=self.start,
            source_domain=self.source_domain,
            source_api=self.source_api,
            api=api,
        )


async def create_elastic(
    nc: Client,
    stream: str,
    group: str,
    max_members: int,
    *,
    partitioning_filters: list[PartitioningFilter] | None = None,
    max_buffered_msgs: int = 0,
    max_buffered_bytes: int = 0,
    sources: list[str] | None = None,
    partition_streams: list[str] | None = None,
    start: str | Start | dict[str, str | Start] | None = None,
    source_domain: str | dict[str, str] | None = None,
    source_api: str | dict[str, str] | None = None,
    api: JetStreamApi | None = None,
) -> ElasticConfig:
    """Create an elastic group, its work-queue stream and its dead-letter stream (``pcgroups.deadletters``; made for a
    group of before on a create again) (idempotent; a failed create leaves nothing).

    ``sources``: further streams the group consumes besides ``stream`` (an aggregate group); each
    partitioning filter must match subjects of exactly one of the streams. ``partition_streams``:
    stream *i* is partition *i* (their count is ``max_members``; ``stream`` is then only the group's
    name and need not exist). ``start``: where sourcing begins, ``all`` (default), ``new``, ``seq:N``
    or ``time:RFC3339``, for every stream or as a dict by stream name. ``source_domain``: the JetStream
    domain the streams are in when it is not the group's (the work queue sources them across a leaf
    node connection), or ``source_api``: the API prefix of their JetStream (another account's API
    imported under a prefix); each for every stream or as a dict by stream name. The group's config
    and work queue live in ``api``'s JetStream. See :mod:`pcgroups.elastic._sources`.
    """
    api = api_of(nc, api)
    check_names(stream, group)
    cfg = ElasticConfig(
        max_members=max_members,
        partitioning_filters=partitioning_filters,
        max_buffered_msgs=max_buffered_msgs,
        max_buffered_bytes=max_buffered_bytes,
    )
    try:
        validate_partition_count(max_members)
        cfg.validate()
        check_member_filters(cfg)
        names, roles = _plan_streams(stream, cfg, list(sources or []), list(partition_streams or []))
        starts = starts_by_stream(start, names)
        given = externals_by_stream(source_domain, source_api, names)
    except ConfigError as e:
        raise ConfigError(f"invalid elastic consumer group config: {e}") from None
    externals = await external_prefixes(given, api)
    infos = await _stream_infos(api, names, roles, externals)
    layout = _layout(stream, cfg, names, infos, starts, externals, partition_streams=bool(partition_streams))
    first = infos[names[0]]["config"]
    replicas = max(i["config"].get("num_replicas", 1) for i in infos.values())
    kv = await open_or_create_bucket(api, ELASTIC_BUCKET, group_key(stream, group), replicas=replicas)
    key = group_key(stream, group)
    existing = await read(kv, key)
    if existing is not None:
        try:
            current = parse_elastic_config(existing.value)
        except ConfigError as e:
            raise GroupExistsError(
                f"elastic consumer group {group} on stream {stream} already exists with an invalid "
                f"config ({e}): delete it first"
            ) from None
        differences = _shape_differences(current, cfg)
        if differences:
            raise _exists_error(differences)
        cfg = current
    wq = work_queue_config(stream, group, cfg, replicas=replicas, storage=first.get("storage", "file"), layout=layout)
    created_stream = await _ensure_work_queue(api, wq, cfg, layout)
    if created_stream:
        await settle_starts(api, wq.name, [src.name for src in layout.streams if src.start_seq or src.start_time])
    made, refused = await make_dead_letters(api, ELASTIC, stream, group, replicas)
    if existing is None:
        try:
            await kv_call(kv, kv.create(key, cfg.to_json()), key)
        except nats.js.errors.BadRequestError:
            if await read(kv, key) is None:
                if created_stream:
                    await api.delete_stream(wq.name)
                if made:
                    await delete_dead_letter_stream(api, ELASTIC.name, stream, group)
                raise
            # Created concurrently (instances joining by name at once): compare with theirs.
            return await create_elastic(
                nc,
                stream,
                group,
                max_members,
                partitioning_filters=partitioning_filters,
                max_buffered_msgs=max_buffered_msgs,
                max_buffered_bytes=max_buffered_bytes,
                sources=sources,
                partition_streams=partition_streams,
                start=start,
                source_domain=source_domain,
                source_api=source_api,
                api=api,
            )
        except BaseException:
            if created_stream:
                await api.delete_stream(wq.name)
            if made:
                await delete_dead_letter_stream(api, ELASTIC.name, stream, group)
            raise
    warn_no_dead_letters(ELASTIC, stream, group, refused)  # said once the group is there
    return cfg


def _layout(
    stream: str,
    cfg: ElasticConfig,
    names: list[str],
    infos: dict[str, dict[str, Any]],
    starts: dict[str, Start],
    externals: dict[str, str],
    *,
    partition_streams: bool,
) -> Layout:
    """The layout a create asks for: each stream with its filters (or partition) and resolved start.

    With several streams every start is explicit (``all`` is the stream's first sequence): nats-server
    sets each source up 100-200 ms after the next, and one set up after the members consumed what an
    earlier one brought would start at the work queue's last message time, skipping its backlog.
    """
    resolve = explicit_start if len(names) > 1 else resolve_start
    if partition_streams:
        return Layout(
            tuple(
                SourceStream(n, (), i, *resolve(starts[n], infos[n]), externals.get(n, "")) for i, n in enumerate(names)
            )
        )
    filters = list(cfg.partitioning_filters or [])
    if len(names) == 1:
        unmatched = unmatched_filters([pf.filter for pf in filters], infos[stream]["config"])
        if unmatched:
            raise ConfigError(
                f"invalid elastic consumer group config: partitioning filter {unmatched[0]} matches "
                f"none of the subjects of stream {stream} "
                f"({', '.join(infos[stream]['config']['subjects'])}); a filter must match some of them"
            )
    try:
        assigned = assign_filters(filters, {n: infos[n]["config"] for n in names})
    except ConfigError as e:
        raise ConfigError(f"invalid elastic consumer group config: {e}") from None
    return Layout(
        tuple(
            SourceStream(n, tuple(assigned[n]), None, *resolve(starts[n], infos[n]), externals.get(n, ""))
            for n in names
        )
    )


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
                continue  # created concurrently with another start position: compare with theirs
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
        log.warning(
            "%s: sourcing of %s has not started yet; its start position stays in the work queue's config",
            work_queue,
            ", ".join(late),
        )
    cfg = info["config"]
    sources = [
        {k: v for k, v in src.items() if k not in ("opt_start_seq", "opt_start_time")}
        if src.get("name") in active and src.get("name") in names
        else src
        for src in cfg.get("sources", [])
    ]
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
    """The streams the group consumes, as its work queue sources them (see :mod:`pcgroups.elastic._sources`)."""
    api = api_of(nc, api)
    cfg = await get_elastic_config(nc, stream, group, api=api)
    return layout_of((await _work_queue_info(api, stream, group))["config"], cfg.partitioning_filters)


async def _work_queue_info(api: JetStreamApi, stream: str, group: str) -> dict[str, Any]:
    return await consumer_stream_info(ELASTIC, api, stream, group)


async def delete_elastic(
    nc: Client, stream: str, group: str, *, with_dead_letters: bool = False, api: JetStreamApi | None = None
) -> None:
    """Delete the config (instances end normally), then the work-queue stream; a user who may delete the
    config but not the stream (an automatic member) is refused before anything is deleted. The dead-letter
    stream is kept (a group made again finds its dead letters) unless ``with_dead_letters``."""
    api = api_of(nc, api)
    check_names(stream, group)
    await api.check_delete(f"STREAM.DELETE.{work_queue_name(stream, group)}")
    if with_dead_letters:
        await check_delete_dead_letters(api, ELASTIC, stream, group)
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
    if with_dead_letters and (had_key or had_stream):
        await delete_dead_letter_stream(api, ELASTIC.name, stream, group)
    if not had_key and not had_stream:
        raise NotFoundError(
            f"elastic consumer group {group} on stream {stream} not found"
            + await flavour_hint(api, "elastic", stream, group)
        )


async def list_elastic_groups(nc: Client, stream: str, *, api: JetStreamApi | None = None) -> list[str]:
    """Names of the elastic groups defined on ``stream`` (empty when there is no bucket yet)."""
    return await flavour.list_groups(ELASTIC, nc, stream, api=api)


async def _modify(
    nc: Client, stream: str, group: str, api: JetStreamApi | None, change: Callable[[ElasticConfig], ElasticConfig]
) -> ElasticConfig:
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
            check_member_filters(new)
        except ConfigError as e:
            raise ConfigError(f"invalid elastic consumer group config: {e}") from None
        result[:] = [new]
        return new.to_json()

    await update(kv, group_key(stream, group), apply)
    return result[0]


# --- the group's streams ------------------------------------------------------------------------
async def add_source(
    nc: Client,
    stream: str,
    group: str,
    source: str,
    *,
    partitioning_filters: list[PartitioningFilter] | None = None,
    start: str | Start = "all",
    source_domain: str | None = None,
    source_api: str | None = None,
    api: JetStreamApi | None = None,
) -> Layout:
    """Add ``source`` to an elastic group's streams (an aggregate group); returns the new layout.
    ``source_domain`` / ``source_api``: the JetStream it is in, as for :func:`create_elastic`.

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
    try:
        given = externals_by_stream(source_domain, source_api, [source])
    except ConfigError as e:
        raise ConfigError(f"invalid elastic consumer group config: {e}") from None
    external = (await external_prefixes(given, api)).get(source, "")
    infos = await _stream_infos(
        api,
        [*layout.names, source],
        {**dict.fromkeys(layout.names, "stream"), source: "stream to add"},
        {**{s.name: s.external_api for s in layout.streams}, source: external},
    )
    new = [pf for pf in partitioning_filters or [] if pf not in (cfg.partitioning_filters or [])]
    _check_added_filters(cfg, group, source, new, partitioning_filters or [], infos)
    seq, when = explicit_start(Start.parse(start), infos[source])
    # A source the work queue has not set up yet would, once our source's messages were handled, start at the
    # work queue's last message time (see _layout): let every source start first.
    wq = await _sources_active(api, wq["config"]["name"], layout.names, 10.0)
    if new:
        await _modify(
            nc,
            stream,
            group,
            api,
            lambda c: replace(
                c,
                partitioning_filters=[
                    *(c.partitioning_filters or []),
                    *(pf for pf in new if pf not in (c.partitioning_filters or [])),
                ],
            ),
        )
    added = SourceStream(source, tuple(partitioning_filters or ()), None, seq, when, external)
    body = dict(wq["config"], sources=[*wq["config"].get("sources", []), source_config(added, cfg.max_members)])
    await _update_stream(api, body)
    await settle_starts(api, body["name"], [source])
    return layout_of((await api.stream_info(body["name"]))["config"], [*(cfg.partitioning_filters or []), *new])


async def _group_streams(
    nc: Client, api: JetStreamApi, stream: str, group: str, source: str, verb: str
) -> tuple[ElasticConfig, dict[str, Any], Layout]:
    """The config, work-queue info and layout of a group whose streams change (not a partition-stream group)."""
    check_names(stream, group)
    validate_name("stream", source)
    cfg = await get_elastic_config(nc, stream, group, api=api)
    wq = await _work_queue_info(api, stream, group)
    layout = layout_of(wq["config"], cfg.partitioning_filters)
    if layout.kind == "partition-streams":
        raise ConfigError(
            f"elastic consumer group {group} on {stream} is a group of partition streams (one stream "
            f"per partition): streams cannot be {verb} it"
        )
    return cfg, wq, layout


def _check_added_filters(
    cfg: ElasticConfig,
    group: str,
    source: str,
    new: list[PartitioningFilter],
    given: list[PartitioningFilter],
    infos: dict[str, dict[str, Any]],
) -> None:
    """The filters given for an added stream: present when the group partitions by filters, matching its subjects
    and no other stream's, and valid together with the group's."""
    if cfg.partitioning_filters and not given:
        raise ConfigError(
            f"elastic consumer group {group} partitions by filters ({_show_filters(cfg)}): give the "
            f"filters of {source}'s subjects (--filter, with --wildcards)"
        )
    if given and not cfg.partitioning_filters:
        raise ConfigError(
            f"elastic consumer group {group} partitions whole subjects (it has no partitioning filters): "
            f"a stream added to it takes no --filter"
        )
    try:
        assigned = assign_filters(given, {n: i["config"] for n, i in infos.items()}, every_stream=False)
        wrong = [pf.filter for n, pfs in assigned.items() if n != source for pf in pfs]
        if wrong:
            raise ConfigError(
                f"partitioning filter {wrong[0]} matches subjects of another stream of the group, not of {source}"
            )
        replace(cfg, partitioning_filters=[*(cfg.partitioning_filters or []), *new]).validate()
    except ConfigError as e:
        raise ConfigError(f"invalid elastic consumer group config: {e}") from None


async def remove_source(
    nc: Client,
    stream: str,
    group: str,
    source: str,
    *,
    discard: bool = False,
    timeout: float = 30.0,
    api: JetStreamApi | None = None,
) -> Layout:
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
        raise NotFoundError(
            f"stream {source} is not a stream of elastic consumer group {group} (its streams: "
            f"{', '.join(layout.names)})"
        )
    rest = Layout(tuple(s for s in layout.streams if s.name != source))
    if not rest.streams:
        raise ConfigError(
            f"stream {source} is the only stream of elastic consumer group {group}: delete the group instead"
        )
    if source in layout.names:
        body = dict(wq["config"], sources=[s for s in wq["config"].get("sources", []) if s.get("name") != source])
        await _update_stream(api, body)
    subjects = [f"*.{pf.filter}" for pf in leaving.filters] or await _whole_subjects(
        api.at(leaving.external_api), source
    )
    wq_name = work_queue_name(stream, group)
    if discard:
        for subject in subjects:
            await api.request(f"STREAM.PURGE.{wq_name}", {"filter": subject})
    elif not await _drained(api, wq_name, subjects, timeout):
        raise PCGroupsError(
            f"stream {source} is no longer sourced, but messages of it are still queued for elastic "
            f"consumer group {group} after {timeout:g}s (are its members running?): run the removal "
            "again to wait longer, or discard them"
        )
    if leaving.filters:
        await _modify(
            nc,
            stream,
            group,
            api,
            lambda c: replace(
                c, partitioning_filters=[pf for pf in c.partitioning_filters or [] if pf not in leaving.filters]
            ),
        )
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
        raise ConfigError(
            f"stream {source} has no subjects to tell its queued messages apart: remove it while "
            "its messages are all handled, or delete the group"
        )
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


async def add_members(
    nc: Client, stream: str, group: str, names: list[str], *, sticky: bool = False, api: JetStreamApi | None = None
) -> list[str]:
    """Add members (existing order kept, new names appended as given); returns the new membership.

    ``sticky=True`` writes the result as ``member_mappings`` that move the fewest partitions (only to
    the new members; see :mod:`pcgroups.elastic._sticky`); it also works on a group that already uses mappings.
    """
    return await _change_members(nc, stream, group, api, add=_member_names(names), sticky=sticky)


async def delete_members(
    nc: Client, stream: str, group: str, names: list[str], *, sticky: bool = False, api: JetStreamApi | None = None
) -> list[str]:
    """Drop members; returns the remaining membership.

    ``sticky=True`` hands only the dropped members' partitions to the others, written as
    ``member_mappings`` (see :func:`add_members`).
    """
    return await _change_members(nc, stream, group, api, drop=set(_member_names(names)), sticky=sticky)


async def _change_members(
    nc: Client,
    stream: str,
    group: str,
    api: JetStreamApi | None,
    *,
    add: Sequence[str] = (),
    drop: AbstractSet[str] = frozenset(),
    sticky: bool,
) -> list[str]:
    """Add the members ``add`` and drop those in ``drop`` (compare-and-set); the membership after."""

    def change(cfg: ElasticConfig) -> ElasticConfig:
        if sticky:
            return _sticky(cfg, add=add, drop=drop)
        if cfg.member_mappings:
            verb, where = ("add", "to") if add else ("drop", "from")
            raise ConfigError(
                f"can't {verb} members {where} an elastic consumer group that uses member mappings "
                f"({verb} them with sticky mappings instead: --sticky)"
            )
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
        raise ConfigError(
            f"can't have {len(live)} members with sticky mappings: the group has "
            f"{cfg.max_members} partitions, so at most {cfg.max_members} members can own one"
        )
    return replace(cfg, members=[], member_mappings=sticky_change(cfg, add=add, drop=drop), automatic=False)


async def set_member_mappings(
    nc: Client, stream: str, group: str, mappings: list[MemberMapping], *, api: JetStreamApi | None = None
) -> None:
    """Replace the membership by explicit partition mappings (compare-and-set)."""
    if not mappings:
        raise ConfigError("no member mappings given")
    for m in mappings:
        validate_name("member", m.member)
    await _modify(
        nc, stream, group, api, lambda cfg: replace(cfg, members=[], member_mappings=list(mappings), automatic=False)
    )


async def delete_member_mappings(nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None) -> None:
    """Remove the mappings (the group is left with no members)."""
    await _modify(nc, stream, group, api, lambda cfg: replace(cfg, member_mappings=[], automatic=False))


async def list_elastic_active_members(
    nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None
) -> list[str]:
    """Members whose consumer exists and has an instance pulling, in membership order."""
    return await flavour.list_active_members(ELASTIC, nc, stream, group, api=api)


async def elastic_is_in_membership_and_active(
    nc: Client, stream: str, group: str, member: str, *, api: JetStreamApi | None = None
) -> tuple[bool, bool]:
    """Whether ``member`` is in the membership, and whether *its* consumer has an instance pulling."""
    return await flavour.is_in_membership_and_active(ELASTIC, nc, stream, group, member, api=api)


async def elastic_member_step_down(
    nc: Client, stream: str, group: str, member: str, *, api: JetStreamApi | None = None
) -> None:
    """Unpin the member's consumer: another of its instances takes over at once."""
    await flavour.member_step_down(ELASTIC, nc, stream, group, member, api=api)
