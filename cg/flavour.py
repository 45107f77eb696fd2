"""The two flavours of ``cg`` commands, static and elastic, described once.

A :class:`Flavour` holds what differs between ``cg static ...`` and ``cg elastic ...``: the name, the
mode's help, the commands' aliases and the library functions behind them (:class:`Calls`, imported
on first use). The commands both flavours have are written once here as functions of a flavour:
``ls``, ``info``, ``delete``, ``member-info``, ``step-down``, ``status``, ``reset`` and ``prompt`` (see
:data:`SHARED`), and the common part of ``consume`` (:func:`join`). cg/static.py and cg/elastic.py
build their apps with :func:`add_shared` and :func:`flavour_command`, in the reference's command
order, between their own commands (static ``create balanced|mapped``; elastic ``create``, ``add``,
``drop``, the mappings, and ``consume --auto``).

A command body imports what it needs (the library, nats-py, rich) when it runs: building this tree
imports Typer and nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from .common import ConsumeRequest, check_names, parse_concurrency, parse_dispatch, parse_duration_option, parse_sleep
from .errors import CLIError, warn
from .help import Command
from .help import Group as CommandGroup
from .runtime import runtime

if TYPE_CHECKING:
    from nats.aio.client import Client

    from pcgroups.jetstream import JetStreamApi

Fn = Callable[..., Any]


@dataclass(frozen=True)
class Calls:
    """One flavour's library functions, each ``(nc, stream, group, ..., api=api)``."""

    list_groups: Fn
    get_config: Fn
    list_active_members: Fn
    membership: Fn  # (nc, stream, group, member, api=) -> (in the membership, active)
    delete: Fn
    step_down: Fn
    status: Fn  # pcgroups.ops._status (imported when called: only ``status`` needs it)
    layout: Fn | None = None  # the streams a group consumes (elastic)
    stuck: Fn | None = None  # sources stuck on an origin message, or losing messages (elastic: pcgroups.elastic)


@dataclass(frozen=True)
class Flavour:
    """What differs between the static and the elastic commands."""

    name: str  # "static" | "elastic": the command and the KV bucket
    help: str  # the mode's help (``cg <name> --help``)
    calls: Callable[[], Calls]  # the library functions, imported on first call
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # command -> hidden aliases
    per_partition_status: bool = False  # ``status --per-partition`` (exact pending per partition)

    @property
    def with_article(self) -> str:
        """``a static``, ``an elastic``: as the reference's help texts say it."""
        return f"{'an' if self.name[0] in 'aeiou' else 'a'} {self.name}"


def _imported_when_called(module: str, name: str) -> Fn:
    """The async function ``module.name``, imported on its first call."""

    async def call(*args: Any, **kwargs: Any) -> Any:
        import importlib

        return await getattr(importlib.import_module(module), name)(*args, **kwargs)

    return call


def _static_calls() -> Calls:
    from functools import partial

    from pcgroups import flavour as shared
    from pcgroups import static as lib

    return Calls(
        list_groups=lib.list_static_groups,
        get_config=lib.get_static_config,
        list_active_members=lib.list_static_active_members,
        membership=partial(shared.is_in_membership_and_active, shared.STATIC),
        delete=lib.delete_static,
        step_down=lib.static_member_step_down,
        status=_imported_when_called("pcgroups.ops._status", "static_status"),
    )


def _elastic_calls() -> Calls:
    from pcgroups import elastic as lib

    return Calls(
        list_groups=lib.list_elastic_groups,
        get_config=lib.get_elastic_config,
        list_active_members=lib.list_elastic_active_members,
        membership=lib.elastic_is_in_membership_and_active,
        delete=lib.delete_elastic,
        step_down=lib.elastic_member_step_down,
        status=_imported_when_called("pcgroups.ops", "elastic_status"),
        layout=lib.get_elastic_layout,
        stuck=_imported_when_called("pcgroups.elastic", "intake_of"),
    )


