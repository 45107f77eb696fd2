"""Static groups against a real nats-server: the reference scenario, wire bytes, failover, step-down, ends."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import nats.aio.msg
import nats.js.api
import nats.js.errors
import pytest
from nats.js.api import StreamConfig, SubjectTransform

from pcgroups import (
    ConfigChangedError,
    ConfigError,
    ConsumerConfig,
    GroupExistsError,
    JetStreamApi,
    JetStreamAPIError,
    MemberMapping,
    NotAMemberError,
    NotFoundError,
    create_static,
    delete_static,
    get_static_config,
    list_static_active_members,
    list_static_groups,
    static_consume,
    static_member_step_down,
)
from pcgroups.jetstream._store import STATIC_BUCKET

from .helpers.support import wait_for

FAST = ConsumerConfig(max_ack_pending=1, ack_wait=1)


def counter(counts: dict, name: str, seen: list | None = None):
    async def handler(msg):
        counts[name] = counts.get(name, 0) + 1
        if seen is not None:
            seen.append((name, msg.subject, msg.partition))
        await msg.ack()

    return handler


async def test_reference_static_scenario(nc, js, uniq):
    """orbit.go TestStatic: 10 and 10, nothing from bad.*; delete ends both instances normally."""
    stream = uniq
    await js.add_stream(
        StreamConfig(
            name=stream,
            subjects=[f"{stream}.foo.*", f"{stream}.bar.*", f"{stream}.bad.*"],
            subject_transform=SubjectTransform(
                src=f"{stream}.*.*", dest="{{partition(2,2)}}.{{wildcard(1)}}.{{wildcard(2)}}"
            ),
        )
    )
    for kind in ("foo", "bad", "bar"):
        for i in range(10):
            await js.publish(f"{stream}.{kind}.{i}", b"x")
    await create_static(nc, stream, "group", 2, filters=["foo.*", "bar.*"], members=["m1", "m2"])
    counts: dict[str, int] = {}
    seen: list = []
    m1 = await static_consume(nc, stream, "group", "m1", counter(counts, "m1", seen), config=FAST)
    m2 = await static_consume(nc, stream, "group", "m2", counter(counts, "m2", seen), config=FAST)
    await wait_for(lambda: counts == {"m1": 10, "m2": 10}, 5, what="10 and 10")
    assert not [s for s in seen if s[1].startswith("bad.")]
    # odd digits hash to partition 0 (m1), even digits to partition 1 (m2), as in the reference
    assert all((int(subj[-1]) % 2 == 1) == (name == "m1") for name, subj, _ in seen)
    assert sorted(await list_static_active_members(nc, stream, "group")) == ["m1", "m2"]
    await delete_static(nc, stream, "group")
    assert await asyncio.wait_for(m1.done(), 5) is None
    assert await asyncio.wait_for(m2.done(), 5) is None
    assert counts == {"m1": 10, "m2": 10}
    assert await list_static_groups(nc, stream) == []


async def test_wire_bytes_match_the_reference(nc, js, uniq):
    """KV value, consumer create, pulls and unpin: the reference's bytes (tests/data/wire-log.md)."""
    stream = uniq
    await js.add_stream(
        StreamConfig(
            name=stream,
            subjects=[f"{stream}.*"],
            subject_transform=SubjectTransform(
                src=f"{stream}.*", dest=f"{{{{partition(4,1)}}}}.{stream}.{{{{wildcard(1)}}}}"
            ),
        )
    )
    captured: list[tuple[str, bytes]] = []

    async def capture(msg):
        captured.append((msg.subject, msg.data))

    spy = await nc.subscribe("$JS.API.CONSUMER.>", cb=capture)
    await create_static(nc, stream, "sg", 4, filters=[f"{stream}.*"], members=["m1", "m2"])
    kv = await js.key_value(STATIC_BUCKET)
    assert (await kv.get(f"{stream}.sg")).value == (
        b'{"max_members":4,"filters":["' + stream.encode() + b'.*"],"members":["m1","m2"]}'
    )
    template = ConsumerConfig(max_ack_pending=1, ack_wait=2)

    async def handler(msg):
        await msg.ack()

    inst = await static_consume(nc, stream, "sg", "m1", handler, config=template)
    for key in "abcdefgh":  # some of these land in m1's partitions 0 and 1
        await js.publish(f"{stream}.{key}", b"1")
    await wait_for(lambda: inst.pinned, 5, what="pinned")
    for key in "ijklmnop":
        await js.publish(f"{stream}.{key}", b"2")
    await wait_for(lambda: any(b'"id":' in d for s, d in captured if ".MSG.NEXT." in s), 5, what="pull with pin id")
    await static_member_step_down(nc, stream, "sg", "m1")
    await nc.flush()
    await wait_for(lambda: any(".UNPIN." in s for s, _ in captured), 5, what="unpin")
    await inst.stop()
    await spy.unsubscribe()
    create = [d for s, d in captured if s == f"$JS.API.CONSUMER.CREATE.{stream}.sg-m1"]
    assert create == [
        (
            f'{{"stream_name":"{stream}","config":{{"durable_name":"sg-m1","deliver_policy":"all","ack_policy":"explicit",'
            '"ack_wait":2000000000,"replay_policy":"instant","max_ack_pending":1,"num_replicas":0,'
            f'"filter_subjects":["0.{stream}.*","1.{stream}.*"],"priority_policy":"pinned_client","priority_timeout":2000000000,'
            '"priority_groups":["PCG"]},"action":"create"}'
        ).encode()
    ]
    pulls = [d for s, d in captured if s == f"$JS.API.CONSUMER.MSG.NEXT.{stream}.sg-m1"]
    assert pulls[0] == b'{"expires":1000000000,"batch":500,"idle_heartbeat":500000000,"group":"PCG"}'
    with_pin = [json.loads(d) for d in pulls if b'"id":' in d]
    keepalives = [p for p in with_pin if p["expires"] == 1_000_000]  # ours: they renew the pin
    assert all(list(p) == ["expires", "batch", "id", "group"] and p["batch"] == 1 for p in keepalives), keepalives
    with_pin = [p for p in with_pin if p not in keepalives]
    assert with_pin and list(with_pin[0]) == ["expires", "batch", "idle_heartbeat", "id", "group"]
    assert [d for s, d in captured if s == f"$JS.API.CONSUMER.UNPIN.{stream}.sg-m1"] == [b'{"group":"PCG"}']


