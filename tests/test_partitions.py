"""Partition arithmetic: the reference's balanced assignment, filter subjects, transforms and the server's hash."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pcgroups.config import ElasticConfig, MemberMapping, PartitioningFilter, StaticConfig
from pcgroups.elastic._sources import SourceStream, source_config
from pcgroups.errors import ConfigError
from pcgroups.partitions import (
    MAX_MEMBER_FILTERS,
    balanced_assignment,
    elastic_member_filters,
    fnv1a32,
    member_partitions,
    partition_filters,
    partition_of_subject,
    static_member_filters,
    strip_partition,
    transform_destination,
)
from tests.helpers.vectors import ADDED, VECTORS, elastic_from_cli, static_from_cli

# ---------------------------------------------------------------------------------------------------------------------
# Ref §9 TestBaseFunctions


def test_transform_destination_reference_example():
    assert transform_destination("foo.*.*.>", [1, 2], 4) == "{{Partition(4,1,2)}}.foo.{{Wildcard(1)}}.{{Wildcard(2)}}.>"


@pytest.mark.parametrize(
    ("pattern", "wildcards", "n", "dest"),
    [
        ("foo.*", [1], 10, "{{Partition(10,1)}}.foo.{{Wildcard(1)}}"),
        ("foo.>", [], 5, "{{Partition(5)}}.foo.>"),
        ("foo.>", None, 5, "{{Partition(5)}}.foo.>"),
        (">", None, 3, "{{Partition(3)}}.>"),
        ("src.a.*.*", [2, 1], 6, "{{Partition(6,2,1)}}.src.a.{{Wildcard(1)}}.{{Wildcard(2)}}"),
        ("*.x.*", [2], 2, "{{Partition(2,2)}}.{{Wildcard(1)}}.x.{{Wildcard(2)}}"),
    ],
)
def test_transform_destination(pattern, wildcards, n, dest):
    assert transform_destination(pattern, wildcards, n) == dest


TABLE = {
    6: {"m1": [0, 1], "m2": [2, 3], "m3": [4, 5]},
    7: {"m1": [0, 1, 6], "m2": [2, 3], "m3": [4, 5]},
    8: {"m1": [0, 1, 6], "m2": [2, 3, 7], "m3": [4, 5]},
}


@pytest.mark.parametrize("max_members", sorted(TABLE))
def test_reference_distribution_table(max_members):
    cfg = ElasticConfig(max_members, [PartitioningFilter("foo.*.*.>", [1, 2])], members=["m1", "m2", "m3"])
    for member, partitions in TABLE[max_members].items():
        assert elastic_member_filters(cfg, member) == [f"{p}.foo.*.*.>" for p in partitions]
        owned = member_partitions(max_members=max_members, members=cfg.members, member_mappings=[], member=member)
        assert owned == partitions
    assert balanced_assignment(["m3", "m1", "m2"], max_members) == TABLE[max_members]


# ---------------------------------------------------------------------------------------------------------------------
# Wire vectors: per-member consumer filter subjects and work-queue source transforms


@pytest.mark.parametrize("vector", VECTORS["static"], ids=lambda v: v["cli"][4])
def test_static_vector_consumers(vector):
    group, cfg = static_from_cli(vector["cli"])
    names = {m.member for m in cfg.member_mappings} | set(cfg.members)
    expected = {name: vector["consumers"].get(f"{group}-{name}", []) for name in names}
    assert {name: static_member_filters(cfg, name) for name in names} == expected
    assert static_member_filters(cfg, "nobody") == []


@pytest.mark.parametrize("vector", VECTORS["elastic"], ids=lambda v: v["cli"][3])
def test_elastic_vector_consumers_and_transforms(vector):
    _, cfg = elastic_from_cli(vector["cli"], vector["stdin"])
    (source,) = vector["stream_sources"]
    assert source == source_config(SourceStream(source["name"], tuple(cfg.partitioning_filters or ())), cfg.max_members)
    assert all(elastic_member_filters(cfg, m) == [] for m in ADDED)  # no members yet
    cfg.members = list(ADDED)
    assert {m: elastic_member_filters(cfg, m) for m in ADDED} == {m: vector["consumers"].get(m, []) for m in ADDED}


# ---------------------------------------------------------------------------------------------------------------------
# Filter subjects in mapping mode and edge cases


def test_mapping_filters_ignore_filters_and_deduplicate():
    mappings = [MemberMapping("m2", [2]), MemberMapping("m1", [3, 0, 3])]
    kwargs = dict(max_members=4, members=[], member_mappings=mappings, member="m1")
    assert partition_filters(**kwargs, filters=None) == ["3.>", "0.>"]
    assert partition_filters(**kwargs, filters=["foo.*", "bar.*"]) == ["3.>", "0.>"]  # the reference would repeat them
    assert member_partitions(**kwargs) == [0, 3]
    assert partition_filters(**{**kwargs, "member": "m3"}, filters=None) == []


def test_members_take_priority_over_mappings():
    kwargs = dict(max_members=2, members=["b", "a"], member_mappings=[MemberMapping("b", [0, 1])], member="b")
    assert member_partitions(**kwargs) == [1]
    assert partition_filters(**kwargs, filters=["x.*"]) == ["1.x.*"]


def test_no_members_no_mappings_owns_nothing():
    assert member_partitions(max_members=3, members=[], member_mappings=[], member="a") == []
    assert static_member_filters(StaticConfig(3, filters=["f"]), "a") == []


def test_elastic_without_filters():
    cfg = ElasticConfig(3, None, members=["a"])
    assert elastic_member_filters(cfg, "a") == ["0.>", "1.>", "2.>"]
    for c in (cfg, ElasticConfig(3, [])):
        assert source_config(SourceStream("s", tuple(c.partitioning_filters or ())), 3) == {
            "name": "s",
            "subject_transforms": [{"src": ">", "dest": "{{Partition(3)}}.>"}],
        }


# ---------------------------------------------------------------------------------------------------------------------
# Balanced assignment properties


_members = st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f", "g", "h", "é", "B", "a1"]), max_size=12)


@given(_members, st.integers(1, 40))
def test_every_partition_has_exactly_one_owner(members, max_members):
    owned = sorted(p for parts in balanced_assignment(members, max_members).values() for p in parts)
    assert owned == (list(range(max_members)) if members else [])


@given(_members, st.integers(1, 40))
def test_shares_differ_by_at_most_one_and_extras_own_nothing(members, max_members):
    result = balanced_assignment(members, max_members)
    assert set(result) == set(members)
    ranked = sorted(set(members))
    owners, extras = ranked[:max_members], ranked[max_members:]
    sizes = [len(result[m]) for m in owners]
    assert not sizes or max(sizes) - min(sizes) <= 1
    assert all(result[m] == [] for m in extras)
    assert all(parts == sorted(parts) for parts in result.values())


@given(_members, st.integers(1, 40), st.randoms(use_true_random=False))
def test_assignment_ignores_order_and_duplicates(members, max_members, rnd):
    shuffled = members + rnd.sample(members, k=len(members) // 2)
    rnd.shuffle(shuffled)
    assert balanced_assignment(shuffled, max_members) == balanced_assignment(members, max_members)


@given(_members, st.integers(1, 60), st.sampled_from(["a", "b", "é", "zz"]))
def test_one_members_share_is_its_part_of_the_whole_assignment(members, max_members, member):
    """member_partitions computes one share without walking the group's partitions: the same answer."""
    assert member_partitions(
        max_members=max_members, members=members, member_mappings=[], member=member
    ) == balanced_assignment(members, max_members).get(member, [])


