"""Configs: Go-identical JSON (wire vectors), Go-like decoding, the reference's validation, names and mappings."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pcgroups.config import (
    ElasticConfig,
    MemberMapping,
    PartitioningFilter,
    StaticConfig,
    go_json,
    parse_elastic_config,
    parse_mapping,
    parse_static_config,
    validate_name,
)
from pcgroups.errors import ConfigError
from tests.helpers.support import WIRE_VECTORS as VECTORS
from tests.helpers.vectors import ADDED, elastic_from_cli, static_from_cli

# ---------------------------------------------------------------------------------------------------------------------
# Wire vectors


@pytest.mark.parametrize("vector", VECTORS["static"], ids=lambda v: v["cli"][4])
def test_static_vector_json(vector):
    _, cfg = static_from_cli(vector["cli"])
    cfg.validate()
    kv = vector["kv"].encode()
    assert cfg.to_json() == kv
    assert StaticConfig.from_json(kv) == cfg
    assert StaticConfig.from_json(kv).to_json() == kv
    assert parse_static_config(kv) == cfg


@pytest.mark.parametrize("vector", VECTORS["elastic"], ids=lambda v: v["cli"][3])
def test_elastic_vector_json(vector):
    _, cfg = elastic_from_cli(vector["cli"], vector["stdin"])
    cfg.validate()
    kv = vector["kv"].encode()
    assert cfg.to_json() == kv
    assert ElasticConfig.from_json(kv) == cfg
    assert ElasticConfig.from_json(kv).to_json() == kv
    cfg.members = list(ADDED)
    after = vector["kv_after_add"].encode()
    assert cfg.to_json() == after
    assert parse_elastic_config(after) == cfg
    assert parse_elastic_config(after).to_json() == after


def test_go_html_escaping():
    expected = b'{"max_members":4,"filters":["\\u003e"],"members":["m1"]}'
    assert StaticConfig(4, filters=[">"], members=["m1"]).to_json() == expected
    assert b'"filters":["a\\u0026b","\\u003cx"]' in StaticConfig(1, filters=["a&b", "<x"]).to_json()


def test_go_json_other_characters():
    # Non-ASCII stays UTF-8; U+2028/9, control characters and lone surrogates are escaped as Go does.
    assert go_json(["é", "\u2028\u2029", "\x01\x1f\x7f", '\b\f\n\r\t"\\', "\ud800"]) == (
        '["é","\\u2028\\u2029","\\u0001\\u001f\x7f","\\b\\f\\n\\r\\t\\"\\\\","\\ufffd"]'.encode()
    )
    assert go_json({"b": 1, "a": [None, True, -5]}) == b'{"b":1,"a":[null,true,-5]}'


def test_elastic_json_null_and_empty_lists():
    none = ElasticConfig(2, partitioning_filters=[PartitioningFilter(">", None), PartitioningFilter("a.*", [])])
    assert none.to_json() == (
        b'{"max_members":2,"partitioning_filters":[{"filter":"\\u003e","partitioning_wildcards":null},'
        b'{"filter":"a.*","partitioning_wildcards":[]}]}'
    )
    assert ElasticConfig.from_json(none.to_json()) == none
    assert ElasticConfig(2, partitioning_filters=[]).to_json() == b'{"max_members":2,"partitioning_filters":[]}'
    assert ElasticConfig.from_json(b'{"max_members":2,"partitioning_filters":[]}').partitioning_filters == []
    assert ElasticConfig.from_json(b'{"max_members":2}').partitioning_filters is None


def test_mapping_json_shape():
    cfg = StaticConfig(2, member_mappings=[MemberMapping("m1", [1, 0])])
    assert cfg.to_json() == b'{"max_members":2,"member_mappings":[{"member":"m1","partitions":[1,0]}]}'


# ---------------------------------------------------------------------------------------------------------------------
# Decoding like Go's json.Unmarshal


def test_decode_ignores_unknown_fields_and_folds_case():
    assert StaticConfig.from_json(b'{"max_members":2,"x":' + b"9" * 5000 + b"}") == StaticConfig(2)
    cfg = StaticConfig.from_json('{"MAX_Members":3,"x":{"y":[1,2.5,null]},"Members":["a"],"memberſ":["b"]}')  # noqa: RUF001 - the long s
    # 'ſ' folds to 's' in Go; the last duplicate wins  # noqa: RUF003 - the long s
    assert cfg == StaticConfig(3, members=["b"])
    cfg = ElasticConfig.from_json(b'{"max_members":3,"MAX_BUFFERED_MSG":-1,"Max_Buffered_Bytes":7}')
    assert (cfg.max_buffered_msgs, cfg.max_buffered_bytes) == (-1, 7)
    assert ElasticConfig.from_json(b'{"max_members":3,"max_buffered_msgs":5}').max_buffered_msgs == 0


def test_decode_null_is_the_zero_value():
    assert StaticConfig.from_json(b"null") == StaticConfig(0)
    cfg = StaticConfig.from_json(b'{"max_members":null,"filters":null,"members":[null]}')
    assert cfg == StaticConfig(0, members=[""])
    mapped = StaticConfig.from_json(b'{"max_members":1,"member_mappings":[null,{"member":"a","partitions":null}]}')
    assert mapped.member_mappings == [MemberMapping("", []), MemberMapping("a", [])]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"max_members":-1}', "max_members must be a non-negative integer, got -1"),
        (b'{"max_members":1.5}', "max_members must be a non-negative integer, got 1.5"),
        (b'{"max_members":1e2}', "max_members must be a non-negative integer, got 100.0"),
        (b'{"max_members":"3"}', 'max_members must be a non-negative integer, got the string "3"'),
        (b'{"max_members":true}', "max_members must be a non-negative integer, got true"),
        (b'{"max_members":18446744073709551616}', "max_members is too large"),
        (b'{"max_members":2,"filters":"foo"}', 'filters must be an array, got the string "foo"'),
        (b'{"max_members":2,"members":{"a":1}}', "members must be an array, got an object"),
        (b'{"max_members":2,"members":[1]}', "members[0] must be a string, got 1"),
        (b'{"max_members":2,"member_mappings":[[]]}', "member_mappings[0] must be an object, got an array"),
        (
            b'{"max_members":2,"member_mappings":[{"partitions":[0.5]}]}',
            "member_mappings[0].partitions[0] must be an integer, got 0.5",
        ),
        (b'{"max_members":1' + b"0" * 5000 + b"}", "max_members must be a non-negative integer, got a 5001-digit"),
        (b'{"max_members":1,"members":[' + b"7" * 5000 + b"]}", "members[0] must be a string, got a 5000-digit"),
        (b"[1]", "the config must be an object, got an array"),
        (b"\xff\xfe", "not valid JSON"),
        (b"", "not valid JSON"),
        (b'{"max_members":2}x', "not valid JSON"),
        (b'{"max_members":NaN}', "not valid JSON"),
        (b"[" * 100_000, "too deeply nested"),
    ],
)
def test_static_decode_errors(data, message):
    with pytest.raises(ConfigError, match=r"^invalid static consumer group config JSON: ") as err:
        StaticConfig.from_json(data)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"max_members":2,"partitioning_filters":{}}', "partitioning_filters must be an array, got an object"),
        (b'{"max_members":2,"partitioning_filters":[{"filter":1}]}', "partitioning_filters[0].filter must be a string"),
        (
            b'{"max_members":2,"partitioning_filters":[{"filter":"a.*","partitioning_wildcards":"1"}]}',
            "partitioning_filters[0].partitioning_wildcards must be an array",
        ),
        (b'{"max_members":2,"max_buffered_msg":1.0}', "max_buffered_msg must be an integer, got 1.0"),
        (b'{"max_members":2,"max_buffered_bytes":9223372036854775808}', "max_buffered_bytes is out of the 64-bit"),
    ],
)
def test_elastic_decode_errors(data, message):
    with pytest.raises(ConfigError, match=r"^invalid elastic consumer group config JSON: ") as err:
        ElasticConfig.from_json(data)
    assert message in str(err.value)


def test_decode_invalid_utf8_and_surrogates_become_replacement_characters():
    cfg = StaticConfig.from_json(b'{"max_members":1,"members":["a\xffb","\\ud800"]}')
    assert cfg.members == ["a\ufffdb", "\ufffd"]
    assert StaticConfig.from_json(cfg.to_json()) == cfg


def test_parse_validates():
    with pytest.raises(ConfigError, match="the max number of members must be at least 1"):
        parse_static_config(b"{}")
    with pytest.raises(ConfigError, match="partitioning filters must have a non-empty filter"):
        parse_elastic_config(b'{"max_members":1,"partitioning_filters":[null]}')


# ---------------------------------------------------------------------------------------------------------------------
# Validation (the reference's TestBaseFunctions and validation rules, docs/DESIGN.md)


def _elastic(max_members: int, members=(), mappings: dict[str, list[int]] | list[tuple[str, list[int]]] = ()):
    items = mappings.items() if isinstance(mappings, dict) else mappings
    return ElasticConfig(
        max_members,
        partitioning_filters=[PartitioningFilter("foo.*", [1])],
        members=list(members),
        member_mappings=[MemberMapping(m, list(p)) for m, p in items],
    )


BASE_SEQUENCE = [
    (_elastic(2, members=["m1", "m2"]), None),
    (_elastic(2, members=["m1", "m2"], mappings={"m1": [0, 1]}), "either members or member mappings"),
    (_elastic(2, mappings={"m1": [0, 1]}), None),
    (_elastic(2, mappings={"m1": [1, 1]}), "partition numbers must be used only once"),
    (_elastic(2, mappings={"m1": [1]}), "the number of unique partition numbers must be equal"),
    (_elastic(2, mappings={"m1": [0, 1, 2]}), "partition numbers must be between 0 and one less"),
    (_elastic(2, mappings={"m1": [0, 2]}), "partition numbers must be between 0 and one less"),
    (_elastic(2, mappings=[("m1", [0]), ("m1", [1])]), "member names must be unique"),
    (_elastic(2, mappings={"m1": [0, 1], "m2": [0, 1]}), "partition numbers must be used only once"),
    (_elastic(2, mappings={"m1": [0, 1], "m2": [2, 3]}), "partition numbers must be between 0 and one less"),
    (_elastic(2, mappings={"m1": [0], "m2": [1]}), None),
    (_elastic(3, mappings={"m1": [0], "m2": [1]}), "the number of unique partition numbers must be equal"),
    (_elastic(3, mappings={"m1": [0, 2], "m2": [1, 2]}), "partition numbers must be used only once"),
    (_elastic(3, mappings={"m1": [0, 2], "m2": [1]}), None),
]


@pytest.mark.parametrize(("cfg", "error"), BASE_SEQUENCE)
def test_base_validation_sequence(cfg, error):
    static = StaticConfig(cfg.max_members, ["foo.*"], cfg.members, cfg.member_mappings)
    for config in (cfg, static):
        if error is None:
            config.validate()
        else:
            with pytest.raises(ConfigError, match=error):
                config.validate()


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (StaticConfig(0), "the max number of members must be at least 1, got 0"),
        (StaticConfig(-2), "the max number of members must be at least 1, got -2"),
        (
            StaticConfig(4, member_mappings=[MemberMapping("m1", [0, 5])]),
            "partition 5 is out of range, partitions must be between 0 and 3",
        ),
        (StaticConfig(4, member_mappings=[MemberMapping("m1", [0, -1])]), "partition -1 is out of range"),
        (StaticConfig(4, member_mappings=[MemberMapping("m1", [0, 2])]), "partitions 1, 3 are not"),
        (
            StaticConfig(4, member_mappings=[MemberMapping("m1", [0, 1, 2])]),
            "every partition must be assigned, partition 3 is not",
        ),
        (StaticConfig("10", members=["m1"]), "the max number of members must be an int, got str '10'"),  # type: ignore[arg-type]
        (
            StaticConfig(1, member_mappings=[MemberMapping("a", [0]), MemberMapping("b", [])]),
            "the number of member mappings must be between 1 and the max number of members: got 2 mappings for 1",
        ),
        (
            StaticConfig(2, member_mappings=[MemberMapping("a", [0]), MemberMapping("a", [1])]),
            'member names must be unique: "a" is mapped more than once',
        ),
    ],
)
def test_validation_messages(cfg, message):
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    assert message in str(err.value)


def test_members_are_not_validated():
    StaticConfig(2, members=["a", "a", "b", "c", ""]).validate()
    ElasticConfig(1, members=["x", "x", "y"]).validate()


def test_mapping_checks_run_in_listed_order():
    with pytest.raises(ConfigError, match="used only once"):
        StaticConfig(2, member_mappings=[MemberMapping("m1", [0, 1, 1, 7])]).validate()
    with pytest.raises(ConfigError, match="partition 7 is out of range"):
        StaticConfig(2, member_mappings=[MemberMapping("m1", [0, 7, 1, 1])]).validate()


@pytest.mark.parametrize(
    ("pf", "message"),
    [
        (PartitioningFilter(""), "partitioning filters must have a non-empty filter"),
        (PartitioningFilter("foo"), 'at least one * wildcard or end with > wildcard: "foo" has neither'),
        (PartitioningFilter("foo.>.bar"), "at least one * wildcard or end with > wildcard"),
        (PartitioningFilter("foo.*", [1, 2]), "must not be larger than the total number of * wildcards"),
        (PartitioningFilter("a.*.*", [2, 2]), "partitioning wildcard indexes must be unique: 2 is listed twice"),
        (PartitioningFilter("a.*.*", [0]), "must be between 1 and the number of * wildcards in the filter: 0 is out"),
        (PartitioningFilter("a.*.*", [3]), "3 is out of range 1..2"),
        (PartitioningFilter("a.>", [1]), "must not be larger"),
    ],
)
def test_partitioning_filter_rules(pf, message):
    with pytest.raises(ConfigError) as err:
        ElasticConfig(2, partitioning_filters=[pf]).validate()
    assert message in str(err.value)


@pytest.mark.parametrize(
    "pf",
    [
        PartitioningFilter("foo.>"),
        PartitioningFilter(">", []),
        PartitioningFilter("foo.*.*.>", [2, 1]),
        PartitioningFilter("*", None),
        PartitioningFilter("a.*.b.*", [2]),
    ],
)
def test_valid_partitioning_filters(pf):
    ElasticConfig(2, partitioning_filters=[pf]).validate()


def test_filters_are_checked_before_membership():
    mappings = [MemberMapping("a", [0, 1])]
    cfg = ElasticConfig(2, partitioning_filters=[PartitioningFilter("x")], members=["a"], member_mappings=mappings)
    with pytest.raises(ConfigError, match="partitioning filters must have"):
        cfg.validate()


def test_is_in_membership():
    assert StaticConfig(1, members=["a", "b"]).is_in_membership("b")
    assert StaticConfig(2, members=["a", "b", "c"]).is_in_membership("c")  # no truncation
    assert ElasticConfig(1, member_mappings=[MemberMapping("m", [0])]).is_in_membership("m")
    assert not ElasticConfig(1, members=["a"]).is_in_membership("m")


# ---------------------------------------------------------------------------------------------------------------------
# Names and mappings


@pytest.mark.parametrize(
    ("kind", "name"), [("member", "m1"), ("group", "G_2-x"), ("stream", "ORDERS-é:1"), ("stream", "a-b")]
)
def test_valid_names(kind, name):
    validate_name(kind, name)


@pytest.mark.parametrize(
    ("kind", "name", "message"),
    [
        ("member", "a.b", "invalid member name \"a.b\": names may contain only letters, digits, '-' and '_'"),
        ("group", "g=1", 'invalid group name "g=1": names may contain only'),
        ("member", "", 'invalid member name "": names must not be empty'),
        ("member", "é", "names may contain only"),
        ("stream", "a b", 'invalid stream name "a b": names may not contain'),
        ("stream", "a.b", "names may not contain"),
        ("stream", "a*", "names may not contain"),
        ("stream", "a>", "names may not contain"),
        ("stream", "a/b", "names may not contain"),
        ("stream", "a\\b", "names may not contain"),
        ("stream", "a\tb", "names may not contain"),
        ("stream", "a\x00b", "names may not contain"),
        ("stream", "x" * 256, "at most 255 bytes"),
    ],
)
def test_invalid_names(kind, name, message):
    with pytest.raises(ConfigError) as err:
        validate_name(kind, name)
    assert message in str(err.value)


def test_parse_mapping():
    assert parse_mapping("m1:0,1") == MemberMapping("m1", [0, 1])
    assert parse_mapping("m2:7") == MemberMapping("m2", [7])
    assert parse_mapping("m3: 2, 0") == MemberMapping("m3", [2, 0])
    # ranges, as every output prints partitions
    assert parse_mapping("m1:0-4") == MemberMapping("m1", [0, 1, 2, 3, 4])
    assert parse_mapping("m2:5-6,9, 7 - 8") == MemberMapping("m2", [5, 6, 9, 7, 8])
    assert parse_mapping("m3:3-3") == MemberMapping("m3", [3])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("m1", "missing ':'"),
        (":0,1", "the member name is empty"),
        ("m1:", "no partitions given"),
        ("m1:a", 'partition "a" is not an integer'),
        ("m1:1.5", 'partition "1.5" is not an integer'),
        ("m1:0,,1", 'partition "" is not an integer'),
        ("m1:-1", "partition -1 is negative"),
        ("m1:4-2", "range 4-2 goes down; write it 2-4"),
        ("m1:0-", 'partition "0-" is not an integer or a range'),
        ("m1:1-2-3", 'partition "1-2-3" is not an integer or a range'),
        ("m1:0-1000000", "range 0-1000000 names more than 1000000 partitions"),
    ],
)
def test_parse_mapping_errors(text, message):
    with pytest.raises(ConfigError) as err:
        parse_mapping(text)
    assert message in str(err.value)


# ---------------------------------------------------------------------------------------------------------------------
# Fuzzing: decode + validate only ever returns a valid config or raises ConfigError; valid configs round-trip


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
_keys = st.sampled_from(
    [
        "max_members",
        "MAX_MEMBERS",
        "filters",
        "members",
        "Members",
        "member_mappings",
        "partitioning_filters",
        "max_buffered_msg",
        "max_buffered_bytes",
        "other",
    ]
)
_plausible = (
    st.integers(-2, 6)
    | st.lists(st.sampled_from(["m1", "m2", "foo.*", ">", ""]), max_size=4)
    | st.lists(
        st.fixed_dictionaries(
            {"member": st.sampled_from(["m1", "m2", "m3"]), "partitions": st.lists(st.integers(-1, 5), max_size=4)}
        ),
        max_size=3,
    )
    | st.lists(
        st.fixed_dictionaries(
            {
                "filter": st.sampled_from(["foo.*", "foo.>", "*.*", ">", "foo", "", "a.*.b.*"]),
                "partitioning_wildcards": st.none() | st.lists(st.integers(-1, 3), max_size=3),
            }
        ),
        max_size=3,
    )
    | _json_values
)
_config_like = _json_values | st.dictionaries(_keys, _plausible, max_size=6)


def _check_parse(parse, cls, data: bytes) -> None:
    try:
        cfg = parse(data)
    except ConfigError:
        return
    assert isinstance(cfg, cls)
    cfg.validate()
    assert cls.from_json(cfg.to_json()) == cfg


@given(st.binary(max_size=64))
def test_fuzz_bytes(data):
    _check_parse(parse_static_config, StaticConfig, data)
    _check_parse(parse_elastic_config, ElasticConfig, data)


@given(_config_like)
def test_fuzz_json_values(value):
    data = json.dumps(value).encode()
    _check_parse(parse_static_config, StaticConfig, data)
    _check_parse(parse_elastic_config, ElasticConfig, data)


_names = st.text(min_size=1, max_size=5)
_filter_texts = st.sampled_from(["foo.*", ">", "a&b.<x>", "é.\u2028", "x"])


@st.composite
def _membership(draw, max_members: int) -> tuple[list[str], list[MemberMapping]]:
    """Either a members list (anything goes) or mappings that assign every partition exactly once."""
    if max_members > 64 or draw(st.booleans()):
        return draw(st.lists(_names, max_size=8)), []
    order = draw(st.permutations(range(max_members)))
    cuts = sorted(draw(st.sets(st.integers(1, max_members - 1), max_size=max_members - 1))) if max_members > 1 else []
    chunks = [order[a:b] for a, b in zip([0, *cuts], [*cuts, max_members], strict=False)]
    owners = draw(st.lists(_names, min_size=len(chunks), max_size=len(chunks), unique=True))
    return [], [MemberMapping(m, list(c)) for m, c in zip(owners, chunks, strict=False)]


@st.composite
def _valid_static(draw) -> StaticConfig:
    n = draw(st.integers(1, 12) | st.integers(1, 2**64 - 1))
    members, mappings = draw(_membership(n))
    return StaticConfig(n, draw(st.lists(_filter_texts, max_size=3)), members, mappings)


@st.composite
def _partitioning_filter(draw) -> PartitioningFilter:
    tokens = draw(st.lists(st.sampled_from(["a", "*", "é&"]), min_size=1, max_size=4))
    if "*" not in tokens or draw(st.booleans()):
        tokens.append(">")
    stars = tokens.count("*")
    chosen = draw(st.permutations(range(1, stars + 1)))[: draw(st.integers(0, stars))]
    wildcards = None if not chosen and draw(st.booleans()) else list(chosen)
    return PartitioningFilter(".".join(tokens), wildcards)


@st.composite
def _valid_elastic(draw) -> ElasticConfig:
    n = draw(st.integers(1, 12))
    members, mappings = draw(_membership(n))
    pfs = draw(st.none() | st.lists(_partitioning_filter(), max_size=3))
    buffered = st.integers(-(2**63), 2**63 - 1)
    return ElasticConfig(n, pfs, draw(buffered), draw(buffered), members, mappings)


@given(_valid_static())
def test_valid_static_configs_round_trip(cfg):
    cfg.validate()
    data = cfg.to_json()
    assert parse_static_config(data) == cfg
    assert parse_static_config(data).to_json() == data


@given(_valid_elastic())
def test_valid_elastic_configs_round_trip(cfg):
    cfg.validate()
    data = cfg.to_json()
    assert parse_elastic_config(data) == cfg
    assert parse_elastic_config(data).to_json() == data