async def test_a_handler_reaches_the_nats_py_message(nc, js, uniq):
    """``msg.nats_msg`` is the nats-py message as delivered: partition token in its subject, the same
    data, headers and metadata as the pcgroups message."""
    await js.add_stream(
        StreamConfig(
            name=uniq,
            subjects=[f"{uniq}.*"],
            subject_transform=SubjectTransform(
                src=f"{uniq}.*", dest=f"{{{{partition(2,1)}}}}.{uniq}.{{{{wildcard(1)}}}}"
            ),
        )
    )
    await create_static(nc, uniq, "g", 2, members=["m1"])
    got: list = []

    async def handler(msg):
        got.append((msg, msg.nats_msg))
        await msg.ack()

    async with static_consume(nc, uniq, "g", "m1", handler, config=FAST):
        await js.publish(f"{uniq}.k7", b"payload", headers={"Order-Id": "7"})
        await wait_for(lambda: got, 5, what="the message")
    msg, raw = got[0]
    assert isinstance(raw, nats.aio.msg.Msg)
    assert raw.subject == msg.partitioned_subject == f"{msg.partition}.{uniq}.k7" and msg.subject == f"{uniq}.k7"
    assert raw.data == msg.data == b"payload" and raw.headers is msg.headers and msg.headers["Order-Id"] == "7"
    assert raw.metadata.sequence.stream == msg.sequence == 1