_SHARED_ALIASES = {
    "ls": ("list",),
    "delete": ("rm",),
    "member-info": ("memberinfo", "minfo"),
    "step-down": ("stepdown", "sd"),
    "consume": ("join",),
    "status": ("describe",),
}

STATIC = Flavour("static", "static consumer groups mode", _static_calls, _SHARED_ALIASES, per_partition_status=True)
ELASTIC = Flavour(
    "elastic",
    "elastic consumer groups mode",
    _elastic_calls,
    {**_SHARED_ALIASES, "create-mapping": ("cm", "createmapping"), "delete-mapping": ("dm", "deletemapping")},
)
FLAVOURS = (STATIC, ELASTIC)


# ---------------------------------------------------------------- arguments both flavours take

Stream = Annotated[str, typer.Argument(help="stream name", metavar="STREAM", show_default=False)]
Group = Annotated[str, typer.Argument(help="consumer group name", metavar="GROUP", show_default=False)]
Member = Annotated[str, typer.Argument(help="member name", metavar="MEMBER", show_default=False)]
MaxMembers = Annotated[
    int,
    typer.Argument(help="max number of members (the number of partitions)", metavar="MAX-MEMBERS", show_default=False),
]
Json = Annotated[bool, typer.Option("--json", help="print JSON")]
Force = Annotated[bool, typer.Option("--force/--no-force", "-f", help="force delete the consumer group")]
SLEEP_HELP = "sleep to simulate processing time"
DEFAULT_SLEEP = "20ms"
Sleep = Annotated[str, typer.Option("--sleep", help=SLEEP_HELP, metavar="DURATION")]
Concurrency = Annotated[
    int | None,
    typer.Option(
        "--concurrency",
        metavar="K",
        help="handle up to K messages at once, one per key at a time, each key in "
        "order (default 1: one message at a time, as the reference); with "
        "--dispatch: at most K messages at the workers at once (default: their "
        "capacities)",
        show_default=False,
    ),
]
Dispatch = Annotated[
    bool,
    typer.Option(
        "--dispatch",
        help="run no handler: hand this member's messages to the group's workers (cg ... worker), one "
        "per key at a time, keys in turn",
    ),
]
KeyHeader = Annotated[
    str | None,
    typer.Option(
        "--key-header",
        metavar="HEADER",
        help="with --concurrency: the key is this header's value (messages without it share one key)",
        show_default=False,
    ),
]
KeyTokens = Annotated[
    str | None,
    typer.Option(
        "--key-tokens",
        metavar="POSITIONS",
        help="with --concurrency: the key is these tokens of the subject (without "
        "the partition token), counted from 1 as in subject transforms, e.g. "
        "1,2 (default key: the partitioning tokens (elastic), the subject "
        "(static))",
        show_default=False,
    ),
]
MaxAckPending = Annotated[
    int | None,
    typer.Option(
        "--max-ack-pending",
        metavar="N",
        help="messages delivered and not yet acked (default 1; with --concurrency K: "
        "16384 (a burst on one key that long does not hold back other keys), and "
        "at least K)",
        show_default=False,
    ),
]
MetricsListen = Annotated[
    str | None,
    typer.Option(
        "--metrics-listen",
        help="serve this instance's metrics on http://ADDR/metrics (HOST:PORT)",
        metavar="ADDR",
        show_default=False,
    ),
]
Otel = Annotated[
    bool,
    typer.Option(
        "--otel",
        help="export OpenTelemetry spans of each message handled and of the group's control work, as the "
        "OTEL_* environment variables say (default: OTLP over HTTP to localhost:4318)",
    ),
]
Fail = Annotated[
    list[str] | None,
    typer.Option(
        "--fail",
        metavar="PATTERN",
        help="simulate a failing handler: every message whose subject (as printed) matches this NATS pattern "
        "raises, is retried and then dead-lettered (repeatable)",
        show_default=False,
    ),
]
MaxDeliver = Annotated[
    int | None,
    typer.Option(
        "--max-deliver",
        metavar="N",
        help="attempts at a failing message before it is dead-lettered (default 5; 0: retry for ever)",
        show_default=False,
    ),
]
ParkKeys = Annotated[
    bool,
    typer.Option(
        "--park-keys",
        help="park the key of a dead-lettered message: its later messages follow it into the dead-letter "
        "stream, unrun, until it is replayed or purged (cg ... dead-letters)",
    ),
]
StatusJson = Annotated[bool, typer.Option("--json", help="print JSON (with --watch: one line per refresh)")]
Watch = Annotated[bool, typer.Option("--watch", help="refresh until Ctrl-C")]
Interval = Annotated[
    str, typer.Option("--interval", help="refresh interval with --watch (Go duration)", metavar="DURATION")
]
PerPartition = Annotated[
    bool,
    typer.Option(
        "--per-partition",
        help="count each partition's pending messages exactly (an ephemeral "
        "consumer per partition of members owning several)",
    ),
]

