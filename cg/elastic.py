"""``cg elastic ...``: elastic partitioned consumer groups (membership changes while consuming).

The commands both flavours have come from cg/flavour.py; here are elastic's own: ``create`` (with
the reference's interactive filter entry on a terminal), ``add``, ``drop``, ``create-mapping``,
``delete-mapping`` and ``consume`` (with ``--auto``: automatic membership).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from .common import (
    check_config,
    check_names,
    given,
    group_exists,
    parse_duration_option,
    parse_mappings,
    parse_source_apis,
    parse_starts,
    parse_wildcards,
    partitioning_filters,
    split_list,
)
from .deadletters import dead_letters_app
from .errors import CLIError, warn
from .flavour import (
    ELASTIC,
    Concurrency,
    Dispatch,
    Fail,
    Group,
    Json,
    KeyHeader,
    KeyTokens,
    MaxAckPending,
    MaxDeliver,
    MaxMembers,
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
from .runtime import Runtime, runtime

if TYPE_CHECKING:
    from nats.aio.client import Client

    from pcgroups.config import ElasticConfig, MemberMapping, PartitioningFilter
    from pcgroups.elastic import ElasticSpec
    from pcgroups.jetstream import JetStreamApi

elastic_app = flavour_app(ELASTIC)

Members = Annotated[list[str], typer.Argument(help="member names", metavar="MEMBER", show_default=False)]
Mappings = Annotated[
    list[str],
    typer.Argument(
        help="mappings of members to partition numbers in the format <member>:<partition1>,<partition2>,... "
        "(ranges too: m1:0-4,7)",
        metavar="MAPPING",
        show_default=False,
    ),
]


add_shared(elastic_app, ELASTIC, "ls", "info")


def _prompt_filters(rt: Runtime) -> list[PartitioningFilter] | None:
    """The reference's interactive filter entry (only when stdin is a terminal)."""
    from pcgroups.config import PartitioningFilter

    from .output import out

    pfs = []
    while True:
        answer = rt.ask("filter (empty when done): ")
        tokens = (answer or "").split()
        if not tokens:
            break
        filter = tokens[0]
        while True:
            line = rt.ask("space separated partitioning wildcard indexes: ")
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


Filters = Annotated[
    list[str],
    typer.Option(
        "--filter",
        metavar="FILTER",
        help="partitioning filter(s), e.g. 'foo.*' (repeatable; with no --filter a terminal "
        "asks for them, otherwise the whole subject is used)",
        show_default=False,
    ),
]
Wildcards = Annotated[
    list[str],
    typer.Option(
        "--wildcards",
        metavar="INDEXES",
        help="partitioning wildcard indexes of the matching --filter, e.g. '1,2' "
        "(repeatable, paired with the filters in order; default: every * of the "
        "filter)",
        show_default=False,
    ),
]
Sources = Annotated[
    list[str],
    typer.Option(
        "--source",
        metavar="STREAM",
        help="another stream the group consumes (repeatable): each --filter must match "
        "subjects of exactly one of the group's streams",
        show_default=False,
    ),
]
PartitionStreams = Annotated[
    list[str],
    typer.Option(
        "--partition-stream",
        metavar="STREAM",
        help="stream i is partition i, its subjects kept (repeatable in "
        "partition order, or comma-separated); as many as partitions",
        show_default=False,
    ),
]
Starts = Annotated[
    list[str],
    typer.Option(
        "--start",
        metavar="[STREAM=]WHERE",
        help="where sourcing begins: all (default: the whole stream), new (what is "
        "published from now on), seq:N or time:RFC3339; STREAM=WHERE for one "
        "stream (repeatable)",
        show_default=False,
    ),
]
SourceDomains = Annotated[
    list[str],
    typer.Option(
        "--source-domain",
        metavar="[STREAM=]DOMAIN",
        help="the JetStream domain the group's streams are in when it is "
        "not the group's (across a leaf node connection); "
        "STREAM=DOMAIN for one stream (repeatable)",
        show_default=False,
    ),
]
SourceApis = Annotated[
    list[str],
    typer.Option(
        "--source-api",
        metavar="[STREAM=]PREFIX",
        help="instead of --source-domain: the API prefix of the JetStream the "
        "streams are in (e.g. another account's, imported); "
        "STREAM=PREFIX for one stream (repeatable)",
        show_default=False,
    ),
]
MaxBufferedMsgs = Annotated[int, typer.Option("--max-buffered-msgs", help="max number of buffered messages")]
MaxBufferedBytes = Annotated[int, typer.Option("--max-buffered-bytes", help="max number of buffered bytes")]