async def test_nats_py_consumer_config_is_a_template_its_unset_fields_the_defaults(nc, js, uniq):
    """nats-py's ``ConsumerConfig`` (what nats-py's examples build) is taken as the template: unset fields (None
    there) are the defaults, AckWait 5 s among them; pcgroups' own takes None the same way."""
    await js.add_stream(
        StreamConfig(
            name=uniq,
            subjects=[f"{uniq}.*"],
            subject_transform=SubjectTransform(
                src=f"{uniq}.*", dest=f"{{{{partition(2,1)}}}}.{uniq}.{{{{wildcard(1)}}}}"
            ),
        )
    )
    await create_static(nc, uniq, "g", 2, members=["m1", "m2"])
    got: list[str] = []

    async def handler(msg):
        got.append(msg.subject)
        await msg.ack()

    templates = {
        "m1": nats.js.api.ConsumerConfig(max_ack_pending=1000),
        "m2": ConsumerConfig(max_ack_pending=3, ack_wait=None),
    }  # type: ignore[arg-type]
    for member, template in templates.items():
        async with static_consume(nc, uniq, "g", member, handler, config=template):
            info = await js.consumer_info(uniq, f"g-{member}")
            assert (info.config.max_ack_pending, info.config.ack_wait) == (template.max_ack_pending, 5.0)
            assert info.config.ack_policy == nats.js.api.AckPolicy.EXPLICIT
    explicit = nats.js.api.ConsumerConfig(ack_wait=2, ack_policy=nats.js.api.AckPolicy.EXPLICIT)
    async with (
        static_consume(nc, uniq, "g", "m1", handler, config=explicit),
        static_consume(nc, uniq, "g", "m2", handler, config=explicit),
    ):
        for k in range(4):
            await js.publish(f"{uniq}.k{k}", b"x")
        await wait_for(lambda: len(got) == 4, 5, what="the messages of both partitions")
        assert (await js.consumer_info(uniq, "g-m1")).config.ack_wait == 2.0
    assert sorted(got) == [f"{uniq}.k{k}" for k in range(4)]


def test_a_template_of_another_type_or_with_push_settings_is_refused():
    with pytest.raises(
        TypeError,
        match=r"config must be a pcgroups.ConsumerConfig \(or nats-py's "
        r"nats.js.api.ConsumerConfig\), not builtins.dict",
    ):
        ConsumerConfig.of({"max_ack_pending": 1})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="config sets deliver_subject, idle_heartbeat, which a member's consumer"):
        ConsumerConfig.of(nats.js.api.ConsumerConfig(deliver_subject="x", idle_heartbeat=1.0, flow_control=False))
    converted = ConsumerConfig.of(
        nats.js.api.ConsumerConfig(
            ack_policy=nats.js.api.AckPolicy.ALL,
            replay_policy=nats.js.api.ReplayPolicy.ORIGINAL,
            backoff=[1.0, 2.0],
            metadata={"team": "a"},
        )
    )
    assert converted == ConsumerConfig(
        ack_policy="all", replay_policy="original", backoff=[1.0, 2.0], metadata={"team": "a"}
    )


async def test_create_is_idempotent_and_a_different_config_is_an_error(nc, js, uniq):
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.>"]))
    first = await create_static(nc, uniq, "g", 4, members=["a", "b"])
    assert await create_static(nc, uniq, "g", 4, members=["a", "b"]) == first
    with pytest.raises(GroupExistsError, match="doesn't match"):
        await create_static(nc, uniq, "g", 5, members=["a", "b"])
    assert await get_static_config(nc, uniq, "g") == first


async def test_bad_input_is_refused_before_anything_is_written(nc, js, uniq):
    with pytest.raises(NotFoundError, match="stream does not exist"):
        await create_static(nc, uniq, "g", 2, members=["a"])
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.>"]))
    with pytest.raises(ConfigError, match="max number of members must be at least 1"):
        await create_static(nc, uniq, "g", 0, members=["a"])
    with pytest.raises(ConfigError, match="the max number of members must be an int, got str '2'"):
        await create_static(nc, uniq, "g", "2", members=["a"])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="member name"):
        await create_static(nc, uniq, "g", 2, members=["a.b"])
    with pytest.raises(ConfigError, match="partition"):
        await create_static(nc, uniq, "g", 2, member_mappings=[MemberMapping("a", [0, 0])])
    assert await list_static_groups(nc, uniq) == []


