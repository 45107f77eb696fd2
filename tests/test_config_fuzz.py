"""Hypothesis fuzzing of config decoding and validation.

* Decoding anything (bytes, JSON-like text with odd numbers, duplicate keys and deep nesting,
  arbitrary JSON values, near-miss configs) raises nothing but ConfigError.
* Validation agrees with a small independent model of the reference's rules (docs/DESIGN.md), including
  which rule fails first.
* Configs whose fields are in range round-trip: encode -> decode gives the same config, and the JSON
  is Go's (no spaces, `<`, `>`, `&` escaped).
* The CLI's mapping syntax and the name rules agree with their own models.

Example counts are kept so the whole file runs in a few seconds.
"""

from __future__ import annotations

import json
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pcgroups.config import (
    ElasticConfig,
    MemberMapping,
    PartitioningFilter,
    StaticConfig,
    parse_elastic_config,
    parse_mapping,
    parse_static_config,
    validate_name,
)
from pcgroups.errors import ConfigError

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
UINT64_MAX = 2**64 - 1
INT64 = (-(2**63), 2**63 - 1)

# ---------------------------------------------------------------------------------------------------------------------
# Decoding never raises anything but ConfigError


def _decode_all(data) -> None:
    for decode in (StaticConfig.from_json, ElasticConfig.from_json, parse_static_config, parse_elastic_config):
        try:
            cfg = decode(data)
        except ConfigError as e:
            assert str(e)  # a message, never an empty error
            continue
        if decode in (parse_static_config, parse_elastic_config):
            cfg.validate()  # what parse returns is valid


_numbers = st.sampled_from(
    [
        "0",
        "-0",
        "1e3",
        "1.0",
        "-1",
        "18446744073709551615",
        "18446744073709551616",
        "9223372036854775808",
        "-9223372036854775809",
        "1" * 5000,
        "NaN",
        "Infinity",
        "0x10",
        "01",
        "1e999",
        "-",
    ]
)
_json_text = st.recursive(
    _numbers | st.sampled_from(["null", "true", "false", '""', '"\\ud800"', '"\\u0000"', '"<>&"']),
    lambda children: (
        st.lists(children, max_size=4).map(lambda xs: "[" + ",".join(xs) + "]")
        | st.lists(
            st.tuples(
                st.sampled_from(
                    [
                        '"max_members"',
                        '"MAX_MEMBERS"',
                        '"members"',
                        '"member_mappings"',
                        '"partitioning_filters"',
                        '"filters"',
                        '"max_buffered_msg"',
                        '"max_buffered_bytes"',
                        '"member"',
                        '"partitions"',
                        '"filter"',
                        '"partitioning_wildcards"',
                        '"x"',
                        '"\\u017fmembers"',
                    ]
                ),
                children,
            ),
            max_size=5,
        ).map(lambda kv: "{" + ",".join(f"{k}:{v}" for k, v in kv) + "}")
    ),
    max_leaves=16,
)


@FUZZ
@given(st.binary(max_size=200))
def test_decoding_bytes_raises_only_config_errors(data):
    _decode_all(data)


@FUZZ
@given(_json_text, st.sampled_from(["", " ", "x", "\n", "}"]))
def test_decoding_json_like_text_raises_only_config_errors(text, tail):
    _decode_all(text.encode() + tail.encode())
    _decode_all(text)


def test_decoding_deeply_nested_and_wrong_argument_types():
    for data in (b"[" * 100_000, b'{"members":' + b"[" * 50_000 + b"]" * 50_000 + b"}", b"\x00", "\ud800"):
        _decode_all(data)
    for wrong in (None, 42, ["x"], {"max_members": 1}):
        _decode_all(wrong)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=10,
)
_near = {  # values close to valid ones for each known field
    "max_members": st.integers(-3, 8) | st.sampled_from([UINT64_MAX, UINT64_MAX + 1, 2.0, "2", True]),
    "members": st.lists(st.sampled_from(["m1", "m2", "", 7, None]), max_size=4),
    "filters": st.lists(st.sampled_from(["foo.*", ">", 3, None]), max_size=3),
    "member_mappings": st.lists(
        st.fixed_dictionaries(
            {
                "member": st.sampled_from(["m1", "m2", 5, None]),
                "partitions": st.lists(st.integers(-2, 8) | st.sampled_from([1.5, "1", None]), max_size=4) | st.none(),
            }
        ),
        max_size=3,
    )
    | _json_values,
    "partitioning_filters": st.lists(
        st.fixed_dictionaries(
            {
                "filter": st.sampled_from(["a.*", "a.>", "", "a", 1, None]),
                "partitioning_wildcards": st.none() | st.lists(st.integers(-1, 3) | st.just("1"), max_size=3),
            }
        ),
        max_size=3,
    )
    | _json_values,
    "max_buffered_msg": st.integers(INT64[0] - 1, INT64[1] + 1) | _json_values,
    "max_buffered_bytes": st.integers(-5, 5) | _json_values,
}


