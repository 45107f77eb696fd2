"""``cg static status`` / ``cg elastic status``: a group's members, pins and pending messages, like Kafka's
``--describe``.

What is shown once per member (a member consumer's counters cover all its partitions): its partitions,
how long its pinned instance has held the pin (or why nobody holds it), pending, unacked and redelivered
messages and the stream sequence acked up to. Then the pins (pin id, since when, and with automatic
membership the lease of the instance holding it: instance id, pid, host), the pending count of each
partition when it is counted per partition (elastic groups; static with ``--per-partition``), the
partitions no member owns, each member's dead letters and parked keys, the leases, and the workers of each
dispatching member (``consume --dispatch``).

- :func:`render_status` prints one :class:`pcgroups.ops._status.GroupStatus`: rich tables on a terminal (the
  member table drops its least important columns rather than cut a number), aligned plain columns into
  a pipe, one JSON document with ``json=True``.
- :func:`watch` refreshes it every ``interval`` seconds until Ctrl-C (a live view on a terminal; into
  a pipe a new table, or one compact JSON line, per refresh).
- :func:`run_status` runs the ``status`` command of either flavour (declared in cg/flavour.py).
"""

from __future__ import annotations

import asyncio
import json as jsonlib
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

from .output import ranges, stuck_line
from .output import table as new_table

if TYPE_CHECKING:
    from pcgroups.ops import GroupStatus, MemberStatus

    from .runtime import Runtime


def age(since: datetime | None, now: datetime | None = None) -> str:
    """``3.2s``, ``4m05s``, ``2h03m`` since ``since`` (``-`` when unknown)."""
    if since is None:
        return "-"
    now = now or datetime.now(UTC)
    s = max((now - since).total_seconds(), 0.0)
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def _title(status: GroupStatus) -> str:
    where = status.stream if status.flavour == "static" else f"{status.stream} (work queue {status.consumer_stream})"
    return (
        f"{status.flavour} consumer group {status.group} on stream {where}: "
        f"{status.max_members} partitions, {_count(len(status.members), 'member')} ({status.mode})"
    )


def _count(n: int, noun: str) -> str:
    """``1 member``, ``2 members``."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _pending_note(status: GroupStatus) -> str:
    if status.flavour == "elastic":
        return "pending: messages of the member's partitions not yet acked"
    return "pending: messages of the member's partitions not yet delivered"


def _footer(status: GroupStatus) -> str:
    parts = [f"{status.messages} messages in {status.consumer_stream}, last sequence {status.last_seq}"]
    if status.source_lag is not None:
        parts.append(f"source lag {status.source_lag}")
    parts.append(_pending_note(status))
    return "; ".join(parts)


def stuck_lines(status: GroupStatus) -> list[str]:
    """One line per source stuck on an origin message (pcgroups.elastic), with the way past it, and per gap of
    origin messages lost before sourcing."""
    return [stuck_line(s, status.stream, status.group) for s in [*status.stuck_sources, *status.source_gaps]]


#: Parked keys named per member in ``status`` (``dead-letters ls`` and ``--json`` name them all).
KEYS_SHOWN = 10


def dead_letter_lines(status: GroupStatus) -> list[str]:
    """The members' dead letters and parked keys (nothing when there are none): a heading line naming the command
    that lists them, then a line per member that has some."""
    if not status.dead_letters:
        return []
    lines = [f"dead letters (cg {status.flavour} dead-letters ls {status.stream} {status.group}):"]
    owned = 0
    for m in status.members:
        dead, replaying = m.dead_letters or 0, m.replaying or 0
        if not dead + replaying:
            continue
        owned += dead + replaying
        counts = ", ".join(([f"{dead} dead"] if dead else []) + ([f"{replaying} replaying"] if replaying else []))
        keys = m.parked_keys[:KEYS_SHOWN]
        more = f" and {len(m.parked_keys) - len(keys)} more" if len(m.parked_keys) > len(keys) else ""
        noun = "parked key" if len(m.parked_keys) == 1 else "parked keys"
        lines.append(f"  {m.member}: {counts}; {noun}: {', '.join(keys)}{more}")
    if status.dead_letters > owned:
        lines.append(f"  partitions no member owns: {status.dead_letters - owned}")
    return lines


def _pinned_for(m: MemberStatus, now: datetime) -> str:
    """How long the member's pinned instance has held the pin, or why there is none."""
    if m.pinned_id:
        return age(m.pinned_since, now)
    if not m.exists:
        return "no consumer"
    return "not pinned" if m.active else "no instance"


def _holders(status: GroupStatus) -> dict[str, Any]:
    """pin id -> the lease (automatic membership) of the instance holding it."""
    return {x.pin: x for x in status.leases if getattr(x, "pin", "")}


