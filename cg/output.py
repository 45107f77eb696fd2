"""Everything ``cg`` prints on stdout goes through :data:`out`, which holds the one rich Console.

- stdout not a terminal (pipes, files, scripts): the reference's exact lines (Go ``%v`` formatting),
  written as they are, never wrapped.
- stdout a terminal: rich tables for ``ls``/``info``/``member-info`` (``CG_PRETTY=0``/``1`` overrides
  the detection).
- ``--json``: one JSON document, whatever stdout is.

rich is imported only for pretty output: plain lines and JSON need nothing but the standard library.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from pcgroups.config import ElasticConfig, MemberMapping, StaticConfig
    from pcgroups.elastic import Layout, SourceStream

# ---------------------------------------------------------------- Go %v formatting


def go_list(items: Iterable[Any]) -> str:
    """A Go slice as ``%v`` prints it: ``[a b]``, empty or nil ``[]``."""
    return "[" + " ".join(str(i) for i in items) + "]"


def go_mapping(m: MemberMapping) -> str:
    """A MemberMapping as ``%+v``: ``{Member:m1 Partitions:[0 1]}``."""
    return f"{{Member:{m.member} Partitions:{go_list(m.partitions)}}}"


def go_mappings(mappings: Iterable[MemberMapping]) -> str:
    return go_list(go_mapping(m) for m in mappings)


def ranges(partitions: list[int]) -> str:
    """``0-4 7 9-10``: partition numbers with runs written as ranges (``none`` for no partition)."""
    out: list[str] = []
    for p in sorted(partitions):
        if out and out[-1].split("-")[-1] == str(p - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{p}"
        else:
            out.append(str(p))
    return " ".join(out) or "none"


def go_duration(seconds: float) -> str:
    """A duration as Go's ``time.Duration.String()``: ``20ms``, ``1.5s``, ``1m30s``, ``1h0m0s``, ``0s``."""
    ns = round(seconds * 1e9)
    sign = "-" if ns < 0 else ""
    u = abs(ns)
    if u == 0:
        return "0s"

    def frac(value: int, digits: int) -> str:
        whole, rest = divmod(value, 10**digits)
        if rest == 0:
            return str(whole)
        return f"{whole}.{str(rest).rjust(digits, '0').rstrip('0')}"

    if u < 1_000:
        return f"{sign}{u}ns"
    if u < 1_000_000:
        return f"{sign}{frac(u, 3)}µs"
    if u < 1_000_000_000:
        return f"{sign}{frac(u, 6)}ms"
    secs_text = frac(u % 60_000_000_000, 9) + "s"
    minutes = u // 60_000_000_000
    if minutes == 0:
        return sign + secs_text
    hours, minutes = divmod(minutes, 60)
    if hours == 0:
        return f"{sign}{minutes}m{secs_text}"
    return f"{sign}{hours}h{minutes}m{secs_text}"


# ---------------------------------------------------------------- the console


