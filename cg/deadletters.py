"""``cg static|elastic dead-letters ls|show|replay|purge``: a group's dead letters (pcgroups.deadletters).

- ``ls STREAM GROUP``: every dead letter, oldest first: a table in a terminal, aligned plain columns in a pipe,
  a JSON array with ``--json``.
- ``show STREAM GROUP SEQ``: one dead letter, its headers, body and why it failed.
- ``replay STREAM GROUP`` and ``purge STREAM GROUP``, with ``--key KEY``, ``--seq N`` (both repeatable) or
  ``--all``: the plan (one line per dead letter on stdout, the outcome on stderr in a pipe; a table in a
  terminal; ``--json``); ``--execute`` applies it. A replay moves the dead letters to lane R, where the pinned
  instance of each partition's member runs them, in order, before later messages of their keys; a purge
  deletes them. Either way a key with no dead letter left is no longer parked.

Choices are checked before connecting; a group that does not exist is an error, except that ``ls``, ``show``
and ``purge`` still reach the dead letters a deleted group left (``delete`` keeps them unless
``--with-dead-letters``).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Protocol

import typer

from .common import check_names
from .errors import CLIError, warn
from .help import Command
from .help import Group as CommandGroup
from .output import out
from .runtime import runtime

if TYPE_CHECKING:
    from nats.aio.client import Client

    from pcgroups.deadletters import DeadLetter, DeadLetterPlan
    from pcgroups.jetstream import JetStreamApi


Stream = Annotated[str, typer.Argument(help="stream name", metavar="STREAM", show_default=False)]
Group = Annotated[str, typer.Argument(help="consumer group name", metavar="GROUP", show_default=False)]
Json = Annotated[bool, typer.Option("--json", help="print JSON")]
Keys = Annotated[
    list[str] | None,
    typer.Option("--key", help="the dead letters of this key (repeatable)", metavar="KEY", show_default=False),
]
Seqs = Annotated[
    list[str] | None,
    typer.Option(
        "--seq", help="the dead letter of this sequence, as ls shows it (repeatable)", metavar="N", show_default=False
    ),
]
Every = Annotated[bool, typer.Option("--all", help="every dead letter")]
Execute = Annotated[bool, typer.Option("--execute", help="apply the plan (without it nothing changes)")]


class Flavour(Protocol):
    """What the commands need of a flavour (cg/flavour.py's ``Flavour``)."""

    @property
    def name(self) -> str: ...

    @property
    def calls(self) -> Callable[[], Any]: ...

    @property
    def with_article(self) -> str: ...


COLUMNS = ("SEQ", "LANE", "PARTITION", "KEY", "SUBJECT", "MEMBER", "DELIVERIES", "PARKED", "DEAD-LETTERED", "REASON")


def dead_letters_app(flavour: Flavour) -> typer.Typer:
    """``cg <flavour> dead-letters``: its four commands."""
    app = typer.Typer(help=f"list, show, replay or purge {flavour.with_article} group's dead letters", cls=CommandGroup)
    kind = flavour.name

    @app.command("ls", help="list the group's dead letters, oldest first", cls=Command)
    def ls(ctx: typer.Context, stream: Stream, group: Group, json: Json = False) -> None:
        from pcgroups.deadletters import list_dead_letters

        check_names(stream=stream, group=group)

        async def body(nc: Client, api: JetStreamApi) -> list[DeadLetter]:
            await _group_or_its_dead_letters(flavour, nc, api, stream, group)
            return await list_dead_letters(nc, kind, stream, group, api=api)

        print_entries(kind, stream, group, runtime(ctx).with_connection(body), as_json=json)

    @app.command("show", help="show one dead letter: why it failed, its headers and body", cls=Command)
    def show(
        ctx: typer.Context,
        stream: Stream,
        group: Group,
        seq: Annotated[str, typer.Argument(help="its sequence, as ls shows it", metavar="SEQ", show_default=False)],
        json: Json = False,
    ) -> None:
        from pcgroups.deadletters import get_dead_letter

        check_names(stream=stream, group=group)
        number = parse_seq("SEQ", seq)

        async def body(nc: Client, api: JetStreamApi) -> DeadLetter:
            await _group_or_its_dead_letters(flavour, nc, api, stream, group)
            return await get_dead_letter(nc, kind, stream, group, number, api=api)

        print_entry(runtime(ctx).with_connection(body), as_json=json)

    @app.command(
        "replay",
        help="run dead letters again, in their order, in the member that owns their partition "
        "(prints the plan; --execute applies it)",
        cls=Command,
    )
    def replay(
        ctx: typer.Context,
        stream: Stream,
        group: Group,
        key: Keys = None,
        seq: Seqs = None,
        every: Every = False,
        execute: Execute = False,
        json: Json = False,
    ) -> None:
        _plan_command(ctx, flavour, "replay", stream, group, key, seq, every, execute, json)

    @app.command("purge", help="delete dead letters (prints the plan; --execute applies it)", cls=Command)
    def purge(
        ctx: typer.Context,
        stream: Stream,
        group: Group,
        key: Keys = None,
        seq: Seqs = None,
        every: Every = False,
        execute: Execute = False,
        json: Json = False,
    ) -> None:
        _plan_command(ctx, flavour, "purge", stream, group, key, seq, every, execute, json)

    return app


def parse_seq(option: str, text: str) -> int:
    """A dead letter's sequence: a whole number from 1."""
    if not re.fullmatch(r"\s*\+?[0-9]+\s*", text) or int(text) < 1:
        raise CLIError(f"invalid {option} {text!r}: give a dead letter's sequence, a whole number from 1 (ls shows it)")
    return int(text)


def check_choice(action: str, keys: list[str], seqs: list[str], every: bool, where: str) -> list[int]:
    """``--key``, ``--seq`` and ``--all``: something chosen, ``--all`` alone; the sequences as numbers."""
    if every and (keys or seqs):
        raise CLIError(f"--all and --key/--seq can't be combined: {action} every dead letter, or the ones named")
    if not (every or keys or seqs):
        raise CLIError(f"say which dead letters to {action}: --all, --key KEY or --seq N (cg {where} lists them)")
    return [parse_seq("--seq", s) for s in seqs]


async def _group_or_its_dead_letters(flavour: Flavour, nc: Client, api: JetStreamApi, stream: str, group: str) -> Any:
    """The group's config; for a group deleted with its dead letters kept, None and a warning; for neither,
    the group's NotFoundError. A group whose stored config is invalid: None (its dead letters are still there)."""
    from pcgroups.deadletters import dead_letter_stream
    from pcgroups.errors import ConfigError, NotFoundError

    try:
        return await flavour.calls().get_config(nc, stream, group, api=api)
    except ConfigError:
        return None
    except NotFoundError:
        name = dead_letter_stream(flavour.name, stream, group)
        try:
            await api.stream_info(name)
        except NotFoundError:
            raise CLIError(
                f"{flavour.name} consumer group {group} on stream {stream} does not exist, and has no dead letters "
                f"(cg {flavour.name} ls {stream} lists the groups)"
            ) from None
        warn(
            f"{flavour.name} consumer group {group} on stream {stream} was deleted; its dead letters were kept ({name})"
        )
        return None


def _plan_command(
    ctx: typer.Context,
    flavour: Flavour,
    action: str,
    stream: str,
    group: str,
    keys: list[str] | None,
    seqs: list[str] | None,
    every: bool,
    execute: bool,
    as_json: bool,
) -> None:
    from pcgroups import deadletters as dl

    check_names(stream=stream, group=group)
    numbers = check_choice(action, keys or [], seqs or [], every, f"{flavour.name} dead-letters ls {stream} {group}")
    planner = dl.plan_replay if action == "replay" else dl.plan_purge

    async def body(nc: Client, api: JetStreamApi) -> tuple[DeadLetterPlan, list[str]]:
        calls = flavour.calls()
        if action == "replay":  # they go back into the group: it must be there
            config = await calls.get_config(nc, stream, group, api=api)
        else:
            config = await _group_or_its_dead_letters(flavour, nc, api, stream, group)
        plan = await planner(
            nc, flavour.name, stream, group, keys=keys or [], seqs=numbers, everything=every, config=config, api=api
        )
        idle: list[str] = []
        if action == "replay" and plan.entries:
            active = set(await calls.list_active_members(nc, stream, group, api=api))
            idle = [m for m in plan.members() if m not in active]
        if execute:
            await dl.execute_plan(nc, plan, api=api)
        return plan, idle

    plan, idle = runtime(ctx).with_connection(body)
    print_plan(plan, idle, as_json=as_json)


# ---------------------------------------------------------------- printing


def _when(entry: DeadLetter) -> str:
    return entry.time.strftime("%Y-%m-%d %H:%M:%S") if entry.time else "-"


def _cells(entry: DeadLetter) -> list[str]:
    return [
        str(entry.seq),
        entry.lane_name,
        str(entry.partition),
        entry.key,
        entry.subject,
        entry.member,
        str(entry.deliveries),
        "yes" if entry.parked else "no",
        _when(entry),
        entry.reason or ("(followed its parked key)" if entry.parked else "-"),
    ]


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False)).rstrip() for r in rows]


