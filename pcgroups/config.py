"""Consumer group configs: typed dataclasses, Go-identical JSON, Go-like decoding and the reference's validation."""

from __future__ import annotations

import itertools
import json
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from .errors import ConfigError

T = TypeVar("T")

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_UINT64_MAX = 2**64 - 1

# ---------------------------------------------------------------------------------------------------------------------
# Encoding


_GO_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_GO_ESCAPE_RE = re.compile("[<>&\u2028\u2029\ud800-\udfff]")


def go_json(obj: Any) -> bytes:
    """Encode plain JSON data exactly as Go's encoding/json does, so stored values are byte-identical to the reference.

    No spaces, dict order kept, HTML characters and U+2028/U+2029 escaped, other non-ASCII as UTF-8 and any lone
    surrogate (invalid UTF-8 to Go) written as ``\\ufffd``.
    """
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return _GO_ESCAPE_RE.sub(lambda m: _GO_ESCAPES.get(m.group(), "\\ufffd"), text).encode()


def _q(text: str) -> str:
    """Quote a name for an error message (like Go's %q), so empty names and control characters stay visible."""
    return json.dumps(text, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------------------------------
# Decoding: Go's json.Unmarshal semantics (unknown fields ignored, names case-insensitive, null leaves the zero value)


class _Obj(list[tuple[str, Any]]):
    """A decoded JSON object as its ordered (key, value) pairs, so duplicate keys resolve as in Go (the last wins)."""


class _BadJSON(Exception):
    """Internal: what is wrong with a decoded value; from_json wraps it into a ConfigError."""


def _reject_constant(name: str) -> Any:
    """NaN and Infinity are not JSON (Go rejects them); Python's parser would accept them."""
    raise ValueError(f"invalid number {name}")


class _HugeInt:
    """An integer literal too long for int() (Python's digit limit): valid JSON, but never a valid field value."""

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("-"))


def _parse_int(text: str) -> int | _HugeInt:
    return int(text) if len(text) <= 4000 else _HugeInt(text)


_SURROGATE_RE = re.compile("[\ud800-\udfff]")


