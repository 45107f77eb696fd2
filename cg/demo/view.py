"""What the demo shows while it runs: on a terminal a live view (each group's partitions with their owner,
pinned instance, rate, pending and acks; the instance processes; the latest events), elsewhere a progress
line every two seconds (the events are printed as they happen, :meth:`cg.demo.run.Demo.event`)."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from typing import TYPE_CHECKING

from ..output import table as new_table
from .script import (
    ELASTIC_GROUP,
    ELASTIC_PARTITIONS,
    ELASTIC_STREAM,
    KILL_ELASTIC_MEMBER,
    KILL_STATIC_MEMBER,
    STATIC_GROUP,
    STATIC_MEMBERS,
    STATIC_PARTITIONS,
    STATIC_STREAM,
)

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.table import Table
    from rich.text import Text

    from .run import Demo


class View:
    """The live view and progress lines of a :class:`~cg.demo.run.Demo`."""

    def __init__(self, demo: Demo) -> None:
        self.demo = demo
        self._last_progress = 0.0

    def rates(self, flavour: str, window: float = 2.0) -> dict[int, float]:
        now = time.time()
        rates: defaultdict[int, float] = defaultdict(float)
        for c in reversed(self.demo.recorders[flavour].calls):
            if c.start < now - window - 5:
                break
            if c.outcome == "ack" and c.end is not None and c.end >= now - window:
                rates[c.partition] += 1 / window
        return rates

    def _group_table(self, flavour: str, *, caption: bool = True) -> Table:
        from rich.text import Text

        from pcgroups.partitions import balanced_assignment

        d = self.demo
        if flavour == "static":
            title = f"static group {STATIC_GROUP} on {STATIC_STREAM}: members {' '.join(STATIC_MEMBERS)}"
            if not caption:
                title += " (* pending: per member)"
            owners = balanced_assignment(STATIC_MEMBERS, STATIC_PARTITIONS)
            n = STATIC_PARTITIONS
        else:
            title = f"elastic group {ELASTIC_GROUP} on {ELASTIC_STREAM}: members {' '.join(d.elastic_members) or '-'}"
            owners = balanced_assignment(d.elastic_members, ELASTIC_PARTITIONS)
            n = ELASTIC_PARTITIONS
        owner = {p: m for m, ps in owners.items() for p in ps}
        st = d.status.get(flavour)
        rates = self.rates(flavour)
        acked = d.acked[flavour]
        table = new_table(title)
        for col, just in (
            ("partition", "right"),
            ("member", "left"),
            ("pinned instance", "left"),
            ("msg/s", "right"),
            ("pending", "right"),
            ("acked", "right"),
        ):
            table.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
        for p in range(n):
            member = owner.get(p)
            pinned = d.pinned_worker(member) if member else None
            if member is None:
                pin_text = Text("-", style="dim")
            elif pinned is not None:
                standby = [w.name for w in d.workers.values() if w.member == member and w.alive and w is not pinned]
                pin_text = Text(pinned.name, style="bold cyan")
                if standby:
                    pin_text.append(f"  (standby {' '.join(standby)})", style="dim")
            else:
                waiting = [w.name for w in d.workers.values() if w.member == member and w.alive]
                pin_text = Text(
                    "waiting for the pin: " + " ".join(waiting) if waiting else "no instance", style="yellow"
                )
            pending = "-"
            if st is not None and p < len(st.partitions):
                row = st.partitions[p]
                if row.pending is not None:
                    pending = f"{row.pending}" + ("" if row.pending_exact else "*")
            rate = rates.get(p, 0) if pinned is not None else 0  # no pinned instance: nothing handles it now
            table.add_row(
                str(p),
                member or Text("unassigned", style="yellow"),
                pin_text,
                f"{rate:.0f}",
                pending,
                str(acked.get(p, 0)),
            )
        if flavour == "static" and caption:
            table.caption = "* pending: the member's partitions together"
            table.caption_justify = "left"
        return table

    def _instances_table(self) -> Table:
        from rich.text import Text

        d = self.demo
        table = new_table("instances (one process each)")
        for col in ("instance", "member", "pid", "state", "acked"):
            table.add_column(col, no_wrap=True)
        for w in d.workers.values():
            if w.state == "killed":
                state = Text("killed (SIGKILL)", style="bold red")
            elif not w.alive:
                state = Text(w.state, style="dim")
            elif w.pin:
                state = Text("pinned", style="bold cyan")
            elif w.flavour == "elastic" and w.member not in d.elastic_members:
                state = Text("not a member", style="dim")
            else:
                state = Text("standby", style="yellow")
            table.add_row(w.name, w.member, str(w.pid or "-"), state, str(d.acked[w.name][0]))
        return table

    def render(self) -> RenderableType:
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table
        from rich.text import Text

        d = self.demo
        plan = d.plan
        width, height = d.console.size
        header = Text()
        header.append("cg demo", style="bold")
        if d.server is not None and width >= 110:  # narrower: the first event says where it runs
            header.append(f"  nats-server {d.server.url}", style="dim")
        elif d.cluster is not None:
            up = " ".join(n.name if n.running else f"{n.name}(down)" for n in d.cluster.nodes)
            header.append(f"  3-node cluster: {up}", style="dim")
        header.append(f"  {d.elapsed():5.1f}s")
        if d.phase != "summary":  # the plan's bound: the run ends once the groups caught up
            header.append(f" (ends by {d.duration:g}s)", style="dim")
        if plan is not None:
            header.append(f"  {plan.rate:g} msg/s" if d.publishing else "  not publishing", style="dim")
        phases = d.phases
        current = phases.index(d.phase) if d.phase in phases else 0
        steps: Text | None = None
        if width < 110:  # the phase bar would wrap: the phase goes on the header line
            header.append(f"  phase {current + 1}/{len(phases)}: ", style="dim")
            header.append(d.phase, style="bold")
        else:
            steps = Text()
            for i, name in enumerate(phases):
                style = "green" if i < current else "bold reverse" if i == current else "dim"
                steps.append(f" {name} ", style=style)
                if i < len(phases) - 1:
                    steps.append("›", style="dim")  # noqa: RUF001 - the separator, as meant
        wide = width >= 150
        groups: RenderableType
        if wide:
            groups = Table.grid(padding=(0, 3))
            groups.add_row(self._group_table("static", caption=True), self._group_table("elastic"))
            used = 10
        else:
            groups = Group(self._group_table("static", caption=False), self._group_table("elastic"))
            used = 7 + 9
        used += 1 + (steps is not None)
        instances: RenderableType | None = self._instances_table()
        room = height - used - 1
        if not wide:
            if room - 10 >= 5:
                room -= 10
            else:  # a short terminal: the group tables and the events matter most
                instances = None
        panel = Panel(
            self._events_text(room - 2, width - 4 if not wide else width // 2), title="events", title_align="left"
        )
        parts: list[RenderableType] = [header, *([steps] if steps is not None else []), groups]
        if instances is not None and wide:
            bottom = Table.grid(padding=(0, 3))
            bottom.add_column(no_wrap=True)
            bottom.add_column(ratio=1)
            bottom.add_row(instances, panel)
            parts.append(bottom)
        else:
            if instances is not None:
                parts.append(instances)
            parts.append(panel)
        return Group(*parts)

    def _events_text(self, lines: int, width: int) -> Text:
        """The newest events that fit ``lines`` lines of ``width`` columns (a long event wraps)."""
        from rich.text import Text

        chosen: list[tuple[float, Text]] = []
        used = 0
        for t, text in reversed(self.demo.events):
            need = -(-(8 + len(text.plain)) // max(width, 20))
            if chosen and used + need > max(lines, 2):
                break
            chosen.append((t, text))
            used += need
        log = Text()
        for t, text in reversed(chosen):
            log.append(f"{t:6.1f}s  ", style="dim")
            log.append_text(text)
            log.append("\n")
        log.rstrip()
        return log if log.plain else Text("-")

    def progress_line(self) -> None:
        from rich.text import Text

        d = self.demo
        now = time.monotonic()
        if d.phase == "setup" or now - self._last_progress < 2.0:
            return
        self._last_progress = now
        parts = []
        for flavour in ("static", "elastic"):
            done = len(d.recorders[flavour].acked_keys())
            parts.append(f"{flavour} acked {done}/{len(d.expected[flavour])}")
        pinned = []
        for member in (KILL_STATIC_MEMBER, KILL_ELASTIC_MEMBER):
            w = d.pinned_worker(member)
            pinned.append(f"{member}→{w.name if w else '-'}")
        d.console.print(
            Text(f"[{d.elapsed():6.1f}s] {d.phase}: {', '.join(parts)}; pinned {' '.join(pinned)}"), soft_wrap=True
        )

    async def refresh_loop(self, live) -> None:
        while True:
            if live is not None:
                live.update(self.render(), refresh=True)
            else:
                self.progress_line()
            await asyncio.sleep(0.25)