def _instance(lease: Any) -> str:
    """``156d0e15 pid 12521 on vm``: a lease's instance id, process and host (as the leases table shows them)."""
    return lease.instance + (f" pid {lease.pid}" if lease.pid else "") + (f" on {lease.host}" if lease.host else "")


def _pin_holder(pin: str, instances: Mapping[str, str] | None, holders: Mapping[str, Any]) -> str:
    if pin in holders:
        return _instance(holders[pin])
    name = (instances or {}).get(pin)
    return name or "-"


def _per_partition(status: GroupStatus) -> str | None:
    """``0=3 1=0 2=5``: each partition's pending messages, when counted per partition."""
    rows = [p for p in status.partitions if p.member is not None]
    if not rows or not all(p.pending_exact and p.pending is not None for p in rows):
        return None
    return " ".join(f"{p.partition}={p.pending}" for p in rows)


def _unassigned(status: GroupStatus) -> list[int]:
    return [p.partition for p in status.partitions if p.member is None]


def _unassigned_text(status: GroupStatus) -> str:
    rows = [p for p in status.partitions if p.member is None]
    waiting = sum(p.pending or 0 for p in rows)
    return f"unassigned partitions: {ranges([p.partition for p in rows])} (no member owns them" + (
        f"; {waiting} messages wait)" if waiting else ")"
    )


# ---------------------------------------------------------------- rendering

#: The member columns: (header, plain header, justify). A narrow terminal loses columns in the order of
#: :data:`DROPPABLE` (the widest and least telling first) before a number would be cut, and the footer
#: names what it lost.
MEMBER_COLUMNS: list[tuple[str, str, JustifyMethod]] = [
    ("member", "MEMBER", "left"),
    ("partitions", "PARTITIONS", "left"),
    ("pinned for", "PINNED-FOR", "right"),
    ("pending", "PENDING", "right"),
    ("unacked", "UNACKED", "right"),
    ("redelivered", "REDELIVERED", "right"),
    ("acked to seq", "ACKED-TO-SEQ", "right"),
]
DROPPABLE = ["acked to seq", "unacked", "redelivered"]
LEASE_COLUMNS = ["MEMBER", "INSTANCE", "HOST", "PID", "HOLDS-PIN", "EXPIRES-IN"]
LEASE_JUSTIFY: list[JustifyMethod] = ["left", "left", "left", "right", "left", "right"]


def _member_cells(m: MemberStatus, now: datetime) -> list[str]:
    return [
        m.member,
        ranges(m.partitions),
        _pinned_for(m, now),
        _num(m.pending),
        _num(m.ack_pending),
        _num(m.redelivered),
        _num(m.ack_floor),
    ]


def _members_table(status: GroupStatus, now: datetime, drop: set[str]) -> Table:
    table = new_table()
    keep = [i for i, (name, _, _) in enumerate(MEMBER_COLUMNS) if name not in drop]
    for i in keep:
        name, _, justify = MEMBER_COLUMNS[i]
        wraps = name in ("member", "partitions")
        table.add_column(
            name,
            justify=justify,
            no_wrap=not wraps,
            overflow="fold" if wraps else "ellipsis",
            min_width=len(name) if not wraps else None,
        )
    for m in status.members:
        cells = _member_cells(m, now)
        styled: list[Any] = [cells[i] for i in keep]
        styled[keep.index(2)] = Text(cells[2], style="cyan" if m.pinned_id else "yellow" if m.exists else "red")
        table.add_row(*styled)
    return table


def _fitting_members_table(status: GroupStatus, now: datetime, width: int | None) -> tuple[Table, list[str]]:
    """The members table with as many columns as fit ``width`` (every number whole), and the columns
    it left out."""
    from rich.console import Console

    drop: list[str] = []
    while True:
        table = _members_table(status, now, set(drop))
        if width is None or len(drop) == len(DROPPABLE):
            return table, drop
        measure = Console(width=10_000).measure(table)
        if measure.minimum <= width:
            return table, drop
        drop.append(DROPPABLE[len(drop)])


def _pins_table(status: GroupStatus, instances: Mapping[str, str] | None, now: datetime) -> Table | None:
    pinned = [m for m in status.members if m.pinned_id]
    if not pinned:
        return None
    holders = {} if status.leases else _holders(status)  # with leases, their table says who holds each pin
    held = [_pin_holder(m.pinned_id or "", instances, holders) for m in pinned]
    table = new_table()
    table.add_column("member", overflow="fold", min_width=len("member"))
    table.add_column("pin id", no_wrap=True)
    table.add_column("pinned at", no_wrap=True)
    if any(h != "-" for h in held):
        table.add_column("held by instance", overflow="fold")
    for m, by in zip(pinned, held, strict=False):
        since = m.pinned_since.astimezone().strftime("%H:%M:%S") if m.pinned_since else "-"
        cells: list[str | Text] = [m.member, Text(m.pinned_id or "", style="cyan"), since, by]
        table.add_row(*cells[: len(table.columns)])
    return table


