"""``cg elastic ...``: elastic partitioned consumer groups (membership changes while consuming)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .common import (CLIError, ask, check_elastic_config, check_names, confirm_delete, options,
                     parse_duration_option, parse_mappings, parse_sleep, parse_wildcards, partitioning_filters,
                     stdin_is_terminal, with_connection)
from .output import go_list, go_mappings, out, print_groups, print_elastic_info, print_member_info
from .static import Force, Group, Json, MaxMembers, Member, Sleep, Stream, _command

elastic_app = typer.Typer(help="elastic consumer groups mode")

ALIASES: dict[tuple[str, ...], list[str]] = {
    ("elastic", "ls"): ["list"],
    ("elastic", "delete"): ["rm"],
    ("elastic", "create-mapping"): ["cm", "createmapping"],
    ("elastic", "delete-mapping"): ["dm", "deletemapping"],
    ("elastic", "member-info"): ["memberinfo", "minfo"],
    ("elastic", "step-down"): ["stepdown", "sd"],
    ("elastic", "consume"): ["join"],
}

Members = Annotated[list[str], typer.Argument(help="member names", show_default=False)]
Mappings = Annotated[list[str], typer.Argument(
    help="mappings of members to partition numbers in the format <member>:<partition1>,<partition2>,...",
    show_default=False)]


@_command(elastic_app, "ls", ALIASES[("elastic", "ls")], "list the consumer groups defined on a stream")
def ls(ctx: typer.Context, stream: Stream, json: Json = False) -> None:
    check_names(stream=stream)

    async def body(nc, api):
        from pcgroups.elastic import list_elastic_groups

        return await list_elastic_groups(nc, stream, api=api)

    print_groups("elastic", stream, with_connection(ctx, body), as_json=json)


@_command(elastic_app, "info", [], "get elastic consumer group info")
def info(ctx: typer.Context, stream: Stream, name: Group, json: Json = False) -> None:
    check_names(stream=stream, group=name)

    async def body(nc, api):
        from pcgroups.elastic import get_elastic_config, list_elastic_active_members

        cfg = await get_elastic_config(nc, stream, name, api=api)
        active = await list_elastic_active_members(nc, stream, name, api=api)
        return cfg, active

    cfg, active = with_connection(ctx, body)
    print_elastic_info(stream, name, cfg, active, as_json=json)


def _prompt_filters():
    """The reference's interactive filter entry (only when stdin is a terminal)."""
    from pcgroups.config import PartitioningFilter

    pfs = []
    while True:
        answer = ask("filter (empty when done): ")
        tokens = (answer or "").split()
        if not tokens:
            break
        filter = tokens[0]
        while True:
            line = ask("space separated partitioning wildcard indexes: ")
            if line is None:
                raise CLIError("no partitioning wildcard indexes given")
            try:
                # an empty answer means every * of the filter, in order
                wildcards = parse_wildcards(line if line.strip() else None, filter)
                break
            except CLIError as e:
                out.line(str(e))
        pfs.append(PartitioningFilter(filter, wildcards))
    return pfs or None


@_command(elastic_app, "create", [], "create an elastic partitioned consumer group")
def create(ctx: typer.Context, stream: Stream, name: Group, max_members: MaxMembers,
           filter: Annotated[list[str], typer.Option(
               "--filter", metavar="FILTER", help="partitioning filter(s), e.g. 'foo.*' (repeatable; with no --filter a "
                                "terminal asks for them, otherwise the whole subject is used)",
               show_default=False)] = [],  # noqa: B006
           wildcards: Annotated[list[str], typer.Option(
               "--wildcards", metavar="INDEXES",
               help="partitioning wildcard indexes of the matching --filter, e.g. '1,2' (repeatable, paired "
                    "with the filters in order; default: every * of the filter)", show_default=False)] = [],  # noqa: B006
           max_buffered_msgs: Annotated[int, typer.Option("--max-buffered-msgs",
                                                          help="max number of buffered messages")] = 0,
           max_buffered_bytes: Annotated[int, typer.Option("--max-buffered-bytes",
                                                           help="max number of buffered bytes")] = 0) -> None:
    from pcgroups.config import ElasticConfig

    check_names(stream=stream, group=name)
    if filter:
        pfs = partitioning_filters(filter, wildcards)
    elif wildcards:
        raise CLIError("--wildcards needs a --filter to pair with")
    elif stdin_is_terminal():
        pfs = _prompt_filters()
    else:
        pfs = None
    check_elastic_config(ElasticConfig(max_members=max_members, partitioning_filters=pfs,
                                       max_buffered_msgs=max_buffered_msgs,
                                       max_buffered_bytes=max_buffered_bytes))

    async def body(nc, api):
        from pcgroups.elastic import create_elastic

        await create_elastic(nc, stream, name, max_members, partitioning_filters=pfs,
                             max_buffered_msgs=max_buffered_msgs, max_buffered_bytes=max_buffered_bytes,
                             api=api)

    with_connection(ctx, body)


@_command(elastic_app, "delete", ALIASES[("elastic", "delete")], "delete an elastic partitioned consumer group")
def delete(ctx: typer.Context, stream: Stream, name: Group, force: Force = False) -> None:
    check_names(stream=stream, group=name)

    async def body(nc, api):
        from pcgroups.errors import ConfigError
        from pcgroups.elastic import delete_elastic, get_elastic_config

        try:
            await get_elastic_config(nc, stream, name, api=api)  # "not found" before asking
        except ConfigError:
            pass  # it exists with an invalid config: deleting it is the way out
        await confirm_delete(force)
        await delete_elastic(nc, stream, name, api=api)

    with_connection(ctx, body)


