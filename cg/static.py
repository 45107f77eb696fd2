"""``cg static ...``: static partitioned consumer groups (membership fixed at creation)."""

from __future__ import annotations

from typing import Annotated

import typer

from .common import (check_names, check_static_config, confirm_delete, options, parse_mappings,
                     parse_sleep, with_connection)
from .output import print_groups, print_member_info, print_static_info

static_app = typer.Typer(help="static consumer groups mode")
create_app = typer.Typer(help="create a static partitioned consumer group")
static_app.add_typer(create_app, name="create")

#: Aliases of the commands below (hidden duplicates here, ``aliases`` in the fisk model).
ALIASES: dict[tuple[str, ...], list[str]] = {
    ("static", "ls"): ["list"],
    ("static", "delete"): ["rm"],
    ("static", "member-info"): ["memberinfo", "minfo"],
    ("static", "step-down"): ["stepdown", "sd"],
    ("static", "consume"): ["join"],
}

Stream = Annotated[str, typer.Argument(help="stream name", show_default=False)]
Group = Annotated[str, typer.Argument(help="consumer group name", show_default=False)]
Member = Annotated[str, typer.Argument(help="member name", show_default=False)]
MaxMembers = Annotated[int, typer.Argument(help="max number of members", show_default=False)]
Json = Annotated[bool, typer.Option("--json", help="print JSON")]
Filters = Annotated[list[str], typer.Option("--filter", help="filter(s) (repeatable)", metavar="FILTER",
                                            show_default=False)]
Force = Annotated[bool, typer.Option("--force", "-f", help="force delete the consumer group")]
Sleep = Annotated[str, typer.Option("--sleep", help="sleep to simulate processing time",
                                    metavar="DURATION")]


def _command(app: typer.Typer, name: str, aliases: list[str], help: str):
    """Register ``fn`` as ``name`` and as hidden duplicates for each alias."""

    def register(fn):
        app.command(name, help=help)(fn)
        for alias in aliases:
            app.command(alias, help=help, hidden=True)(fn)
        return fn

    return register


@_command(static_app, "ls", ALIASES[("static", "ls")], "list the consumer groups defined on a stream")
def ls(ctx: typer.Context, stream: Stream, json: Json = False) -> None:
    check_names(stream=stream)

    async def body(nc, api):
        from pcgroups.static import list_static_groups

        return await list_static_groups(nc, stream, api=api)

    print_groups("static", stream, with_connection(ctx, body), as_json=json)


@_command(static_app, "info", [], "get static consumer group info")
def info(ctx: typer.Context, stream: Stream, name: Group, json: Json = False) -> None:
    check_names(stream=stream, group=name)

    async def body(nc, api):
        from pcgroups.static import get_static_config, list_static_active_members

        cfg = await get_static_config(nc, stream, name, api=api)
        active = await list_static_active_members(nc, stream, name, api=api)
        return cfg, active

    cfg, active = with_connection(ctx, body)
    print_static_info(stream, name, cfg, active, as_json=json)


def _create(ctx: typer.Context, stream: str, name: str, max_members: int, filters: list[str],
            members: list[str], mappings: list) -> None:
    from pcgroups.config import StaticConfig

    check_names(stream=stream, group=name, members=[*members, *(m.member for m in mappings)])
    check_static_config(StaticConfig(max_members=max_members, filters=list(filters), members=list(members),
                                     member_mappings=list(mappings)))

    async def body(nc, api):
        from pcgroups.static import create_static

        await create_static(nc, stream, name, max_members, filters=list(filters), members=list(members),
                            member_mappings=list(mappings), api=api)

    with_connection(ctx, body)


@create_app.command("balanced", help="create a static partitioned consumer group with balanced members")
def create_balanced(ctx: typer.Context, stream: Stream, name: Group, max_members: MaxMembers,
                    members: Annotated[list[str], typer.Argument(help="member names", show_default=False)],
                    filter: Filters = []) -> None:  # noqa: B006 - Typer reads the default
    _create(ctx, stream, name, max_members, filter, members, [])


@create_app.command("mapped", help="create a static partitioned consumer group with member mappings")
def create_mapped(ctx: typer.Context, stream: Stream, name: Group, max_members: MaxMembers,
                  mappings: Annotated[list[str], typer.Argument(
                      help="mappings of members to partition numbers in the format "
                           "<member>:<partition1>,<partition2>,...", show_default=False)],
                  filter: Filters = []) -> None:  # noqa: B006
    _create(ctx, stream, name, max_members, filter, [], parse_mappings(mappings))


@_command(static_app, "delete", ALIASES[("static", "delete")], "delete a static partitioned consumer group")
def delete(ctx: typer.Context, stream: Stream, name: Group, force: Force = False) -> None:
    check_names(stream=stream, group=name)

    async def body(nc, api):
        from pcgroups.errors import ConfigError
        from pcgroups.static import delete_static, get_static_config

        try:
            await get_static_config(nc, stream, name, api=api)  # "not found" before asking
        except ConfigError:
            pass  # it exists with an invalid config: deleting it is the way out
        await confirm_delete(force)
        await delete_static(nc, stream, name, api=api)

    with_connection(ctx, body)


@_command(static_app, "member-info", ALIASES[("static", "member-info")], "get static consumer group member info")
def member_info(ctx: typer.Context, stream: Stream, name: Group, member: Member, json: Json = False) -> None:
    check_names(stream=stream, group=name, members=[member])

    async def body(nc, api):
        from pcgroups.static import get_static_config, list_static_active_members

        cfg = await get_static_config(nc, stream, name, api=api)
        active = await list_static_active_members(nc, stream, name, api=api)
        return cfg.is_in_membership(member), member in active

    in_membership, active = with_connection(ctx, body)
    print_member_info("static", stream, name, member, in_membership, active, as_json=json)


@_command(static_app, "step-down", ALIASES[("static", "step-down")], "initiate a step down for a member")
def step_down(ctx: typer.Context, stream: Stream, name: Group, member: Member) -> None:
    check_names(stream=stream, group=name, members=[member])

    async def body(nc, api):
        from pcgroups.static import static_member_step_down

        await static_member_step_down(nc, stream, name, member, api=api)

    with_connection(ctx, body)


@_command(static_app, "consume", ALIASES[("static", "consume")], "join a static partitioned consumer group")
def consume(ctx: typer.Context, stream: Stream, name: Group, member: Member, sleep: Sleep = "20ms") -> None:
    from .consume import run_consume

    check_names(stream=stream, group=name, members=[member])
    seconds = parse_sleep(sleep)
    raise typer.Exit(run_consume(options(ctx), "static", stream, name, member, seconds))


# `cg static prompt` is added by the prompt module (see cg/main.py).
__all__ = ["ALIASES", "static_app"]