def _title(kind: str, stream: str, group: str, entries: list[DeadLetter]) -> str:
    replaying = sum(1 for e in entries if e.lane_name == "replaying")
    counted = f"{len(entries) - replaying} dead" + (f", {replaying} replaying" if replaying else "")
    return f"dead letters of {kind} consumer group {group} on stream {stream}: {counted}"


def print_entries(kind: str, stream: str, group: str, entries: list[DeadLetter], *, as_json: bool) -> None:
    """``ls``: JSON, a table (a terminal) or aligned columns (a pipe); none is one line saying so."""
    if as_json:
        out.json([e.to_dict() for e in entries])
        return
    if not entries:
        out.note(f"no dead letters in {kind} consumer group {group} on stream {stream}")
        return
    if not out.pretty:
        for line in _aligned([list(COLUMNS), *(_cells(e) for e in entries)]):
            out.line(line)
        return
    shown, left_out = entries_table(kind, stream, group, entries, width=out.console.width)
    out.print(shown)
    if left_out:
        out.styled(f"left out to fit the terminal: {', '.join(left_out)} (--json shows everything)", "dim")


#: ``ls``'s table columns: (name, whether it folds); a narrow terminal loses them in the order of :data:`DROPPABLE`.
TABLE_COLUMNS = (
    ("seq", False),
    ("lane", False),
    ("partition", False),
    ("key", True),
    ("subject", True),
    ("member", True),
    ("tries", False),
    ("parked", False),
    ("dead-lettered", False),
    ("reason", True),
)
DROPPABLE = ("member", "partition", "subject", "parked", "dead-lettered")


