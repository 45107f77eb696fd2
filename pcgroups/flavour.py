"""The two flavours of consumer group, static and elastic: what differs between them, written once.

A :class:`Flavour` holds the facts that differ (the KV bucket of its configs, how a stored config is
decoded, the name of a member's consumer and the stream that holds the member consumers); the admin
functions both flavours have are written here once, as functions of a flavour: read a group's
config (:func:`get_config`, :func:`stored_config`), list the groups of a stream, list the active
members, tell whether a member is in the membership and active, step a member down.

pcgroups.static and pcgroups.elastic keep the reference's names (``get_static_config``,
``list_elastic_groups``, ...) as thin wrappers over these: they are the public API.

"Active" means that *the member's own* consumer has an instance pulling (waiting pulls > 0).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from nats.aio.client import Client

from . import deadletters
from .config import ElasticConfig, StaticConfig, parse_elastic_config, parse_static_config, validate_name
from .errors import ConfigError, JetStreamAPIError, NotAMemberError, NotFoundError, PCGroupsError, PermissionDeniedError
from .jetstream._api import JetStreamApi
from .jetstream._store import ELASTIC_BUCKET, STATIC_BUCKET, group_entry, keys_of_stream

log = logging.getLogger("pcgroups")

C = TypeVar("C", StaticConfig, ElasticConfig)


def static_consumer_name(group: str, member: str) -> str:
    """A static member's durable consumer, on the group's stream: ``<group>-<member>``."""
    return f"{group}-{member}"


def work_queue_name(stream: str, group: str) -> str:
    """An elastic group's work-queue stream, which holds its member consumers: ``<stream>-<group>``."""
    return f"{stream}-{group}"


@dataclass(frozen=True)
class Flavour(Generic[C]):
    """What differs between static and elastic groups (the wire names are the reference's)."""

    name: str  # "static" | "elastic", as messages say it
    bucket: str  # the KV bucket of the configs, keyed ``<stream>.<group>``
    parse: Callable[[bytes | str], C]  # decode and validate a stored config
    consumer_name: Callable[[str, str], str]  # (group, member) -> the member's consumer
    consumer_stream: Callable[[str, str], str]  # (stream, group) -> the stream holding the member consumers


STATIC: Flavour[StaticConfig] = Flavour(
    "static", STATIC_BUCKET, parse_static_config, static_consumer_name, lambda stream, group: stream
)
ELASTIC: Flavour[ElasticConfig] = Flavour(
    "elastic", ELASTIC_BUCKET, parse_elastic_config, lambda group, member: member, work_queue_name
)


def api_of(nc: Client, api: JetStreamApi | None) -> JetStreamApi:
    """The caller's JetStreamApi, or one on ``nc``."""
    return api if api is not None else JetStreamApi(nc)


def check_names(stream: str, group: str, member: str | None = None) -> None:
    """Raise ConfigError unless the names are usable (see :func:`pcgroups.config.validate_name`)."""
    validate_name("stream", stream)
    validate_name("group", group)
    if member is not None:
        validate_name("member", member)


def stored_config(flavour: Flavour[C], stream: str, group: str, value: bytes) -> C:
    """A stored config, decoded and validated; a ConfigError naming the group when it is not valid."""
    try:
        return flavour.parse(value)
    except ConfigError as e:
        raise ConfigError(
            f"{flavour.name} consumer group {group} on stream {stream} has an invalid config: {e} "
            "(write a valid config or delete the group)"
        ) from None


async def get_config(flavour: Flavour[C], nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None) -> C:
    """The group's config, validated; NotFoundError (saying so when it is of the other flavour) if none."""
    check_names(stream, group)
    _, entry = await group_entry(api_of(nc, api), flavour.bucket, flavour.name, stream, group)
    return stored_config(flavour, stream, group, entry.value)


async def consumer_stream_info(flavour: Flavour[Any], api: JetStreamApi, stream: str, group: str) -> dict[str, Any]:
    """Stream info of the stream holding the group's member consumers; a NotFoundError naming it."""
    name = flavour.consumer_stream(stream, group)
    try:
        return await api.stream_info(name)
    except NotFoundError:
        raise _no_stream(flavour, name) from None


def _no_stream(flavour: Flavour[Any], name: str) -> NotFoundError:
    return NotFoundError(f"the {flavour.name} consumer group's stream does not exist: {name}")


