"""A group's dead letters for an operator (pcgroups.deadletters._admin) on a real server, with entries written in
the documented format (tests/helpers/deadletters.py): listing, showing, replay and purge plans and their execution,
the counts ``status`` shows."""

from __future__ import annotations

import json

import pytest

from pcgroups import MemberMapping, StaticConfig
from pcgroups.deadletters import (
    LANE_DEAD,
    LANE_REPLAY,
    dead_letter_stream,
    dead_letter_summary,
    delete_dead_letter_stream,
    execute_plan,
    get_dead_letter,
    list_dead_letters,
    plan_purge,
    plan_replay,
)
from pcgroups.errors import NotFoundError, PCGroupsError
from pcgroups.jetstream import JetStreamApi
from tests.helpers.deadletters import make_dead_letter_stream, write_dead_letter

CONFIG = StaticConfig(
    max_members=4, member_mappings=[MemberMapping("m1", [0, 1]), MemberMapping("m2", [2, 3])], members=[]
)
LONG_KEY = "k" * 200  # named by its SHA-256 in the subject


async def _world(nc, uniq: str) -> dict[str, int]:
    """Five dead letters of a static group ``g`` on stream ``uniq``: key a (partition 0) twice, the second
    having followed the first (parked); key b (partition 2); the long key (partition 1); key a again."""
    await make_dead_letter_stream(nc, "static", uniq, "g")

    async def put(name: str, **kw) -> None:
        seqs[name] = await write_dead_letter(nc, "static", uniq, "g", **kw)

    seqs: dict[str, int] = {}
    await put(
        "a1",
        partition=0,
        key="a",
        subject=f"{uniq}.a",
        origin_seq=10,
        data=b"first of a",
        headers={"Order-Id": "7", "Pcg-Orig-Nats-Msg-Id": "pub-1"},
        reason="ValueError: bad order 7",
        deliveries=5,
    )
    await put("a2", partition=0, key="a", subject=f"{uniq}.a", origin_seq=11, data=b"second of a", parked=True)
    await put("b1", partition=2, key="b", subject=f"{uniq}.b", origin_seq=12, member="m2", data=b"\xff\x00")
    await put("long", partition=1, key=LONG_KEY, subject=f"{uniq}.long", origin_seq=13)
    await put("a3", partition=0, key="a", subject=f"{uniq}.a", origin_seq=14, parked=True)
    return seqs


async def test_entries_are_listed_oldest_first_with_their_headers(nc, uniq):
    seqs = await _world(nc, uniq)
    entries = await list_dead_letters(nc, "static", uniq, "g")
    assert [e.seq for e in entries] == sorted(seqs.values()) == [seqs[n] for n in ("a1", "a2", "b1", "long", "a3")]
    a1 = entries[0]
    assert (a1.lane, a1.lane_name, a1.partition, a1.key, a1.subject) == (LANE_DEAD, "dead", 0, "a", f"{uniq}.a")
    assert (a1.member, a1.deliveries, a1.reason, a1.parked) == ("m1", 5, "ValueError: bad order 7", False)
    assert (a1.origin_stream, a1.origin_seq, a1.data) == (uniq, 10, b"first of a")
    assert a1.headers == {"Order-Id": "7", "Nats-Msg-Id": "pub-1"}  # as published: JetStream's header restored
    assert a1.time is not None and a1.partitioned_subject == f"0.{uniq}.a"
    assert entries[1].parked and entries[1].reason == ""
    assert entries[3].key == LONG_KEY and ".~" in entries[3].dead_letter_subject
    assert [e.seq for e in await list_dead_letters(nc, "static", uniq, "g", keys=["a"])] == [
        seqs["a1"],
        seqs["a2"],
        seqs["a3"],
    ]
    assert [e.key for e in await list_dead_letters(nc, "static", uniq, "g", keys=[LONG_KEY, "b"])] == ["b", LONG_KEY]
    as_json = entries[2].to_dict(body=True)
    assert as_json["data_base64"] == "/wA=" and "data" not in as_json and as_json["lane"] == "dead"
    assert json.loads(json.dumps(entries[0].to_dict(body=True)))["data"] == "first of a"
    assert await list_dead_letters(nc, "static", uniq, "other") == []  # no dead-letter stream: none


async def test_one_entry_by_its_sequence(nc, uniq):
    seqs = await _world(nc, uniq)
    b1 = await get_dead_letter(nc, "static", uniq, "g", seqs["b1"])
    assert (b1.key, b1.member, b1.data) == ("b", "m2", b"\xff\x00")
    with pytest.raises(NotFoundError, match=f"no dead letter 999 in static consumer group g on stream {uniq}"):
        await get_dead_letter(nc, "static", uniq, "g", 999)