STATUS_HELP = (
    "show each member's partitions, how long its pinned instance has held the pin, its pending, unacked "
    "and redelivered messages and the sequence acked up to; the pin ids and the leases"
)


def flavour_app(flavour: Flavour) -> typer.Typer:
    """``cg <flavour>``'s app (built on its own by cg/app.py: no shell-completion options, as the root).

    As in the reference, ``--sleep`` belongs to ``cg static``/``cg elastic`` themselves: it is taken
    anywhere after the flavour (cg/main.py moves it next to the flavour: :data:`FLAVOUR_OPTIONS`), and
    ``consume`` and ``prompt`` use it; consume's own ``--sleep`` (what the nats plugin passes) wins."""
    app = typer.Typer(help=flavour.help, add_completion=False, cls=CommandGroup)

    @app.callback()
    def mode(
        sleep: Annotated[
            str | None,
            typer.Option(
                "--sleep",
                help=f"{SLEEP_HELP} (consume, worker, prompt; default {DEFAULT_SLEEP})",
                metavar="DURATION",
                show_default=False,
            ),
        ] = None,
    ) -> None:
        if sleep is not None:
            parse_sleep(sleep)  # a bad value is an error whatever the command (a Go duration flag)

    return app


#: Options of ``cg static``/``cg elastic`` taken anywhere after the flavour, as the reference's command
#: flags are (cg/main.py moves them next to the flavour before parsing).
FLAVOUR_OPTIONS = ("--sleep",)


def flavour_sleep(ctx: typer.Context, sleep: str) -> str:
    """The ``--sleep`` a command runs with: its own when given, else the flavour's, else the default."""
    from typer._click.core import ParameterSource

    if ctx.get_parameter_source("sleep") is not ParameterSource.DEFAULT:
        return sleep
    parent = ctx.parent
    while parent is not None:
        given = parent.params.get("sleep")
        if given is not None:
            return str(given)
        parent = parent.parent
    return sleep


def flavour_command(app: typer.Typer, flavour: Flavour, name: str, help: str) -> Callable[[Fn], Fn]:
    """Register a function as ``name`` and, hidden, as each of the flavour's aliases of ``name``
    (the fisk model lists them as aliases: cg/app.py :data:`ALIASES`)."""

    def register(fn: Fn) -> Fn:
        app.command(name, help=help, cls=Command)(fn)
        for alias in flavour.aliases.get(name, ()):
            app.command(alias, help=help, hidden=True, cls=Command)(fn)
        return fn

    return register


# ---------------------------------------------------------------- the shared commands


def _ls(flavour: Flavour) -> tuple[Fn, str]:
    def ls(ctx: typer.Context, stream: Stream, json: Json = False) -> None:
        from .output import print_groups

        check_names(stream=stream)

        async def body(nc: Client, api: JetStreamApi) -> list[str]:
            from pcgroups.errors import NotFoundError

            groups = await flavour.calls().list_groups(nc, stream, api=api)
            if not groups:  # a group's name need not be a stream (partition streams): only then ask
                try:
                    await api.stream_info(stream)
                except NotFoundError:
                    raise CLIError(
                        f"stream {stream} does not exist (and no {flavour.name} consumer group is "
                        f"defined under that name)"
                    ) from None
            return groups

        print_groups(flavour.name, stream, runtime(ctx).with_connection(body), as_json=json)

    return ls, "list the consumer groups defined on a stream"


