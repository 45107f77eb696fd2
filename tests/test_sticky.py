"""Sticky assignment (pure): exactly one owner per partition, shares within one, deterministic, a fixed
point, a join moves at most ceil(N/n) partitions (all to the joiner), a leave moves only the leaver's,
and no balanced assignment moves fewer partitions (brute force on small groups)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pcgroups.config import ElasticConfig, MemberMapping, PartitioningFilter
from pcgroups.elastic._sticky import (
    group_members,
    moved_partitions,
    previous_assignment,
    sticky_assignment,
    sticky_change,
    sticky_mappings,
)
from pcgroups.partitions import balanced_assignment

NAMES = ["a", "b", "c", "d", "e", "f", "g", "h", "m1", "m10", "m2", "auto-0f3a", "Z", "_x"]
names = st.sampled_from(NAMES)
lives = st.lists(names, max_size=10)
partitions_n = st.integers(1, 24)


@st.composite
def previous_maps(draw, n_max: int = 30):
    """Any previous state: members (live or not) with partitions, possibly overlapping or out of range."""
    members = draw(st.lists(names, max_size=8, unique=True))
    return {m: draw(st.lists(st.integers(-2, n_max), max_size=10)) for m in members}


@st.composite
def proper_previous(draw, n: int, pool: list[str]):
    """A previous state where each partition has at most one owner (or none)."""
    out: dict[str, list[int]] = {}
    for p in range(n):
        owner = draw(st.one_of(st.none(), st.sampled_from(pool)))
        if owner is not None:
            out.setdefault(owner, []).append(p)
    return out


def check_valid(n: int, live: list[str], result: dict[str, list[int]]) -> None:
    members = sorted(set(live))
    assert list(result) == members
    owned = [p for ps in result.values() for p in ps]
    if members:
        assert sorted(owned) == list(range(n)), "every partition exactly one owner"
    else:
        assert owned == []
    for ps in result.values():
        assert ps == sorted(ps)
    holders = [m for m in members if result[m]]
    assert len(holders) == min(len(members), n), "members beyond the partition count own nothing"
    shares = [len(result[m]) for m in holders]
    if shares:
        assert max(shares) - min(shares) <= 1, f"shares differ by more than one: {result}"


def owner_map(assignment: dict[str, list[int]]) -> dict[int, str]:
    return {p: m for m, ps in assignment.items() for p in ps}


# --- the walk-through --------------------------------------------------------------------------
def test_sarama_walk_through_exact_steps():
    """3 partitions; a, b, c, d join one at a time, then a leaves: its partition goes to the idle d."""
    steps = [
        (["a"], {"a": [0, 1, 2]}),
        (["a", "b"], {"a": [0, 1], "b": [2]}),
        (["a", "b", "c"], {"a": [0], "b": [2], "c": [1]}),
        (["a", "b", "c", "d"], {"a": [0], "b": [2], "c": [1], "d": []}),
        (["b", "c", "d"], {"b": [2], "c": [1], "d": [0]}),
    ]
    prev: dict[str, list[int]] = {}
    for live, expected in steps:
        prev = sticky_assignment(3, prev, live)
        assert prev == expected


def test_join_and_leave_moves_vs_balanced():
    """8 partitions, 1 -> 4 members and back: sticky moves the minimum; balanced (sorted blocks) more."""
    sticky_moves, balanced_moves = [], []
    prev_s: dict[str, list[int]] = {}
    prev_b: dict[str, list[int]] = {}
    for live in (["a"], ["a", "b"], ["a", "b", "c"], ["a", "b", "c", "d"], ["b", "c", "d"], ["c", "d"]):
        s = sticky_assignment(8, prev_s, live)
        b = {m: ps for m, ps in balanced_assignment(live, 8).items()}
        sticky_moves.append(len(moved_partitions(prev_s, s)))
        balanced_moves.append(len(moved_partitions(prev_b, b)))
        prev_s, prev_b = s, b
    print(
        f"\npartitions moved per step (8 partitions: +a +b +c +d -a -b): sticky {sticky_moves}, "
        f"balanced {balanced_moves}"
    )
    assert sticky_moves == [8, 4, 2, 2, 2, 3]
    assert sum(sticky_moves) <= sum(balanced_moves)


def test_edge_cases():
    assert sticky_assignment(4, {"a": [0, 1]}, []) == {}
    assert sticky_assignment(0, {}, ["a"]) == {"a": []}
    # more members than partitions: the previous owners keep theirs, newcomers idle
    assert sticky_assignment(2, {"z": [0], "y": [1]}, ["a", "y", "z"]) == {"a": [], "y": [1], "z": [0]}
    # overlapping / out-of-range input still gives a valid result (first claim in name order wins)
    assert sticky_assignment(3, {"b": [0, 0, 5], "a": [0, -1]}, ["a", "b"]) == {"a": [0, 1], "b": [2]}
    with pytest.raises(ValueError):
        sticky_assignment(-1, {}, ["a"])


# --- properties --------------------------------------------------------------------------------
@given(partitions_n, previous_maps(), lives)
def test_valid_for_any_input(n, previous, live):
    check_valid(n, live, sticky_assignment(n, previous, live))


@given(partitions_n, previous_maps(), lives, st.randoms(use_true_random=False))
def test_deterministic_independent_of_input_order(n, previous, live, rnd):
    expected = sticky_assignment(n, previous, live)
    shuffled_live = live + live[: len(live) // 2]
    rnd.shuffle(shuffled_live)
    items = list(previous.items())
    rnd.shuffle(items)
    shuffled_prev = {m: rnd.sample(ps, len(ps)) for m, ps in items}
    assert sticky_assignment(n, shuffled_prev, shuffled_live) == expected


@given(partitions_n, previous_maps(), lives)
def test_fixed_point(n, previous, live):
    once = sticky_assignment(n, previous, live)
    assert sticky_assignment(n, once, live) == once
    assert moved_partitions(once, sticky_assignment(n, {m: ps for m, ps in once.items() if ps}, live)) == []


@given(partitions_n, previous_maps(), lives, names)
def test_join_moves_at_most_ceil_n_over_members_all_to_the_joiner(n, start, live, joiner):
    live = sorted(set(live))
    assume(joiner not in live)
    before = sticky_assignment(n, start, live)
    after = sticky_assignment(n, before, [*live, joiner])
    check_valid(n, [*live, joiner], after)
    moved = moved_partitions(before, after)
    owners = min(len(live) + 1, n)
    assert len(moved) <= math.ceil(n / owners)
    assert all(owner_map(after)[p] == joiner for p in moved), "a join only gives partitions to the joiner"
    if len(live) >= n:
        assert moved == [], "a joiner beyond the partition count idles"
    elif live:
        assert len(moved) == len(after[joiner]) >= n // owners


@given(partitions_n, previous_maps(), lives.filter(bool), st.data())
def test_leave_moves_only_the_leavers_partitions(n, start, live, data):
    live = sorted(set(live))
    leaver = data.draw(st.sampled_from(live))
    before = sticky_assignment(n, start, live)
    rest = [m for m in live if m != leaver]
    after = sticky_assignment(n, before, rest)
    check_valid(n, rest, after)
    moved = moved_partitions(before, after)
    if rest:
        assert moved == before[leaver]
    else:
        assert after == {}


@given(partitions_n, previous_maps(), st.lists(st.tuples(st.booleans(), names), max_size=12))
def test_sequences_of_joins_and_leaves_stay_valid_and_bounded(n, start, ops):
    live: list[str] = []
    state = sticky_assignment(n, start, live)
    for join, name in ops:
        if join == (name in live):
            continue
        new_live = sorted(set(live) | {name}) if join else [m for m in live if m != name]
        new = sticky_assignment(n, state, new_live)
        check_valid(n, new_live, new)
        moved = moved_partitions(state, new)
        if join:
            assert len(moved) <= math.ceil(n / min(len(new_live), n))
        elif new_live:
            assert moved == state.get(name, [])
        state, live = new, new_live


def _balanced_candidates(n: int, live: list[str]):
    """Every balanced assignment of n partitions to the live members (brute force)."""
    owners = min(len(live), n)
    for choice in itertools.product(live, repeat=n):
        counts = [choice.count(m) for m in live]
        holders = [c for c in counts if c]
        if len(holders) == owners and max(holders) - min(holders) <= 1:
            yield {p: m for p, m in enumerate(choice)}


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 5), st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=4, unique=True), st.data()
)
def test_no_balanced_assignment_moves_fewer(n, live, data):
    previous = data.draw(proper_previous(n, ["a", "b", "c", "d", "gone"]))
    ours = owner_map(sticky_assignment(n, previous, live))
    prev = owner_map(previous)
    best = min(sum(1 for p in range(n) if cand[p] != prev.get(p)) for cand in _balanced_candidates(n, sorted(live)))
    assert sum(1 for p in range(n) if ours[p] != prev.get(p)) == best


# --- mappings for the config --------------------------------------------------------------------
def test_sticky_mappings_from_balanced_members_and_from_mappings():
    cfg = ElasticConfig(
        max_members=6, partitioning_filters=[PartitioningFilter("foo.*", [1])], members=["m1", "m2", "m3"]
    )
    # previous = the balanced assignment m1 0,1 m2 2,3 m3 4,5; m3 leaves and m4 joins
    mappings = sticky_mappings(cfg, ["m4", "m2", "m1"])
    assert mappings == [MemberMapping("m1", [0, 1]), MemberMapping("m2", [2, 3]), MemberMapping("m4", [4, 5])]
    cfg2 = ElasticConfig(max_members=6, member_mappings=mappings)
    cfg2.validate()
    assert previous_assignment(cfg2) == {"m1": [0, 1], "m2": [2, 3], "m4": [4, 5]}
    # more members than partitions: the idle ones are left out of the mappings
    small = ElasticConfig(max_members=2, member_mappings=[MemberMapping("b", [0, 1])])
    out = sticky_mappings(small, ["a", "b", "c"])
    assert out == [MemberMapping("a", [1]), MemberMapping("b", [0])]
    ElasticConfig(max_members=2, member_mappings=out).validate()
    assert sticky_mappings(small, []) == []


@given(partitions_n, lives, st.booleans(), previous_maps())
def test_sticky_mappings_always_validate(n, live, balanced, previous):
    if balanced:
        cfg = ElasticConfig(max_members=n, members=list(previous))
    else:
        mappings = sticky_mappings(ElasticConfig(max_members=n), list(previous))
        cfg = ElasticConfig(max_members=n, member_mappings=mappings)
    out = sticky_mappings(cfg, live)
    assert all(m.partitions for m in out)
    assert [m.member for m in out] == sorted(m.member for m in out)
    ElasticConfig(max_members=n, member_mappings=out).validate()


def test_sticky_change_for_cli_add_and_drop():
    cfg = ElasticConfig(max_members=4, members=["m1", "m2"])  # balanced: m1 0,1  m2 2,3
    added = sticky_change(cfg, add=["m3"])
    assert added == [MemberMapping("m1", [0, 1]), MemberMapping("m2", [2]), MemberMapping("m3", [3])]
    cfg2 = ElasticConfig(max_members=4, member_mappings=added)
    assert group_members(cfg2) == ["m1", "m2", "m3"]
    assert sticky_change(cfg2, drop=["m1"]) == [MemberMapping("m2", [0, 2]), MemberMapping("m3", [1, 3])]
    assert sticky_change(cfg2, add=["m3", ""]) == added  # nothing new: nothing moves
    assert sticky_change(cfg2, drop=["m1", "m2", "m3"]) == []