async def test_a_replay_moves_entries_to_lane_r_in_order(nc, uniq):
    seqs = await _world(nc, uniq)
    before = await list_dead_letters(nc, "static", uniq, "g")
    plan = await plan_replay(nc, "static", uniq, "g", keys=["a"], config=CONFIG)
    assert [e.seq for e in plan.entries] == [seqs["a1"], seqs["a2"], seqs["a3"]] and not plan.executed
    assert plan.members() == ["m1"] and plan.keys == ["a"]
    assert await list_dead_letters(nc, "static", uniq, "g") == before  # a plan changes nothing
    follower = await write_dead_letter(
        nc, "static", uniq, "g", partition=0, key="a", subject=f"{uniq}.a", origin_seq=15, parked=True
    )
    done = await execute_plan(nc, plan)
    assert (done.executed, done.done, done.followers, done.already) == (True, 3, 1, 0)
    after = await list_dead_letters(nc, "static", uniq, "g")
    moved = [e for e in after if e.key == "a"]
    assert [e.lane for e in moved] == [LANE_REPLAY] * 4
    assert [e.origin_seq for e in moved] == [10, 11, 14, 15]  # the original order, the follower last
    assert [(e.data, dict(e.headers)) for e in moved[:1]] == [
        (b"first of a", {"Order-Id": "7", "Nats-Msg-Id": "pub-1"})
    ]
    assert moved[0].reason == "ValueError: bad order 7" and moved[1].parked
    assert {e.seq for e in after}.isdisjoint({seqs["a1"], seqs["a2"], seqs["a3"], follower})  # originals gone
    assert sorted(e.key for e in after if e.lane == LANE_DEAD) == sorted(["b", LONG_KEY])  # others untouched
    with pytest.raises(NotFoundError, match="no dead letter to replay of key 'a'"):
        await plan_replay(nc, "static", uniq, "g", keys=["a"])  # all in lane R already
    with pytest.raises(PCGroupsError, match="being replayed already"):
        await plan_replay(nc, "static", uniq, "g", seqs=[moved[0].seq])


async def test_a_replay_interrupted_after_its_copy_only_deletes_the_entry(nc, uniq):
    seqs = await _world(nc, uniq)
    b1 = await get_dead_letter(nc, "static", uniq, "g", seqs["b1"])
    copy = await write_dead_letter(
        nc, "static", uniq, "g", partition=2, key="b", subject=b1.subject, origin_seq=12, member="m2", lane=LANE_REPLAY
    )  # as the interrupted replay left it: the copy in lane R, the entry still in lane D
    done = await execute_plan(nc, await plan_replay(nc, "static", uniq, "g", seqs=[seqs["b1"]]))
    assert (done.done, done.already) == (1, 1)
    assert [(e.seq, e.lane) for e in await list_dead_letters(nc, "static", uniq, "g", keys=["b"])] == [
        (copy, LANE_REPLAY)
    ]


async def test_a_purge_removes_exactly_the_planned_entries(nc, uniq):
    seqs = await _world(nc, uniq)
    plan = await plan_purge(nc, "static", uniq, "g", keys=["a"], seqs=[seqs["long"]])
    assert [e.seq for e in plan.entries] == [seqs["a1"], seqs["a2"], seqs["long"], seqs["a3"]]
    later = await write_dead_letter(
        nc, "static", uniq, "g", partition=0, key="a", subject=f"{uniq}.a", origin_seq=15, parked=True
    )
    assert (await execute_plan(nc, plan)).done == 4
    assert [e.seq for e in await list_dead_letters(nc, "static", uniq, "g")] == [seqs["b1"], later]
    everything = await plan_purge(nc, "static", uniq, "g", everything=True)
    assert (await execute_plan(nc, everything)).done == 2
    assert await list_dead_letters(nc, "static", uniq, "g") == []
    assert (await dead_letter_summary(nc, "static", uniq, "g")).total == 0


async def test_choosing_nothing_or_what_is_not_there_is_an_error(nc, uniq):
    seqs = await _world(nc, uniq)
    with pytest.raises(PCGroupsError, match="say which dead letters"):
        await plan_replay(nc, "static", uniq, "g")
    with pytest.raises(PCGroupsError, match="not both"):
        await plan_purge(nc, "static", uniq, "g", everything=True, keys=["a"])
    with pytest.raises(NotFoundError, match="no dead letter of key 'zz'"):
        await plan_purge(nc, "static", uniq, "g", keys=["zz"])
    with pytest.raises(NotFoundError, match="no dead letter 999"):
        await plan_purge(nc, "static", uniq, "g", seqs=[seqs["a1"], 999])
    assert (await plan_replay(nc, "static", uniq, "h", everything=True)).entries == []  # no stream: none
    with pytest.raises(NotFoundError, match=f"no dead letter of key 'a' in static consumer group h on stream {uniq}"):
        await plan_purge(nc, "static", uniq, "h", keys=["a"])
    with pytest.raises(NotFoundError, match=f"no dead letter 1 in static consumer group h on stream {uniq}"):
        await get_dead_letter(nc, "static", uniq, "h", 1)
    assert len(await list_dead_letters(nc, "static", uniq, "g")) == 5


