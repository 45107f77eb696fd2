"""Sticky partition assignment (pure, no I/O): rebalance by moving as few partitions as possible.

Used by automatic membership (:mod:`pcgroups.elastic._membership`) and ``cg elastic add/drop --sticky``. The
result is written as an elastic group's ``member_mappings``, which Go members understand.

Rules, for ``N`` partitions and the live members ``L`` (de-duplicated):

- every partition has exactly one owner, a live member;
- ``n = min(|L|, N)`` members own partitions, ``N // n`` or ``N // n + 1`` each (shares differ by
  at most one); the others own nothing (more live members than partitions: the surplus idles);
- the previous owners are kept in preference, and each keeps as many of its partitions as its new
  share allows (the larger shares go to those that held the most); only the surplus, the partitions
  of members that left and unowned ones move. This is the fewest moves any balanced result allows, so
  from a balanced start a join moves at most ``ceil(N / n)`` partitions (only to the joiner) and a
  leave moves only the leaver's partitions;
- the result depends only on the inputs' contents (never on their order), and a balanced result is a
  fixed point: recomputing it for the same members changes nothing, so concurrent writers agree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..config import ElasticConfig, MemberMapping
from ..partitions import balanced_assignment

__all__ = [
    "group_members",
    "moved_partitions",
    "previous_assignment",
    "sticky_assignment",
    "sticky_change",
    "sticky_mappings",
]


def _owners(max_members: int, previous: Mapping[str, Iterable[int]]) -> dict[int, str]:
    """Partition -> previous owner. A partition claimed twice goes to the first member in name order;
    partitions out of range are ignored (so any input, even an invalid one, gives a valid result)."""
    owner: dict[int, str] = {}
    for member in sorted(previous):
        for p in sorted(set(previous[member])):
            if type(p) is int and 0 <= p < max_members and p not in owner:
                owner[p] = member
    return owner


def sticky_assignment(
    max_members: int, previous: Mapping[str, Iterable[int]], live: Iterable[str]
) -> dict[str, list[int]]:
    """The partitions of every live member (ascending; ``[]`` for an idle one), keys in name order.

    ``max_members`` is the number of partitions; ``previous`` the current owner -> partitions (any
    members, live or not; may be empty, partial or even overlapping); ``live`` the members that are up.
    """
    if type(max_members) is not int or max_members < 0:
        raise ValueError(f"the number of partitions must be a non-negative integer, got {max_members!r}")
    members = sorted(set(live))
    result: dict[str, list[int]] = {m: [] for m in members}
    if not members or max_members == 0:
        return result
    kept: dict[str, list[int]] = {m: [] for m in members}
    for p, m in sorted(_owners(max_members, previous).items()):
        if m in kept:
            kept[m].append(p)

    # Who owns partitions: every previous owner (there are at most N), then newcomers in name order.
    holders = [m for m in members if kept[m]]
    newcomers = [m for m in members if not kept[m]]
    selected = holders + newcomers[: max(0, max_members - len(holders))]
    n = len(selected)
    base, extra = divmod(max_members, n)
    # The larger shares go to those holding the most (fewest moves), ties by name.
    ranked = sorted(selected, key=lambda m: (-len(kept[m]), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(ranked)}

    pool: list[int] = []
    for m in members:
        if m in quota:
            keep, surplus = kept[m][: quota[m]], kept[m][quota[m] :]
            result[m] = keep
            pool.extend(surplus)
    taken = {p for ps in result.values() for p in ps}
    pool = sorted(set(pool) | {p for p in range(max_members) if p not in taken})
    # Hand out the free partitions, lowest first, to the members short of their share, in name order.
    i = 0
    for m in members:
        if m in quota:
            need = quota[m] - len(result[m])
            result[m] = sorted(result[m] + pool[i : i + need])
            i += need
    return result


def previous_assignment(cfg: ElasticConfig) -> dict[str, list[int]]:
    """The group's current owner -> partitions: its mappings, or the balanced assignment of its members."""
    if cfg.member_mappings:
        out: dict[str, list[int]] = {}
        for m in cfg.member_mappings:
            out.setdefault(m.member, []).extend(m.partitions)
        return out
    if cfg.members:
        return {m: ps for m, ps in balanced_assignment(cfg.members, cfg.max_members).items() if ps}
    return {}


def sticky_mappings(cfg: ElasticConfig, live: Iterable[str]) -> list[MemberMapping]:
    """The group's new ``member_mappings`` for the members ``live``, moving the fewest partitions.

    In member name order; members that own nothing are left out (the reference's validation requires
    every mapping to hold partitions). No live member gives ``[]`` (a group with no members).
    """
    assignment = sticky_assignment(cfg.max_members, previous_assignment(cfg), live)
    return [MemberMapping(m, ps) for m, ps in assignment.items() if ps]


def group_members(cfg: ElasticConfig) -> list[str]:
    """The group's members: its ``members`` (de-duplicated, idle ones included) and mapped members."""
    return cfg.membership()


def sticky_change(cfg: ElasticConfig, *, add: Iterable[str] = (), drop: Iterable[str] = ()) -> list[MemberMapping]:
    """The new ``member_mappings`` after adding and dropping members (``cg elastic add/drop --sticky``)."""
    dropped = set(drop)
    live = [m for m in dict.fromkeys([*group_members(cfg), *add]) if m and m not in dropped]
    return sticky_mappings(cfg, live)


def moved_partitions(before: Mapping[str, Iterable[int]], after: Mapping[str, Iterable[int]]) -> list[int]:
    """The partitions whose owner differs between two assignments (unowned counts as an owner)."""
    a = {p: m for m, ps in before.items() for p in ps}
    b = {p: m for m, ps in after.items() for p in ps}
    return sorted(p for p in set(a) | set(b) if a.get(p) != b.get(p))