Sticky = Annotated[bool, typer.Option("--sticky", help="write the membership as member mappings that move the "
                                                     "fewest partitions (only the changed members' ones)")]


def _change_members(ctx: typer.Context, stream: str, name: str, members: list[str], sticky: bool, *,
                    add: bool) -> None:
    check_names(stream=stream, group=name, members=members)

    async def body(nc, api):
        from pcgroups.elastic import add_members, delete_members, get_elastic_config

        change = add_members if add else delete_members
        result = await change(nc, stream, name, list(members), sticky=sticky, api=api)
        mappings = (await get_elastic_config(nc, stream, name, api=api)).member_mappings if sticky else None
        return result, mappings

    result, mappings = with_connection(ctx, body)
    out.line(f"{'added' if add else 'dropped'} members: {go_list(result)}")
    if sticky:
        out.line(f"member mapping: {go_mappings(mappings)}")


@_command(elastic_app, "add", [], "add members to a partitioned consumer group")
def add(ctx: typer.Context, stream: Stream, name: Group, members: Members, sticky: Sticky = False) -> None:
    _change_members(ctx, stream, name, members, sticky, add=True)


@_command(elastic_app, "drop", [], "drop members from a partitioned consumer group")
def drop(ctx: typer.Context, stream: Stream, name: Group, members: Members, sticky: Sticky = False) -> None:
    _change_members(ctx, stream, name, members, sticky, add=False)


@_command(elastic_app, "create-mapping", ALIASES[("elastic", "create-mapping")],
          "create member mappings for a partitioned consumer group")
def create_mapping(ctx: typer.Context, stream: Stream, name: Group, mappings: Mappings) -> None:
    check_names(stream=stream, group=name)
    parsed = parse_mappings(mappings)
    check_names(members=[m.member for m in parsed])

    async def body(nc, api):
        from pcgroups.elastic import set_member_mappings

        await set_member_mappings(nc, stream, name, parsed, api=api)

    with_connection(ctx, body)
    out.line(f"member mapping: {go_mappings(parsed)}")


@_command(elastic_app, "delete-mapping", ALIASES[("elastic", "delete-mapping")],
          "delete member mappings for a partitioned consumer group")
def delete_mapping(ctx: typer.Context, stream: Stream, name: Group) -> None:
    check_names(stream=stream, group=name)

    async def body(nc, api):
        from pcgroups.elastic import delete_member_mappings

        await delete_member_mappings(nc, stream, name, api=api)

    with_connection(ctx, body)


@_command(elastic_app, "member-info", ALIASES[("elastic", "member-info")], "get elastic consumer group member info")
def member_info(ctx: typer.Context, stream: Stream, name: Group, member: Member, json: Json = False) -> None:
    check_names(stream=stream, group=name, members=[member])

    async def body(nc, api):
        from pcgroups.elastic import elastic_is_in_membership_and_active

        return await elastic_is_in_membership_and_active(nc, stream, name, member, api=api)

    in_membership, active = with_connection(ctx, body)
    print_member_info("elastic", stream, name, member, in_membership, active, as_json=json)


@_command(elastic_app, "step-down", ALIASES[("elastic", "step-down")], "initiate a step down for a member")
def step_down(ctx: typer.Context, stream: Stream, name: Group, member: Member) -> None:
    check_names(stream=stream, group=name, members=[member])

    async def body(nc, api):
        from pcgroups.elastic import elastic_member_step_down

        await elastic_member_step_down(nc, stream, name, member, api=api)

    with_connection(ctx, body)


OptionalMember = Annotated[Optional[str], typer.Argument(
    help="member name (with --auto: optional; instances of one name are hot standbys, without a name each "
         "instance is a member of its own)", show_default=False)]
Auto = Annotated[bool, typer.Option("--auto", help="automatic membership: join the group by starting, leave it by "
                                                   "stopping (instance leases; partitions rebalanced sticky)")]
LeaseTTL = Annotated[str, typer.Option("--lease-ttl", help="with --auto: how long after its last renewal a dead "
                                                           "instance's lease expires (at least 1s)",
                                       metavar="DURATION")]


@_command(elastic_app, "consume", ALIASES[("elastic", "consume")], "join a partitioned consumer group")
def consume(ctx: typer.Context, stream: Stream, name: Group, member: OptionalMember = None,
            sleep: Sleep = "20ms", auto: Auto = False, lease_ttl: LeaseTTL = "5s") -> None:
    from .consume import run_consume

    if not member and not auto:
        raise CLIError("a member name is required (or join with --auto to get a generated one)")
    lease = parse_duration_option("--lease-ttl", lease_ttl, minimum=1.0)
    if member is None:
        from pcgroups.membership import auto_member_name

        member = auto_member_name()
    check_names(stream=stream, group=name, members=[member])
    seconds = parse_sleep(sleep)
    raise typer.Exit(run_consume(options(ctx), "elastic", stream, name, member, seconds,
                                 auto=auto, lease_ttl=lease))


# `cg elastic prompt` is added by the prompt module (see cg/main.py).