@FUZZ
@given(_json_values | st.fixed_dictionaries({}, optional=_near))
def test_decoding_json_values_raises_only_config_errors(value):
    _decode_all(json.dumps(value).encode())


# ---------------------------------------------------------------------------------------------------------------------
# Validation agrees with an independent model of the rules (docs/DESIGN.md), rule by rule


def model_membership(n: int, members: list, mappings: list) -> str | None:
    """The first broken rule's name, or None when the membership is valid."""
    if members and mappings:
        return "both"
    if not mappings:
        return None  # members are never checked
    if not 1 <= len(mappings) <= n:
        return "count"
    names: list[str] = []
    used: list[int] = []
    for m in mappings:
        if m.member in names:
            return "unique-names"
        names.append(m.member)
        for p in m.partitions:
            if p in used:
                return "once"
            used.append(p)
            if p < 0 or p >= n:
                return "range"
    return None if len(used) == n else "all-assigned"  # distinct and in range: all of 0..n-1 iff n of them


def model_filter(f: str, wildcards: list | None) -> str | None:
    if f == "":
        return "filter-empty"
    tokens = f.split(".")
    stars = len([t for t in tokens if t == "*"])
    if stars == 0 and tokens[len(tokens) - 1] != ">":
        return "filter-wildcard"
    indexes = wildcards or []
    if len(indexes) > stars:
        return "too-many-indexes"
    for i, k in enumerate(indexes):
        if k in indexes[:i]:
            return "duplicate-index"
        if not 1 <= k <= stars:
            return "index-range"
    return None


def model_static(cfg: StaticConfig) -> str | None:
    if not 1 <= cfg.max_members <= UINT64_MAX:
        return "max"
    return model_membership(cfg.max_members, cfg.members, cfg.member_mappings)


def model_elastic(cfg: ElasticConfig) -> str | None:
    if not 1 <= cfg.max_members <= UINT64_MAX:
        return "max"
    if not (INT64[0] <= cfg.max_buffered_msgs <= INT64[1] and INT64[0] <= cfg.max_buffered_bytes <= INT64[1]):
        return "buffered"
    for pf in cfg.partitioning_filters or []:
        broken = model_filter(pf.filter, pf.partitioning_wildcards)
        if broken:
            return broken
    return model_membership(cfg.max_members, cfg.members, cfg.member_mappings)


PHRASES = {  # the reference's phrase that names each rule
    "max": "the max number of members must be",
    "buffered": "the max number of buffered",
    "both": "either members or member mappings must be provided, not both",
    "count": "the number of member mappings must be between 1 and the max number of members",
    "unique-names": "member names must be unique",
    "once": "partition numbers must be used only once",
    "range": "partition numbers must be between 0 and one less than the max number of members",
    "all-assigned": "the number of unique partition numbers must be equal to the max number of members",
    "filter-empty": "partitioning filters must have a non-empty filter",
    "filter-wildcard": "partitioning filters must have at least one * wildcard or end with > wildcard",
    "too-many-indexes": "the number of partitioning wildcards must not be larger than the total number of * wildcards",
    "duplicate-index": "partitioning wildcard indexes must be unique",
    "index-range": "partitioning wildcard indexes must be between 1 and the number of * wildcards",
}