def _shape(
    rt: Runtime,
    stream: str,
    name: str,
    max_members: int,
    filter: list[str],
    wildcards: list[str],
    source: list[str],
    partition_stream: list[str],
    start: list[str],
    source_domain: list[str],
    source_api: list[str],
    max_buffered_msgs: int,
    max_buffered_bytes: int,
) -> ElasticSpec:
    """The group ``create`` (or ``consume --create``) asks for, checked before connecting."""
    from pcgroups.config import ElasticConfig
    from pcgroups.elastic import ElasticSpec

    check_names(stream=stream, group=name)
    for flag, value in (("--max-buffered-msgs", max_buffered_msgs), ("--max-buffered-bytes", max_buffered_bytes)):
        if value < -1:  # the work queue's max_msgs/max_bytes: the server takes any negative one for no limit
            raise CLIError(f"invalid {flag} {value}: give a limit, or 0 for none")
    sources, partition_streams = split_list(source), split_list(partition_stream)
    pfs: list[PartitioningFilter] | None
    if filter:
        pfs = partitioning_filters(filter, wildcards)
    elif wildcards:
        raise CLIError("--wildcards needs a --filter to pair with")
    elif rt.stdin_is_terminal() and not partition_streams:
        pfs = _prompt_filters(rt)
    else:
        pfs = None
    if partition_streams and (pfs or sources):
        raise CLIError("--partition-stream takes no --filter or --source: each stream is one whole partition")
    if partition_streams and len(partition_streams) != max_members:
        raise CLIError(
            f"{len(partition_streams)} partition streams given for {max_members} partitions: give one "
            "--partition-stream per partition, in partition order"
        )
    for s in [*sources, *partition_streams]:
        check_names(stream=s)
    check_config(
        "elastic",
        ElasticConfig(
            max_members=max_members,
            partitioning_filters=pfs,
            max_buffered_msgs=max_buffered_msgs,
            max_buffered_bytes=max_buffered_bytes,
        ),
    )
    streams = partition_streams or [stream, *sources]
    domains, apis = parse_source_apis(source_domain, source_api, streams)
    return ElasticSpec(
        max_members,
        pfs,
        max_buffered_msgs,
        max_buffered_bytes,
        sources or None,
        partition_streams or None,
        parse_starts(start, streams),
        domains,
        apis,
    )


@flavour_command(elastic_app, ELASTIC, "create", "create an elastic partitioned consumer group")
def create(
    ctx: typer.Context,
    stream: Stream,
    name: Group,
    max_members: MaxMembers,
    filter: Filters = [],
    wildcards: Wildcards = [],
    source: Sources = [],
    partition_stream: PartitionStreams = [],
    start: Starts = [],
    source_domain: SourceDomains = [],
    source_api: SourceApis = [],
    max_buffered_msgs: MaxBufferedMsgs = 0,
    max_buffered_bytes: MaxBufferedBytes = 0,
) -> None:
    rt = runtime(ctx)
    spec = _shape(
        rt,
        stream,
        name,
        max_members,
        filter,
        wildcards,
        source,
        partition_stream,
        start,
        source_domain,
        source_api,
        max_buffered_msgs,
        max_buffered_bytes,
    )

    from .changes import say_created
    from .output import out

    async def body(nc: Client, api: JetStreamApi) -> tuple[bool, ElasticConfig]:
        from pcgroups.elastic import get_elastic_config

        existed = out.pretty and await group_exists(get_elastic_config(nc, stream, name, api=api))  # for say_created
        return existed, await spec.create(nc, stream, name, api=api)

    existed, cfg = rt.with_connection(body)
    if spec.partition_streams:
        by = f" (a stream each: {', '.join(spec.partition_streams)})"
    elif spec.partitioning_filters:
        by = " by " + ", ".join(pf.filter for pf in spec.partitioning_filters)
    else:
        by = " by the whole subject"
    say_created("elastic", stream, name, cfg, existed=existed, by=by, after=f" (work queue {stream}-{name})")
    if (
        spec.partitioning_filters is None
        and spec.partition_streams is None
        and rt.stdin_is_terminal()
        and not out.pretty
    ):
        # no filter typed at the prompt: the group exists, say what it partitions by
        out.note(
            f"created elastic consumer group {name} on stream {stream} with no partitioning filter: "
            "the whole subject is the key"
        )