def _leases_table(status: GroupStatus) -> Table:
    table = new_table("leases (automatic membership)")
    for name, justify in zip(LEASE_COLUMNS, LEASE_JUSTIFY, strict=True):
        wraps = name in ("MEMBER", "HOST")
        table.add_column(
            name.lower().replace("-", " "),
            justify=justify,
            no_wrap=not wraps,
            overflow="fold" if wraps else "ellipsis",
        )
    for row in _lease_rows(status):
        table.add_row(*row)
    return table


def status_table(
    status: GroupStatus,
    *,
    instances: Mapping[str, str] | None = None,
    now: datetime | None = None,
    width: int | None = None,
) -> RenderableType:
    """The rich renderable of a status: title, one row per member (its totals once), the pins and who holds
    them, pending per partition when counted, the leases of automatic membership, the footer. ``width``:
    the console's, so the member table drops its least important columns rather than cut a number."""
    now = now or datetime.now(UTC)
    parts: list[RenderableType] = [Text(_title(status), style="bold")]
    left_out: list[str] = []
    if status.members:
        table, left_out = _fitting_members_table(status, now, width)
        parts.append(table)
    else:
        parts.append(Text("no members or mappings defined", style="yellow"))
    per_partition = _per_partition(status)
    if per_partition:
        parts.append(Text(f"pending by partition: {per_partition}"))
    if _unassigned(status):
        parts.append(Text(_unassigned_text(status), style="yellow"))
    parts += [Text(line, style="bold red") for line in stuck_lines(status)]
    parts += [Text(line, style="yellow") for line in dead_letter_lines(status)]
    pins = _pins_table(status, instances, now)
    if pins is not None:
        parts.append(pins)
    if status.leases:
        parts.append(_leases_table(status))
    if status.pools:
        parts.extend(Text(line) for line in _pool_summary(status))
        if _worker_rows(status):
            parts.append(_workers_table(status))
    parts.append(Text(_footer(status), style="dim"))
    if left_out:
        parts.append(
            Text(
                f"left out to fit {width} columns: {', '.join(left_out)} (a wider terminal, or --json, shows them)",
                style="dim",
            )
        )
    return Group(*parts)


WORKER_COLUMNS = ("MEMBER", "WORKER", "CAPACITY", "BUSY", "HANDLED")


def _dispatching(status: GroupStatus) -> list[dict]:
    """One pool per dispatching member: its pinned instance's view (pcgroups.pool._dispatcher), or, with nobody pinned, the
    first instance's (its standbys see the same workers; --json shows every instance)."""
    chosen: dict[str, dict] = {}
    for p in status.pools:  # the pinned ones first (pcgroups.status)
        chosen.setdefault(str(p.get("member")), p)
    return list(chosen.values())


def _worker_rows(status: GroupStatus) -> list[list[str]]:
    """A row per worker of each dispatching member."""
    return [
        [
            str(p.get("member")),
            str(w.get("name")) + (" (stopping)" if w.get("stopping") else ""),
            str(w.get("capacity", 0)),
            str(w.get("busy", 0)),
            str(w.get("handled", 0)),
        ]
        for p in _dispatching(status)
        for w in p.get("workers") or []
    ]


def _pool_summary(status: GroupStatus) -> list[str]:
    """One line per dispatching member: its workers' slots, messages at them, messages waiting."""
    return [
        f"member {p.get('member')} dispatches to {len(p.get('workers') or [])} worker(s): "
        f"{p.get('in_flight', 0)} of {p.get('slots', 0)} slots busy, {p.get('waiting', 0)} messages waiting"
        for p in _dispatching(status)
    ]


def _workers_table(status: GroupStatus) -> Table:
    table = new_table("workers (consume --dispatch)")
    for name in WORKER_COLUMNS:
        table.add_column(name.lower(), justify="left" if name in ("MEMBER", "WORKER") else "right")
    for row in _worker_rows(status):
        table.add_row(*row)
    return table


def _lease_rows(status: GroupStatus) -> list[list[str]]:
    return [
        [
            x.member,
            x.instance,
            x.host or "-",
            str(x.pid) if x.pid else "-",
            getattr(x, "pin", "") or "standby",
            f"{x.expires_in:.1f}s",
        ]
        for x in status.leases
    ]


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=False)).rstrip() for r in rows]


