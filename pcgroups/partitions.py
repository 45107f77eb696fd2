"""Partition arithmetic for both group kinds: assignment, filter subjects, transforms and hashing (pure, no I/O)."""

from __future__ import annotations

from typing import Any

from .config import ElasticConfig, MemberMapping, StaticConfig
from .errors import ConfigError

#: The most filter subjects one member's consumer gets (one per partition and filter): they travel in one JetStream
#: API request, which must fit the server's max_payload (1 MB by default).
MAX_MEMBER_FILTERS = 20_000

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def fnv1a32(data: bytes) -> int:
    """32-bit FNV-1a, the hash nats-server's `partition()` transform uses."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def balanced_assignment(members: list[str], max_members: int) -> dict[str, list[int]]:
    """Each listed member's partitions under the reference's balanced distribution, ascending.

    Members are de-duplicated and sorted (code point order, which is UTF-8 byte order like Go's), the first
    `max_members` get contiguous blocks of N // n partitions and the leftover high partitions go one each to the first
    members; members cut off by `max_members` own nothing.
    """
    result: dict[str, list[int]] = {m: [] for m in members}
    ranked = sorted(dict.fromkeys(members))[: max(max_members, 0)]
    n = len(ranked)
    if n == 0:
        return result
    per = max_members // n
    for i in range(max_members):
        owner = ranked[i // per] if i < n * per else ranked[i - n * per]
        result[owner].append(i)
    return result


def _balanced_share(members: list[str], max_members: int, member: str, per_partition: int = 1) -> list[int]:
    """One member's partitions under :func:`balanced_assignment`, without walking every partition of the group;
    checked against MAX_MEMBER_FILTERS (``per_partition`` subjects each) before anything is built."""
    ranked = sorted(dict.fromkeys(members))[: max(max_members, 0)]
    if member not in ranked:
        return []
    n, k = len(ranked), ranked.index(member)
    per = max_members // n
    owned = (per + 1) if n * per + k < max_members else per
    _check_share(member, owned, max_members, per_partition)
    return list(range(k * per, (k + 1) * per)) + ([n * per + k] if owned > per else [])


def _check_share(member: str, owned: int, max_members: int, per_partition: int = 1) -> None:
    if owned * per_partition > MAX_MEMBER_FILTERS:
        raise ConfigError(
            f"member {member} would own {owned} of the group's {max_members} partitions, and its "
            f"consumer takes at most {MAX_MEMBER_FILTERS} filter subjects ({per_partition} per "
            f"partition): use fewer partitions (max_members) or more members"
        )


def _mapped(member_mappings: list[MemberMapping], member: str) -> list[int]:
    """The member's mapped partitions in mapping order, de-duplicated."""
    return list(dict.fromkeys(p for m in member_mappings if m.member == member for p in m.partitions))


def member_partitions(
    *, max_members: int, members: list[str], member_mappings: list[MemberMapping], member: str
) -> list[int]:
    """The partitions one member owns, ascending: balanced when there are members (they win), else from the mappings."""
    if members:
        return _balanced_share(members, max_members, member)
    return sorted(_mapped(member_mappings, member))


def partition_filters(
    *,
    max_members: int,
    members: list[str],
    member_mappings: list[MemberMapping],
    member: str,
    filters: list[str] | None,
) -> list[str]:
    """The member's consumer filter subjects (docs/DESIGN.md, *Wire contract*): `<p>.<filter>` per filter, then partition; or mapped `<p>.>`.

    Mapping mode ignores the filters and de-duplicates, which fixes the reference's duplicate subjects with several
    filters while giving its exact result with one filter or none.
    """
    if members:
        owned = _balanced_share(members, max_members, member, len(filters or [">"]))
        return [f"{p}.{f}" for f in (filters or [">"]) for p in owned]
    owned = _mapped(member_mappings, member)
    _check_share(member, len(owned), max_members)
    return [f"{p}.>" for p in owned]


def static_member_filters(cfg: StaticConfig, member: str) -> list[str]:
    """The filter subjects of a static member's consumer on the origin stream."""
    return partition_filters(
        max_members=cfg.max_members,
        members=cfg.members,
        member_mappings=cfg.member_mappings,
        member=member,
        filters=cfg.filters,
    )


def elastic_member_filters(cfg: ElasticConfig, member: str) -> list[str]:
    """The filter subjects of an elastic member's consumer on the work-queue stream (no filters: `<p>.>`)."""
    return partition_filters(
        max_members=cfg.max_members,
        members=cfg.members,
        member_mappings=cfg.member_mappings,
        member=member,
        filters=[pf.filter for pf in cfg.partitioning_filters or []],
    )


def check_member_filters(cfg: StaticConfig | ElasticConfig) -> None:
    """Each member's consumer takes at most MAX_MEMBER_FILTERS filter subjects, or a :class:`ConfigError` names the
    first that would not: a config is checked before it is written (a member could never consume under it)."""
    for member in cfg.membership():
        if isinstance(cfg, ElasticConfig):
            elastic_member_filters(cfg, member)
        else:
            static_member_filters(cfg, member)


def transform_destination(filter: str, wildcards: list[int] | None, max_members: int) -> str:
    """The work-queue source transform destination of a partitioning filter (the reference's getPartitioningTransformDest)."""
    tokens = filter.split(".")
    k = 0
    for i, token in enumerate(tokens):
        if token == "*":
            k += 1
            tokens[i] = f"{{{{Wildcard({k})}}}}"
    args = ",".join([str(max_members), *map(str, wildcards or [])])
    return f"{{{{Partition({args})}}}}." + ".".join(tokens)


def partition_of_subject(
    subject: str,
    max_members: int,
    wildcard_tokens: list[int] | None = None,
    filter: str | None = None,
) -> int:
    """The partition the server's transform gives `subject`, predicted client-side.

    Without indexes the whole subject is hashed (`{{Partition(N)}}`). With indexes, the subject tokens selected by them
    are concatenated with no separator and hashed: index k is the k-th `*` token of `filter`, or, with no filter, the
    k-th token of the subject (as for a `*.*`-style filter). The result is FNV-1a 32 modulo `max_members`.
    """
    if max_members < 1:
        raise ConfigError(f"the max number of members must be >= 1, got {max_members}")
    if not wildcard_tokens:
        return fnv1a32(subject.encode()) % max_members
    tokens = subject.split(".")
    positions = list(range(len(tokens))) if filter is None else [i for i, t in enumerate(filter.split(".")) if t == "*"]
    key = []
    for k in wildcard_tokens:
        if not 1 <= k <= len(positions) or positions[k - 1] >= len(tokens):
            raise ConfigError(f"wildcard index {k} does not select a token of subject {subject!r}")
        key.append(tokens[positions[k - 1]])
    return fnv1a32("".join(key).encode()) % max_members


def strip_partition(subject: str) -> tuple[int | None, str]:
    """Split a partitioned subject into its partition number (None if the first token is not one) and the rest.

    The rest is everything after the first `.`, or the whole subject when it has no `.` (what handlers see).
    """
    head, dot, rest = subject.partition(".")
    if not dot:
        return None, subject
    return (int(head) if head.isascii() and head.isdigit() else None), rest


def tokens_match(pattern: list[str], tokens: list[str]) -> bool:
    """A subject's ``tokens`` match a filter's ``pattern`` tokens (`*` one token, `>` one or more trailing)."""
    for i, p in enumerate(pattern):
        if p == ">":
            return len(tokens) > i
        if i >= len(tokens) or (p != "*" and p != tokens[i]):
            return False
    return len(tokens) == len(pattern)


def subjects_intersect(a: str, b: str) -> bool:
    """True if some subject matches both NATS subject filters (`*` one token, `>` one or more trailing tokens)."""
    ta, tb = a.split("."), b.split(".")
    for _i, (x, y) in enumerate(zip(ta, tb, strict=False)):
        if x == ">" or y == ">":
            return True  # the other has a token here, and `>` takes it and anything after it
        if x != y and x != "*" and y != "*":
            return False
    return len(ta) == len(tb)


def unmatched_filters(filters: list[str], stream_config: dict[str, Any]) -> list[str]:
    """The filters that can match no message of a stream whose subjects are known from its config.

    Only a plain stream is judged: one with `subjects` and no subject transform, sources or mirror (their stored
    subjects are not simply the configured ones); otherwise nothing is reported.
    """
    subjects = stream_config.get("subjects") or []
    if (
        not subjects
        or stream_config.get("subject_transform")
        or stream_config.get("sources")
        or stream_config.get("mirror")
    ):
        return []
    return [f for f in filters if not any(subjects_intersect(f, s) for s in subjects)]