@flavour_command(
    elastic_app, ELASTIC, "add-source", "add a stream to an elastic consumer group (running members follow)"
)
def add_source(
    ctx: typer.Context,
    stream: Stream,
    name: Group,
    source: Annotated[str, typer.Argument(help="the stream to add", metavar="SOURCE", show_default=False)],
    filter: Filters = [],
    wildcards: Wildcards = [],
    start: Annotated[
        str,
        typer.Option(
            "--start", metavar="WHERE", help="where sourcing begins: all (the whole stream), new, seq:N or time:RFC3339"
        ),
    ] = "all",
    source_domain: Annotated[
        str | None,
        typer.Option(
            "--source-domain",
            metavar="DOMAIN",
            help="the JetStream domain the stream is in when it is not the group's",
            show_default=False,
        ),
    ] = None,
    source_api: Annotated[
        str | None,
        typer.Option(
            "--source-api",
            metavar="PREFIX",
            help="instead of --source-domain: the API prefix of the stream's JetStream",
            show_default=False,
        ),
    ] = None,
) -> None:
    from .output import print_streams

    rt = runtime(ctx)
    check_names(stream=stream, group=name)
    check_names(stream=source)
    if wildcards and not filter:
        raise CLIError("--wildcards needs a --filter to pair with")
    pfs = partitioning_filters(filter, wildcards) if filter else None
    parse_starts([start], [source])
    domains, apis = parse_source_apis(
        [source_domain] if source_domain else [], [source_api] if source_api else [], [source]
    )

    async def body(nc: Client, api: JetStreamApi):
        from pcgroups.elastic import add_source

        return await add_source(
            nc,
            stream,
            name,
            source,
            partitioning_filters=pfs,
            start=start,
            source_domain=(domains or {}).get(source),
            source_api=(apis or {}).get(source),
            api=api,
        )

    print_streams(f"added stream {source} to elastic consumer group {name}", rt.with_connection(body))


@flavour_command(
    elastic_app,
    ELASTIC,
    "remove-source",
    "remove a stream from an elastic consumer group (its queued messages are handled first)",
)
def remove_source(
    ctx: typer.Context,
    stream: Stream,
    name: Group,
    source: Annotated[str, typer.Argument(help="the stream to remove", metavar="SOURCE", show_default=False)],
    discard: Annotated[
        bool,
        typer.Option(
            "--discard", help="drop its messages still queued instead of waiting for the members to handle them"
        ),
    ] = False,
    timeout: Annotated[
        str, typer.Option("--wait", metavar="DURATION", help="how long to wait for its queued messages to be handled")
    ] = "30s",
) -> None:
    from .output import print_streams

    rt = runtime(ctx)
    check_names(stream=stream, group=name)
    check_names(stream=source)
    seconds = parse_duration_option("--wait", timeout, positive=True)

    async def body(nc: Client, api: JetStreamApi):
        from pcgroups.elastic import remove_source

        return await remove_source(nc, stream, name, source, discard=discard, timeout=seconds, api=api)

    print_streams(f"removed stream {source} from elastic consumer group {name}", rt.with_connection(body))


@flavour_command(
    elastic_app,
    ELASTIC,
    "skip-stuck",
    "step past the origin message a source of the group is stuck on (prints what it would do; --execute does it)",
)
def skip_stuck(
    ctx: typer.Context,
    stream: Stream,
    name: Group,
    source: Annotated[
        str | None,
        typer.Option("--source", metavar="STREAM", help="the stuck source to step past, when several are"),
    ] = None,
    execute: Annotated[bool, typer.Option("--execute", help="step past it (without it nothing changes)")] = False,
    timeout: Annotated[
        str,
        typer.Option(
            "--wait", metavar="DURATION", help="how long to wait for the members to handle what was queued before it"
        ),
    ] = "30s",
    json: Json = False,
) -> None:
    from .output import print_skip

    rt = runtime(ctx)
    check_names(stream=stream, group=name)
    if source is not None:
        check_names(stream=source)
    seconds = parse_duration_option("--wait", timeout, positive=True)

    async def body(nc: Client, api: JetStreamApi):
        from pcgroups.elastic import skip_stuck

        return await skip_stuck(nc, stream, name, source=source, execute=execute, timeout=seconds, api=api)

    print_skip(rt.with_connection(body), as_json=json)


add_shared(elastic_app, ELASTIC, "delete")

Sticky = Annotated[
    bool,
    typer.Option(
        "--sticky",
        help="write the membership as member mappings that move the fewest partitions (only the changed members' ones)",
    ),
]