def _info(flavour: Flavour) -> tuple[Fn, str]:
    def info(ctx: typer.Context, stream: Stream, name: Group, json: Json = False) -> None:
        from .output import print_info

        check_names(stream=stream, group=name)

        async def body(nc: Client, api: JetStreamApi) -> tuple[Any, list[str], Any, list[Any]]:
            calls = flavour.calls()
            cfg = await calls.get_config(nc, stream, name, api=api)
            active = await calls.list_active_members(nc, stream, name, api=api)
            layout = await calls.layout(nc, stream, name, api=api) if calls.layout else None
            return cfg, active, layout, (await calls.stuck(nc, stream, name, api=api) if calls.stuck else [])

        cfg, active, layout, stuck = runtime(ctx).with_connection(body)
        print_info(flavour.name, stream, name, cfg, active, as_json=json, layout=layout, stuck=stuck)

    return info, f"get {flavour.name} consumer group info"


WithDeadLetters = Annotated[
    bool,
    typer.Option(
        "--with-dead-letters",
        help="delete the group's dead letters too (without it they are kept when there are any)",
    ),
]


def _delete(flavour: Flavour) -> tuple[Fn, str]:
    def delete(
        ctx: typer.Context,
        stream: Stream,
        name: Group,
        force: Force = False,
        with_dead_letters: WithDeadLetters = False,
    ) -> None:
        check_names(stream=stream, group=name)
        _delete_group(runtime(ctx), flavour, stream, name, force=force, with_dead_letters=with_dead_letters)

    return delete, f"delete {flavour.with_article} partitioned consumer group"


def _delete_group(rt: Any, flavour: Flavour, stream: str, group: str, *, force: bool, with_dead_letters: bool) -> None:
    """``delete``: the group (its instances end), and its dead-letter stream when it is empty or
    ``with_dead_letters``; one that holds dead letters is kept and said so. A group already deleted whose dead
    letters were kept: ``--with-dead-letters`` deletes them, else it is the group's not-found error, saying so.
    Every delete is checked first (a refused one deletes nothing)."""
    from pcgroups.deadletters import dead_letter_stream, delete_dead_letter_stream, held_dead_letters
    from pcgroups.errors import ConfigError, NotFoundError, PermissionDeniedError

    from .deadletters import count as letters
    from .output import out

    name = dead_letter_stream(flavour.name, stream, group)

    async def body(nc: Client, api: JetStreamApi) -> tuple[bool, bool, int]:
        calls = flavour.calls()
        held = await held_dead_letters(api, flavour.name, stream, group)
        there = True
        try:
            await calls.get_config(nc, stream, group, api=api)  # "not found" before asking
        except ConfigError:
            pass  # it exists with an invalid config: deleting it is the way out
        except NotFoundError as e:
            if await _left_work_queue(flavour, api, stream, group):
                pass
            elif held is None:
                raise
            elif not with_dead_letters:
                raise NotFoundError(
                    f"{e}; its dead-letter stream {name} is left, with {letters(held)} (--with-dead-letters deletes it)"
                ) from None
            else:
                there = False
        removable = held is not None and (with_dead_letters or held == 0)
        if removable:
            try:
                await api.check_delete(f"STREAM.DELETE.{name}")
            except PermissionDeniedError:
                if with_dead_letters:
                    raise
                removable = False  # an empty one the user may not delete: left as it is
        await rt.confirm_delete(force)
        if there:
            await calls.delete(nc, stream, group, api=api)
        deleted, count = (False, held or 0)
        if removable:
            deleted, count = await delete_dead_letter_stream(
                nc, flavour.name, stream, group, only_if_empty=not with_dead_letters, api=api
            )
        return there, deleted, count

    there, deleted, count = rt.with_connection(body)
    kept = not deleted and count > 0
    if kept:
        warn(
            f"{flavour.name} consumer group {group}'s {letters(count)} are kept in stream {name} "
            f"(cg {flavour.name} dead-letters ls {stream} {group} lists them; cg {flavour.name} delete {stream} "
            f"{group} --with-dead-letters deletes them)"
        )
    if not out.pretty:  # the reference prints nothing (kept in pipes)
        return
    if not there:
        out.styled(f"deleted the dead-letter stream {name} ({letters(count)}) of deleted group {group}", "green")
        return
    queue = f" and its work queue {stream}-{group}" if flavour.name == "elastic" else ""
    dead = f"; its {letters(count)} deleted with it" if deleted and count else ""
    out.styled(
        f"deleted {flavour.name} consumer group {group} on stream {stream}{queue}: its instances end{dead}", "green"
    )


