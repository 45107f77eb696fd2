"""``cg static ...``: static partitioned consumer groups (membership fixed at creation).

The commands both flavours have come from cg/flavour.py; here are static's own: ``create balanced``,
``create mapped``, ``create-consumers`` (an admin creates the members' consumers, so that members need no
permission to create them) and ``consume`` (a member name is required).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .common import check_config, check_names, group_exists, parse_mappings
from .deadletters import dead_letters_app
from .errors import CLIError, warn
from .flavour import (
    STATIC,
    Concurrency,
    Dispatch,
    Fail,
    Group,
    KeyHeader,
    KeyTokens,
    MaxAckPending,
    MaxDeliver,
    MaxMembers,
    Member,
    MetricsListen,
    Otel,
    ParkKeys,
    Sleep,
    Stream,
    add_shared,
    flavour_app,
    flavour_command,
    join,
)
from .help import Command
from .help import Group as CommandGroup
from .runtime import runtime

if TYPE_CHECKING:
    from nats.aio.client import Client

    from pcgroups.config import MemberMapping
    from pcgroups.jetstream import JetStreamApi

static_app = flavour_app(STATIC)
create_app = typer.Typer(help="create a static partitioned consumer group", cls=CommandGroup)

Filters = Annotated[
    list[str], typer.Option("--filter", help="filter(s) (repeatable)", metavar="FILTER", show_default=False)
]
Force = Annotated[
    bool,
    typer.Option(
        "--force", help="create the group even if the stream's subjects do not carry a partition number it would use"
    ),
]

add_shared(static_app, STATIC, "ls", "info", "delete", "member-info", "step-down")


@flavour_command(static_app, STATIC, "consume", "join a static partitioned consumer group")
def consume(
    ctx: typer.Context,
    stream: Stream,
    name: Group,
    member: Member,
    sleep: Sleep = "20ms",
    concurrency: Concurrency = None,
    key_header: KeyHeader = None,
    key_tokens: KeyTokens = None,
    max_ack_pending: MaxAckPending = None,
    metrics_listen: MetricsListen = None,
    dispatch: Dispatch = False,
    otel: Otel = False,
    fail: Fail = None,
    max_deliver: MaxDeliver = None,
    park_keys: ParkKeys = False,
) -> None:
    join(
        ctx,
        STATIC,
        stream,
        name,
        member,
        sleep,
        concurrency,
        key_header,
        key_tokens,
        max_ack_pending,
        dispatch,
        fail,
        max_deliver,
        park_keys,
        metrics_listen=metrics_listen,
        otel=otel,
    )


@flavour_command(
    static_app,
    STATIC,
    "create-consumers",
    "create the members' consumers as their instances would (members then need no permission to create consumers)",
)
def create_consumers(
    ctx: typer.Context,
    stream: Stream,
    name: Group,
    concurrency: Concurrency = None,
    max_ack_pending: MaxAckPending = None,
) -> None:
    from .common import parse_concurrency
    from .consume import consumer_template
    from .output import out

    check_names(stream=stream, group=name)
    window = parse_concurrency(1 if concurrency is None else concurrency, None, None, max_ack_pending).max_ack_pending

    async def body(nc: Client, api: JetStreamApi) -> list[str]:
        from pcgroups.static import create_static_consumers

        return await create_static_consumers(nc, stream, name, config=consumer_template(window), api=api)

    names = runtime(ctx).with_connection(body)
    out.line(
        f"member consumers of static consumer group {name} on stream {stream} (max ack pending {window}): "
        + (", ".join(names) or "none (no member owns a partition)")
    )


add_shared(static_app, STATIC, "worker", "status", "reset")
static_app.add_typer(dead_letters_app(STATIC), name="dead-letters")
add_shared(static_app, STATIC, "prompt")
static_app.add_typer(create_app, name="create")


def _create(
    ctx: typer.Context,
    stream: str,
    name: str,
    max_members: int,
    filters: list[str],
    members: list[str],
    mappings: list[MemberMapping],
    force: bool,
) -> None:
    from pcgroups.config import StaticConfig

    from .changes import check_unique, say_created, warn_idle
    from .output import out

    check_names(stream=stream, group=name, members=[*members, *(m.member for m in mappings)])
    check_unique(members)
    cfg = StaticConfig(
        max_members=max_members, filters=list(filters), members=list(members), member_mappings=list(mappings)
    )
    check_config("static", cfg)

    async def body(nc: Client, api: JetStreamApi) -> bool:
        from pcgroups.errors import NotFoundError
        from pcgroups.static import create_static, get_static_config

        try:
            never, lost = partition_token_problems(stream, (await api.stream_info(stream))["config"], max_members)
        except NotFoundError:
            never, lost = None, None  # create_static says the stream does not exist
        if never and not force:
            raise CLIError(never + "; --force creates the group anyway")
        existed = out.pretty and await group_exists(get_static_config(nc, stream, name, api=api))  # for say_created
        await create_static(
            nc,
            stream,
            name,
            max_members,
            filters=list(filters),
            members=list(members),
            member_mappings=list(mappings),
            api=api,
        )
        for problem in (never, lost):
            if problem:
                warn(problem)
        return existed

    existed = runtime(ctx).with_connection(body)
    warn_idle("static", name, cfg)
    say_created("static", stream, name, cfg, existed=existed)


_PARTITION = re.compile(r"\{\{\s*partition\s*\(\s*(\d+)", re.IGNORECASE)


def partition_token_problems(stream: str, config: dict[str, Any], max_members: int) -> tuple[str | None, str | None]:
    """(why a static group of ``max_members`` partitions on a stream of this config would never receive a message,
    why it would miss some), each None when it would not.

    A static group reads the partition from the first token of the stored subject: the stream's own subject
    transform (or its sources' transforms) must write one, ``{{partition(N,...)}}`` with N the group's number
    of partitions, or the subjects themselves must start with a wildcard or a number."""
    transforms = [
        t
        for t in [config.get("subject_transform") or {}]
        + [st for src in config.get("sources") or [] for st in src.get("subject_transforms") or []]
        if t.get("dest")
    ]
    subjects = list(config.get("subjects") or [])
    if not transforms:
        if not subjects or any(s.split(".")[0] in ("*", ">") or s.split(".")[0].isdigit() for s in subjects):
            return None, None  # sourced or mirrored without transforms, or publishers may write the partition
        return (
            f"the subjects of stream {stream} ({' '.join(subjects)}) do not start with a partition number, so a "
            f"static consumer group on it would never receive a message: give the stream a subject transform "
            f"such as {subjects[0]} -> {_example_dest(subjects[0], max_members)} (scripts/static_stream_setup.sh "
            "makes one) or use an elastic consumer group"
        ), None
    for t in transforms:
        found = _PARTITION.match(t["dest"])
        if found and int(found[1]) != max_members:
            n = int(found[1])
            lost = (
                f"partitions {max_members}..{n - 1} would never be consumed"
                if n > max_members
                else f"partitions {n}..{max_members - 1} would never receive a message"
            )
            return None, (
                f"stream {stream}'s subject transform {t.get('src') or '>'} -> {t['dest']} makes {n} "
                f"partitions, the group has {max_members}: {lost}"
            )
        if not found and not t["dest"].startswith("{{"):
            return (
                f"stream {stream}'s subject transform {t.get('src') or '>'} -> {t['dest']} does not put a "
                "partition number first, so a static consumer group on it would never receive a message"
            ), None
    return None, None


def _example_dest(subject: str, partitions: int) -> str:
    tokens = subject.split(".")
    stars = [i for i, t in enumerate(tokens) if t == "*"]
    if not stars:
        return f"{{{{partition({partitions})}}}}.{subject}"
    k = 0
    for i in stars:
        k += 1
        tokens[i] = f"{{{{wildcard({k})}}}}"
    return f"{{{{partition({partitions},{','.join(map(str, range(1, k + 1)))})}}}}.{'.'.join(tokens)}"


@create_app.command("balanced", help="create a static partitioned consumer group with balanced members", cls=Command)
def create_balanced(
    ctx: typer.Context,
    stream: Stream,
    name: Group,
    max_members: MaxMembers,
    members: Annotated[list[str], typer.Argument(help="member names", metavar="MEMBER", show_default=False)],
    filter: Filters = [],
    force: Force = False,
) -> None:
    _create(ctx, stream, name, max_members, filter, members, [], force)


@create_app.command("mapped", help="create a static partitioned consumer group with member mappings", cls=Command)
def create_mapped(
    ctx: typer.Context,
    stream: Stream,
    name: Group,
    max_members: MaxMembers,
    mappings: Annotated[
        list[str],
        typer.Argument(
            help="mappings of members to partition numbers in the format "
            "<member>:<partition1>,<partition2>,... (ranges too: m1:0-4,7)",
            metavar="MAPPING",
            show_default=False,
        ),
    ],
    filter: Filters = [],
    force: Force = False,
) -> None:
    _create(ctx, stream, name, max_members, filter, [], parse_mappings(mappings), force)


__all__ = ["static_app"]