def check_against_model(cfg, broken: str | None) -> None:
    try:
        cfg.validate()
    except ConfigError as e:
        assert broken is not None, f"rejected a valid config {cfg}: {e}"
        assert str(e).startswith(PHRASES[broken]), (broken, str(e), cfg)
    else:
        assert broken is None, f"accepted {cfg}, which breaks {broken}"


_member_names = st.sampled_from(["m1", "m2", "m3", "", "é"])
_mappings = st.lists(st.builds(MemberMapping, _member_names, st.lists(st.integers(-2, 7), max_size=5)), max_size=5)
_max = st.integers(-2, 6) | st.sampled_from([UINT64_MAX, UINT64_MAX + 1])


@st.composite
def _membership_parts(draw) -> tuple[list[str], list[MemberMapping]]:
    """Members, mappings, both, or neither; mappings are often a near-valid assignment of a few partitions."""
    members = draw(st.lists(_member_names, max_size=4)) if draw(st.booleans()) else []
    if draw(st.booleans()):
        return members, []
    if draw(st.booleans()):
        return members, draw(_mappings)
    n = draw(st.integers(1, 5))
    order = draw(st.permutations(range(n)))
    cut = draw(st.integers(0, n))
    mappings = [MemberMapping("m1", order[:cut]), MemberMapping("m2", order[cut:])]
    return members, draw(st.sampled_from([mappings, mappings[:1], [mappings[0], MemberMapping("m1", [])]]))


@FUZZ
@given(_max, _membership_parts(), st.lists(st.sampled_from(["foo.*", "", ">"]), max_size=2))
def test_static_validation_agrees_with_the_model(n, parts, filters):
    members, mappings = parts
    cfg = StaticConfig(n, filters, members, mappings)
    check_against_model(cfg, model_static(cfg))


@st.composite
def _filters(draw) -> PartitioningFilter:
    """Filters of a few tokens; indexes near the filter's own `*` count (in range, out of range, repeated)."""
    tokens = draw(st.lists(st.sampled_from(["a", "*", "*", ">", "", "b*"]), min_size=1, max_size=4))
    stars = tokens.count("*")
    indexes = st.lists(st.integers(-1, stars + 1) | st.integers(1, max(stars, 1)), max_size=stars + 1)
    return PartitioningFilter(".".join(tokens), draw(st.none() | indexes))


_buffered = st.sampled_from([0, -1, 1000, INT64[0], INT64[1], INT64[0] - 1, INT64[1] + 1])


@FUZZ
@given(_max, _membership_parts(), st.none() | st.lists(_filters(), max_size=3), _buffered, _buffered)
def test_elastic_validation_agrees_with_the_model(n, parts, pfs, msgs, size):
    members, mappings = parts
    cfg = ElasticConfig(n, pfs, msgs, size, members, mappings)
    check_against_model(cfg, model_elastic(cfg))


@FUZZ
@given(_max, _membership_parts(), st.none() | st.lists(_filters(), max_size=3))
def test_stored_configs_decode_and_validate_as_the_model_says(n, parts, pfs):
    """The same through JSON: what parse_* accepts from a stored value is what the model accepts."""
    members, mappings = parts
    n = min(n, UINT64_MAX)  # a larger value is a decoding error ("too large"), not a validation one
    for cfg, parse, model in (
        (StaticConfig(n, [], members, mappings), parse_static_config, model_static),
        (ElasticConfig(n, pfs, 0, 0, members, mappings), parse_elastic_config, model_elastic),
    ):
        data = json.dumps(json.loads(cfg.to_json())).encode()  # spaces: a different writer
        negative = n < 0
        try:
            parsed = parse(data)
        except ConfigError as e:
            assert negative or model(cfg) is not None, (cfg, str(e))
        else:
            assert model(cfg) is None and parsed == cfg


# ---------------------------------------------------------------------------------------------------------------------
# Encode -> decode round trips, and the JSON is Go's