async def test_delete_removes_exactly_its_members_consumers(nc, js, uniq):
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.>"]))
    api = JetStreamApi(nc)
    await create_static(nc, uniq, "a", 2, members=["m1"])
    await create_static(nc, uniq, "a-b", 2, members=["m1"])
    ia = await static_consume(nc, uniq, "a", "m1", counter({}, "x"), config=FAST)
    ib = await static_consume(nc, uniq, "a-b", "m1", counter({}, "x"), config=FAST)
    names = sorted(c["name"] for c in await api.list_consumers(uniq))
    assert names == ["a-b-m1", "a-m1"]
    await delete_static(nc, uniq, "a")
    assert await asyncio.wait_for(ia.done(), 5) is None
    assert [c["name"] for c in await api.list_consumers(uniq)] == ["a-b-m1"]
    assert ib.consuming
    await ib.stop()


@pytest.mark.parametrize("change", ["update", "delete", "purge", "garbage"])
async def test_config_change_ends_every_instance(nc, js, uniq, change):
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.>"]))
    await create_static(nc, uniq, "g", 2, members=["m1", "m2"])
    insts = [await static_consume(nc, uniq, "g", m, counter({}, m), config=FAST) for m in ("m1", "m1", "m2")]
    for i in insts:
        await i.wait_for_consuming(5)
    kv = await js.key_value(STATIC_BUCKET)
    key = f"{uniq}.g"
    if change == "update":
        await kv.put(key, b'{"max_members":2,"members":["m1","m3"]}')
    elif change == "delete":
        await kv.delete(key)
    elif change == "purge":
        await kv.purge(key)
    else:
        await kv.put(key, b"\x00garbage")
    results = [await asyncio.wait_for(i.done(), 5) for i in insts]
    if change in ("delete", "purge"):
        assert results == [None, None, None]
        assert [await i.wait() for i in insts] == [None, None, None]
    else:
        wanted = ConfigChangedError if change == "update" else ConfigError
        assert all(isinstance(r, wanted) for r in results)
        for inst, result in zip(insts, results, strict=False):
            with pytest.raises(wanted) as raised:  # wait() raises what done() returns
                await inst.wait()
            assert raised.value is result
    if change != "delete":  # consumers of a changed config are deleted by its instances
        assert await JetStreamApi(nc).list_consumers(uniq) == []


async def test_join_errors(nc, js, uniq):
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.>"]))
    await create_static(nc, uniq, "g", 2, members=["m1"])
    with pytest.raises(NotAMemberError, match=r"^zz is not a member of static consumer group g \(members: m1\)$"):
        await static_consume(nc, uniq, "g", "zz", counter({}, "x"))
    with pytest.raises(ConfigError, match="concurrency must be 1 without a handler"):
        await static_consume(nc, uniq, "g", "m1", None, concurrency=2)  # handler=None: iterated
    with pytest.raises(NotFoundError):
        await static_consume(nc, uniq, "nope", "m1", counter({}, "x"))
    with pytest.raises(NotFoundError, match="stream does not exist"):
        await static_consume(nc, uniq + "x", "g", "m1", counter({}, "x"))