def _load(data: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON text as Go would: invalid UTF-8 becomes U+FFFD, NaN/Infinity are errors, objects keep all pairs."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data).decode("utf-8", errors="replace")
    elif not isinstance(data, str):
        raise _BadJSON(f"expected bytes or str, got {type(data).__name__}")
    try:
        return json.loads(data, object_pairs_hook=_Obj, parse_constant=_reject_constant, parse_int=_parse_int)
    except RecursionError:
        raise _BadJSON("too deeply nested") from None
    except ValueError as exc:  # JSONDecodeError, and int() digit limits
        raise _BadJSON(f"not valid JSON ({exc})") from None


def _show(value: Any) -> str:
    """Describe a decoded JSON value for an error message."""
    if isinstance(value, _HugeInt):
        return f"a {value.digits}-digit number"
    if isinstance(value, _Obj):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return f"the string {_q(value)}"
    return json.dumps(value)


def _fields(value: Any, path: str, names: tuple[str, ...]) -> dict[str, Any]:
    """The known fields of a JSON object, matched case-insensitively as Go does ('ſ' is s); others ignored."""  # noqa: RUF002 - the long s, as Go folds it
    if not isinstance(value, _Obj):
        raise _BadJSON(f"{path} must be an object, got {_show(value)}")
    found: dict[str, Any] = {}
    for key, item in value:
        folded = key.lower().replace("\u017f", "s")
        if folded in names:
            found[folded] = item
    return found


def _uint(value: Any, path: str) -> int:
    if value is None:
        return 0
    if type(value) is not int or value < 0:
        raise _BadJSON(f"{path} must be a non-negative integer, got {_show(value)}")
    if value > _UINT64_MAX:
        raise _BadJSON(f"{path} is too large: {value}")
    return value


def _int(value: Any, path: str) -> int:
    if value is None:
        return 0
    if type(value) is not int:
        raise _BadJSON(f"{path} must be an integer, got {_show(value)}")
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise _BadJSON(f"{path} is out of the 64-bit integer range: {value}")
    return value


def _str(value: Any, path: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise _BadJSON(f"{path} must be a string, got {_show(value)}")
    return _SURROGATE_RE.sub("\ufffd", value)


def _list(value: Any, path: str, item: Callable[[Any, str], T]) -> list[T] | None:
    """A JSON array decoded element-wise; None for null or absent (Go's nil slice)."""
    if value is None:
        return None
    if isinstance(value, _Obj) or not isinstance(value, list):
        raise _BadJSON(f"{path} must be an array, got {_show(value)}")
    return [item(x, f"{path}[{i}]") for i, x in enumerate(value)]


def _mapping(value: Any, path: str) -> MemberMapping:
    if value is None:
        return MemberMapping("", [])
    f = _fields(value, path, ("member", "partitions"))
    return MemberMapping(
        member=_str(f.get("member"), f"{path}.member"),
        partitions=_list(f.get("partitions"), f"{path}.partitions", _int) or [],
    )


def _partitioning_filter(value: Any, path: str) -> PartitioningFilter:
    if value is None:
        return PartitioningFilter("")
    f = _fields(value, path, ("filter", "partitioning_wildcards"))
    return PartitioningFilter(
        filter=_str(f.get("filter"), f"{path}.filter"),
        partitioning_wildcards=_list(f.get("partitioning_wildcards"), f"{path}.partitioning_wildcards", _int),
    )


def _decode(kind: str, data: bytes | str, build: Callable[[Any], T]) -> T:
    try:
        return build(_load(data))
    except _BadJSON as exc:
        raise ConfigError(f"invalid {kind} consumer group config JSON: {exc}") from None


# ---------------------------------------------------------------------------------------------------------------------
# Validation (orbit-pcgroups.md §1.6, same order and the reference's phrases first)


def _validate_max_members(max_members: Any) -> None:
    if type(max_members) is not int:
        raise ConfigError(f"the max number of members must be an int, got {type(max_members).__name__} {max_members!r}")
    if max_members < 1:
        raise ConfigError(f"the max number of members must be at least 1, got {max_members!r}")
    if max_members > _UINT64_MAX:  # Go's uint: a larger value could be written but never read back
        raise ConfigError(f"the max number of members must be at most {_UINT64_MAX}, got {max_members}")


#: The largest partition count the server's {{Partition(N,...)}} transform function accepts (a Go int32).
MAX_PARTITIONS = 2**31 - 1


def validate_partition_count(max_members: int) -> None:
    """Checked when a group is created (not on reads, which follow the reference): more partitions than the
    server's partition transform takes can never be used, by an elastic work queue or a static stream's transform."""
    if type(max_members) is int and max_members > MAX_PARTITIONS:
        raise ConfigError(
            f"the max number of members must be between 1 and {MAX_PARTITIONS} (the largest partition count the "
            f"server's partition transform takes), got {max_members}"
        )


def _validate_membership(max_members: int, members: list[str], mappings: list[MemberMapping]) -> None:
    """Check the membership: members are tolerated as they are; mappings must assign every partition exactly once."""
    if members and mappings:
        raise ConfigError("either members or member mappings must be provided, not both")
    if not mappings:
        return
    if not 1 <= len(mappings) <= max_members:
        raise ConfigError(
            "the number of member mappings must be between 1 and the max number of members: "
            f"got {len(mappings)} mappings for {max_members} members"
        )
    names: set[str] = set()
    seen: set[int] = set()
    for mapping in mappings:
        if mapping.member in names:
            raise ConfigError(f"member names must be unique: {_q(mapping.member)} is mapped more than once")
        names.add(mapping.member)
        for p in mapping.partitions:
            if type(p) is not int:
                raise ConfigError(f"partition numbers must be integers, got {p!r} for member {_q(mapping.member)}")
            if p in seen:
                raise ConfigError(f"partition numbers must be used only once: partition {p} is mapped more than once")
            seen.add(p)
            if not 0 <= p < max_members:
                raise ConfigError(
                    "partition numbers must be between 0 and one less than the max number of members: "
                    f"partition {p} is out of range, partitions must be between 0 and {max_members - 1}"
                )
    if len(seen) != max_members:
        missing = list(itertools.islice((p for p in range(max_members) if p not in seen), 10))
        listed = ", ".join(map(str, missing)) + (", ..." if max_members - len(seen) > len(missing) else "")
        which = f"partition {listed} is" if max_members - len(seen) == 1 else f"partitions {listed} are"
        raise ConfigError(
            "the number of unique partition numbers must be equal to the max number of members: "
            f"every partition must be assigned, {which} not"
        )


def _validate_partitioning_filter(pf: PartitioningFilter) -> None:
    if not pf.filter:
        raise ConfigError("partitioning filters must have a non-empty filter")
    tokens = pf.filter.split(".")
    stars = tokens.count("*")
    if stars == 0 and tokens[-1] != ">":
        raise ConfigError(
            "partitioning filters must have at least one * wildcard or end with > wildcard: "
            f"{_q(pf.filter)} has neither"
        )
    indexes = pf.partitioning_wildcards or []
    if len(indexes) > stars:
        raise ConfigError(
            "the number of partitioning wildcards must not be larger than the total number of * wildcards in the "
            f"filter: {len(indexes)} indexes for the {stars} * wildcards of {_q(pf.filter)}"
        )
    seen: set[int] = set()
    for index in indexes:
        if index in seen:
            raise ConfigError(
                f"partitioning wildcard indexes must be unique: {index} is listed twice for {_q(pf.filter)}"
            )
        seen.add(index)
        if type(index) is not int or not 1 <= index <= stars:
            raise ConfigError(
                "partitioning wildcard indexes must be between 1 and the number of * wildcards in the filter: "
                f"{index!r} is out of range 1..{stars} for {_q(pf.filter)}"
            )


# ---------------------------------------------------------------------------------------------------------------------
# The config types


@dataclass
class MemberMapping:
    """One member and the partitions it owns (mapping mode)."""

    member: str
    partitions: list[int]

    def to_obj(self) -> dict[str, Any]:
        """The JSON object as Go writes it (`partitions` has no omitempty)."""
        return {"member": self.member, "partitions": list(self.partitions)}


@dataclass
class PartitioningFilter:
    """An elastic filter and the 1-based indexes of its `*` tokens that are hashed (None/[]: the whole subject)."""

    filter: str
    partitioning_wildcards: list[int] | None = None

    def to_obj(self) -> dict[str, Any]:
        """The JSON object as Go writes it: None is `null` and [] is `[]` (no omitempty)."""
        wildcards = None if self.partitioning_wildcards is None else list(self.partitioning_wildcards)
        return {"filter": self.filter, "partitioning_wildcards": wildcards}


class _Membership:
    """What both config types say of their membership: ``members`` (balanced) or ``member_mappings``."""

    members: list[str]
    member_mappings: list[MemberMapping]

    def membership(self) -> list[str]:
        """The member names: the members, then the mapped members, de-duplicated (the order status shows)."""
        return list(dict.fromkeys([*self.members, *(m.member for m in self.member_mappings)]))

    def is_in_membership(self, name: str) -> bool:
        """True if the name is a member or has a mapping (ignoring truncation to max_members, as the reference)."""
        return name in self.members or any(m.member == name for m in self.member_mappings)

    @property
    def mode(self) -> str:
        """``balanced`` (members), ``mapped`` (member mappings) or ``empty`` (neither)."""
        return "balanced" if self.members else "mapped" if self.member_mappings else "empty"

    def _membership_obj(self) -> dict[str, Any]:
        """The membership's JSON fields as Go writes them (both omitempty)."""
        obj: dict[str, Any] = {}
        if self.members:
            obj["members"] = list(self.members)
        if self.member_mappings:
            obj["member_mappings"] = [m.to_obj() for m in self.member_mappings]
        return obj


@dataclass
class StaticConfig(_Membership):
    """A static group's config, stored in the `static-consumer-groups` bucket under `<stream>.<group>`."""

    max_members: int
    filters: list[str] = field(default_factory=list)
    members: list[str] = field(default_factory=list)
    member_mappings: list[MemberMapping] = field(default_factory=list)

    def to_json(self) -> bytes:
        """The stored JSON, byte-identical to the reference's."""
        obj: dict[str, Any] = {"max_members": self.max_members}
        if self.filters:
            obj["filters"] = list(self.filters)
        return go_json({**obj, **self._membership_obj()})

    @classmethod
    def from_json(cls, data: bytes | str) -> StaticConfig:
        """Decode (without validating) as Go's json.Unmarshal would; ConfigError on bad JSON or wrong types."""

        def build(value: Any) -> StaticConfig:
            if value is None:
                return cls(0)
            f = _fields(value, "the config", ("max_members", "filters", "members", "member_mappings"))
            return cls(
                max_members=_uint(f.get("max_members"), "max_members"),
                filters=_list(f.get("filters"), "filters", _str) or [],
                members=_list(f.get("members"), "members", _str) or [],
                member_mappings=_list(f.get("member_mappings"), "member_mappings", _mapping) or [],
            )

        return _decode("static", data, build)

    def validate(self) -> None:
        """Raise ConfigError unless the config passes the reference's rules (filters are not checked, as there)."""
        _validate_max_members(self.max_members)
        _validate_membership(self.max_members, self.members, self.member_mappings)


@dataclass
class ElasticConfig(_Membership):
    """An elastic group's config, stored in the `elastic-consumer-groups` bucket under `<stream>.<group>`."""

    max_members: int
    partitioning_filters: list[PartitioningFilter] | None = None
    max_buffered_msgs: int = 0
    max_buffered_bytes: int = 0
    members: list[str] = field(default_factory=list)
    member_mappings: list[MemberMapping] = field(default_factory=list)
    # written by automatic membership's rebalance, cleared by a membership change by hand: stored as
    # the extra field ``"automatic_membership":true`` (last; Go ignores it and drops it on a rewrite)
    automatic: bool = False

    def to_json(self) -> bytes:
        """The stored JSON, byte-identical to the reference's (note the singular `max_buffered_msg`), with
        ``automatic_membership`` last when set."""
        pfs = self.partitioning_filters
        obj: dict[str, Any] = {
            "max_members": self.max_members,
            "partitioning_filters": None if pfs is None else [pf.to_obj() for pf in pfs],
        }
        if self.max_buffered_msgs:
            obj["max_buffered_msg"] = self.max_buffered_msgs
        if self.max_buffered_bytes:
            obj["max_buffered_bytes"] = self.max_buffered_bytes
        extra = {"automatic_membership": True} if self.automatic else {}
        return go_json({**obj, **self._membership_obj(), **extra})

    @classmethod
    def from_json(cls, data: bytes | str) -> ElasticConfig:
        """Decode (without validating) as Go's json.Unmarshal would; ConfigError on bad JSON or wrong types."""
        names = (
            "max_members",
            "partitioning_filters",
            "max_buffered_msg",
            "max_buffered_bytes",
            "members",
            "member_mappings",
            "automatic_membership",
        )

        def build(value: Any) -> ElasticConfig:
            if value is None:
                return cls(0)
            f = _fields(value, "the config", names)
            return cls(
                max_members=_uint(f.get("max_members"), "max_members"),
                partitioning_filters=_list(f.get("partitioning_filters"), "partitioning_filters", _partitioning_filter),
                max_buffered_msgs=_int(f.get("max_buffered_msg"), "max_buffered_msg"),
                max_buffered_bytes=_int(f.get("max_buffered_bytes"), "max_buffered_bytes"),
                members=_list(f.get("members"), "members", _str) or [],
                member_mappings=_list(f.get("member_mappings"), "member_mappings", _mapping) or [],
                automatic=f.get("automatic_membership") is True,  # ours: anything else is no mark
            )

        return _decode("elastic", data, build)

    def validate(self) -> None:
        """Raise ConfigError unless the config passes the reference's rules: max_members, filters, then membership."""
        _validate_max_members(self.max_members)
        for name, value in (("messages", self.max_buffered_msgs), ("bytes", self.max_buffered_bytes)):
            if type(value) is not int or not _INT64_MIN <= value <= _INT64_MAX:  # Go's int64
                raise ConfigError(
                    f"the max number of buffered {name} must be a 64-bit integer (-1 or 0 for no limit), got {value!r}"
                )
        for pf in self.partitioning_filters or []:
            _validate_partitioning_filter(pf)
        _validate_membership(self.max_members, self.members, self.member_mappings)


def parse_static_config(data: bytes | str) -> StaticConfig:
    """Decode and validate a stored static config: what readers of the KV value use."""
    config = StaticConfig.from_json(data)
    config.validate()
    return config


def parse_elastic_config(data: bytes | str) -> ElasticConfig:
    """Decode and validate a stored elastic config: what readers of the KV value use."""
    config = ElasticConfig.from_json(data)
    config.validate()
    return config


# ---------------------------------------------------------------------------------------------------------------------
# Names and the CLI mapping syntax


_STRICT_NAME_RE = re.compile(r"[A-Za-z0-9_-]+")
_MAX_NAME_BYTES = 255  # the server's limit for stream and consumer names


def validate_name(kind: str, name: str) -> None:
    """Raise ConfigError unless ``name`` is usable as a ``kind`` name ("stream", "group" or "member").

    Group and member names end up in KV keys, stream and consumer names, so they are kept to ``[A-Za-z0-9_-]``;
    stream names may hold anything the server accepts except '.', '*', '>', '/', '\\', whitespace and control
    characters.
    """
    if not isinstance(name, str) or not name:
        shown = _q(name) if isinstance(name, str) else repr(name)
        raise ConfigError(f"invalid {kind} name {shown}: names must not be empty")
    if kind == "stream":
        bad = [c for c in name if c in ".*>/\\" or c.isspace() or unicodedata.category(c) == "Cc"]
        if bad:
            raise ConfigError(
                f"invalid stream name {_q(name)}: names may not contain '.', '*', '>', '/', '\\', whitespace or "
                f"control characters (found {_q(bad[0])})"
            )
    elif not _STRICT_NAME_RE.fullmatch(name):
        raise ConfigError(f"invalid {kind} name {_q(name)}: names may contain only letters, digits, '-' and '_'")
    if len(name.encode("utf-8", errors="surrogatepass")) > _MAX_NAME_BYTES:
        raise ConfigError(f"invalid {kind} name {_q(name)}: names may be at most {_MAX_NAME_BYTES} bytes long")


_PARTITION_RE = re.compile(r"\s*(-?)([0-9]+)\s*(?:-\s*([0-9]+)\s*)?")
#: The most partitions one range of a mapping (``0-4``) may name: more would not fit a config in the KV bucket.
MAX_RANGE = 1_000_000


def parse_mapping(text: str) -> MemberMapping:
    """Parse the CLI mapping syntax `member:p1,p2,...` (the reference's) where a partition may also be a range
    `a-b` (``m1:0-4,7``: 0, 1, 2, 3, 4 and 7), as every output prints them, with a clear error for bad input."""
    member, colon, rest = text.partition(":")
    usage = "mappings are written member:p1,p2,... with ranges allowed (for example m1:0,1 or m1:0-4,7)"
    if not colon:
        raise ConfigError(f"invalid member mapping {_q(text)}: missing ':'; {usage}")
    if not member:
        raise ConfigError(f"invalid member mapping {_q(text)}: the member name is empty; {usage}")
    if not rest.strip():
        raise ConfigError(f"invalid member mapping {_q(text)}: no partitions given; {usage}")
    partitions: list[int] = []
    for item in rest.split(","):
        match = _PARTITION_RE.fullmatch(item)
        if match is None:
            raise ConfigError(
                f"invalid member mapping {_q(text)}: partition {_q(item)} is not an integer or a range; {usage}"
            )
        if match.group(1):
            raise ConfigError(
                f"invalid member mapping {_q(text)}: partition {item.strip()} is negative, partitions are numbered from 0"
            )
        first = int(match.group(2))
        last = first if match.group(3) is None else int(match.group(3))
        if last < first:
            raise ConfigError(
                f"invalid member mapping {_q(text)}: range {item.strip()} goes down; write it {last}-{first}"
            )
        if last - first >= MAX_RANGE:
            raise ConfigError(
                f"invalid member mapping {_q(text)}: range {item.strip()} names more than {MAX_RANGE} partitions"
            )
        partitions.extend(range(first, last + 1))
    return MemberMapping(member, partitions)