def plain_lines(
    status: GroupStatus, *, instances: Mapping[str, str] | None = None, now: datetime | None = None
) -> list[str]:
    """Aligned plain columns (for pipes): a row per member with its totals and its pin (PIN-ID, and the
    instance holding it when known), a row per partition when pending is counted per partition."""
    now = now or datetime.now(UTC)
    holders = _holders(status)
    rows = [[plain for _, plain, _ in MEMBER_COLUMNS] + ["PIN-ID", "HELD-BY"]]
    for m in status.members:
        pin = m.pinned_id or ""
        rows.append([*_member_cells(m, now), pin or "-", _pin_holder(pin, instances, holders) if pin else "-"])
    lines = [_title(status), *_aligned(rows)]
    if _per_partition(status) or _unassigned(status):
        exact = bool(_per_partition(status))
        prows = [["PARTITION", "MEMBER", "PENDING"]]
        prows += [
            [str(p.partition), p.member or "-", _num(p.pending) if exact or p.member is None else "-"]
            for p in status.partitions
        ]
        lines += _aligned(prows)
    lines += stuck_lines(status)
    lines += dead_letter_lines(status)
    lines.append(_footer(status))
    if status.leases:
        lines += ["leases (automatic membership):", *_aligned([LEASE_COLUMNS, *_lease_rows(status)])]
    if status.pools:
        lines += _pool_summary(status)
        if _worker_rows(status):
            lines += _aligned([list(WORKER_COLUMNS), *_worker_rows(status)])
    return lines


def _write(console: Console, text: str) -> None:
    console.file.write(text + "\n")
    console.file.flush()


def render_status(
    status: GroupStatus,
    console: Console,
    json: bool = False,
    *,
    pretty: bool | None = None,
    instances: Mapping[str, str] | None = None,
) -> None:
    """Print ``status``: JSON (``json=True``), a rich table (``pretty``, default: the console is a
    terminal) or plain aligned lines. ``instances`` maps pin ids to instance names to show."""
    if json:
        _write(console, jsonlib.dumps(status.to_dict(), indent=2))
    elif console.is_terminal if pretty is None else pretty:
        console.print(status_table(status, instances=instances, width=console.width))
    else:
        _write(console, "\n".join(plain_lines(status, instances=instances)))


async def watch(
    fetch: Callable[[], Awaitable[GroupStatus]],
    console: Console,
    *,
    interval: float = 2.0,
    json: bool = False,
    pretty: bool | None = None,
    iterations: int | None = None,
    instances: Mapping[str, str] | None = None,
) -> int:
    """Refresh the status every ``interval`` seconds until cancelled (Ctrl-C) or ``iterations`` ran.

    On a terminal a live view is redrawn in place; otherwise each refresh prints a table (or one
    compact JSON line with ``json=True``). An error from ``fetch`` (group deleted, server gone)
    propagates. Returns the number of refreshes.
    """
    pretty = console.is_terminal if pretty is None else pretty
    n = 0
    if pretty and not json:
        from rich.live import Live

        with Live(console=console, auto_refresh=False, transient=False) as live:
            while iterations is None or n < iterations:
                status = await fetch()
                n += 1
                live.update(
                    Group(
                        status_table(status, instances=instances, width=console.width),
                        Text(f"refreshing every {interval:g}s, Ctrl-C to stop", style="dim"),
                    ),
                    refresh=True,
                )
                if iterations is not None and n >= iterations:
                    break
                await asyncio.sleep(interval)
        return n
    while iterations is None or n < iterations:
        status = await fetch()
        n += 1
        if json:
            _write(console, jsonlib.dumps(status.to_dict(), separators=(",", ":")))
        else:
            if n > 1:
                _write(console, "")
            _write(console, status.taken_at.isoformat(timespec="seconds").replace("+00:00", "Z"))
            _write(console, "\n".join(plain_lines(status, instances=instances)))
        if iterations is not None and n >= iterations:
            break
        await asyncio.sleep(interval)
    return n


# ---------------------------------------------------------------- the command


def run_status(
    rt: Runtime,
    status_of: Callable[..., Awaitable[GroupStatus]],
    stream: str,
    group: str,
    *,
    as_json: bool = False,
    watching: bool = False,
    interval: float = 2.0,
    **options: Any,
) -> int:
    """Run one ``status`` command (declared in cg/flavour.py): print once or watch; returns the exit
    code. ``status_of(nc, stream, group, api=, **options)`` is the flavour's library function
    (static's takes ``per_partition``). Ctrl-C ends a watch with 0; errors propagate to the caller."""
    from .output import out

    console, pretty = out.console, out.pretty

    async def main() -> int:
        async with rt.connection() as (nc, api):

            async def fetch() -> GroupStatus:
                return await status_of(nc, stream, group, api=api, **options)

            if watching:
                await watch(fetch, console, interval=interval, json=as_json, pretty=pretty)
            else:
                render_status(await fetch(), console, json=as_json, pretty=pretty)
        return 0

    try:
        return rt.run(main)
    except KeyboardInterrupt:
        return 0


__all__ = ["age", "plain_lines", "ranges", "render_status", "run_status", "status_table", "watch"]