async def _left_work_queue(flavour: Flavour, api: JetStreamApi, stream: str, group: str) -> bool:
    """An elastic group's work queue is left without its config (a delete that stopped half way): say so; the
    delete removes it."""
    from pcgroups import work_queue_name
    from pcgroups.errors import NotFoundError

    if flavour.name != "elastic":
        return False
    wq = work_queue_name(stream, group)
    try:
        await api.stream_info(wq)
    except NotFoundError:
        return False
    warn(
        f"elastic consumer group {group} on stream {stream} has no config, but its work queue {wq} is left: deleting it"
    )
    return True


def _member_info(flavour: Flavour) -> tuple[Fn, str]:
    def member_info(ctx: typer.Context, stream: Stream, name: Group, member: Member, json: Json = False) -> None:
        from .output import print_member_info

        check_names(stream=stream, group=name, members=[member])

        async def body(nc: Client, api: JetStreamApi) -> tuple[bool, bool]:
            return await flavour.calls().membership(nc, stream, name, member, api=api)

        in_membership, active = runtime(ctx).with_connection(body)
        print_member_info(flavour.name, stream, name, member, in_membership, active, as_json=json)

    return member_info, f"get {flavour.name} consumer group member info"


def _step_down(flavour: Flavour) -> tuple[Fn, str]:
    def step_down(ctx: typer.Context, stream: Stream, name: Group, member: Member) -> None:
        check_names(stream=stream, group=name, members=[member])

        async def body(nc: Client, api: JetStreamApi) -> None:
            calls = flavour.calls()
            in_membership, active = await calls.membership(nc, stream, name, member, api=api)
            if in_membership and not active:
                raise CLIError(
                    f"member {member} of {flavour.name} consumer group {name} has no running instance: "
                    "nothing to step down (start one with consume)"
                )
            await calls.step_down(nc, stream, name, member, api=api)

        runtime(ctx).with_connection(body)
        from .output import out

        if out.pretty:  # the reference prints nothing (kept in pipes)
            out.styled(
                f"member {member}'s pinned instance stepped down: the next instance to pull gets the pin "
                "(a standby when one runs)",
                "green",
            )

    return step_down, "initiate a step down for a member"


def _status(flavour: Flavour) -> tuple[Fn, str]:
    def show(
        ctx: typer.Context, stream: str, name: str, json: bool, watch: bool, interval: str, **options: Any
    ) -> NoReturn:
        from .status import run_status

        check_names(stream=stream, group=name)
        seconds = parse_duration_option("--interval", interval, positive=True)
        raise typer.Exit(
            run_status(
                runtime(ctx),
                flavour.calls().status,
                stream,
                name,
                as_json=json,
                watching=watch,
                interval=seconds,
                **options,
            )
        )

    if flavour.per_partition_status:

        def status_per_partition(
            ctx: typer.Context,
            stream: Stream,
            name: Group,
            json: StatusJson = False,
            watch: Watch = False,
            interval: Interval = "2s",
            per_partition: PerPartition = False,
        ) -> None:
            show(ctx, stream, name, json, watch, interval, per_partition=per_partition)

        return status_per_partition, STATUS_HELP

    def status(
        ctx: typer.Context,
        stream: Stream,
        name: Group,
        json: StatusJson = False,
        watch: Watch = False,
        interval: Interval = "2s",
    ) -> None:
        show(ctx, stream, name, json, watch, interval)

    return status, STATUS_HELP