async def test_a_member_switches_consumer_settings_between_runs_but_not_under_a_running_instance(nc, js, uniq, caplog):
    """Plain, then max_ack_pending 16, then plain again: each run updates the member's consumer (name,
    filters, PCG group and PinnedTTL kept) and logs one line; while an instance runs, another asking other
    settings is refused, naming them, and the consumer is left as it was."""
    await js.add_stream(
        StreamConfig(
            name=uniq,
            subjects=[f"{uniq}.>"],
            subject_transform=SubjectTransform(src=f"{uniq}.*", dest="0.{{wildcard(1)}}"),
        )
    )
    await create_static(nc, uniq, "g", 1, members=["m1"])
    api = JetStreamApi(nc)
    wide = ConsumerConfig(max_ack_pending=16, ack_wait=1)
    counts: dict[str, int] = {}
    published = 0

    async def run(cfg: ConsumerConfig, concurrency: int) -> dict:
        nonlocal published
        caplog.clear()
        inst = await static_consume(nc, uniq, "g", "m1", counter(counts, "m1"), config=cfg, concurrency=concurrency)
        published += 1
        await js.publish(f"{uniq}.k{published}", b"x")
        await wait_for(lambda: counts.get("m1") == published, 5, what="the message handled")
        await inst.stop()
        return (await api.consumer_info(uniq, "g-m1"))["config"]

    first = await run(FAST, 1)
    assert first["max_ack_pending"] == 1 and not [r for r in caplog.records if "consumer" in r.getMessage()]
    for cfg, concurrency, change in ((wide, 4, "1 -> 16"), (FAST, 1, "16 -> 1")):
        now = await run(cfg, concurrency)
        assert now["max_ack_pending"] == cfg.max_ack_pending
        assert [r.getMessage() for r in caplog.records if "consumer" in r.getMessage()] == [
            f"member m1's consumer: max_ack_pending {change} (updated: no other instance was running)"
        ]
        kept = ("name", "durable_name", "filter_subjects", "priority_groups", "priority_policy", "priority_timeout")
        assert {k: now.get(k) for k in kept} == {k: first.get(k) for k in kept}

    running = await static_consume(nc, uniq, "g", "m1", counter(counts, "m1"), config=FAST)
    await wait_for(lambda: running.consuming, 5, what="the first instance pulling")
    before = await api.consumer_info(uniq, "g-m1")
    with pytest.raises(
        ConfigError,
        match=r"another instance of member m1 is running with other consumer settings "
        r"\(max_ack_pending 1 there, 16 asked\): stop the other instances of m1",
    ):
        await static_consume(nc, uniq, "g", "m1", counter(counts, "m1"), config=wide, concurrency=4)
    after = await api.consumer_info(uniq, "g-m1")
    assert after["config"] == before["config"]
    published += 1
    await js.publish(f"{uniq}.k{published}", b"x")
    await wait_for(lambda: counts.get("m1") == published, 5, what="the running instance still handling")
    await running.stop()
    assert await running.done() is None
    with pytest.raises(
        JetStreamAPIError,
        match=r"error updating our member's consumer g-m1 to this instance's "
        r"settings \(deliver_policy all -> new\): deliver policy can not",
    ):
        await static_consume(nc, uniq, "g", "m1", counter(counts, "m1"), config=replace(FAST, deliver_policy="new"))
    assert (await api.consumer_info(uniq, "g-m1"))["config"] == after["config"]


async def test_only_the_pinned_instance_receives_and_step_down_moves_the_pin(nc, js, uniq):
    await js.add_stream(
        StreamConfig(
            name=uniq,
            subjects=[f"{uniq}.>"],
            subject_transform=SubjectTransform(src=f"{uniq}.*", dest="0.{{wildcard(1)}}"),
        )
    )
    await create_static(nc, uniq, "g", 1, members=["m1"])
    got: dict[str, list[str]] = {"a": [], "b": []}

    def handler(name):
        def h(msg):  # a sync handler: runs in a worker thread, acks block until sent
            got[name].append(msg.subject)
            msg.ack()

        return h

    a = await static_consume(nc, uniq, "g", "m1", handler("a"), config=FAST)
    b = await static_consume(nc, uniq, "g", "m1", handler("b"), config=FAST)
    for i in range(20):
        await js.publish(f"{uniq}.k{i}", b"x")
    await wait_for(lambda: len(got["a"]) + len(got["b"]) == 20, 5, what="20 messages")
    first = "a" if got["a"] else "b"
    other = "b" if first == "a" else "a"
    assert got[other] == [] and got[first] == [f"k{i}" for i in range(20)]
    owner = a if first == "a" else b
    assert owner.pinned
    await static_member_step_down(nc, uniq, "g", "m1")
    for i in range(20, 40):
        await js.publish(f"{uniq}.k{i}", b"x")
    await wait_for(lambda: len(got["a"]) + len(got["b"]) == 40, 5, what="40 messages")
    assert got[other], "after step-down the other instance took over"
    await a.stop()
    await b.stop()