_text = st.text(max_size=6)  # no lone surrogates: Go writes those as U+FFFD, so they cannot round-trip
_any_static = st.builds(
    StaticConfig,
    st.integers(0, UINT64_MAX),
    st.lists(_text, max_size=3),
    st.lists(_text, max_size=3),
    st.lists(st.builds(MemberMapping, _text, st.lists(st.integers(*INT64), max_size=3)), max_size=3),
)
_any_elastic = st.builds(
    ElasticConfig,
    st.integers(0, UINT64_MAX),
    st.none()
    | st.lists(st.builds(PartitioningFilter, _text, st.none() | st.lists(st.integers(*INT64), max_size=3)), max_size=3),
    st.integers(*INT64),
    st.integers(*INT64),
    st.lists(_text, max_size=3),
    st.lists(st.builds(MemberMapping, _text, st.lists(st.integers(*INT64), max_size=3)), max_size=3),
)


def _go_shaped(data: bytes) -> None:
    text = data.decode()
    assert not re.search("[<>&]", text), text
    assert (
        json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
        == text.replace("\\u003c", "<").replace("\\u003e", ">").replace("\\u0026", "&")
        or "\\u2028" in text
        or "\\u2029" in text
        or "\\\\" in text
    )


@FUZZ
@given(_any_static)
def test_static_encode_decode_round_trips(cfg):
    """Any in-range config, valid or not, decodes back to itself (validation is a separate step)."""
    data = cfg.to_json()
    _go_shaped(data)
    assert StaticConfig.from_json(data) == cfg
    assert StaticConfig.from_json(data).to_json() == data
    assert list(json.loads(data)) == [
        k for k in ("max_members", "filters", "members", "member_mappings") if k == "max_members" or getattr(cfg, k)
    ]


@FUZZ
@given(_any_elastic)
def test_elastic_encode_decode_round_trips(cfg):
    data = cfg.to_json()
    _go_shaped(data)
    assert ElasticConfig.from_json(data) == cfg
    assert ElasticConfig.from_json(data).to_json() == data
    keys = list(json.loads(data))
    assert keys[:2] == ["max_members", "partitioning_filters"]
    assert ("max_buffered_msg" in keys) == bool(cfg.max_buffered_msgs)


# ---------------------------------------------------------------------------------------------------------------------
# The CLI's mapping syntax and names


@FUZZ
@given(st.text(alphabet="m1:,- 2x\t.\u00a0\x1c٣", max_size=12) | st.text(max_size=12))
def test_parse_mapping_agrees_with_its_model(text):
    member, colon, rest = text.partition(":")

    def number(part: str) -> bool:
        return part.strip().isascii() and part.strip().isdigit()

    def partitions(item: str) -> list[int] | None:  # a number, or a range a-b with a <= b
        ends = [e.strip() for e in item.split("-")]
        if len(ends) == 1 and number(ends[0]):
            return [int(ends[0])]
        if len(ends) == 2 and number(ends[0]) and number(ends[1]) and int(ends[0]) <= int(ends[1]):
            return list(range(int(ends[0]), int(ends[1]) + 1))
        return None

    items = [partitions(i) for i in rest.split(",")]
    ok = bool(colon and member and rest.strip() and all(p is not None for p in items))
    try:
        mapping = parse_mapping(text)
    except ConfigError as e:
        assert not ok, (text, str(e))
        assert "invalid member mapping" in str(e) and (
            "member:p1,p2,..." in str(e) or "partitions are numbered from 0" in str(e) or "goes down" in str(e)
        ), str(e)
    else:
        assert ok, text
        assert mapping == MemberMapping(member, [p for ps in items for p in ps or []])


@FUZZ
@given(
    st.sampled_from(["group", "member", "stream"]), st.text(max_size=10) | st.text(alphabet="ab-_.*> \t/", max_size=6)
)
def test_names_agree_with_their_model(kind, name):
    if kind == "stream":
        ok = (
            bool(name)
            and not re.search(r"[.*>/\\\s]", name)
            and all(ord(c) >= 32 and not 0x7F <= ord(c) < 0xA0 for c in name)
        )
    else:
        ok = bool(re.fullmatch(r"[A-Za-z0-9_-]+", name))
    ok = ok and len(name.encode("utf-8", "surrogatepass")) <= 255
    try:
        validate_name(kind, name)
    except ConfigError as e:
        assert not ok, (kind, name, str(e))
        assert str(e).startswith(f"invalid {kind} name ")
    else:
        assert ok, (kind, name)
