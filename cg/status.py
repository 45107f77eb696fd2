"""``cg static status`` / ``cg elastic status``: a group per partition, like Kafka's ``--describe``.

- :func:`render_status` prints one :class:`pcgroups.status.GroupStatus`: a rich table on a terminal,
  aligned plain columns into a pipe, one JSON document with ``json=True``.
- :func:`watch` refreshes it every ``interval`` seconds until Ctrl-C (a live view on a terminal; into
  a pipe a new table, or one compact JSON line, per refresh).
- :func:`run_status` runs the ``status`` command of either flavour (declared in cg/flavour.py).
"""

from __future__ import annotations

import asyncio
import json as jsonlib
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from pcgroups.status import GroupStatus

    from .runtime import Runtime

PLAIN_COLUMNS = ["PARTITION", "MEMBER", "ACTIVE", "PINNED-ID", "PINNED-SINCE", "PENDING", "ACK-PENDING",
                 "REDELIVERED", "ACK-FLOOR"]


# ---------------------------------------------------------------- formatting helpers


def age(since: datetime | None, now: datetime | None = None) -> str:
    """``3.2s``, ``4m05s``, ``2h03m`` since ``since`` (``-`` when unknown)."""
    if since is None:
        return "-"
    now = now or datetime.now(timezone.utc)
    s = max((now - since).total_seconds(), 0.0)
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


def _pin_label(pin: str | None, instances: Mapping[str, str] | None) -> str:
    if not pin:
        return "-"
    name = (instances or {}).get(pin)
    return f"{name} ({pin})" if name else pin


def _title(status: "GroupStatus") -> str:
    where = status.stream if status.flavour == "static" else f"{status.stream} (work queue {status.consumer_stream})"
    return (f"{status.flavour} consumer group {status.group} on stream {where}: "
            f"{status.max_members} partitions, {len(status.members)} members ({status.mode})")


def _footer(status: "GroupStatus") -> str:
    parts = [f"{status.messages} messages in {status.consumer_stream}, last sequence {status.last_seq}"]
    if status.source_lag is not None:
        parts.append(f"source lag {status.source_lag}")
    if any(p.member is not None and not p.pending_exact and p.pending is not None for p in status.partitions):
        parts.append("* pending of the member's partitions together (--per-partition counts each)")
    if status.flavour == "elastic":
        parts.append("pending: messages of the partition not yet acked")
    return "; ".join(parts)


# ---------------------------------------------------------------- rendering


def status_table(status: "GroupStatus", *, instances: Mapping[str, str] | None = None,
                 now: datetime | None = None) -> RenderableType:
    """The rich renderable of a status (title, partition table, member notes, footer)."""
    now = now or datetime.now(timezone.utc)
    table = Table(title=_title(status), title_justify="left", caption=_footer(status), caption_justify="left")
    for name, justify in (("partition", "right"), ("member", "left"), ("active", "left"),
                          ("pinned instance", "left"), ("pinned for", "right"), ("pending", "right"),
                          ("ack pending", "right"), ("redelivered", "right"), ("ack floor", "right")):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for p in status.partitions:
        if p.member is None:
            table.add_row(str(p.partition), Text("unassigned", style="yellow"), "", "", "",
                          _num(p.pending), "", "", "")
            continue
        active = Text("yes", style="green") if p.active else Text("no", style="red")
        pending = _num(p.pending) + ("" if p.pending_exact or p.pending is None else "*")
        table.add_row(str(p.partition), p.member, active,
                      Text(_pin_label(p.pinned_id, instances), style="cyan" if p.pinned_id else "dim"),
                      age(p.pinned_since, now), pending, _num(p.ack_pending), _num(p.redelivered),
                      _num(p.ack_floor))
    idle = [m.member for m in status.members if not m.partitions]
    parts: list[RenderableType] = [table]
    if idle:
        parts.append(Text(f"members with no partitions: {' '.join(idle)}", style="dim"))
    if status.leases:
        leases = Table(title="leases (automatic membership)", title_justify="left")
        for name, justify in zip(LEASE_COLUMNS, ("left", "left", "left", "right", "right")):
            leases.add_column(name.lower(), justify=justify, no_wrap=True)  # type: ignore[arg-type]
        for row in _lease_rows(status):
            leases.add_row(*row)
        parts.append(leases)
    return Group(*parts)


LEASE_COLUMNS = ["MEMBER", "INSTANCE", "HOST", "PID", "EXPIRES-IN"]


def _lease_rows(status: "GroupStatus") -> list[list[str]]:
    return [[x.member, x.instance, x.host or "-", str(x.pid) if x.pid else "-", f"{x.expires_in:.1f}s"]
            for x in status.leases]


def _aligned(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def plain_lines(status: "GroupStatus", *, instances: Mapping[str, str] | None = None,
                now: datetime | None = None) -> list[str]:
    """Aligned plain columns (for pipes), Kafka ``--describe`` style."""
    now = now or datetime.now(timezone.utc)
    rows = [PLAIN_COLUMNS]
    for p in status.partitions:
        if p.member is None:
            rows.append([str(p.partition), "-", "-", "-", "-", _num(p.pending), "-", "-", "-"])
            continue
        pending = _num(p.pending) + ("" if p.pending_exact or p.pending is None else "*")
        rows.append([str(p.partition), p.member, "yes" if p.active else "no", _pin_label(p.pinned_id, instances),
                     age(p.pinned_since, now), pending, _num(p.ack_pending), _num(p.redelivered),
                     _num(p.ack_floor)])
    lines = [_title(status), *_aligned(rows), _footer(status)]
    if status.leases:
        lines += ["leases (automatic membership):", *_aligned([LEASE_COLUMNS, *_lease_rows(status)])]
    return lines


def _write(console: Console, text: str) -> None:
    console.file.write(text + "\n")
    console.file.flush()


def render_status(status: "GroupStatus", console: Console, json: bool = False, *, pretty: bool | None = None,
                  instances: Mapping[str, str] | None = None) -> None:
    """Print ``status``: JSON (``json=True``), a rich table (``pretty``, default: the console is a
    terminal) or plain aligned lines. ``instances`` maps pin ids to instance names to show."""
    if json:
        _write(console, jsonlib.dumps(status.to_dict(), indent=2))
    elif console.is_terminal if pretty is None else pretty:
        console.print(status_table(status, instances=instances))
    else:
        _write(console, "\n".join(plain_lines(status, instances=instances)))


async def watch(fetch: Callable[[], Awaitable["GroupStatus"]], console: Console, *, interval: float = 2.0,
                json: bool = False, pretty: bool | None = None, iterations: int | None = None,
                instances: Mapping[str, str] | None = None) -> int:
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
                live.update(Group(status_table(status, instances=instances),
                                  Text(f"refreshing every {interval:g}s, Ctrl-C to stop", style="dim")),
                            refresh=True)
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


def run_status(rt: Runtime, status_of: Callable[..., Awaitable[GroupStatus]], stream: str, group: str, *,
               as_json: bool = False, watching: bool = False, interval: float = 2.0, **options: Any) -> int:
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


__all__ = ["age", "plain_lines", "render_status", "run_status", "status_table", "watch"]