class Output:
    """The single stdout console plus the plain-line and JSON writers."""

    def __init__(self) -> None:
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        """The rich console, made on first use."""
        if self._console is None:
            from rich.console import Console

            # file=None: the console follows sys.stdout (tests redirect it); no markup, emoji or
            # highlighting, so names are printed as they are; a long line of text wraps at the
            # terminal's width (plain lines for pipes do not go through rich).
            self._console = Console(highlight=False, emoji=False, markup=False)
        return self._console

    @property
    def file(self):
        return sys.stdout

    @property
    def pretty(self) -> bool:
        """Rich tables? Only when stdout is a terminal (``CG_PRETTY`` forces either way)."""
        forced = os.environ.get("CG_PRETTY")
        if forced in ("0", "1"):
            return forced == "1"
        try:
            return bool(self.file.isatty())
        except (AttributeError, ValueError, OSError):
            return False

    def write(self, text: str) -> None:
        """Raw text, flushed at once (prompts, partial consume lines)."""
        self.file.write(text)
        self.file.flush()

    def line(self, text: str = "") -> None:
        """One plain line exactly as given."""
        self.file.write(text + "\n")
        self.file.flush()

    def note(self, text: str) -> None:
        """A human line beyond the reference's: on stdout in a terminal (wrapped at its width), on
        stderr in a pipe, where stdout keeps the reference's lines."""
        if self.pretty:
            self.styled(text)
        else:
            sys.stderr.write(text + "\n")
            sys.stderr.flush()

    def json(self, obj: Any) -> None:
        self.line(json.dumps(obj, indent=2, ensure_ascii=False))

    def styled(self, text: str, style: str = "") -> None:
        """One line of text in a style (pretty output only: plain lines are :meth:`line`'s)."""
        from rich.text import Text

        self.print(Text(text, style=style))

    def print(self, *renderables: Any) -> None:
        """Rich renderables (tables): on a terminal at its width, long cells folded; forced
        pretty output into a pipe or file gets a wide page instead."""
        try:
            tty = bool(self.file.isatty())
        except (AttributeError, ValueError, OSError):
            tty = False
        if tty:
            self.console.print(*renderables)
        else:
            with self.console.capture() as cap:
                saved = self.console.width
                self.console.width = 250
                try:
                    self.console.print(*renderables)
                finally:
                    self.console.width = saved
            self.file.write(cap.get())
            self.file.flush()


out = Output()


def line_buffered_stdout() -> None:
    """Make stdout line-buffered even into a pipe (long-running commands)."""
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        try:
            reconfigure(line_buffering=True)
        except (ValueError, OSError):
            pass


# ---------------------------------------------------------------- tables


def table(title: str | None = None, **options: Any) -> Table:
    """cg's one table style (every command, the demo too): no box, the header underlined by a rule, columns
    two spaces apart; a title sits on one line above it, left-justified, and the table is at least as wide
    as the title (rich wraps a title to the table's width, one word a line above a narrow table)."""
    from rich import box
    from rich.table import Table

    style: dict[str, Any] = {"box": box.SIMPLE_HEAD, "padding": (0, 1, 0, 0), "pad_edge": False, "show_edge": False}
    if title:
        style.update(title=title, title_justify="left", min_width=len(title))
    return Table(**{**style, **options})


# ---------------------------------------------------------------- ls


def groups_table(kind: str, stream: str, groups: Sequence[str]) -> Table | Text:
    """``ls`` in a terminal: the groups, one a row, under a one-line title."""
    from rich.text import Text

    if not groups:
        return Text(f"no {kind} consumer groups on stream {stream}", style="dim")
    listed = table(f"{kind} consumer groups on stream {stream}", show_header=False)  # a list under its title
    listed.add_column("group", overflow="fold")
    for g in groups:
        listed.add_row(g)
    return listed


def print_groups(kind: str, stream: str, groups: Sequence[str], *, as_json: bool) -> None:
    if as_json:
        out.json({"stream": stream, "kind": kind, "groups": list(groups)})
    elif out.pretty:
        out.print(groups_table(kind, stream, groups))
    else:
        out.line(f"{kind} consumer groups: {go_list(groups)}")


# ---------------------------------------------------------------- info


