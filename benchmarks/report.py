"""The results table: rich on a terminal, plain text (also valid Markdown) otherwise."""

from __future__ import annotations

from .common import Result, Row


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if abs(value) < 10 else f"{value:.1f} s"
    if unit == "msg/s":
        return f"{value:,.0f} msg/s"
    if unit == "MiB":
        return f"{value:.1f} MiB"
    if abs(value) >= 100:
        return f"{value:,.0f}{(' ' + unit) if unit else ''}"
    return f"{value:.3g}{(' ' + unit) if unit else ''}"


def cells(res: Result, row: Row) -> list[str]:
    met = {True: "yes", False: "NO", None: "-"}[row.met]
    base = fmt(row.baseline, row.unit)
    if row.baseline_label:
        base = f"{base} ({row.baseline_label})"
    return [
        res.id,
        row.metric,
        fmt(row.value, row.unit),
        base,
        "-" if row.ratio is None else f"{row.ratio:.2f}",
        row.target or "-",
        met,
    ]


HEADER = ["id", "metric", "pcgroups", "baseline (same run)", "ratio", "target", "met"]


def markdown(results: list[Result]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for res in results:
        if res.error:
            lines.append(f"| {res.id} | {res.title} | error: {res.error} | | | | NO |")
        for row in res.rows:
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells(res, row)) + " |")
    return "\n".join(lines)


def render(results: list[Result], doc: dict, *, plain: bool) -> None:
    m = doc["machine"]
    head = (
        f"pcgroups benchmarks ({doc['size']}, {doc['seconds']:.0f}s): {m['nproc']} cores, "
        f"python {m['python']}, nats-py {m['nats_py']}, {m['nats_server']}"
    )
    summary = doc["summary"]
    tail = f"{summary['met']} met, {summary['missed']} missed, errors: {', '.join(summary['errors']) or 'none'}"
    if plain:
        print(head)
        print(markdown(results))
        print(tail)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=head, show_lines=False)
    for h in HEADER:
        table.add_column(h, overflow="fold")
    for res in results:
        if res.error:
            table.add_row(res.id, res.title, f"[red]error: {res.error}[/]", "", "", "", "[red]NO[/]")
        for row in res.rows:
            c = cells(res, row)
            c[-1] = {"yes": "[green]yes[/]", "NO": "[red]NO[/]"}.get(c[-1], c[-1])
            table.add_row(*c)
    console = Console()
    console.print(table)
    console.print(tail)