def stream_gone(
    flavour: Flavour[Any], stream: str, group: str, error: type[PCGroupsError] = NotFoundError
) -> PCGroupsError:
    """The group exists and the stream holding its member consumers does not (it was deleted under the group):
    what is gone, and how to recover (``error``: ConsumerGoneError under a running instance)."""
    name = flavour.consumer_stream(stream, group)
    if flavour.name == "static":
        what, again = f"stream {name}", "create the stream and the group again"
    else:
        what, again = f"work queue {name}", "create it again"
    return error(
        f"the {what} of {flavour.name} consumer group {group} was deleted: delete the group "
        f"(cg {flavour.name} delete {stream} {group}), then {again}"
    )


async def list_groups(flavour: Flavour[Any], nc: Client, stream: str, *, api: JetStreamApi | None = None) -> list[str]:
    """Names of the groups of this flavour defined on ``stream`` (empty when there is no bucket yet)."""
    validate_name("stream", stream)
    try:
        return await keys_of_stream(api_of(nc, api), flavour.bucket, stream)
    except NotFoundError:
        return []


async def _waiting_by_consumer(flavour: Flavour[Any], api: JetStreamApi, stream: str, group: str) -> dict[str, int]:
    """Each consumer of the group's consumer stream and its waiting pulls."""
    name = flavour.consumer_stream(stream, group)
    try:
        infos = await api.list_consumers(name)
    except NotFoundError:
        raise stream_gone(flavour, stream, group) from None  # the callers read the group's config first
    return {c["name"]: c.get("num_waiting", 0) for c in infos}


async def list_active_members(
    flavour: Flavour[Any], nc: Client, stream: str, group: str, *, api: JetStreamApi | None = None
) -> list[str]:
    """Members whose consumer exists and has an instance pulling, in membership order."""
    api = api_of(nc, api)
    members = (await get_config(flavour, nc, stream, group, api=api)).membership()
    if not members:
        return []
    waiting = await _waiting_by_consumer(flavour, api, stream, group)
    return [m for m in members if waiting.get(flavour.consumer_name(group, m), 0) > 0]


async def is_in_membership_and_active(
    flavour: Flavour[Any], nc: Client, stream: str, group: str, member: str, *, api: JetStreamApi | None = None
) -> tuple[bool, bool]:
    """Whether ``member`` is in the membership, and whether *its* consumer has an instance pulling."""
    api = api_of(nc, api)
    validate_name("member", member)
    if not (await get_config(flavour, nc, stream, group, api=api)).is_in_membership(member):
        return False, False
    waiting = await _waiting_by_consumer(flavour, api, stream, group)
    return True, waiting.get(flavour.consumer_name(group, member), 0) > 0


async def member_step_down(
    flavour: Flavour[Any], nc: Client, stream: str, group: str, member: str, *, api: JetStreamApi | None = None
) -> None:
    """Unpin the member's consumer: another of its instances takes over at once."""
    api = api_of(nc, api)
    validate_name("member", member)
    if not (await get_config(flavour, nc, stream, group, api=api)).is_in_membership(member):
        raise NotAMemberError(f"member {member} is not part of {flavour.name} consumer group {group}")
    await api.unpin(flavour.consumer_stream(stream, group), flavour.consumer_name(group, member))


async def make_dead_letters(
    api: JetStreamApi, flavour: Flavour[Any], stream: str, group: str, replicas: int
) -> tuple[bool, Exception | None]:
    """The group's dead-letter stream, made with the group (``pcgroups.deadletters``): (made by this call, why it
    was refused). A user who may create the group but not that stream (or a server that refuses it: another stream
    takes its subjects) is told by :func:`warn_no_dead_letters` once the group is there: a member instance makes it
    on first need when it may, else its dead letters are refused (the messages held) until an admin makes it."""
    try:
        return await deadletters.ensure_stream(api, flavour.name, stream, group, replicas), None
    except (PermissionDeniedError, JetStreamAPIError) as e:  # refused, or its subjects are another stream's
        return False, e


def warn_no_dead_letters(flavour: Flavour[Any], stream: str, group: str, refused: Exception | None) -> None:
    """Say why the group's dead-letter stream was not made (nothing when it was)."""
    if refused is not None:
        log.warning(
            "%s consumer group %s on stream %s: its dead-letter stream %s was not made: %s",
            flavour.name,
            group,
            stream,
            deadletters.dead_letter_stream(flavour.name, stream, group),
            refused,
        )


async def check_delete_dead_letters(api: JetStreamApi, flavour: Flavour[Any], stream: str, group: str) -> None:
    """Refuse now (deleting nothing) when the user may not delete the group's dead-letter stream."""
    await api.check_delete(f"STREAM.DELETE.{deadletters.dead_letter_stream(flavour.name, stream, group)}")