async def test_long_handler_keeps_its_message_with_in_progress(nc, js, uniq):
    await js.add_stream(
        StreamConfig(
            name=uniq,
            subjects=[f"{uniq}.>"],
            subject_transform=SubjectTransform(src=f"{uniq}.*", dest="0.{{wildcard(1)}}"),
        )
    )
    await create_static(nc, uniq, "g", 1, members=["m1"])
    deliveries: list[int] = []

    async def slow(msg):
        deliveries.append(msg.metadata.num_delivered)
        await asyncio.sleep(2.5)  # 2.5 x AckWait
        await msg.ack_sync()

    inst = await static_consume(nc, uniq, "g", "m1", slow, config=FAST)
    await js.publish(f"{uniq}.a", b"x")
    await js.publish(f"{uniq}.b", b"x")
    await wait_for(lambda: len(deliveries) == 2, 8, what="two deliveries")
    await inst.stop()
    assert deliveries == [1, 1]


def _spawn(url, stream, group, member):
    return subprocess.Popen(
        [sys.executable, "-m", "tests.member_proc", url, "static", stream, group, member],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )


async def _lines(proc, sink: list):
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, proc.stdout.readline)
        if not line:
            return
        sink.append(json.loads(line))


@pytest.mark.slow
async def test_sigkill_of_the_pinned_instance_fails_over_to_the_standby(nc, js, uniq, nats_server):
    """Two processes of one member; SIGKILL the pinned one: the standby takes over within ~PinnedTTL and
    every published message is processed, at most the in-flight one twice."""
    await js.add_stream(
        StreamConfig(
            name=uniq,
            subjects=[f"{uniq}.>"],
            subject_transform=SubjectTransform(src=f"{uniq}.*", dest="0.{{wildcard(1)}}"),
        )
    )
    await create_static(nc, uniq, "g", 1, members=["m1"])
    procs = [_spawn(nats_server.url, uniq, "g", "m1") for _ in range(2)]
    events: list[list[dict]] = [[], []]
    readers = [asyncio.ensure_future(_lines(p, e)) for p, e in zip(procs, events, strict=False)]
    try:
        await wait_for(lambda: all(any(e["ev"] == "ready" for e in ev) for ev in events), 20, what="ready")
        published = 0
        killed_at = None
        victim = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            await js.publish(f"{uniq}.k{published}", b"x")
            published += 1
            await asyncio.sleep(0.01)
            starts = [[e for e in ev if e["ev"] == "start"] for ev in events]
            if victim is None and published >= 50 and any(starts):
                victim = 0 if starts[0] else 1
                procs[victim].send_signal(signal.SIGKILL)
                killed_at = time.time()
            if victim is not None and published >= 250:
                break
        survivor = 1 - victim
        await wait_for(
            lambda: len({e["subject"] for ev in events for e in ev if e["ev"] == "end"}) == published,
            15,
            what="every message processed",
        )
        ends = [e for ev in events for e in ev if e["ev"] == "end"]
        subjects = [e["subject"] for e in ends]
        assert len(subjects) - len(set(subjects)) <= 1, "at most the in-flight message twice"
        takeover = min(e["t"] for e in events[survivor] if e["ev"] == "start" and e["t"] > killed_at) - killed_at
        print(f"failover after SIGKILL: {takeover:.3f}s (PinnedTTL 1s)")
        assert takeover < 3.0
        # order of success: the survivor's subjects are in publish order
        order = [int(e["subject"][1:]) for e in events[survivor] if e["ev"] == "end"]
        assert order == sorted(order)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        for r in readers:
            await asyncio.wait_for(r, 5)


