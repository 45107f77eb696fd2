"""``cg static|elastic reset``: print a replay/skip plan (pcgroups.ops._offsets) and apply it with ``--execute``.

In a pipe: one plain line per member (static, elastic skip) or per stream (elastic replay), then on
stderr whether anything changed. In a terminal: a table, then that line. ``--json``: the plan as JSON
(with ``executed``). Nothing is changed without ``--execute``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from .output import out, ranges

if TYPE_CHECKING:
    from pcgroups.ops import MemberMove, ResetPlan, SourceMove


def _when(stamp: str | None) -> str:
    """``2026-11-26 14:25:55`` from an RFC3339 time (nanoseconds dropped)."""
    return stamp[:19].replace("T", " ") if stamp else ""


def _count(n: int, noun: str) -> str:
    """``1 queued message``, ``2 queued messages``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _at(seq: int, stamp: str | None) -> str:
    return f"seq {seq}" + (f" ({_when(stamp)})" if stamp else "")


def member_line(plan: ResetPlan, m: MemberMove) -> str:
    parts = ranges(m.partitions) if m.partitions else "none"
    if not m.exists:
        return f"{m.member}: {m.note}"
    if plan.flavour == "elastic":
        return f"{m.member}: partitions {parts}: skip {m.skip} queued"
    counted = f"replay {m.replay}" if m.replay else f"skip {m.skip}"
    return f"{m.member}: {_at(m.now, m.now_time)} -> {_at(m.after, m.after_time)}: {counted}"


def source_line(s: SourceMove) -> str:
    return f"{s.stream}: source again from {_at(s.start, s.start_time)}: {_count(s.messages, 'message')}"


def summary(plan: ResetPlan) -> str:
    if plan.executed:
        head, purge, source = "done", "purged", "every stream sourced again"
    else:
        head, purge, source = (
            "plan only, nothing changed (add --execute to apply)",
            "would purge",
            "would source every stream again",
        )
    if plan.replay:
        return f"{head}: {purge} {_count(plan.queued, 'queued message')}, {source}"
    if plan.flavour == "elastic":
        return f"{head}: {purge} {_count(plan.queued, 'queued message')}"
    return head


def print_plan(plan: ResetPlan, *, as_json: bool) -> None:
    if as_json:
        out.json(plan.to_dict())
        return
    if out.pretty:
        out.print(plan_table(plan))
        out.styled(summary(plan), "green" if plan.executed else "yellow")
        return
    if plan.replay:
        for s in plan.sources:
            out.line(source_line(s))
    else:
        for m in plan.members:
            out.line(member_line(plan, m))
    print(summary(plan), file=sys.stderr)


def plan_table(plan: ResetPlan) -> Any:
    from .output import table as new_table

    title = f"reset {plan.flavour} group {plan.group} on {plan.stream} to {plan.target}"
    table = new_table(title)
    if plan.replay:
        for name in ("stream", "from", "messages"):
            table.add_column(name, overflow="fold")
        for s in plan.sources:
            table.add_row(s.stream, _at(s.start, s.start_time), str(s.messages))
        return table
    if plan.flavour == "elastic":
        for name in ("member", "partitions", "queued (skip)"):
            table.add_column(name, overflow="fold")
        for m in plan.members:
            table.add_row(m.member, ranges(m.partitions) if m.partitions else "none", str(m.skip))
        return table
    for name in ("member", "now", "after", "replay", "skip"):
        table.add_column(name, overflow="fold")
    for m in plan.members:
        if not m.exists:
            table.add_row(m.member, "no consumer yet", "(never started)", "-", "-")
            continue
        table.add_row(
            m.member,
            f"{m.now}\n{_when(m.now_time)}".strip(),
            f"{m.after}\n{_when(m.after_time)}".strip(),
            str(m.replay),
            str(m.skip),
        )
    return table
