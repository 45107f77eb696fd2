"""The demo's last screen: what each kill and membership change did (the hand-overs), then the checker's
counts with what they mean, the checks, and the verdict last, so that at 24 rows the verdict and its
figures (published, processed, redelivered, lost) are on the screen the demo ends with."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..output import ranges, table
from .script import ELASTIC_GROUP, STATIC_GROUP, DemoResult, Move

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

GROUP_NAMES = {"static": f"static {STATIC_GROUP}", "elastic": f"elastic {ELASTIC_GROUP}"}


def print_summary(console: Console, result: DemoResult, pinned_ttl: float | None) -> None:
    """The summary; into a pipe or a log without the spaces rich pads wrapped lines and titles with."""
    renderables = summary(result, pinned_ttl)
    if console.is_terminal:
        for renderable in renderables:
            console.print(renderable)
        return
    with console.capture() as cap:
        for renderable in renderables:
            console.print(renderable)
    console.file.write("".join(line.rstrip() + "\n" for line in cap.get().splitlines()))
    console.file.flush()


def _counts_table(result: DemoResult) -> Table:
    """What the checker found, a column per group (narrow: fits 80 columns with room to spare)."""
    from rich.text import Text

    counts = table("every handler call, checked")
    counts.add_column("", no_wrap=True)
    for flavour in result.reports:
        counts.add_column(GROUP_NAMES[flavour], justify="right", no_wrap=True)
    rows: list[tuple[str, Any]] = [
        ("published", lambda f, r: str(result.published.get(f, 0))),
        ("processed (acked)", lambda f, r: str(r.processed)),
        ("handler calls", lambda f, r: str(r.calls)),
        ("redelivered (allowed)", lambda f, r: f"{r.redelivered} (≤ {r.redelivery_bound})"),
        ("lost", lambda f, r: str(r.lost)),
        ("overlapping calls", lambda f, r: str(r.overlaps)),
        ("out of order", lambda f, r: str(r.order_violations)),
        ("result", lambda f, r: Text("PASS", style="bold green") if r.ok else Text("FAIL", style="bold red")),
    ]
    for name, cell in rows:
        counts.add_row(name, *(cell(f, r) for f, r in result.reports.items()))
    return counts


def _moves_table(result: DemoResult) -> Table:
    """Each kill and each partition moved by a membership change, with how long until it was handled again."""
    moved = table("failover and hand-over")
    for col, justify in (
        ("what", "left"),
        ("partitions", "left"),
        ("from", "left"),
        ("to", "left"),
        ("after", "right"),
    ):
        moved.add_column(col, justify=justify, no_wrap=col != "partitions", overflow="fold")  # type: ignore[arg-type]

    def took(after: float | None) -> str:
        return f"{after:.2f}s" if after is not None else "never"

    for t in result.takeovers:
        kind = t.what.split()[0]
        if not t.moves:
            what = f"SIGKILL pinned {t.what.split()[-1]}" if kind in ("static", "elastic") else t.what
            moved.add_row(what, ranges(t.partitions) if t.partitions else "all", t.victim, t.by or "-", took(t.after))
            continue
        pairs: dict[tuple[str | None, str | None], list[Move]] = {}
        for m in t.moves:
            pairs.setdefault((m.src, m.dst), []).append(m)
        for (src, dst), ms in pairs.items():
            by = " ".join(sorted({m.by for m in ms if m.by})) or dst or "-"
            done = None if any(m.after is None for m in ms) else max(m.after or 0.0 for m in ms)
            moved.add_row(t.what, ranges([m.partition for m in ms]), src or "-", by, took(done))
    return moved


def summary(result: DemoResult, pinned_ttl: float | None) -> list[Any]:
    """The demo's last screen: the hand-overs, then the counts, what they mean, the checks and the verdict."""
    from rich.text import Text

    kills = sum(1 for t in result.takeovers if not t.moves)
    changes = sum(1 for t in result.takeovers if t.moves)
    ttl = f" (PinnedTTL, {pinned_ttl:g}s)" if pinned_ttl else ""
    explain = Text(
        "handler calls = processed + redelivered: a redelivery is a message handled again, the one a killed "
        "instance was on or the one in flight on a moved partition, so up to one per kill or membership change "
        f"({kills} kills, {changes} changes here). A kill's takeover waits for its pin to expire{ttl}.",
        style="dim",
    )
    checks = [
        ("no loss", all(r.lost == 0 for r in result.reports.values())),
        ("order", all(r.order_violations == 0 for r in result.reports.values())),
        ("exclusivity", all(r.overlaps == 0 for r in result.reports.values())),
        ("redeliveries in bound", all(r.redeliveries_ok for r in result.reports.values())),
        ("takeovers", all(t.after is not None for t in result.takeovers if t.what.startswith(("static", "elastic")))),
    ]
    line = Text()
    for name, ok in checks:
        line.append("✔ " if ok else "✘ ", style="bold green" if ok else "bold red")
        line.append(name + "  ")
    line.rstrip()
    verdict = "PASS: every check passed" if result.exit_code == 0 else "FAIL: some checks failed"
    return [
        _moves_table(result),
        _counts_table(result),
        explain,
        line,
        *(Text(f"  {f}", style="red") for f in result.failures),
        Text(f"{verdict} ({result.elapsed:.1f}s)", style="bold green" if result.exit_code == 0 else "bold red"),
    ]