def _change_members(ctx: typer.Context, stream: str, name: str, members: list[str], sticky: bool, *, add: bool) -> None:
    from .changes import check_unique, print_change, print_members_line, warn_idle
    from .output import out

    check_names(stream=stream, group=name, members=members)
    check_unique(members)

    async def body(nc: Client, api: JetStreamApi):
        from pcgroups.elastic import add_members, delete_members, get_elastic_config

        before = await get_elastic_config(nc, stream, name, api=api)
        named = [m for m in members if before.is_in_membership(m) == add]  # already in / not in
        if named and not add:
            raise CLIError(
                f"{' '.join(named)} {'is' if len(named) == 1 else 'are'} not a member of elastic consumer "
                f"group {name} (members: {' '.join(before.membership()) or 'none'}): nothing dropped"
            )
        if named:
            warn(
                f"{' '.join(named)} {'is' if len(named) == 1 else 'are'} already a member of elastic consumer "
                f"group {name}"
            )
        result = await (add_members if add else delete_members)(nc, stream, name, list(members), sticky=sticky, api=api)
        after = await get_elastic_config(nc, stream, name, api=api)
        return before, result, after, await _live_leases(nc, stream, name, api)

    before, result, after, leases = runtime(ctx).with_connection(body)
    if leases:
        _warn_automatic(name, len(leases))
    warn_idle("elastic", name, after)
    _warn_memberless(stream, name, before, after)
    if out.pretty:
        done = f"{'added' if add else 'dropped'} {' '.join(members)}" + (" (sticky mappings)" if sticky else "")
        print_change(
            "elastic",
            stream,
            name,
            done,
            before,
            after,
            note=None
            if add
            else f"the instances of {' '.join(members)} keep running, waiting to be added "
            "again (stop them with Ctrl-C)",
        )
    else:
        print_members_line(add, result, after.member_mappings if sticky else None)


async def _live_leases(nc: Client, stream: str, name: str, api: JetStreamApi) -> list:
    """The group's live leases, for the automatic-membership warning only: none when this user may not
    read them (an admin role needs no lease permissions, docs/SECURITY.md)."""
    from pcgroups.elastic import list_leases
    from pcgroups.errors import PermissionDeniedError

    try:
        return await list_leases(nc, stream, name, api=api)
    except PermissionDeniedError:
        return []


def _warn_memberless(stream: str, group: str, before: ElasticConfig, after: ElasticConfig) -> None:
    """A change that left the group with no member: nothing consumes it any more."""
    if before.membership() and not after.membership():
        warn(
            f"elastic consumer group {group} has no members now: its messages queue up in work queue "
            f"{stream}-{group} (up to its limits) until cg elastic add or create-mapping"
        )


def _warn_automatic(group: str, instances: int) -> None:
    warn(
        f"elastic consumer group {group} runs with automatic membership ({instances} live instance"
        f"{'' if instances == 1 else 's'}): the next rebalance rewrites this change to the live instances"
    )


@flavour_command(elastic_app, ELASTIC, "add", "add members to a partitioned consumer group")
def add(ctx: typer.Context, stream: Stream, name: Group, members: Members, sticky: Sticky = False) -> None:
    _change_members(ctx, stream, name, members, sticky, add=True)


@flavour_command(elastic_app, ELASTIC, "drop", "drop members from a partitioned consumer group")
def drop(ctx: typer.Context, stream: Stream, name: Group, members: Members, sticky: Sticky = False) -> None:
    _change_members(ctx, stream, name, members, sticky, add=False)


def _change_mappings(ctx: typer.Context, stream: str, name: str, mappings: list[MemberMapping] | None) -> None:
    """create-mapping (``mappings``) or delete-mapping (None): the change, its warnings, its summary."""
    from .changes import print_change
    from .output import go_mappings, out

    async def body(nc: Client, api: JetStreamApi):
        from pcgroups.elastic import delete_member_mappings, get_elastic_config, set_member_mappings

        before = await get_elastic_config(nc, stream, name, api=api)
        if mappings is None and before.members:  # delete-mapping would leave them: not "no members"
            raise CLIError(
                f"elastic consumer group {name} on stream {stream} has no member mappings to delete: its "
                f"members were given with add ({' '.join(before.members)}); drop them with cg elastic drop "
                f"{stream} {name} {' '.join(before.members)}"
            )
        if mappings is None:
            await delete_member_mappings(nc, stream, name, api=api)
        else:
            await set_member_mappings(nc, stream, name, mappings, api=api)
        after = await get_elastic_config(nc, stream, name, api=api)
        return before, after, await _live_leases(nc, stream, name, api)

    before, after, leases = runtime(ctx).with_connection(body)
    if leases:
        _warn_automatic(name, len(leases))
    _warn_memberless(stream, name, before, after)
    if out.pretty:
        done = "member mappings set" if mappings is not None else "member mappings deleted"
        note = (
            None
            if after.membership()
            else ("the group has no members now: its instances keep running, waiting for add or create-mapping")
        )
        print_change("elastic", stream, name, done, before, after, note=note)
    elif mappings is not None:
        out.line(f"member mapping: {go_mappings(mappings)}")