def test_a_share_larger_than_a_consumer_takes_is_a_clear_error_at_once():
    """max_members up to 2^31-1 is valid, but one member's consumer takes one filter subject per partition (and
    filter) in one API request: beyond MAX_MEMBER_FILTERS a clear error, before anything is built."""
    with pytest.raises(
        ConfigError,
        match=r"member a would own 1000000000 of the group's 2000000000 partitions, "
        r"and its consumer takes at most 20000 filter subjects",
    ):
        partition_filters(max_members=2_000_000_000, members=["a", "b"], member_mappings=[], member="a", filters=None)
    with pytest.raises(ConfigError, match=r"at most 20000 filter subjects \(2 per partition\)"):
        partition_filters(
            max_members=30_000, members=["a", "b"], member_mappings=[], member="b", filters=["x.*", "y.*"]
        )
    assert (
        len(partition_filters(max_members=40_000, members=["a", "b"], member_mappings=[], member="b", filters=None))
        == MAX_MEMBER_FILTERS
    )
    with pytest.raises(ConfigError, match="member m would own 20001"):
        partition_filters(
            max_members=30_000,
            members=[],
            member="m",
            filters=None,
            member_mappings=[MemberMapping("m", list(range(20_001)))],
        )


def test_assignment_sorts_byte_wise():
    assert balanced_assignment(["b", "B", "é", "a"], 4) == {"B": [0], "a": [1], "b": [2], "é": [3]}


# ---------------------------------------------------------------------------------------------------------------------
# Hashing


def test_fnv1a32_vectors():
    assert fnv1a32(b"") == 0x811C9DC5
    assert fnv1a32(b"a") == 0xE40C292C
    assert fnv1a32(b"foobar") == 0xBF9CF968


def test_static_test_digits_split_by_parity():
    # the reference's TestStatic: `*.*` -> {{partition(2,2)}}...: odd digits land in partition 0, even digits in partition 1.
    for digit in range(10):
        assert fnv1a32(str(digit).encode()) % 2 == (0 if digit % 2 else 1)
        assert partition_of_subject(f"foo.{digit}", 2, [2], "*.*") == (0 if digit % 2 else 1)
        assert partition_of_subject(f"foo.{digit}", 2, [2]) == (0 if digit % 2 else 1)


@pytest.mark.parametrize(
    ("key", "partition"),
    [("k0", 0), ("k19", 0), ("k16", 1), ("k3", 1), ("k17", 2), ("k1", 9), ("k18", 9)],
)
def test_partition_matches_server_observation(key, partition):
    # Observed on nats-server: foo.* -> {{partition(10,1)}}.foo.{{wildcard(1)}} (nats-py-capabilities.md §1.1).
    assert partition_of_subject(f"foo.{key}", 10, [1], "foo.*") == partition


def test_partition_of_subject_forms():
    assert partition_of_subject("src.a.x.y", 6, [2, 1], "src.a.*.*") == fnv1a32(b"yx") % 6
    assert partition_of_subject("src.a.x.y", 6, [1, 2], "src.a.*.*") == fnv1a32(b"xy") % 6
    assert partition_of_subject("zz.q.r", 5) == fnv1a32(b"zz.q.r") % 5
    assert partition_of_subject("zz.q.r", 5, []) == fnv1a32(b"zz.q.r") % 5
    with pytest.raises(ValueError):
        partition_of_subject("foo.x", 2, [2], "foo.*")
    with pytest.raises(ValueError):
        partition_of_subject("foo", 0)


def test_strip_partition():
    assert strip_partition("3.foo.bar") == (3, "foo.bar")
    assert strip_partition("12.>") == (12, ">")
    assert strip_partition("foo") == (None, "foo")
    assert strip_partition("x.foo") == (None, "foo")
    assert strip_partition("3.") == (3, "")