Members = Annotated[
    list[str] | None, typer.Argument(help="members to reset (default: all)", metavar="MEMBER", show_default=False)
]


def _once(option: str, values: list[Any] | None) -> Any:
    """The value of an option given at most once (Click keeps the last of a repeated one, silently)."""
    if values and len(values) > 1:
        raise CLIError(f"{option} given {len(values)} times ({', '.join(map(str, values))}): give one position, once")
    return values[0] if values else None


def _whole(option: str, text: str | None) -> int | None:
    """A whole number (list options are strings: cg/coercion.py reads only plain ones without pydantic)."""
    if text is None:
        return None
    if not re.fullmatch(r"\s*[+-]?[0-9]+\s*", text):
        raise CLIError(f"invalid {option}: {text!r} is not a whole number")
    return int(text)


def _warn_future(target: Any, given: list[str] | None) -> None:
    """``--to-time`` after now: nothing is at or after it, so the reset goes past the last message."""
    from datetime import datetime

    if target.kind == "time" and given and target.time > datetime.now(UTC):
        warn(
            f"--to-time {given[0]} is in the future: no message is at or after it, so this skips everything "
            "pending, as --to-latest does"
        )


def _reset(flavour: Flavour) -> tuple[Fn, str]:
    def reset(
        ctx: typer.Context,
        stream: Stream,
        name: Group,
        members: Members = None,
        to_earliest: Annotated[bool, typer.Option("--to-earliest", help="to the first message")] = False,
        to_latest: Annotated[
            bool, typer.Option("--to-latest", help="past the last message: skip everything pending")
        ] = False,
        to_seq: Annotated[
            list[str] | None, typer.Option("--to-seq", help="to this stream sequence", metavar="N")
        ] = None,
        to_time: Annotated[
            list[str] | None,
            typer.Option("--to-time", help="to the first message at or after this time", metavar="RFC3339"),
        ] = None,
        by_duration: Annotated[
            list[str] | None, typer.Option("--by-duration", help="to this long before now", metavar="DURATION")
        ] = None,
        execute: Annotated[bool, typer.Option("--execute", help="apply the plan (without it nothing changes)")] = False,
        json: Json = False,
    ) -> None:
        from pcgroups import ops

        from .offsets import print_plan

        check_names(stream=stream, group=name, members=members or [])
        target = ops.Target.of(
            earliest=to_earliest,
            latest=to_latest,
            seq=_whole("--to-seq", _once("--to-seq", to_seq)),
            time=_once("--to-time", to_time),
            duration=_once("--by-duration", by_duration),
        )
        plan_fn = ops.plan_static_reset if flavour.name == "static" else ops.plan_elastic_reset
        _warn_future(target, to_time)

        async def body(nc: Client, api: JetStreamApi) -> Any:
            plan = await plan_fn(nc, stream, name, target, members or None, api=api)
            return await ops.execute_reset(nc, plan, api=api) if execute else plan

        print_plan(runtime(ctx).with_connection(body), as_json=json)

    return reset, (
        "replay or skip: move members to --to-earliest, --to-latest, --to-seq N, --to-time T or "
        "--by-duration D (prints the plan; --execute applies it)"
    )


def _prompt(flavour: Flavour) -> tuple[Fn, str]:
    def prompt(ctx: typer.Context) -> None:
        from .prompt import Repl

        sleep = ctx.parent.params.get("sleep") if ctx.parent is not None else None
        raise typer.Exit(Repl(flavour.name, runtime(ctx).options, ctx.find_root().command, sleep=sleep).run())

    return prompt, f"interactive shell in {flavour.name} mode"


#: The commands both flavours have: name -> (the command function for a flavour, its help).
WorkerName = Annotated[
    str | None,
    typer.Option(
        "--name",
        help="the worker's name (default: <host>-<pid>); letters, digits, '-' and '_'",
        metavar="NAME",
        show_default=False,
    ),
]
Capacity = Annotated[int, typer.Option("--capacity", metavar="C", help="handle up to C messages at once")]


