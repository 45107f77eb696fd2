"""``cg static ...``: static partitioned consumer groups (membership fixed at creation).

The commands both flavours have come from cg/flavour.py; here are static's own: ``create balanced``,
``create mapped`` and ``consume`` (a member name is required).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from .common import check_config, check_names, parse_mappings
from .flavour import STATIC, Group, MaxMembers, Member, Sleep, Stream, add_shared, flavour_app, flavour_command, join
from .help import Command, Group as CommandGroup
from .runtime import runtime

if TYPE_CHECKING:
    from nats.aio.client import Client

    from pcgroups.config import MemberMapping
    from pcgroups.jsapi import JetStreamApi

static_app = flavour_app(STATIC)
create_app = typer.Typer(help="create a static partitioned consumer group", cls=CommandGroup)

Filters = Annotated[list[str], typer.Option("--filter", help="filter(s) (repeatable)", metavar="FILTER",
                                            show_default=False)]

add_shared(static_app, STATIC, "ls", "info", "delete", "member-info", "step-down")


@flavour_command(static_app, STATIC, "consume", "join a static partitioned consumer group")
def consume(ctx: typer.Context, stream: Stream, name: Group, member: Member, sleep: Sleep = "20ms") -> None:
    join(ctx, STATIC, stream, name, member, sleep)


add_shared(static_app, STATIC, "status", "prompt")
static_app.add_typer(create_app, name="create")


def _create(ctx: typer.Context, stream: str, name: str, max_members: int, filters: list[str],
            members: list[str], mappings: list[MemberMapping]) -> None:
    from pcgroups.config import StaticConfig

    check_names(stream=stream, group=name, members=[*members, *(m.member for m in mappings)])
    check_config("static", StaticConfig(max_members=max_members, filters=list(filters), members=list(members),
                                        member_mappings=list(mappings)))

    async def body(nc: Client, api: JetStreamApi) -> None:
        from pcgroups.static import create_static

        await create_static(nc, stream, name, max_members, filters=list(filters), members=list(members),
                            member_mappings=list(mappings), api=api)

    runtime(ctx).with_connection(body)


@create_app.command("balanced", help="create a static partitioned consumer group with balanced members", cls=Command)
def create_balanced(ctx: typer.Context, stream: Stream, name: Group, max_members: MaxMembers,
                    members: Annotated[list[str], typer.Argument(help="member names", metavar="MEMBER",
                                                                 show_default=False)],
                    filter: Filters = []) -> None:  # noqa: B006 - Typer reads the default
    _create(ctx, stream, name, max_members, filter, members, [])


@create_app.command("mapped", help="create a static partitioned consumer group with member mappings", cls=Command)
def create_mapped(ctx: typer.Context, stream: Stream, name: Group, max_members: MaxMembers,
                  mappings: Annotated[list[str], typer.Argument(
                      help="mappings of members to partition numbers in the format "
                           "<member>:<partition1>,<partition2>,...", metavar="MAPPING", show_default=False)],
                  filter: Filters = []) -> None:  # noqa: B006
    _create(ctx, stream, name, max_members, filter, [], parse_mappings(mappings))


__all__ = ["static_app"]