@flavour_command(elastic_app, ELASTIC, "create-mapping", "create member mappings for a partitioned consumer group")
def create_mapping(ctx: typer.Context, stream: Stream, name: Group, mappings: Mappings) -> None:
    check_names(stream=stream, group=name)
    parsed = parse_mappings(mappings)
    check_names(members=[m.member for m in parsed])
    _change_mappings(ctx, stream, name, parsed)


@flavour_command(
    elastic_app,
    ELASTIC,
    "delete-mapping",
    "delete the member mappings of a partitioned consumer group "
    "(it is left with no members; members given with add are "
    "dropped with drop)",
)
def delete_mapping(ctx: typer.Context, stream: Stream, name: Group) -> None:
    check_names(stream=stream, group=name)
    _change_mappings(ctx, stream, name, None)


add_shared(elastic_app, ELASTIC, "member-info", "step-down")

OptionalMember = Annotated[
    str | None,
    typer.Argument(
        metavar="MEMBER",
        help="member name (with --auto: optional; instances of one name are hot standbys, without a name each "
        "instance is a member of its own)",
        show_default=False,
    ),
]
Auto = Annotated[
    bool,
    typer.Option(
        "--auto",
        help="automatic membership: join the group by starting, leave it by "
        "stopping (instance leases; partitions rebalanced sticky)",
    ),
]
LeaseTTL = Annotated[
    str,
    typer.Option(
        "--lease-ttl",
        help="with --auto: how long after its last renewal a dead instance's lease expires (at least 1s)",
        metavar="DURATION",
    ),
]


Create = Annotated[
    int | None,
    typer.Option(
        "--create",
        metavar="PARTITIONS",
        help="with --auto: create the group with this many partitions (and the "
        "--filter/--source/--partition-stream/--start/--source-domain given) if "
        "it does not exist, else join it",
        show_default=False,
    ),
]


@flavour_command(elastic_app, ELASTIC, "consume", "join a partitioned consumer group")
def consume(
    ctx: typer.Context,
    stream: Stream,
    name: Group,
    member: OptionalMember = None,
    sleep: Sleep = "20ms",
    auto: Auto = False,
    lease_ttl: LeaseTTL = "5s",
    create: Create = None,
    filter: Filters = [],
    wildcards: Wildcards = [],
    source: Sources = [],
    partition_stream: PartitionStreams = [],
    start: Starts = [],
    source_domain: SourceDomains = [],
    source_api: SourceApis = [],
    max_buffered_msgs: MaxBufferedMsgs = 0,
    max_buffered_bytes: MaxBufferedBytes = 0,
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
    if not member and not auto:
        raise CLIError("a member name is required (or join with --auto to get a generated one)")
    shaped = (
        filter
        or wildcards
        or source
        or partition_stream
        or start
        or source_domain
        or source_api
        or max_buffered_msgs
        or max_buffered_bytes
    )
    if create is None and shaped:
        raise CLIError(
            "--filter, --wildcards, --source, --partition-stream, --start, --source-domain, --source-api "
            "and --max-buffered-* describe the group to create: give them with --create PARTITIONS"
        )
    if create is not None and not auto:
        raise CLIError("--create needs --auto: a named member of a new group would wait forever to be added")
    if not auto and given(ctx, "lease_ttl"):
        raise CLIError(
            "--lease-ttl is the lease of an --auto instance (automatic membership): add --auto, or "
            "leave --lease-ttl out"
        )
    lease = parse_duration_option("--lease-ttl", lease_ttl, minimum=1.0)
    spec = None
    if create is not None:
        spec = _shape(
            runtime(ctx),
            stream,
            name,
            create,
            filter,
            wildcards,
            source,
            partition_stream,
            start,
            source_domain,
            source_api,
            max_buffered_msgs,
            max_buffered_bytes,
        )
    if member is None:
        from pcgroups.elastic import auto_member_name

        member = auto_member_name()
    join(
        ctx,
        ELASTIC,
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
        auto=auto,
        lease_ttl=lease,
        create=spec,
        metrics_listen=metrics_listen,
        otel=otel,
    )


add_shared(elastic_app, ELASTIC, "worker", "status", "reset")
elastic_app.add_typer(dead_letters_app(ELASTIC), name="dead-letters")
add_shared(elastic_app, ELASTIC, "prompt")

__all__ = ["elastic_app"]