def _worker(flavour: Flavour) -> tuple[Fn, str]:
    def worker(
        ctx: typer.Context,
        stream: Stream,
        name: Group,
        worker_name: WorkerName = None,
        capacity: Capacity = 1,
        sleep: Sleep = "20ms",
        otel: Otel = False,
        fail: Fail = None,
    ) -> NoReturn:
        from pcgroups.pool import check_worker_name, default_worker_name

        from .common import MAX_CONCURRENCY, parse_fail
        from .consume import work

        check_names(stream=stream, group=name)
        worker_name = worker_name if worker_name is not None else default_worker_name()
        check_worker_name(worker_name)
        if not 1 <= capacity <= MAX_CONCURRENCY:
            raise CLIError(
                f"invalid --capacity {capacity}: must be between 1 and {MAX_CONCURRENCY} (the messages it "
                "handles at once)"
            )
        seconds = parse_sleep(flavour_sleep(ctx, sleep))
        patterns = parse_fail(fail or [])
        rt = runtime(ctx)
        raise typer.Exit(
            rt.run_member(
                work, rt, flavour.name, stream, name, worker_name, seconds, capacity, otel=otel, fail=patterns
            )
        )

    return worker, (
        f"run a worker for {flavour.with_article} group's dispatching members (consume --dispatch): it "
        "handles the messages they hand it"
    )


SHARED: dict[str, Callable[[Flavour], tuple[Fn, str]]] = {
    "ls": _ls,
    "info": _info,
    "delete": _delete,
    "member-info": _member_info,
    "step-down": _step_down,
    "status": _status,
    "prompt": _prompt,
    "reset": _reset,
    "worker": _worker,
}


def add_shared(app: typer.Typer, flavour: Flavour, *names: str) -> None:
    """Add the shared commands ``names`` (keys of :data:`SHARED`), in that order, to a flavour's app."""
    for name in names:
        fn, help = SHARED[name](flavour)
        flavour_command(app, flavour, name, help)(fn)


def join(
    ctx: typer.Context,
    flavour: Flavour,
    stream: str,
    name: str,
    member: str,
    sleep: str,
    concurrency: int | None = None,
    key_header: str | None = None,
    key_tokens: str | None = None,
    max_ack_pending: int | None = None,
    dispatch: bool = False,
    fail: list[str] | None = None,
    max_deliver: int | None = None,
    park_keys: bool = False,
    **options: Any,
) -> NoReturn:
    """The common part of ``consume``: check the names, ``--sleep``, the concurrency options
    (:func:`~cg.common.parse_concurrency`, :func:`~cg.common.parse_dispatch`) and the failure options
    (``--fail``, ``--max-deliver``, ``--park-keys``: :func:`~cg.common.parse_failures`) into one
    :class:`~cg.common.ConsumeRequest`, then run the member instance (cg/consume.py) until it ends; exits with
    its status."""
    from .common import parse_failures
    from .consume import consume

    check_names(stream=stream, group=name, members=[member])
    seconds = parse_sleep(flavour_sleep(ctx, sleep))
    if dispatch:
        keyed = parse_dispatch(concurrency, key_header, key_tokens, max_ack_pending)
    else:
        keyed = parse_concurrency(1 if concurrency is None else concurrency, key_header, key_tokens, max_ack_pending)
    failures = parse_failures(fail or [], max_deliver, park_keys, dispatch, f"cg {flavour.name} worker")
    request = ConsumeRequest(flavour.name, stream, name, member, seconds, keyed, dispatch, failures=failures, **options)
    rt = runtime(ctx)
    raise typer.Exit(rt.run_member(consume, rt, request))


__all__ = [
    "ELASTIC",
    "FLAVOURS",
    "FLAVOUR_OPTIONS",
    "STATIC",
    "Calls",
    "Flavour",
    "add_shared",
    "flavour_app",
    "flavour_command",
    "flavour_sleep",
    "join",
]
