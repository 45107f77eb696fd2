"""What a membership change does, said to the user: who owns which partition before and after, which
partitions move, which members get nothing, and the mistakes that would otherwise pass silently.

- :func:`owners` / :func:`moves` / :func:`idle_members`: pure views of a config (static or elastic);
- :func:`check_unique`: a member named twice is refused before anything is written;
- :func:`warn_idle`: more members than partitions (on stderr, every output mode);
- :func:`say_created`: ``create``'s one line on a terminal;
- :func:`print_change`: after ``add``/``drop``/``create-mapping``/``delete-mapping``, a rich summary
  on a terminal (members before -> after, partitions moved); in a pipe the caller prints the
  reference's lines instead.

Nothing here connects; the library is imported only by the functions that use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .errors import CLIError, warn

if TYPE_CHECKING:
    from pcgroups.config import ElasticConfig, StaticConfig

    Config = StaticConfig | ElasticConfig


def owners(cfg: Config) -> dict[str, list[int]]:
    """member -> the partitions it owns (members that own nothing are left out)."""
    from pcgroups.partitions import member_partitions

    out = {}
    for m in cfg.membership():
        parts = member_partitions(
            max_members=cfg.max_members, members=cfg.members, member_mappings=cfg.member_mappings, member=m
        )
        if parts:
            out[m] = parts
    return out


def idle_members(cfg: Config) -> list[str]:
    """Members that own no partition (balanced groups keep only the first ``max_members`` names, sorted)."""
    owning = owners(cfg)
    return [m for m in cfg.membership() if m not in owning]


def moves(
    before: Mapping[str, Iterable[int]], after: Mapping[str, Iterable[int]]
) -> list[tuple[str | None, str | None, list[int]]]:
    """(from member, to member, partitions) for every partition whose owner changed, grouped by the pair
    and ordered by partition; None: no owner."""
    a = {p: m for m, ps in before.items() for p in ps}
    b = {p: m for m, ps in after.items() for p in ps}
    grouped: dict[tuple[str | None, str | None], list[int]] = {}
    for p in sorted(set(a) | set(b)):
        if a.get(p) != b.get(p):
            grouped.setdefault((a.get(p), b.get(p)), []).append(p)
    return [(src, dst, ps) for (src, dst), ps in grouped.items()]


def describe_moves(found: Sequence[tuple[str | None, str | None, list[int]]]) -> str:
    """``2 e1 -> e2; 4 5 e2 -> e3`` (``none`` when nothing moved)."""
    if not found:
        return "none"
    return "; ".join(f"{' '.join(map(str, ps))} {src or 'nobody'} -> {dst or 'nobody'}" for src, dst, ps in found)


def check_unique(members: Sequence[str]) -> None:
    """Refuse a member named twice (the library would quietly keep one)."""
    seen: set[str] = set()
    for m in members:
        if m in seen:
            raise CLIError(f"member {m} is given twice: name each member once")
        seen.add(m)


def warn_idle(kind: str, group: str, cfg: Config) -> None:
    """More members than partitions: say which members get nothing."""
    idle = idle_members(cfg)
    if not idle:
        return
    n = len(cfg.membership())
    what = "get" if len(idle) > 1 else "gets"
    extra = " (a static group never rebalances)" if kind == "static" else " until a member leaves"
    warn(
        f"{n} members for {cfg.max_members} partitions in {kind} consumer group {group}: "
        f"{' '.join(idle)} {what} no partition{extra}"
    )


def membership_words(cfg: Config) -> str:
    """``members m1 m2``, ``m1 0-4, m2 5-9`` (mappings) or ``no members yet``: a group's membership in words."""
    from .output import ranges

    if cfg.members:
        return f"member{'s' if len(cfg.members) > 1 else ''} {' '.join(cfg.members)}"
    if cfg.member_mappings:
        return "mapped " + ", ".join(f"{m.member} {ranges(m.partitions)}" for m in cfg.member_mappings)
    return "no members yet"


def say_created(
    kind: str, stream: str, group: str, cfg: Config, *, existed: bool, by: str = "", after: str = ""
) -> None:
    """In a terminal, the one line that says a ``create`` did what was asked (a pipe stays silent, as the
    reference's is): ``by`` what it partitions, ``after`` the membership."""
    from .output import out

    if out.pretty:
        what = "already exists as asked" if existed else "created"
        out.styled(
            f"{kind} consumer group {group} on stream {stream} {what}: {cfg.max_members} partitions"
            f"{by}, {membership_words(cfg)}{after}",
            "green",
        )


def print_change(
    kind: str, stream: str, group: str, done: str, before: Config, after: Config, *, note: str | None = None
) -> None:
    """A terminal's summary of a change (:func:`change_summary`)."""
    from .output import out

    out.print(*change_summary(kind, stream, group, done, before, after, note=note))


def change_summary(
    kind: str, stream: str, group: str, done: str, before: Config, after: Config, *, note: str | None = None
) -> list[Any]:
    """What was done, the members before -> after, the partitions that moved (from -> to), the members
    left with no partition: rich renderables."""
    from rich.table import Table
    from rich.text import Text

    from .output import ranges
    from .output import table as new_table

    parts: list[Any] = [Text(f"{kind} consumer group {group} on stream {stream}: {done}", style="bold")]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    grid.add_row("members", f"{' '.join(before.membership()) or 'none'} -> {' '.join(after.membership()) or 'none'}")
    found = moves(owners(before), owners(after))
    moved = sum(len(ps) for _, _, ps in found)
    grid.add_row("moved", f"{moved} of {after.max_members} partitions" if moved else "no partition")
    parts.append(grid)
    if found:
        table = new_table()
        table.add_column("from", no_wrap=True)
        table.add_column("to", no_wrap=True)
        table.add_column("partitions", overflow="fold")
        for src, dst, ps in found:
            table.add_row(src or Text("nobody", style="dim"), dst or Text("nobody", style="dim"), ranges(ps))
        parts.append(table)
    idle = idle_members(after)
    if idle:
        parts.append(Text(f"no partition: {' '.join(idle)}", style="yellow"))
    if note:
        parts.append(Text(note, style="dim"))
    return parts


def print_members_line(add: bool, result: Sequence[str], mappings: Any | None) -> None:
    """The reference's lines after ``add``/``drop`` (and ``--sticky``'s mappings)."""
    from .output import go_list, go_mappings, out

    out.line(f"{'added' if add else 'dropped'} members: {go_list(result)}")
    if mappings is not None:
        out.line(f"member mapping: {go_mappings(mappings)}")


__all__ = [
    "change_summary",
    "check_unique",
    "describe_moves",
    "idle_members",
    "moves",
    "owners",
    "print_change",
    "print_members_line",
    "warn_idle",
]