def print_info(
    kind: str,
    stream: str,
    group: str,
    cfg: StaticConfig | ElasticConfig,
    active: Sequence[str],
    *,
    as_json: bool,
    layout: Layout | None = None,
    stuck: Sequence[Any] = (),
) -> None:
    """``info`` of a ``kind`` (static, elastic) group: its config, active members and (elastic) the
    streams its work queue sources. In plain output a one-stream group prints the reference's lines
    only; a group over several streams adds one ``streams:`` line. A source stuck on an origin message, or
    losing origin messages (``stuck``, pcgroups.elastic) is a ``cg: warning:`` line (stdout keeps the reference's
    lines)."""
    if as_json:
        doc = {
            "stream": stream,
            "group": group,
            "kind": kind,
            "config": json.loads(cfg.to_json()),
            "active_members": list(active),
        }
        if layout is not None:
            doc["layout"] = layout.kind
            doc["streams"] = [_stream_doc(s) for s in layout.streams]
            doc["stuck_sources"] = [dataclasses.asdict(s) for s in stuck if hasattr(s, "cause")]
            doc["source_gaps"] = [dataclasses.asdict(s) for s in stuck if not hasattr(s, "cause")]
        out.json(doc)
    elif out.pretty:
        for renderable in _pretty_info(kind, stream, group, cfg, active, layout):
            out.print(renderable)
    else:
        for text in _plain_info(kind, cfg, active):
            out.line(text)
        if layout is not None and (layout.kind != "stream" or layout.external):
            out.line(f"streams ({layout.kind}): " + ", ".join(s.describe() for s in layout.streams))
    if not as_json:
        from .errors import warn

        for s in stuck:
            warn(stuck_line(s, stream, group))


def print_skip(result: Any, *, as_json: bool) -> None:
    """``elastic skip-stuck``: the message stepped past (a dead letter left in its stream), what would be, or why
    there is nothing to step past (``pcgroups.elastic._intake.SkipResult``)."""
    if as_json:
        out.json(dataclasses.asdict(result))
        return
    s = result.skipped
    if s is None:
        out.line(result.reason)
        return
    wq = f"{result.stream}-{result.group}"
    if not result.executed:
        out.line(f"would step past message {s.seq} of stream {s.stream}: {s.describe()}")
        out.line("run it again with --execute to do it (what is queued before it is handled first)")
        return
    out.line(f"stepped past message {s.seq} of stream {s.stream}: sourcing into {wq} resumes at message {s.seq + 1}")
    out.line(
        f"dead letter: {s.stream} message {s.seq} ({s.subject}, header block {s.header_bytes} bytes) was not "
        f"copied into {wq}; it stays in {s.stream} (nats stream get {s.stream} {s.seq})"
    )


def stuck_line(stuck: Any, stream: str, group: str) -> str:
    """A source stuck on an origin message (``pcgroups.elastic.StuckSource``), and the way past it; or origin
    messages lost before sourcing (``pcgroups.elastic.SourceGap``)."""
    if not hasattr(stuck, "cause"):
        return f"intake lost messages: {stuck.describe()}"
    step = f" (step past it: cg elastic skip-stuck {stream} {group})" if stuck.cause != "full" else ""
    return f"intake stopped: {stuck.describe()}{step}"


def _stream_doc(s: SourceStream) -> dict[str, Any]:
    return {
        "name": s.name,
        "filters": [f.filter for f in s.filters],
        "partition": s.partition,
        "start": s.start,
        "domain": s.domain,
        "api_prefix": s.external_api or None,
    }


def print_streams(done: str, layout: Layout) -> None:
    """After ``add-source``/``remove-source``: what was done and the group's streams now."""
    out.line(done)
    out.line("streams now: " + ", ".join(s.describe() for s in layout.streams))


def _plain_info(kind: str, cfg: Any, active: Sequence[str]) -> list[str]:
    """The reference's lines."""
    if kind == "static":
        lines = [f"config: max members={cfg.max_members}, filters={go_list(cfg.filters)}"]
    else:
        lines = [
            f"config: max members={cfg.max_members}, max buffered msgs={cfg.max_buffered_msgs}, "
            f"max buffered bytes={cfg.max_buffered_bytes}"
        ]
        if not cfg.partitioning_filters:
            lines.append("no partitioning filters defined (whole subject used)")
        for pf in cfg.partitioning_filters or []:
            lines.append(f"filter={pf.filter}, partitioning wildcards {go_list(pf.partitioning_wildcards or [])}")
    if cfg.members:
        lines.append(f"members: {go_list(cfg.members)}")
    elif cfg.member_mappings:
        lines.append(f"Member mappings: {go_mappings(cfg.member_mappings)}")
    else:
        lines.append("no members or mappings defined")
    lines.append(f"currently active members: {go_list(active)}")
    return lines


