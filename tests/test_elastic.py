"""Elastic groups against a real nats-server: the reference scenario, wire bytes, membership changes
under traffic (no loss, exclusivity, order), unaffected members without a pause, mappings, CAS,
back-pressure, instance lifecycle and step-down."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time

import nats
import pytest
from nats.js.api import StreamConfig

from pcgroups import (
    ConfigChangedError,
    ConfigError,
    ConsumerConfig,
    ConsumerGoneError,
    JetStreamApi,
    MemberMapping,
    PartitioningFilter,
    add_members,
    create_elastic,
    delete_elastic,
    delete_member_mappings,
    delete_members,
    elastic_consume,
    elastic_member_step_down,
    get_elastic_config,
    list_elastic_active_members,
    partition_of_subject,
    set_member_mappings,
)
from pcgroups.jetstream._store import ELASTIC_BUCKET
from pcgroups.testing._checker import Recorder as _Recorder
from pcgroups.testing._checker import origin_of

from .helpers.support import WIRE_VECTORS as VECTORS
from .helpers.support import wait_for


def Recorder() -> _Recorder:
    """The checker's recorder on the monotonic clock (the tests' times), messages keyed (subject, origin seq)."""
    return _Recorder(clock=time.monotonic)


def handler_of(rec: _Recorder, member: str, instance: str, work=None):
    return rec.handler(member, instance, work, key=origin_of)


FAST = ConsumerConfig(max_ack_pending=1, ack_wait=1)


# --- helpers ------------------------------------------------------------------------------------
@pytest.fixture
async def fresh_nc(fresh_server):
    """A connection to a server of the test's own (for tests that need the reference's exact subjects)."""
    conn = await nats.connect(fresh_server.url, connect_timeout=5)
    yield conn
    await conn.close()


class Instances:
    """Starts elastic instances and stops every one of them on exit."""

    def __init__(self, nc):
        self.nc = nc
        self.items = []

    async def start(self, stream, group, member, handler, *, config=FAST, nc=None, **kw):
        inst = await elastic_consume(nc or self.nc, stream, group, member, handler, config=config, **kw)
        self.items.append(inst)
        return inst

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        for inst in self.items:
            try:
                await asyncio.wait_for(inst.stop(), 10)
            except Exception:
                pass


def counting(counts: dict, name: str, seen: list | None = None):
    async def handler(msg):
        counts[name] = counts.get(name, 0) + 1
        if seen is not None:
            seen.append((name, msg.subject, msg.partition))
        await msg.ack()

    return handler


class Publisher:
    """Publishes ``subject_of(i)`` at ``rate`` msg/s until stopped; remembers (subject, origin seq)."""

    def __init__(self, js, subject_of, rate: float):
        self.js = js
        self.subject_of = subject_of
        self.rate = rate
        self.published: list[tuple[str, int]] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> Publisher:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        i = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            subject = self.subject_of(i)
            ack = await self.js.publish(subject, str(i).encode())
            self.published.append((subject, ack.seq))
            i += 1
            next_at += 1 / self.rate
            delay = next_at - time.monotonic()
            if delay > 0:
                try:
                    await asyncio.wait_for(self._stop.wait(), delay)
                except TimeoutError:
                    pass

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 10)


def keys_by_partition(filter_: str, n: int, count: int = 400) -> dict[int, list[str]]:
    """Key tokens (the hashed wildcard of ``<prefix>.*``) grouped by the partition they land in."""
    out: dict[int, list[str]] = {p: [] for p in range(n)}
    for i in range(count):
        out[partition_of_subject(filter_.replace("*", str(i)), n, [1], filter_)].append(str(i))
    return out


async def keyed_group(nc, js, stream: str, group: str, n: int, **kw) -> tuple[str, dict[int, list[str]]]:
    """An origin stream with subjects ``<stream>.k.<key>`` and an elastic group hashing the key."""
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.k.*"]))
    filter_ = f"{stream}.k.*"
    await create_elastic(nc, stream, group, n, partitioning_filters=[PartitioningFilter(filter_, [1])], **kw)
    return filter_, keys_by_partition(filter_, n)


def round_robin(prefix: str, keys: dict[int, list[str]], partitions: list[int] | None = None):
    """subject_of(i): cycles over partitions (and keys within them), so each gets an equal share."""
    parts = sorted(keys) if partitions is None else partitions

    def subject_of(i: int) -> str:
        p = parts[i % len(parts)]
        ks = keys[p]
        return f"{prefix}.{ks[(i // len(parts)) % len(ks)]}"

    return subject_of


# --- 1. the reference's TestElastic --------------------------------------------------------------
async def test_reference_elastic_scenario(fresh_nc):
    """orbit.go TestElastic with its exact counts: 20/0, 30/10, 30/30; then whole-subject hashing 45/45."""
    nc = fresh_nc
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="test", subjects=["foo.*", "bar.*", "bad.*"]))

    async def publish_30():
        for kind in ("foo", "bad", "bar"):
            for i in range(10):
                await js.publish(f"{kind}.{i}", b"x")

    await publish_30()
    await create_elastic(
        nc,
        "test",
        "group",
        2,
        partitioning_filters=[PartitioningFilter("foo.*", [1]), PartitioningFilter("bar.*", [1])],
        max_buffered_msgs=-1,
        max_buffered_bytes=-1,
    )
    counts = {"m1": 0, "m2": 0}
    seen: list = []
    async with Instances(nc) as inst:
        m1 = await inst.start("test", "group", "m1", counting(counts, "m1", seen))
        m2 = await inst.start("test", "group", "m2", counting(counts, "m2", seen))
        assert await add_members(nc, "test", "group", ["m1"]) == ["m1"]
        await wait_for(lambda: counts == {"m1": 20, "m2": 0}, 6, what="20/0")

        assert await add_members(nc, "test", "group", ["m2"]) == ["m1", "m2"]
        await asyncio.sleep(0.05)  # as the reference does
        await publish_30()
        await wait_for(lambda: counts == {"m1": 30, "m2": 10}, 10, what=f"30/10 (have {counts})")

        assert await delete_members(nc, "test", "group", ["m1"]) == ["m2"]
        await asyncio.sleep(0.05)
        await publish_30()
        await wait_for(lambda: counts == {"m1": 30, "m2": 30}, 10, what=f"30/30 (have {counts})")
        assert not [s for s in seen if s[1].startswith("bad.")]

        await delete_elastic(nc, "test", "group")
        assert await asyncio.wait_for(m1.done(), 5) is None
        assert await asyncio.wait_for(m2.done(), 5) is None
        assert counts == {"m1": 30, "m2": 30}  # no duplicate deliveries

    # Second group: no filters, the whole subject is hashed; the work queue sources all 90 messages.
    await create_elastic(nc, "test", "group2", 2, max_buffered_msgs=-1, max_buffered_bytes=-1)
    counts2 = {"m1": 0, "m2": 0}
    seen2: list = []
    async with Instances(nc) as inst:
        g1 = await inst.start("test", "group2", "m1", counting(counts2, "m1", seen2))
        g2 = await inst.start("test", "group2", "m2", counting(counts2, "m2", seen2))
        await add_members(nc, "test", "group2", ["m1", "m2"])
        await wait_for(lambda: counts2 == {"m1": 45, "m2": 45}, 10, what=f"45/45 (have {counts2})")
        expected = {s: ("m1" if partition_of_subject(s, 2) == 0 else "m2") for s in {subj for _, subj, _ in seen2}}
        assert all(name == expected[subj] for name, subj, _ in seen2)
        assert len({subj for _, subj, _ in seen2}) == 30
        await delete_elastic(nc, "test", "group2")
        assert await asyncio.wait_for(g1.done(), 5) is None
        assert await asyncio.wait_for(g2.done(), 5) is None
        assert counts2 == {"m1": 45, "m2": 45}
    await js.delete_stream("test")


# --- 2. wire exactness ---------------------------------------------------------------------------
WIRE_KV_BUCKET = (
    b'{"name":"KV_elastic-consumer-groups","subjects":["$KV.elastic-consumer-groups.\\u003e"],"retention":"limits",'
    b'"max_consumers":-1,"max_msgs":-1,"max_bytes":-1,"discard":"new","max_age":0,"max_msgs_per_subject":1,'
    b'"max_msg_size":-1,"storage":"file","num_replicas":1,"duplicate_window":120000000000,"deny_delete":true,'
    b'"allow_rollup_hdrs":true,"compression":"none","allow_direct":true,"mirror_direct":false,"consumer_limits":{}}'
)
WIRE_KV_VALUE = (
    b'{"max_members":4,"partitioning_filters":[{"filter":"bar.*","partitioning_wildcards":[1]}],'
    b'"max_buffered_msg":1000}'
)
WIRE_WQ_STREAM = (
    b'{"name":"bar-eg","retention":"workqueue","max_consumers":0,"max_msgs":1000,"max_bytes":0,"discard":"new",'
    b'"max_age":0,"max_msgs_per_subject":0,"storage":"file","num_replicas":1,"sources":[{"name":"bar",'
    b'"subject_transforms":[{"src":"bar.*","dest":"{{Partition(4,1)}}.bar.{{Wildcard(1)}}"}]}],'
    b'"compression":"none","allow_direct":true,"mirror_direct":false,"consumer_limits":{}}'
)
WIRE_M1_CONSUMER = (
    b'{"stream_name":"bar-eg","config":{"name":"m1","deliver_policy":"all","ack_policy":"explicit",'
    b'"ack_wait":2000000000,"replay_policy":"instant","max_ack_pending":1,"inactive_threshold":2000000000,'
    b'"num_replicas":0,"filter_subjects":["0.bar.*","1.bar.*"],"priority_policy":"pinned_client",'
    b'"priority_timeout":2000000000,"priority_groups":["PCG"]},"action":"create"}'
)
WIRE_PULL_FIRST = b'{"expires":1000000000,"batch":500,"idle_heartbeat":500000000,"group":"PCG"}'


def wire_pull(pin: str) -> bytes:
    return b'{"expires":1000000000,"batch":500,"idle_heartbeat":500000000,"id":"' + pin.encode() + b'","group":"PCG"}'


async def test_wire_bytes_match_the_reference(fresh_nc, fresh_server):
    """Bucket, KV values, work-queue stream, member consumer and pulls: the bytes of wire-log.md."""
    nc = fresh_nc
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="bar", subjects=["bar.*"]))
    for i in range(8):
        await js.publish(f"bar.{i}", b"x")
    spy_nc = await nats.connect(fresh_server.url)
    captured: list[tuple[str, bytes, dict | None]] = []

    async def capture(msg):
        captured.append((msg.subject, msg.data, msg.headers))

    try:
        await spy_nc.subscribe("$JS.API.>", cb=capture)
        await spy_nc.subscribe("$KV.>", cb=capture)
        await spy_nc.flush()
        await create_elastic(
            nc, "bar", "eg", 4, partitioning_filters=[PartitioningFilter("bar.*", [1])], max_buffered_msgs=1000
        )
        await spy_nc.flush()
        await wait_for(
            lambda: any(s == "$KV.elastic-consumer-groups.bar.eg" for s, _, _ in captured), 5, what="the KV write"
        )
        bodies = {s: d for s, d, _ in captured}
        assert bodies["$JS.API.STREAM.CREATE.KV_elastic-consumer-groups"] == WIRE_KV_BUCKET
        assert bodies["$JS.API.STREAM.CREATE.bar-eg"] == WIRE_WQ_STREAM
        assert bodies["$KV.elastic-consumer-groups.bar.eg"] == WIRE_KV_VALUE

        captured.clear()
        assert await add_members(nc, "bar", "eg", ["m2", "m1"]) == ["m2", "m1"]
        await wait_for(lambda: any(s.startswith("$KV.") for s, _, _ in captured), 5, what="the add")
        ((_subject, data, headers),) = [c for c in captured if c[0].startswith("$KV.")]
        assert data == WIRE_KV_VALUE[:-1] + b',"members":["m2","m1"]}'
        assert headers == {"Nats-Expected-Last-Subject-Sequence": "1"}

        captured.clear()
        pins: list[str] = []

        async def handler(msg):
            pins.append(msg.headers["Nats-Pin-Id"])
            await msg.ack()

        async with Instances(nc) as inst:
            await inst.start("bar", "eg", "m1", handler, config=ConsumerConfig(max_ack_pending=1, ack_wait=2))
            await wait_for(lambda: len(pins) >= 2, 5, what="messages of m1's partitions")
            # one more pull after the first message (it carries the pin id)
            await wait_for(
                lambda: sum(1 for s, _, _ in captured if s == "$JS.API.CONSUMER.MSG.NEXT.bar-eg.m1") >= 2,
                5,
                what="a second pull",
            )
        creates = [d for s, d, _ in captured if s == "$JS.API.CONSUMER.CREATE.bar-eg.m1"]
        assert creates == [WIRE_M1_CONSUMER]
        pulls = [d for s, d, _ in captured if s == "$JS.API.CONSUMER.MSG.NEXT.bar-eg.m1"]
        assert pulls[0] == WIRE_PULL_FIRST
        keepalives = [p for p in pulls if json.loads(p)["expires"] == 1_000_000]  # ours: they renew the pin
        for p in keepalives:
            assert list(json.loads(p)) == ["expires", "batch", "id", "group"] and json.loads(p)["batch"] == 1
        pulls = [p for p in pulls if p not in keepalives]
        pinned = [p for p in pulls[1:] if b'"id"' in p]
        assert pinned, pulls
        for p in pinned:
            body = json.loads(p)
            assert list(body) == ["expires", "batch", "idle_heartbeat", "id", "group"]
            assert body["id"] == pins[0] and body["group"] == "PCG"
            assert body["expires"] == 1_000_000_000 and body["idle_heartbeat"] == 500_000_000
        assert pinned[0] == wire_pull(pins[0]) or json.loads(pinned[0])["batch"] < 500
        assert all(b'"id"' in p for p in pulls[pulls.index(pinned[0]) :])  # once pinned, always with the id

        # The wire vectors: KV values, sources, after-add values and per-member filters.
        await js.add_stream(StreamConfig(name="src", subjects=["src.>"]))
        for vector in VECTORS["elastic"]:
            group = vector["cli"][3]
            kv_json = json.loads(vector["kv"])
            filters = [
                PartitioningFilter(f["filter"], f["partitioning_wildcards"])
                for f in kv_json["partitioning_filters"] or []
            ] or None
            await create_elastic(
                nc,
                "src",
                group,
                kv_json["max_members"],
                partitioning_filters=filters,
                max_buffered_msgs=kv_json.get("max_buffered_msg", 0),
                max_buffered_bytes=kv_json.get("max_buffered_bytes", 0),
            )
            kv = await js.key_value(ELASTIC_BUCKET)
            assert (await kv.get(f"src.{group}")).value == vector["kv"].encode()
            info = await js.stream_info(f"src-{group}")
            sources = [
                {"name": s.name, "subject_transforms": [{"src": t.src, "dest": t.dest} for t in s.subject_transforms]}
                for s in info.config.sources
            ]
            assert sources == vector["stream_sources"]
            await add_members(nc, "src", group, ["m2", "m1", "m3"])
            assert (await kv.get(f"src.{group}")).value == vector["kv_after_add"].encode()
            async with Instances(nc) as inst:
                for m in ("m1", "m2", "m3"):
                    await inst.start("src", group, m, counting({}, m))
                api = JetStreamApi(nc)

                async def filters_now(api=api, group=group):
                    return {
                        c["name"]: c["config"].get("filter_subjects") for c in await api.list_consumers(f"src-{group}")
                    }

                await wait_for(
                    lambda filters_now=filters_now, want=vector["consumers"]: _eq_async(filters_now, want),
                    5,
                    what=f"the consumers of {group}",
                )
            await delete_elastic(nc, "src", group)
    finally:
        await spy_nc.close()


async def _eq_async(fn, expected) -> bool:
    return await fn() == expected


# --- 3. add and drop under continuous traffic -----------------------------------------------------
async def test_add_and_drop_under_traffic_no_loss_no_overlap(nc, js, uniq):
    """3-4 members (1-2 instances each), 8 partitions, ~300 msg/s: no loss, exclusivity, order."""
    stream, group, n = uniq, "g", 8
    _, keys = await keyed_group(nc, js, stream, group, n)
    rec = Recorder()

    async def work(msg):
        await asyncio.sleep(0.001)

    layout = {"m1": ["a", "b"], "m2": ["a"], "m3": ["a", "b"], "m4": ["a"]}
    conns = [await nats.connect(nc.connected_url.geturl()) for _ in range(3)]
    try:
        async with Instances(nc) as inst:
            k = 0
            for member, names in layout.items():
                for name in names:
                    await inst.start(
                        stream,
                        group,
                        member,
                        handler_of(rec, member, f"{member}/{name}", work),
                        nc=conns[k % len(conns)],
                    )
                    k += 1
            await add_members(nc, stream, group, ["m1", "m2"])
            pub = Publisher(js, round_robin(f"{stream}.k", keys), rate=300).start()
            try:

                async def progress(count=150, timeout=10.0):
                    target = len(rec.acked_calls()) + count
                    await wait_for(
                        lambda: len(rec.acked_calls()) >= target,
                        timeout,
                        what=f"{count} more acks (have {len(rec.acked_calls())})",
                    )

                steps = [
                    ("add", ["m3"]),
                    ("add", ["m4"]),
                    ("drop", ["m2"]),
                    ("add", ["m2"]),
                    ("drop", ["m1", "m3"]),
                    ("add", ["m1"]),
                    ("add", ["m3"]),
                ]
                await progress()
                for op, names in steps:
                    if op == "add":
                        await add_members(nc, stream, group, names)
                    else:
                        await delete_members(nc, stream, group, names)
                    await progress()
            finally:
                await pub.stop()
            expected = set(pub.published)
            await wait_for(
                lambda: expected <= rec.acked_keys(),
                15,
                what=f"every published message acked ({len(expected - rec.acked_keys())} left)",
            )
            rec.check(expected, redelivery_bound=0).assert_ok()
            # the final membership (m1..m4) owns the partitions as the balanced assignment says
            final = {0: "m1", 1: "m1", 2: "m2", 3: "m2", 4: "m3", 5: "m3", 6: "m4", 7: "m4"}
            for p, owner in final.items():
                last = rec.by_partition()[p][-1]
                assert last.member == owner, (p, last)
            print(
                f"\nadd/drop under traffic: {len(expected)} messages, {len(rec.calls)} runs, "
                f"{len({r.instance for r in rec.calls})} instances ran handlers"
            )
            assert not [i for i in inst.items if i._done.done()]
    finally:
        for c in conns:
            await c.close()


# --- 4. unchanged members keep consuming during another member's add ------------------------------
async def test_unchanged_member_has_no_pause_during_add(nc, js, uniq):
    """4 partitions, m1 m2 m3 -> add m4: m2 [1] and m3 [2] keep theirs and must not pause; m1 hands 3 to m4."""
    stream, group, n = uniq, "g", 4
    _, keys = await keyed_group(nc, js, stream, group, n)
    rec = Recorder()
    async with Instances(nc) as inst:
        for m in ("m1", "m2", "m3", "m4"):
            await inst.start(stream, group, m, handler_of(rec, m, m))
        await add_members(nc, stream, group, ["m1", "m2", "m3"])
        for i in inst.items[:3]:
            await i.wait_for_consuming(5)
        pub = Publisher(js, round_robin(f"{stream}.k", keys), rate=500).start()  # 125 msg/s per partition
        try:
            await wait_for(lambda: all(rec.first_start(partition=p) for p in range(n)), 5, what="traffic")
            await asyncio.sleep(0.5)  # steady state before the change (part of the measured window)
            t_before = time.monotonic()
            await add_members(nc, stream, group, ["m4"])
            t_kv = time.monotonic()
            await wait_for(
                lambda: rec.first_start(partition=3, member="m4", after=t_before), 10, what="m4 processing partition 3"
            )
            t_m4 = rec.first_start(partition=3, member="m4", after=t_before)
            await wait_for(lambda: time.monotonic() > t_m4 + 1.0, 3)  # keep measuring after the hand-off
            t_end = time.monotonic()
        finally:
            await pub.stop()
        window = dict(since=t_before - 0.5, until=t_end)
        pause_m2 = rec.longest_pause(partitions=[1], **window)
        pause_m3 = rec.longest_pause(partitions=[2], **window)
        pause_m1 = rec.longest_pause(partitions=[0], **window)
        pause_p3 = rec.longest_pause(partitions=[3], **window)
        handoff = t_m4 - t_kv
        print(
            f"\nlongest pause: unchanged m2 {pause_m2 * 1000:.0f} ms, unchanged m3 {pause_m3 * 1000:.0f} ms, "
            f"shrinking m1 (kept p0) {pause_m1 * 1000:.0f} ms, moved p3 {pause_p3 * 1000:.0f} ms; "
            f"hand-off of p3 (KV change -> first message at m4) {handoff * 1000:.0f} ms"
        )
        assert pause_m2 < 0.5 and pause_m3 < 0.5, (pause_m2, pause_m3)
        assert handoff < 5.0
        expected = set(pub.published)
        await wait_for(lambda: expected <= rec.acked_keys(), 10, what="everything acked")
        rec.check(expected, redelivery_bound=0).assert_ok()
        assert rec.owners(1) == ["m2"] and rec.owners(2) == ["m3"]
        assert rec.owners(3) == ["m1", "m4"]


# --- 5. mappings and concurrent adds ------------------------------------------------------------
async def test_mappings_replace_members_and_back(nc, js, uniq):
    stream, group, n = uniq, "g", 4
    _, keys = await keyed_group(nc, js, stream, group, n)
    rec = Recorder()
    async with Instances(nc) as inst:
        for m in ("m1", "m2", "m3", "m4"):
            await inst.start(stream, group, m, handler_of(rec, m, m))
        await add_members(nc, stream, group, ["m1", "m2"])
        pub = Publisher(js, round_robin(f"{stream}.k", keys), rate=200).start()
        try:

            async def owners_since(t, expected, what):
                def ok():
                    return all(rec.first_start(partition=p, member=m, after=t) for p, m in expected.items())

                await wait_for(ok, 10, what=what)

            t0 = time.monotonic()
            await owners_since(t0, {0: "m1", 1: "m1", 2: "m2", 3: "m2"}, "balanced m1/m2")
            await set_member_mappings(nc, stream, group, [MemberMapping("m3", [0, 3]), MemberMapping("m4", [1, 2])])
            cfg = await get_elastic_config(nc, stream, group)
            assert cfg.members == [] and [m.member for m in cfg.member_mappings] == ["m3", "m4"]
            t1 = time.monotonic()
            await owners_since(t1, {0: "m3", 3: "m3", 1: "m4", 2: "m4"}, "mapped m3/m4")
            await wait_for(
                lambda: not inst.items[0].consuming and not inst.items[1].consuming, 5, what="m1 and m2 released"
            )
            t1b = time.monotonic()
            await owners_since(t1b, {0: "m3", 3: "m3", 1: "m4", 2: "m4"}, "mapped m3/m4, steady")
            assert not [r for r in rec.calls if r.start > t1b and r.member in ("m1", "m2")]

            await delete_member_mappings(nc, stream, group)
            await add_members(nc, stream, group, ["m1", "m2"])
            t2 = time.monotonic()
            await owners_since(t2, {0: "m1", 1: "m1", 2: "m2", 3: "m2"}, "balanced m1/m2 again")
            await wait_for(
                lambda: not inst.items[2].consuming and not inst.items[3].consuming, 5, what="m3 and m4 released"
            )
            t2b = time.monotonic()
            await owners_since(t2b, {0: "m1", 1: "m1", 2: "m2", 3: "m2"}, "balanced, steady")
        finally:
            await pub.stop()
        expected = set(pub.published)
        await wait_for(lambda: expected <= rec.acked_keys(), 10, what="everything acked")
        rec.check(expected, redelivery_bound=0).assert_ok()
        assert not [r for r in rec.calls if r.start > t2b and r.member in ("m3", "m4")]
        assert sorted(await list_elastic_active_members(nc, stream, group)) == ["m1", "m2"]


async def test_concurrent_add_members_from_two_clients_all_land(nc, js, uniq, nats_server):
    stream, group = uniq, "g"
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.>"]))
    await create_elastic(nc, stream, group, 64)
    other = await nats.connect(nats_server.url)
    try:
        names = [f"m{i:02d}" for i in range(40)]
        results = await asyncio.gather(
            *[add_members(nc if i % 2 == 0 else other, stream, group, [name]) for i, name in enumerate(names)]
        )
        cfg = await get_elastic_config(nc, stream, group)
        assert sorted(cfg.members) == names
        assert all(name in res for name, res in zip(names, results, strict=False))
        # drops race as well
        await asyncio.gather(
            *[delete_members(nc if i % 2 else other, stream, group, [name]) for i, name in enumerate(names[:20])]
        )
        assert sorted((await get_elastic_config(nc, stream, group)).members) == names[20:]
    finally:
        await other.close()
    await delete_elastic(nc, stream, group)


# --- 6. back-pressure ----------------------------------------------------------------------------
# nats-server 2.15.1 retries a source that hit the work queue's limit only every ~2.1 s, 20 messages a
# round (measured: 300 messages through a 20-message buffer take 30 s, 14 pauses of 2.13-2.19 s), so
# 2,000 messages take about 3.5 minutes: CI runs 120 (6 pauses); PCG_LONG=1 runs the 2,000.
N_BUFFERED = 2000 if os.environ.get("PCG_LONG") else 120


@pytest.mark.timeout(30 + N_BUFFERED // 8)
async def test_small_buffer_pauses_and_resumes_sourcing(nc, js, uniq):
    """max_buffered_msg 20 with a backlog in the origin: sourcing pauses when the work queue is full
    and resumes when it drains; the work queue never holds more than 20; nothing lost, order kept."""
    stream, group, n = uniq, "g", 2
    _, keys = await keyed_group(nc, js, stream, group, n, max_buffered_msgs=20)
    info = await js.stream_info(f"{stream}-{group}")
    assert info.config.max_msgs == 20 and getattr(info.config.discard, "value", info.config.discard) == "new"
    published = []
    subject_of = round_robin(f"{stream}.k", keys)
    for i in range(N_BUFFERED):
        ack = await js.publish(subject_of(i), str(i).encode())
        published.append((subject_of(i), ack.seq))
    await wait_for(lambda: _wq_msgs(js, f"{stream}-{group}", lambda m: m >= 20), 5, what="a full buffer")
    rec = Recorder()
    peak = [0]

    async def sample():
        while True:
            peak[0] = max(peak[0], (await js.stream_info(f"{stream}-{group}")).state.messages)
            await asyncio.sleep(0.05)

    sampler = asyncio.create_task(sample())
    t0 = time.monotonic()
    try:
        async with Instances(nc) as inst:
            for m in ("m1", "m2"):
                await inst.start(stream, group, m, handler_of(rec, m, m))
            await add_members(nc, stream, group, ["m1", "m2"])
            await wait_for(
                lambda: set(published) <= rec.acked_keys(),
                10 + N_BUFFERED // 8,
                what=f"all {N_BUFFERED} processed ({len(rec.acked_keys())} so far)",
            )
    finally:
        sampler.cancel()
    elapsed = time.monotonic() - t0
    starts = sorted(r.start for r in rec.calls)
    pauses = [b - a for a, b in itertools.pairwise(starts) if b - a > 0.5]
    print(
        f"\nmax_buffered_msg 20: {N_BUFFERED} messages in {elapsed:.1f}s, work-queue peak {peak[0]}, "
        f"{len(pauses)} sourcing pauses of {min(pauses, default=0):.2f}-{max(pauses, default=0):.2f}s"
    )
    assert peak[0] <= 20
    assert len(pauses) >= N_BUFFERED // 20 - 2  # it paused when full and resumed each time
    rec.check(published, redelivery_bound=0).assert_ok()
    state = (await js.stream_info(f"{stream}-{group}")).state
    assert state.messages == 0


async def _wq_msgs(js, name, pred) -> bool:
    return pred((await js.stream_info(name)).state.messages)


# --- 7. instance lifecycle ------------------------------------------------------------------------
async def test_instance_before_member_added_dropped_and_readded(nc, js, uniq):
    stream, group, n = uniq, "g", 2
    _, keys = await keyed_group(nc, js, stream, group, n)
    rec = Recorder()
    subject_of = round_robin(f"{stream}.k", keys)
    counter = iter(range(10**6))

    async def publish(count):
        out = []
        for _ in range(count):
            i = next(counter)
            ack = await js.publish(subject_of(i), b"x")
            out.append((subject_of(i), ack.seq))
        return out

    async with Instances(nc) as inst:
        m1 = await inst.start(stream, group, "m1", handler_of(rec, "m1", "m1"))
        sent = await publish(10)
        await asyncio.sleep(0.3)  # a non-member must not consume (bounded negative check)
        assert not m1.consuming and rec.count() == 0
        await add_members(nc, stream, group, ["m1"])
        await m1.wait_for_consuming(5)
        await wait_for(lambda: set(sent) <= rec.acked_keys(), 5, what="m1 consuming once added")

        await delete_members(nc, stream, group, ["m1"])
        await wait_for(lambda: not m1.consuming, 5, what="m1 released")
        assert await list_elastic_active_members(nc, stream, group) == []
        before = rec.count()
        sent2 = await publish(10)
        await asyncio.sleep(0.3)
        assert rec.count() == before and not m1._done.done()

        await add_members(nc, stream, group, ["m1"])
        await wait_for(lambda: set(sent2) <= rec.acked_keys(), 5, what="m1 resumed")
        rec.check(sent + sent2, redelivery_bound=0).assert_ok()


async def test_consumer_deleted_under_instance_rejoins(nc, js, uniq):
    stream, group, n = uniq, "g", 2
    filter_, keys = await keyed_group(nc, js, stream, group, n)
    rec = Recorder()
    subject_of = round_robin(f"{stream}.k", keys)
    async with Instances(nc) as inst:
        m1 = await inst.start(stream, group, "m1", handler_of(rec, "m1", "m1"))
        await add_members(nc, stream, group, ["m1"])
        await m1.wait_for_consuming(5)
        api = JetStreamApi(nc)
        assert await api.delete_consumer(f"{stream}-{group}", "m1")
        await wait_for(lambda: m1.recovered_errors >= 1, 5, what="the instance noticing")
        sent = []
        for i in range(10):
            ack = await js.publish(subject_of(i), b"x")
            sent.append((subject_of(i), ack.seq))
        await wait_for(lambda: set(sent) <= rec.acked_keys(), 5, what="consuming again")
        assert not m1._done.done()
        info = await api.consumer_info(f"{stream}-{group}", "m1")
        assert info["config"]["filter_subjects"] == [f"0.{filter_}", f"1.{filter_}"]


async def test_work_queue_deleted_under_running_instance_ends_it(nc, js, uniq):
    stream, group, n = uniq, "g", 2
    await keyed_group(nc, js, stream, group, n)
    async with Instances(nc) as inst:
        m1 = await inst.start(stream, group, "m1", counting({}, "m1"))
        await add_members(nc, stream, group, ["m1"])
        await m1.wait_for_consuming(5)
        await js.delete_stream(f"{stream}-{group}")
        err = await asyncio.wait_for(m1.done(), 8)
        assert isinstance(err, ConsumerGoneError), repr(err)


async def test_work_queue_deleted_under_waiting_non_member_ends_it(nc, js, uniq):
    """An instance whose member is not (yet) in the membership is no zombie either."""
    stream, group, n = uniq, "g", 2
    await keyed_group(nc, js, stream, group, n)
    async with Instances(nc) as inst:
        m1 = await inst.start(stream, group, "m1", counting({}, "m1"))
        await js.delete_stream(f"{stream}-{group}")
        err = await asyncio.wait_for(m1.done(), 8)
        assert isinstance(err, ConsumerGoneError), repr(err)


async def test_stop_starts_no_new_handler(nc, js, uniq):
    """stop() lets the handler in flight finish and starts no other (docs/DESIGN.md, *The CLI contract*: exits after the handler in
    flight finishes)."""
    stream, group = uniq, "g"
    _, keys = await keyed_group(nc, js, stream, group, 2)
    subject_of = round_robin(f"{stream}.k", keys)
    for i in range(200):
        await js.publish(subject_of(i), b"x")
    await add_members(nc, stream, group, ["m1"])
    rec = Recorder()

    async def work(msg):
        await asyncio.sleep(0.02)

    m1 = await elastic_consume(
        nc,
        stream,
        group,
        "m1",
        handler_of(rec, "m1", "m1", work),
        config=ConsumerConfig(max_ack_pending=20, ack_wait=2),
    )
    try:
        await wait_for(lambda: len(rec.acked_calls()) >= 5, 5, what="processing")
        t = time.monotonic()
        await asyncio.wait_for(m1.stop(), 5)
        took = time.monotonic() - t
    finally:
        await asyncio.wait_for(m1.stop(), 5)
    started_after = [r for r in rec.calls if r.start > t]
    assert not [r for r in rec.calls if not r.acked], "a handler was cancelled mid-run"
    assert not started_after and took < 0.5, f"{len(started_after)} handlers started after stop(); took {took:.2f}s"


async def test_ack_policy_none_is_a_config_error(nc, js, uniq):
    stream, group = uniq, "g"
    await keyed_group(nc, js, stream, group, 2)
    with pytest.raises(ConfigError, match="must be explicit"):
        await elastic_consume(
            nc, stream, group, "m1", counting({}, "m1"), config=ConsumerConfig(ack_policy="none", ack_wait=1)
        )


async def test_max_members_changed_in_kv_ends_instance(nc, js, uniq):
    stream, group = uniq, "g"
    await keyed_group(nc, js, stream, group, 2)
    await add_members(nc, stream, group, ["m1"])
    async with Instances(nc) as inst:
        m1 = await inst.start(stream, group, "m1", counting({}, "m1"))
        await m1.wait_for_consuming(5)
        kv = await js.key_value(ELASTIC_BUCKET)
        value = json.loads((await kv.get(f"{stream}.{group}")).value)
        value["max_members"] = 3
        await kv.put(f"{stream}.{group}", json.dumps(value, separators=(",", ":")).encode())
        err = await asyncio.wait_for(m1.done(), 5)
        assert isinstance(err, ConfigChangedError), repr(err)


async def test_purged_key_ends_instance_normally(nc, js, uniq):
    stream, group = uniq, "g"
    await keyed_group(nc, js, stream, group, 2)
    await add_members(nc, stream, group, ["m1"])
    async with Instances(nc) as inst:
        m1 = await inst.start(stream, group, "m1", counting({}, "m1"))
        m2 = await inst.start(stream, group, "m2", counting({}, "m2"))  # a non-member ends too
        await m1.wait_for_consuming(5)
        kv = await js.key_value(ELASTIC_BUCKET)
        await kv.purge(f"{stream}.{group}")
        assert await asyncio.wait_for(m1.done(), 5) is None
        assert await asyncio.wait_for(m2.done(), 5) is None


# --- 8. two instances of one member, step-down ---------------------------------------------------
async def test_only_pinned_instance_receives_and_step_down_moves_pin(nc, js, uniq):
    stream, group, n = uniq, "g", 2
    _, keys = await keyed_group(nc, js, stream, group, n)
    rec = Recorder()
    subject_of = round_robin(f"{stream}.k", keys)
    counter = iter(range(10**6))

    async def publish(count):
        out = []
        for _ in range(count):
            i = next(counter)
            ack = await js.publish(subject_of(i), b"x")
            out.append((subject_of(i), ack.seq))
        return out

    await add_members(nc, stream, group, ["m1"])
    async with Instances(nc) as inst:
        a = await inst.start(stream, group, "m1", handler_of(rec, "m1", "a"))
        b = await inst.start(stream, group, "m1", handler_of(rec, "m1", "b"))
        await a.wait_for_consuming(5)
        await b.wait_for_consuming(5)
        sent = await publish(20)
        await wait_for(lambda: set(sent) <= rec.acked_keys(), 5, what="first batch")
        first = {r.instance for r in rec.calls}
        assert len(first) == 1, first
        pinned, other = (a, b) if first == {"a"} else (b, a)
        other_name = "b" if first == {"a"} else "a"
        assert pinned.pinned and not other.pinned

        await elastic_member_step_down(nc, stream, group, "m1")
        t = time.monotonic()
        sent2 = await publish(20)
        await wait_for(lambda: set(sent2) <= rec.acked_keys(), 5, what="after step-down")
        after = {r.instance for r in rec.calls if r.start > t}
        assert after == {other_name}, after
        await wait_for(lambda: other.pinned and not pinned.pinned, 3, what="pin flags follow")
        rec.check(sent + sent2, redelivery_bound=0).assert_ok()