async def test_a_lost_ack_is_acked_again_when_the_message_comes_back(nc, js, uniq):
    """An ack that never reached the server (sent just before a disconnect: the client counts it as acked):
    the message comes back after AckWait. The instance does not handle it again, and acks it again; before,
    it dropped the redelivery silently, and with max_ack_pending 1 the member then got nothing, for good."""
    await js.add_stream(
        StreamConfig(
            name=uniq,
            subjects=[f"{uniq}.*"],
            subject_transform=SubjectTransform(src=f"{uniq}.*", dest="{{partition(1,1)}}.{{wildcard(1)}}"),
        )
    )
    await create_static(nc, uniq, "g", 1, members=["m1"])
    handled: list[str] = []

    async def handler(msg):
        handled.append(msg.subject)
        if len(handled) == 1:
            msg._settled(acked=True)  # the ack is lost on the way
        else:
            await msg.ack()

    inst = await static_consume(nc, uniq, "g", "m1", handler, config=FAST)  # AckWait 1 s, max_ack_pending 1
    try:
        for i in range(5):
            await js.publish(f"{uniq}.k{i}", b"x")
        await wait_for(lambda: len(handled) == 5, 10, what="every message handled after the lost ack")
        assert handled == [f"k{i}" for i in range(5)]  # the first one once, not again
        await wait_for(lambda: _acked_all(nc, uniq), 5, what="the consumer's ack floor at the last message")
    finally:
        await inst.stop()


async def _acked_all(nc, stream: str) -> bool:
    info = await JetStreamApi(nc).consumer_info(stream, "g-m1")
    return info["num_ack_pending"] == 0 and info["ack_floor"]["stream_seq"] == 5


async def test_a_member_share_too_large_for_one_consumer_is_a_clear_error(nc, js, uniq):
    """A valid but huge max_members (here 10^9, one member): the create refuses it and stores nothing; written by
    another tool (as the Go reference would), consuming ends at once with a clear error instead of building a
    billion filter subjects."""
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.>"]))
    share = "member m1 would own 1000000000 of the group's 1000000000 partitions"
    with pytest.raises(ConfigError, match=share):
        await create_static(nc, uniq, "g", 10**9, members=["m1"])
    await create_static(nc, uniq, "other", 2, members=["m1"])  # the bucket
    kv = await js.key_value(STATIC_BUCKET)
    with pytest.raises(nats.js.errors.KeyNotFoundError):  # nothing stored by the refused create
        await kv.get(f"{uniq}.g")
    await kv.put(f"{uniq}.g", json.dumps({"max_members": 10**9, "members": ["m1"]}).encode())
    with pytest.raises(ConfigError, match=share):
        await asyncio.wait_for(static_consume(nc, uniq, "g", "m1", counter({}, "m1"), config=FAST), 10)
    assert await JetStreamApi(nc).list_consumers(uniq) == []


async def test_double_ack_replies_come_back_time_out_and_report_no_responders(nc, uniq):
    """The session's reply subscription for Msg.ack_sync (session.AckReplies) behaves as nc.request():
    the reply, nats-py's TimeoutError when none comes, NoRespondersError when nobody listens."""
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeoutError

    from pcgroups.consume._session import AckReplies

    async def echo(msg):
        await msg.respond(b"ok:" + msg.data)

    replies = AckReplies(nc)
    await replies.start()
    answering = await nc.subscribe(f"{uniq}.echo", cb=echo)
    silent = await nc.subscribe(f"{uniq}.silent")
    try:
        assert [(await replies.request(f"{uniq}.echo", str(i).encode(), 2)).data for i in range(3)] == [
            b"ok:0",
            b"ok:1",
            b"ok:2",
        ]
        t0 = time.monotonic()
        with pytest.raises(NatsTimeoutError):
            await replies.request(f"{uniq}.silent", b"x", 0.3)
        assert 0.25 < time.monotonic() - t0 < 2
        with pytest.raises(NoRespondersError):
            await replies.request(f"{uniq}.nobody", b"x", 2)
        assert replies._waiting == {}  # nothing left behind
    finally:
        await answering.unsubscribe()
        await silent.unsubscribe()
        await replies.stop()
