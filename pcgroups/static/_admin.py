"""Static groups, the admin side: create (and their consumers), read, list, delete, active members, step-down.

The partition is already the stream's first subject token, and the membership is fixed at creation (any
config change ends every instance). A member's consumer (``<group>-<member>``) is created by its first
instance (``_instance``) or beforehand by an admin (:func:`create_static_consumers`).
"""

from __future__ import annotations

import logging

from nats.aio.client import Client

from .. import flavour
from ..config import MemberMapping, StaticConfig, parse_static_config, validate_name, validate_partition_count
from ..consume._instance import KEPT_SETTINGS, member_template, setting_differences, with_priority_group
from ..deadletters import delete_stream as delete_dead_letter_stream
from ..errors import ConfigError, GroupExistsError, JetStreamAPIError, NotFoundError
from ..flavour import (
    STATIC,
    api_of,
    check_delete_dead_letters,
    check_names,
    consumer_stream_info,
    make_dead_letters,
    static_consumer_name,
    warn_no_dead_letters,
)
from ..jetstream._api import ERR_CONSUMER_EXISTS, ConsumerConfig, ConsumerTemplate, JetStreamApi
from ..jetstream._store import group_entry, group_key, kv_call, open_or_create_bucket, read
from ..partitions import check_member_filters, static_member_filters

log = logging.getLogger("pcgroups")


def stored_config(stream: str, group: str, value: bytes) -> StaticConfig:
    """A stored config, decoded and validated; a ConfigError naming the group when it is not valid."""
    return flavour.stored_config(STATIC, stream, group, value)


async def get_static_config(nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None) -> StaticConfig:
    """The group's config, validated."""
    return await flavour.get_config(STATIC, nc, stream, group, api=api)


async def create_static(
    nc: Client,
    stream: str,
    group: str,
    max_members: int,
    *,
    filters: list[str] | None = None,
    members: list[str] | None = None,
    member_mappings: list[MemberMapping] | None = None,
    api: JetStreamApi | None = None,
) -> StaticConfig:
    """Create a static group (idempotent: the same config again succeeds; a different one fails), and its
    dead-letter stream (``pcgroups.deadletters``; made for a group of before on a create again).

    No consumers are created here: each member instance creates its own when it joins.
    """
    api = api_of(nc, api)
    check_names(stream, group)
    for m in list(members or []) + [mm.member for mm in member_mappings or []]:
        validate_name("member", m)
    cfg = StaticConfig(
        max_members=max_members,
        filters=list(filters or []),
        members=list(members or []),
        member_mappings=list(member_mappings or []),
    )
    try:
        validate_partition_count(max_members)
        cfg.validate()
        check_member_filters(cfg)
    except ConfigError as e:
        raise ConfigError(f"invalid static consumer group config: {e}") from None
    info = await consumer_stream_info(STATIC, api, stream, group)
    replicas = info["config"].get("num_replicas", 1)
    kv = await open_or_create_bucket(api, STATIC.bucket, group_key(stream, group), replicas=replicas)
    key = group_key(stream, group)
    existing = await read(kv, key)
    if existing is None:
        made, refused = await make_dead_letters(api, STATIC, stream, group, replicas)
        try:
            await kv_call(kv, kv.create(key, cfg.to_json()), key)
            warn_no_dead_letters(STATIC, stream, group, refused)  # said once the group is there
            return cfg
        except Exception:  # created concurrently: compare with theirs below
            existing = await read(kv, key)
            if existing is None:
                if made:  # a create that fails leaves nothing behind
                    await delete_dead_letter_stream(api, STATIC.name, stream, group)
                raise
    try:
        current = parse_static_config(existing.value)
    except ConfigError as e:
        raise GroupExistsError(
            f"static consumer group {group} on stream {stream} already exists with an invalid "
            f"config ({e}): delete it first"
        ) from None
    if current != cfg:
        raise GroupExistsError(
            "the existing static consumer group config doesn't match ours ("
            + "; ".join(_differences(current, cfg))
            + "), please delete the existing static "
            "consumer group and create a new one"
        )
    # a group made before dead-letter streams
    warn_no_dead_letters(STATIC, stream, group, (await make_dead_letters(api, STATIC, stream, group, replicas))[1])
    return current


async def create_static_consumers(
    nc: Client, stream: str, group: str, *, config: ConsumerTemplate | None = None, api: JetStreamApi | None = None
) -> list[str]:
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
        wanted = member_consumer(group, member, member_template(config), filters)
        try:
            await api.create_consumer(stream, wanted)
        except JetStreamAPIError as e:
            if e.err_code != ERR_CONSUMER_EXISTS:
                raise
            have = (await api.consumer_info(stream, wanted.durable_name)).get("config", {})
            differences = setting_differences(have, wanted.to_wire(), only=set(wanted.to_wire()) - KEPT_SETTINGS)
            raise ConfigError(
                f"member {member}'s consumer {wanted.durable_name} exists with other settings "
                f"({there_asked(differences)}): give the settings it has, or delete it first "
                "(its position is lost)"
            ) from None
        names.append(wanted.durable_name)
    return names


def member_consumer(group: str, member: str, template: ConsumerConfig, filters: list[str]) -> ConsumerConfig:
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

    shown = {
        "partitions": lambda c: str(c.max_members),
        "filters": lambda c: words(c.filters),
        "members": lambda c: words(c.members),
        "member mappings": mappings,
    }
    return [f"{what}: {show(now)} now, {show(asked)} asked" for what, show in shown.items() if show(now) != show(asked)]


async def delete_static(
    nc: Client, stream: str, group: str, *, with_dead_letters: bool = False, api: JetStreamApi | None = None
) -> None:
    """Delete the group's config, then exactly its members' consumers (running instances end); a user who may
    delete the config but not every member's consumer is refused before anything is deleted. A group whose
    stream was deleted is deleted too (its consumers went with the stream). Its dead-letter stream is kept (a
    group made again finds its dead letters) unless ``with_dead_letters``."""
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
        log.warning(
            "static consumer group %s on stream %s has an invalid config (%s): deleting it without its "
            "members' consumers",
            group,
            stream,
            e,
        )
    for member in names:
        await api.check_delete(f"CONSUMER.DELETE.{stream}.{static_consumer_name(group, member)}")
    if with_dead_letters:
        await check_delete_dead_letters(api, STATIC, stream, group)
    await kv_call(kv, kv.delete(key), key)
    for member in names if no_stream is None else []:
        await api.delete_consumer(stream, static_consumer_name(group, member))
    if with_dead_letters:
        await delete_dead_letter_stream(api, STATIC.name, stream, group)


async def list_static_groups(nc: Client, stream: str, *, api: JetStreamApi | None = None) -> list[str]:
    """Names of the static groups defined on ``stream`` (empty when there is no bucket yet)."""
    return await flavour.list_groups(STATIC, nc, stream, api=api)


async def list_static_active_members(
    nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None
) -> list[str]:
    """Members whose consumer exists and has an instance pulling, in membership order."""
    return await flavour.list_active_members(STATIC, nc, stream, group, api=api)


async def static_member_step_down(
    nc: Client, stream: str, group: str, member: str, *, api: JetStreamApi | None = None
) -> None:
    """Unpin the member's consumer: another of its instances takes over at once."""
    await flavour.member_step_down(STATIC, nc, stream, group, member, api=api)


def there_asked(differences: list[tuple[str, str, str]]) -> str:
    return ", ".join(f"{k} {now} there, {asked} asked" for k, now, asked in differences)