def _pretty_info(
    kind: str, stream: str, group: str, cfg: Any, active: Sequence[str], layout: Layout | None = None
) -> list[Any]:
    """The config as a key/value table, the partitioning filters (elastic), the membership."""
    from rich.text import Text

    config = table(f"{kind} consumer group {group} on stream {stream}", show_header=False)
    config.add_column("key", style="bold", no_wrap=True)
    config.add_column("value", overflow="fold")
    config.add_row("max members", str(cfg.max_members))
    parts: list[Any] = [config]
    if kind == "static":
        config.add_row("filters", " ".join(cfg.filters) if cfg.filters else Text("none (whole subject)", style="dim"))
    else:
        config.add_row("max buffered msgs", str(cfg.max_buffered_msgs))
        config.add_row("max buffered bytes", str(cfg.max_buffered_bytes))
        if layout is not None:
            config.add_row("streams", "\n".join(s.describe() for s in layout.streams))
        parts.append(_filters_table(cfg))
    config.add_row("active members", " ".join(active) if active else Text("none", style="dim"))
    return [*parts, _membership_table(cfg, active)]


def _filters_table(cfg: ElasticConfig) -> Table | Text:
    from rich.text import Text

    from pcgroups.partitions import transform_destination

    if not cfg.partitioning_filters:
        return Text("no partitioning filters defined (whole subject used)", style="dim")
    ft = table("partitioning filters")
    ft.add_column("filter", overflow="fold")
    ft.add_column("wildcards", overflow="fold")
    ft.add_column("transform", overflow="fold")
    for pf in cfg.partitioning_filters:
        ft.add_row(
            pf.filter,
            " ".join(map(str, pf.partitioning_wildcards or [])) or "whole subject",
            transform_destination(pf.filter, pf.partitioning_wildcards, cfg.max_members),
        )
    return ft


def _membership_table(cfg: StaticConfig | ElasticConfig, active: Sequence[str]) -> Table | Text:
    from rich.text import Text

    from pcgroups.partitions import member_partitions

    names = cfg.membership()
    if not names:
        return Text("no members or mappings defined", style="yellow")
    mode = "balanced" if cfg.members else "mapped"
    members = table(f"members ({mode})")
    members.add_column("member", overflow="fold")
    members.add_column("partitions", overflow="fold")
    members.add_column("active", no_wrap=True)
    for name in names:
        parts = member_partitions(
            max_members=cfg.max_members, members=cfg.members, member_mappings=cfg.member_mappings, member=name
        )
        is_active = name in active
        members.add_row(
            name,
            ranges(parts) if parts else Text("none", style="dim"),
            Text("yes", style="green") if is_active else Text("no", style="red"),
        )
    return members


# ---------------------------------------------------------------- member-info


def print_member_info(
    kind: str, stream: str, group: str, member: str, in_membership: bool, active: bool, *, as_json: bool
) -> None:
    if as_json:
        out.json(
            {
                "stream": stream,
                "group": group,
                "kind": kind,
                "member": member,
                "in_membership": in_membership,
                "active": in_membership and active,
            }
        )
        return
    lines: list[tuple[str, str]] = []
    warning = f"***Warning*** member {member} is part of the consumer group membership but has NO active instance"
    if kind == "static":
        if in_membership:
            lines.append((f"member {member} is part of the consumer group membership", ""))
            lines.append((f"member {member} is active", "green") if active else (warning, "yellow"))
        else:
            lines.append((f"member {member} is not part of the consumer group membership", "red"))
    else:
        if in_membership and active:
            lines.append((f"member {member} is part of the consumer group membership and is active", "green"))
        elif in_membership:
            lines.append((f"member {member} is part of the consumer group membership", ""))
            lines.append((warning, "yellow"))
        else:
            lines.append((f"member {member} is not currently part of the consumer group membership", "red"))
    for text, style in lines:
        if out.pretty:
            from rich.text import Text

            out.print(Text(text, style=style))
        else:
            out.line(text)