async def test_the_summary_counts_per_member_and_names_the_parked_keys(nc, uniq):
    seqs = await _world(nc, uniq)
    await execute_plan(nc, await plan_replay(nc, "static", uniq, "g", seqs=[seqs["b1"]]))
    summary = await dead_letter_summary(nc, "static", uniq, "g", config=CONFIG)
    assert summary.exists and summary.stream == dead_letter_stream("static", uniq, "g")
    assert (summary.dead, summary.replaying, summary.total) == (4, 1, 5)
    m1, m2 = summary.of("m1"), summary.of("m2")
    assert (m1.dead, m1.replaying, m1.parked_keys) == (4, 0, sorted(["a", LONG_KEY]))
    assert (m2.dead, m2.replaying, m2.parked_keys) == (0, 1, ["b"])
    unowned = await dead_letter_summary(nc, "static", uniq, "g")  # no config: no owners
    assert unowned.of("").total == 5
    nothing = await dead_letter_summary(nc, "static", uniq, "none")
    assert not nothing.exists and nothing.total == 0


async def test_the_stream_is_deleted_only_when_empty_unless_asked(nc, uniq):
    await _world(nc, uniq)
    assert await delete_dead_letter_stream(nc, "static", uniq, "g", only_if_empty=True) == (False, 5)
    assert await delete_dead_letter_stream(nc, "static", uniq, "g") == (True, 5)
    with pytest.raises(NotFoundError):
        await JetStreamApi(nc).stream_info(dead_letter_stream("static", uniq, "g"))
    assert await delete_dead_letter_stream(nc, "static", uniq, "g") == (False, 0)
    await make_dead_letter_stream(nc, "elastic", uniq, "g")
    assert await delete_dead_letter_stream(nc, "elastic", uniq, "g", only_if_empty=True) == (True, 0)


async def test_status_and_the_exporter_show_each_members_dead_letters_and_parked_keys(fresh_server):
    """``status`` gives each member the dead letters of the partitions it owns now, and the keys they park; the
    exporter serves them as metrics, with one list of the dead-letter streams per refresh and one stream info per
    group that has dead letters."""
    import nats
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    from cg.status import plain_lines
    from pcgroups import create_static
    from pcgroups.ops import GroupsExporter, static_status
    from tests.helpers.cli import make_stream, partition_transform

    async with await nats.connect(fresh_server.url) as nc, await nats.connect(fresh_server.url) as own:
        await make_stream(nc.jetstream(), "S", transform=partition_transform("S", 4))
        await create_static(nc, "S", "g", 4, member_mappings=CONFIG.member_mappings)
        await create_static(nc, "S", "quiet", 4, members=["m1"])
        seqs = await _world(nc, "S")
        await execute_plan(nc, await plan_replay(nc, "static", "S", "g", seqs=[seqs["b1"]]))
        st = await static_status(nc, "S", "g")
        assert st.dead_letter_stream == "S~g~static~dlq" and st.dead_letters == 5
        m1, m2 = st.member("m1"), st.member("m2")
        assert (m1.dead_letters, m1.replaying, m1.parked_keys) == (4, 0, sorted(["a", LONG_KEY]))
        assert (m2.dead_letters, m2.replaying, m2.parked_keys) == (0, 1, ["b"])
        lines = plain_lines(st)
        at = lines.index("dead letters (cg static dead-letters ls S g):")
        assert lines[at + 1 : at + 3] == [
            f"  m1: 4 dead; parked keys: a, {LONG_KEY}",
            "  m2: 1 replaying; parked key: b",
        ]
        quiet = await static_status(nc, "S", "quiet")
        assert quiet.dead_letter_stream in (None, "S~quiet~static~dlq") and quiet.dead_letters == 0  # made or not
        assert not any("dead letters" in line for line in plain_lines(quiet))

        ex = GroupsExporter(own)
        await ex.refresh()
        assert ex.up == 1 and len(ex.statuses) == 2
        # the static bucket's snapshot (3), no elastic bucket (1), the dead-letter streams (1), S's consumer list and
        # info (2), g's dead-letter stream with its subjects (1) and its long key's name (1), the pools (1)
        assert ex.last_requests == 3 + 1 + 1 + 2 + 1 + 1 + 1
        registry = CollectorRegistry()
        registry.register(ex)
        text = generate_latest(registry).decode()
        for sample in (
            'pcgroups_member_dead_letters{flavour="static",group="g",lane="dead",member="m1",stream="S"} 4.0',
            'pcgroups_member_dead_letters{flavour="static",group="g",lane="replaying",member="m2",stream="S"} 1.0',
            'pcgroups_member_parked_keys{flavour="static",group="g",member="m1",stream="S"} 2.0',
            'pcgroups_member_parked_keys{flavour="static",group="quiet",member="m1",stream="S"} 0.0',
        ):
            assert sample in text, text