def entries_table(
    kind: str, stream: str, group: str, entries: list[DeadLetter], *, width: int | None = None
) -> tuple[Any, list[str]]:
    """``ls`` in a terminal: a row per dead letter, and the columns left out to fit ``width`` (every number
    whole, the key, subject and reason folded)."""
    from rich.console import Console

    from .output import table

    drop: list[str] = []
    while True:
        shown = table(_title(kind, stream, group, entries))
        keep = [i for i, (name, _) in enumerate(TABLE_COLUMNS) if name not in drop]
        for i in keep:
            name, wraps = TABLE_COLUMNS[i]
            shown.add_column(name, overflow="fold", no_wrap=not wraps, min_width=min(len(name), 8) if wraps else None)
        for e in entries:
            cells = _cells(e)
            cells[8] = cells[8].replace(" ", "\n")  # the date over the time
            shown.add_row(*(cells[i] for i in keep))
        if width is None or len(drop) == len(DROPPABLE) or Console(width=10_000).measure(shown).minimum <= width:
            return shown, drop
        drop.append(DROPPABLE[len(drop)])


def _body(data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return f"({len(data)} bytes, not UTF-8: --json shows them in base64)"
    return text


def print_entry(entry: DeadLetter, *, as_json: bool) -> None:
    """``show``: field lines, the headers, then the body."""
    if as_json:
        out.json(entry.to_dict(body=True))
        return
    lane = "dead: waiting for a replay or a purge" if entry.lane_name == "dead" else "replaying: its member runs it"
    fields = [
        ("seq", str(entry.seq)),
        ("lane", lane),
        ("subject", entry.subject),
        ("key", entry.key),
        ("partition", str(entry.partition)),
        ("member", entry.member),
        ("deliveries", str(entry.deliveries)),
        ("reason", entry.reason or "-"),
        ("parked", "yes: it followed its parked key without running" if entry.parked else "no"),
        ("origin", f"stream {entry.origin_stream}, seq {entry.origin_seq}"),
        ("dead-lettered", entry.time.isoformat().replace("+00:00", "Z") if entry.time else "-"),
    ]
    width = max(len(name) for name, _ in fields)
    for name, value in fields:
        out.line(f"{name.ljust(width)}  {value}")
    if entry.headers:
        out.line("headers:")
        for name, value in entry.headers.items():
            out.line(f"  {name}: {value}")
    out.line(f"data ({len(entry.data)} bytes):")
    out.line(_body(entry.data))


def plan_line(plan: DeadLetterPlan, e: DeadLetter) -> str:
    owner = plan.owners.get(e.partition)
    where = f"partition {e.partition}" + (f", member {owner}" if owner else "")
    return f"seq {e.seq}: key {e.key} ({where}): {e.subject}, origin seq {e.origin_seq}, {e.lane_name}"


def count(n: int, noun: str = "dead letter") -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def plan_summary(plan: DeadLetterPlan, idle: list[str]) -> str:
    keys = ", ".join(plan.keys)
    if not plan.entries:
        return f"nothing to {plan.action}"
    if not plan.executed:
        return f"plan only, nothing changed (add --execute to apply): would {plan.action} {count(len(plan.entries))}"
    if plan.action == "purge":
        return f"done: deleted {count(plan.done)}; a key with none left is no longer parked ({keys})"
    members = " and ".join(plan.members()) or "their members"
    text = f"done: {count(plan.done)} moved to lane R (replaying)"
    if plan.followers:
        text += f", and {count(plan.followers)} that followed their keys since the plan"
    text += f"; one instance of {members} runs them in order, before later messages of their keys"
    if idle:
        text += f" ({' and '.join(idle)}: no instance running: they wait until one starts)"
    return text


def print_plan(plan: DeadLetterPlan, idle: list[str], *, as_json: bool) -> None:
    """A replay's or purge's plan, or what it did: JSON; a table and the outcome (a terminal); one line per dead
    letter on stdout and the outcome on stderr (a pipe)."""
    if as_json:
        out.json({**plan.to_dict(), "members_without_instance": idle})
        return
    summary = plan_summary(plan, idle)
    if out.pretty:
        if plan.entries:
            from .output import table

            title = f"{plan.action} {count(len(plan.entries))} of {plan.flavour} consumer group {plan.group}"
            shown = table(f"{title} on stream {plan.stream}")
            for name in ("seq", "key", "partition", "member", "subject", "origin seq", "lane"):
                shown.add_column(name, overflow="fold")
            for e in plan.entries:
                owner = plan.owners.get(e.partition, "-")
                shown.add_row(str(e.seq), e.key, str(e.partition), owner, e.subject, str(e.origin_seq), e.lane_name)
            out.print(shown)
        out.styled(summary, "green" if plan.executed else "yellow")
        return
    for e in plan.entries:
        out.line(plan_line(plan, e))
    print(summary, file=sys.stderr)


__all__ = [
    "check_choice",
    "count",
    "dead_letters_app",
    "parse_seq",
    "print_entries",
    "print_entry",
    "print_plan",
]
