"""Automatic membership on a real nats-server: instances join by starting, leave by stopping or dying
(lease expiry), and the partitions follow with the sticky assignment written as member_mappings.

Scenarios: the Sarama walk-through (exact assignment at each step, an idle surplus member taking over
from a leaver), SIGKILL of every instance of a member (dropped after the lease TTL, its partitions flow
elsewhere, nothing lost), a rolling restart under traffic (checked for loss, overlap and order), joins
and leaves close together making one rebalance, hot standbys of a named member, leases, admin commands.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import nats
import pytest
from nats.js.api import StreamConfig

from pcgroups import (
    AutoInstance,
    ConfigError,
    ConsumeContext,
    ConsumerConfig,
    JetStreamApi,
    PartitioningFilter,
    create_elastic,
    delete_elastic,
    elastic_consume,
    elastic_member_step_down,
    get_elastic_config,
    list_elastic_active_members,
    partition_of_subject,
)
from pcgroups.elastic._membership import LEASE_STREAM, list_leases
from pcgroups.elastic._sticky import moved_partitions
from pcgroups.jetstream._store import ELASTIC_BUCKET
from pcgroups.testing._checker import Recorder

from .helpers.support import wait_for

FAST = ConsumerConfig(max_ack_pending=1, ack_wait=1)
TTL = 2.0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- helpers ------------------------------------------------------------------------------------
def keys_by_partition(filter_: str, n: int, count: int = 300) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {p: [] for p in range(n)}
    for i in range(count):
        out[partition_of_subject(filter_.replace("*", f"k{i}"), n, [1], filter_)].append(f"k{i}")
    return out


async def keyed_group(nc, js, stream: str, group: str, n: int) -> dict[int, list[str]]:
    """Origin stream ``<stream>.k.<key>``; an elastic group hashing the key into n partitions."""
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.k.*"]))
    filter_ = f"{stream}.k.*"
    await create_elastic(nc, stream, group, n, partitioning_filters=[PartitioningFilter(filter_, [1])])
    return keys_by_partition(filter_, n)


async def assignment(nc, stream: str, group: str) -> dict[str, list[int]]:
    cfg = await get_elastic_config(nc, stream, group)
    assert not cfg.members
    return {m.member: m.partitions for m in cfg.member_mappings}


class Auto:
    """Starts auto instances and stops every one still running on exit."""

    def __init__(self, nc):
        self.nc = nc
        self.items = []

    async def start(self, stream, group, handler, *, nc=None, **kw):
        kw.setdefault("lease_ttl", TTL)
        kw.setdefault("config", FAST)
        member = kw.pop("member", "")
        inst = await elastic_consume(nc or self.nc, stream, group, member, handler, auto=True, **kw)
        self.items.append(inst)
        return inst

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await asyncio.gather(*(asyncio.wait_for(i.stop(), 15) for i in self.items), return_exceptions=True)


class Publisher:
    """Publishes round-robin over the partitions at ``rate`` msg/s; remembers the origin sequences."""

    def __init__(self, js, stream: str, keys: dict[int, list[str]], rate: float):
        self.js, self.stream, self.keys, self.rate = js, stream, keys, rate
        self.published: list[int] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> Publisher:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        i, n = 0, len(self.keys)
        next_at = time.monotonic()
        while not self._stop.is_set():
            ks = self.keys[i % n]
            ack = await self.js.publish(f"{self.stream}.k.{ks[(i // n) % len(ks)]}", str(i).encode())
            self.published.append(ack.seq)
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


async def flows_to(
    js, rec: Recorder, stream: str, keys: dict[int, list[str]], owners: dict[int, str], timeout: float = 10.0
) -> None:
    """One message per partition is processed by the member that owns it."""
    seqs = {}
    for p in owners:
        seqs[p] = (await js.publish(f"{stream}.k.{keys[p][0]}", b"probe")).seq
    for p, seq in seqs.items():
        await wait_for(
            lambda seq=seq: any(c.key == seq and c.acked for c in rec.calls),
            timeout,
            what=f"the probe of partition {p}",
        )
        who = {c.member for c in rec.calls if c.key == seq and c.acked}
        assert who == {owners[p]}, f"partition {p} processed by {who}, expected {owners[p]}"


def owners_of(assign: dict[str, list[int]]) -> dict[int, str]:
    return {p: m for m, ps in assign.items() for p in ps}


# --- the Sarama walk-through --------------------------------------------------------------------
async def test_sarama_walk_through_exact_assignment_at_each_step(nc, js, uniq):
    """3 partitions; instances a, b, c, d start one at a time: a 0,1,2; a 0,1 b 2; a 0 b 2 c 1; d idles.
    Stopping a hands its partition 0 to the idle d. Every step is checked in the config, in each
    instance's view and by messages flowing to the owner."""
    stream, group = uniq, "g"
    keys = await keyed_group(nc, js, stream, group, 3)
    rec = Recorder()
    steps = [
        ("a", {"a": [0, 1, 2]}),
        ("b", {"a": [0, 1], "b": [2]}),
        ("c", {"a": [0], "b": [2], "c": [1]}),
        ("d", {"a": [0], "b": [2], "c": [1]}),
    ]
    insts = {}
    async with Auto(nc) as auto:
        for name, expected in steps:
            t0 = time.monotonic()
            insts[name] = await auto.start(stream, group, rec.handler(name, name), member=name)
            await insts[name].wait_settled(10)
            assert await assignment(nc, stream, group) == expected
            for m, inst in insts.items():
                want = expected.get(m, [])
                await wait_for(lambda inst=inst, want=want: inst.partitions == want, 5, what=f"{m}'s view")
            await flows_to(js, rec, stream, keys, owners_of(expected))
            print(f"\n+{name}: {expected} settled and flowing in {time.monotonic() - t0:.2f}s")
        # d idles: a live lease, in no mapping, no consumer
        d = insts["d"]
        assert d.partitions == [] and not d.consuming and not d.pinned
        leases = await list_leases(nc, stream, group)
        assert [x.member for x in leases] == ["a", "b", "c", "d"]
        assert all(0 < x.expires_in <= TTL for x in leases)
        # a stops: its partition goes to the idle d, nothing else moves
        t0 = time.monotonic()
        await asyncio.wait_for(insts["a"].stop(), 10)
        assert await insts["a"].done() is None
        expected = {"b": [2], "c": [1], "d": [0]}
        await wait_for(lambda: d.partitions == [0], 5, what="d gets partition 0")
        assert await assignment(nc, stream, group) == expected
        await flows_to(js, rec, stream, keys, owners_of(expected))
        print(f"-a: {expected} flowing in {time.monotonic() - t0:.2f}s")
        assert [x.member for x in await list_leases(nc, stream, group)] == ["b", "c", "d"]
    report = rec.check()
    assert report.ok, report.failures


# --- SIGKILL of every instance of a member ------------------------------------------------------
def _spawn(url: str, stream: str, group: str, member: str) -> subprocess.Popen:
    logdir = os.environ.get("PCG_TEST_LOGDIR")  # keep the processes' logs for a post-mortem
    log = os.path.join(logdir, f"{stream}-{member}-{time.time_ns()}.log") if logdir else os.devnull
    with open(log, "w") as stderr:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.auto_proc",
                url,
                stream,
                group,
                "--member",
                member,
                "--lease-ttl",
                str(TTL),
                "--ack-wait",
                "1",
                "--work",
                "0.002",
            ],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=ROOT,
        )


async def _read(proc: subprocess.Popen, rec: Recorder, ready: list) -> None:
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, proc.stdout.readline)
        if not line:
            return
        if rec.feed(line) is None:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("ev") == "ready":
                ready.append(event)


@pytest.mark.slow
async def test_sigkill_of_every_instance_of_a_member_drops_it_after_the_lease_ttl(nc, js, uniq, nats_server):
    """Members a (two processes: hot standbys), b and c share 4 partitions under traffic. SIGKILL both
    a processes: a is dropped about a lease TTL later, its partitions flow at b and c, nothing is lost,
    no partition ever has two handlers running."""
    stream, group, n = uniq, "g", 4
    keys = await keyed_group(nc, js, stream, group, n)
    rec = Recorder()
    layout = [("a", 0), ("a", 1), ("b", 0), ("c", 0)]
    procs = [_spawn(nats_server.url, stream, group, m) for m, _ in layout]
    ready: list[dict] = []
    readers = [asyncio.ensure_future(_read(p, rec, ready)) for p in procs]
    pub = None
    try:
        await wait_for(lambda: len(ready) == len(procs), 20, what="all processes ready")
        await wait_for(lambda: assignment(nc, stream, group), 10, what="a first assignment")

        async def has_all():
            return sorted(await assignment(nc, stream, group)) == ["a", "b", "c"]

        await wait_for(has_all, 10, what="a, b and c in the membership")
        before = await assignment(nc, stream, group)
        pub = Publisher(js, stream, keys, rate=120).start()
        await wait_for(lambda: all(rec.count(partition=p) >= 5 for p in range(n)), 15, what="every partition flowing")
        a_procs = [p for p, (m, _) in zip(procs, layout, strict=False) if m == "a"]
        killed_at = time.time()
        for p in a_procs:
            p.send_signal(signal.SIGKILL)
        # every line the killed processes printed is read (EOF) before their open calls are closed
        await asyncio.wait_for(asyncio.gather(*(r for r, (m, _) in zip(readers, layout, strict=False) if m == "a")), 10)
        for e in ready:
            if e["member"] == "a":
                rec.close_instance(e["instance"], t=killed_at)

        async def a_dropped():
            return "a" not in await assignment(nc, stream, group)

        await wait_for(a_dropped, 3 * TTL + 5, interval=0.01, what="a dropped from the membership")
        dropped_at = time.time()
        after = await assignment(nc, stream, group)
        assert moved_partitions(before, after) == sorted(before["a"]), "only a's partitions moved"
        await wait_for(
            lambda: all(rec.first_start(after=killed_at, partition=p) is not None for p in before["a"]),
            15,
            what="a's partitions flowing again",
        )
        flowing = max(rec.first_start(after=killed_at, partition=p) for p in before["a"]) - killed_at
        await asyncio.sleep(1.0)
        await pub.stop()
        expected = set(pub.published)
        killed = {c.key for c in rec.calls if c.outcome == "killed"}

        async def all_done():
            # every message acked, or acked by a killed process just before it died: then it is gone
            # from the work queue although its "end" line never came
            if not expected <= rec.acked_keys() | killed:
                return False
            return (await js.stream_info(f"{stream}-{group}")).state.messages == 0

        try:
            await wait_for(all_done, 20, what=f"every message acked ({len(expected - rec.acked_keys())} left)")
        except AssertionError:
            missing = sorted(expected - rec.acked_keys())
            print(f"\nkilled at {killed_at:.3f}, dropped at {dropped_at:.3f}; missing {missing[:10]}")
            for c in rec.calls:
                if c.key in missing[:10]:
                    print("  call", c.show())
            print("  work queue", (await js.stream_info(f"{stream}-{group}")).state)
            raise
        acked_by_the_dead = expected - rec.acked_keys()
        assert acked_by_the_dead <= killed
        expected -= acked_by_the_dead
        report = rec.check(expected)
        print(
            f"\nSIGKILL of both a instances (lease TTL {TTL:g}s, AckWait 1s): dropped from the membership after "
            f"{dropped_at - killed_at:.2f}s, a's partitions {before['a']} flowing again after {flowing:.2f}s; "
            f"{before} -> {after}; {report.processed} messages, {report.redelivered} redelivered"
        )
        assert report.ok, report.failures
        assert dropped_at - killed_at < TTL + 2.0
        assert flowing < TTL + 3.0
        assert {c.member for c in rec.calls if c.start > killed_at + 0.01 and c.partition in before["a"]} <= {"b", "c"}
    finally:
        if pub is not None and not pub._stop.is_set():
            await pub.stop()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for r in readers:
            await asyncio.wait_for(r, 5)


# --- rolling restart under traffic --------------------------------------------------------------
@pytest.mark.slow
async def test_rolling_restart_under_traffic_nothing_lost_no_overlap(nc, js, uniq):
    """6 partitions; members a (two instances), b, c. Restart every instance in turn under traffic:
    a's instances fail over to each other (no membership change), b and c leave and join again. No
    message is lost, no partition has two handlers at once, each partition succeeds in order."""
    stream, group, n = uniq, "g", 6
    keys = await keyed_group(nc, js, stream, group, n)
    rec = Recorder()
    conns = [await nats.connect(nc.connected_url.geturl()) for _ in range(2)]
    writes: list[bytes] = []
    kv = await js.key_value(ELASTIC_BUCKET)
    watcher = await kv.watch(f"{stream}.{group}")

    async def follow():
        async for e in watcher:
            if e is not None and e.value:
                writes.append(e.value)

    follower = asyncio.ensure_future(follow())
    k = 0
    try:
        async with Auto(nc) as auto:

            async def start(member: str, label: str):
                nonlocal k
                k += 1
                return await auto.start(
                    stream,
                    group,
                    rec.handler(member, label, lambda m: asyncio.sleep(0.002)),
                    member=member,
                    nc=conns[k % len(conns)],
                )

            running = {
                "a1": await start("a", "a1"),
                "a2": await start("a", "a2"),
                "b1": await start("b", "b1"),
                "c1": await start("c", "c1"),
            }
            for inst in running.values():
                await inst.wait_settled(10)
            pub = Publisher(js, stream, keys, rate=150).start()
            try:

                async def progress(count=100):
                    target = rec.count() + count
                    await wait_for(lambda: rec.count() >= target, 15, what=f"{count} more acks")

                await progress()
                for label in ["a1", "a2", "b1", "c1"]:
                    t0 = time.monotonic()
                    member = label[0]
                    await asyncio.wait_for(running.pop(label).stop(), 15)
                    running[label] = await start(member, f"{label}'")
                    for inst in running.values():
                        await inst.wait_settled(10)
                    await progress()
                    print(f"\nrestarted {label}: {await assignment(nc, stream, group)} in {time.monotonic() - t0:.2f}s")
            finally:
                await pub.stop()
            expected = set(pub.published)
            await wait_for(
                lambda: expected <= rec.acked_keys(),
                20,
                what=f"every message acked ({len(expected - rec.acked_keys())} left)",
            )
            report = rec.check(expected)
            print(
                f"rolling restart: {report.processed} messages, {report.calls} calls, {report.redelivered} "
                f"redelivered, {len(writes)} config writes, by instance {report.by_instance}"
            )
            assert report.ok, report.failures
            assert sorted(await assignment(nc, stream, group)) == ["a", "b", "c"]
    finally:
        follower.cancel()
        await watcher.stop()
        for c in conns:
            await c.close()


# --- joins and leaves close together ------------------------------------------------------------
async def test_joins_and_leaves_close_together_make_one_rebalance(nc, js, uniq):
    """Three instances joining at once make one config write, and so do two stopping at once; every
    instance agrees on the result (no coordinator, compare-and-set)."""
    stream, group = uniq, "g"
    await keyed_group(nc, js, stream, group, 6)
    writes: list[bytes] = []
    kv = await js.key_value(ELASTIC_BUCKET)
    watcher = await kv.watch(f"{stream}.{group}")
    initial = asyncio.Event()

    async def follow():
        async for e in watcher:
            if e is None:
                initial.set()
            elif initial.is_set():
                writes.append(e.value)

    follower = asyncio.ensure_future(follow())

    async def noop(msg):
        await msg.ack()

    try:
        async with Auto(nc) as auto:
            await asyncio.wait_for(initial.wait(), 5)
            a = await auto.start(stream, group, noop, member="a")
            await a.wait_settled(10)
            assert await assignment(nc, stream, group) == {"a": [0, 1, 2, 3, 4, 5]}
            assert len(writes) == 1
            others = await asyncio.gather(*(auto.start(stream, group, noop, member=m) for m in ("b", "c", "d")))
            for inst in [a, *others]:
                await inst.wait_settled(10)
            await asyncio.sleep(3 * 0.4)  # a straggling write would show up by now
            assert await assignment(nc, stream, group) == {"a": [0, 1], "b": [2, 3], "c": [4], "d": [5]}
            assert len(writes) == 2, [json.loads(w)["member_mappings"] for w in writes]
            assert sum(i.rebalances for i in [a, *others]) == 2
            # two leaving at once: one write
            b, c, _d = others
            await asyncio.wait_for(asyncio.gather(b.stop(), c.stop()), 15)
            await a.wait_settled(10)
            await asyncio.sleep(3 * 0.4)
            assert await assignment(nc, stream, group) == {"a": [0, 1, 2], "d": [3, 4, 5]}
            assert len(writes) == 3, [json.loads(w)["member_mappings"] for w in writes]
    finally:
        follower.cancel()
        await watcher.stop()


# --- named members are hot standbys; generated names; leases ------------------------------------
async def test_named_member_instances_are_hot_standbys(nc, js, uniq):
    """Two instances of member m: one pinned; stopping one changes nothing in the membership; the
    other carries on; step-down moves the pin (admin commands work on auto groups)."""
    stream, group = uniq, "g"
    keys = await keyed_group(nc, js, stream, group, 2)
    rec = Recorder()
    async with Auto(nc) as auto:
        m1 = await auto.start(stream, group, rec.handler("m", "m1"), member="m")
        m2 = await auto.start(stream, group, rec.handler("m", "m2"), member="m")
        xi = await auto.start(stream, group, rec.handler("x", "x1"), member="x")
        for inst in (m1, m2, xi):
            await inst.wait_settled(10)
        assert await assignment(nc, stream, group) == {"m": [0], "x": [1]}
        await m1.wait_for_consuming(10)
        await m2.wait_for_consuming(10)
        await flows_to(js, rec, stream, keys, {0: "m", 1: "x"})
        assert sorted(await list_elastic_active_members(nc, stream, group)) == ["m", "x"]
        await wait_for(lambda: m1.pinned or m2.pinned, 5, what="a pinned m instance")
        pinned, standby = (m1, m2) if m1.pinned else (m2, m1)
        await elastic_member_step_down(nc, stream, group, "m")
        await flows_to(js, rec, stream, keys, {0: "m"})
        await wait_for(lambda: standby.pinned, 5, what="the pin moved")
        config_before = (await get_elastic_config(nc, stream, group)).to_json()
        await asyncio.wait_for(standby.stop(), 10)
        await asyncio.sleep(0.8)
        assert (await get_elastic_config(nc, stream, group)).to_json() == config_before
        await flows_to(js, rec, stream, keys, {0: "m", 1: "x"})
        leases = await list_leases(nc, stream, group)
        assert [(x.member, x.instance) for x in leases] == [("m", pinned.instance_id), ("x", xi.instance_id)]
    assert rec.check().ok


async def test_generated_names_lease_bucket_and_stop_deletes_the_lease(nc, js, uniq):
    stream, group = uniq, "g"
    await keyed_group(nc, js, stream, group, 4)

    async def noop(msg):
        await msg.ack()

    with pytest.raises(ConfigError):
        await elastic_consume(nc, stream, group, "", noop, auto=True, lease_ttl=0.5)
    async with Auto(nc) as auto:
        i1 = await auto.start(stream, group, noop)
        i2 = await auto.start(stream, group, noop)
        assert not i1.user_named and i1.member_name != i2.member_name
        for i in (i1, i2):
            assert i.member_name.startswith("auto-") and len(i.member_name) == 13
            await i.wait_settled(10)
        got = await assignment(nc, stream, group)
        assert sorted(got) == sorted([i1.member_name, i2.member_name])
        assert sorted(len(ps) for ps in got.values()) == [2, 2]
        leases = await list_leases(nc, stream, group)
        assert sorted(x.member for x in leases) == sorted(got)
        assert all(x.ttl == TTL and x.pid == os.getpid() and 0 < x.expires_in <= TTL for x in leases)
        info = (await js.stream_info(LEASE_STREAM)).config
        assert info.max_msgs_per_subject == 1 and info.allow_msg_ttl and info.subject_delete_marker_ttl
        # renewals keep the lease alive well past its TTL
        await asyncio.sleep(TTL + 0.5)
        assert len(await list_leases(nc, stream, group)) == 2
        t0 = time.monotonic()
        await asyncio.wait_for(i1.stop(), 10)
        assert [x.member for x in await list_leases(nc, stream, group)] == [i2.member_name]
        await i2.wait_settled(10)
        assert await assignment(nc, stream, group) == {i2.member_name: [0, 1, 2, 3]}
        print(f"\nleave by stop: membership written and partitions released in {time.monotonic() - t0:.2f}s")
        await asyncio.wait_for(i2.stop(), 10)
    assert await list_leases(nc, stream, group) == []
    # the last one out leaves a group with no members
    cfg = await get_elastic_config(nc, stream, group)
    assert not cfg.members and not cfg.member_mappings


async def _two_settled(auto: Auto, nc, js, stream: str, group: str) -> list:
    """A 2-partition group with two settled auto instances that ack everything."""
    await keyed_group(nc, js, stream, group, 2)

    async def noop(msg):
        await msg.ack()

    insts = [await auto.start(stream, group, noop) for _ in range(2)]
    for i in insts:
        await i.wait_settled(10)
    return insts


async def test_a_consumer_deleted_under_an_auto_instance_is_recreated_and_counted(nc, js, uniq):
    """``recovered_errors``, a ConsumeContext property: the auto instance whose consumer was deleted
    creates it again and keeps running, and counts the fault; the other instance counts none."""
    stream, group = uniq, "g"
    async with Auto(nc) as auto:
        a, b = await _two_settled(auto, nc, js, stream, group)
        assert isinstance(a, ConsumeContext) and (a.recovered_errors, b.recovered_errors) == (0, 0)
        api = JetStreamApi(nc)
        assert await api.delete_consumer(f"{stream}-{group}", a.member_name)
        await wait_for(lambda: a.recovered_errors == 1, 5, what="the instance recovering")
        await wait_for(lambda: _has_consumer(api, f"{stream}-{group}", a.member_name), 5, what="its consumer back")
        assert a.consuming and b.recovered_errors == 0


async def _has_consumer(api, stream: str, name: str) -> bool:
    return name in [c["name"] for c in await api.list_consumers(stream)]


async def test_group_deleted_ends_auto_instances_and_their_leases(nc, js, uniq):
    stream, group = uniq, "g"
    async with Auto(nc) as auto:
        insts = await _two_settled(auto, nc, js, stream, group)
        await delete_elastic(nc, stream, group)
        for i in insts:
            assert await asyncio.wait_for(i.done(), 10) is None
    assert await list_leases(nc, stream, group) == []


@pytest.mark.parametrize(
    "bad,want",
    [(b"\xff\xfe\x00{garbage", "not valid JSON"), (b'{"max_members":-4,"members":["a"]}', "got -4")],
    ids=["garbage-bytes", "negative-number"],
)
async def test_corrupted_config_ends_auto_instances_and_they_leave_it_alone(nc, js, uniq, bad, want):
    """A corrupted config under auto instances: each ends with a ConfigError naming the group, none of them
    writes a membership over the bad value (it stays for an admin to fix or delete), and their leases go."""
    stream, group = uniq, "g"
    async with Auto(nc) as auto:
        insts = await _two_settled(auto, nc, js, stream, group)
        kv = await js.key_value(ELASTIC_BUCKET)
        await kv.put(f"{stream}.{group}", bad)
        for i in insts:
            err = await asyncio.wait_for(i.done(), 10)
            assert isinstance(err, ConfigError), repr(err)
            with pytest.raises(ConfigError) as raised:  # wait() raises what done() returns
                await i.wait()
            assert raised.value is err
            assert f"elastic consumer group {group} on stream {stream} is no longer valid" in str(err), str(err)
            assert want in str(err), str(err)
        await wait_for(lambda: _no_leases(nc, stream, group), 10, what="the leases released")
        entry = await kv.get(f"{stream}.{group}")
        assert entry.value == bad and entry.operation is None  # nothing rewrote it


async def _no_leases(nc, stream: str, group: str) -> bool:
    return await list_leases(nc, stream, group) == []


async def test_admin_mapping_change_is_brought_back_to_the_live_members(nc, js, uniq):
    """An admin writes mappings naming a member with no lease: the instances put the live members back
    (and a mapping that already fits the live members is left alone)."""
    from pcgroups import MemberMapping, set_member_mappings

    stream, group = uniq, "g"
    await keyed_group(nc, js, stream, group, 4)

    async def noop(msg):
        await msg.ack()

    async with Auto(nc) as auto:
        a = await auto.start(stream, group, noop, member="a")
        b = await auto.start(stream, group, noop, member="b")
        for i in (a, b):
            await i.wait_settled(10)
        await set_member_mappings(
            nc, stream, group, [MemberMapping("a", [0, 1]), MemberMapping("b", [3]), MemberMapping("ghost", [2])]
        )

        async def fixed():
            return await assignment(nc, stream, group) in ({"a": [0, 1], "b": [2, 3]},)

        await wait_for(fixed, 10, what="the ghost's partition given to b")
        await set_member_mappings(nc, stream, group, [MemberMapping("a", [1, 3]), MemberMapping("b", [0, 2])])
        await asyncio.sleep(1.0)
        assert await assignment(nc, stream, group) == {"a": [1, 3], "b": [0, 2]}


async def test_lapsed_lease_drops_the_member_and_renewal_takes_it_again(nc, js, uniq):
    """An instance that misses its renewals for longer than the TTL (a stall) is dropped like a dead
    one; when it renews again it takes its key over at the server's expiry marker and joins again."""
    stream, group = uniq, "g"
    await keyed_group(nc, js, stream, group, 2)

    async def noop(msg):
        await msg.ack()

    async with Auto(nc) as auto:
        a = await auto.start(stream, group, noop, member="a")
        b = await auto.start(stream, group, noop, member="b")
        for i in (a, b):
            await i.wait_settled(10)
        assert await assignment(nc, stream, group) == {"a": [0], "b": [1]}
        renew = a._renew

        async def stalled():
            pass

        a._renew = stalled
        t0 = time.monotonic()

        async def a_dropped():
            return await assignment(nc, stream, group) == {"b": [0, 1]}

        await wait_for(a_dropped, TTL + 3, what="a dropped after its lease lapsed")
        print(f"\nlapsed lease: dropped {time.monotonic() - t0:.2f}s after the last renewal was skipped")
        assert "a" not in b.live_members and not a.settled
        a._renew = renew  # renewals resume: wrong last sequence -> take over at the marker
        await a.wait_settled(TTL + 3)
        assert await assignment(nc, stream, group) == {"a": [1], "b": [0]}  # sticky: b keeps its lowest
        assert [x.member for x in await list_leases(nc, stream, group)] == ["a", "b"]


async def test_auto_is_reached_through_elastic_consume_only(nc, js, uniq):
    """``elastic_consume(..., auto=True)`` is the one entry point of automatic membership (a generated
    member without a name); what it gives is a consume context like any instance."""
    import pcgroups

    assert not hasattr(pcgroups, "elastic_consume_auto")
    stream, group = uniq, "g"
    await keyed_group(nc, js, stream, group, 2)

    async def noop(msg):
        await msg.ack()

    inst = await elastic_consume(nc, stream, group, "", noop, auto=True, lease_ttl=2)
    try:
        assert isinstance(inst, AutoInstance) and isinstance(inst, ConsumeContext)
        assert inst.member_name.startswith("auto-")
        await inst.wait_settled(10)
        assert await assignment(nc, stream, group) == {inst.member_name: [0, 1]}
    finally:
        await asyncio.wait_for(inst.stop(), 10)


async def test_auto_instances_follow_a_join_right_after_a_server_restart(fresh_server, uniq):
    """Across a server restart the lease and config watches start again at the reconnect: a third instance
    joining right after it is in every instance's partitions within seconds (it took 17 s when the
    watches waited for missed heartbeats, and the two older instances wrote it out again meanwhile)."""
    nc = await nats.connect(fresh_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    js = nc.jetstream()
    try:
        await keyed_group(nc, js, uniq, "g", 6)

        async def handler(msg):
            await msg.ack()

        async with Auto(nc) as auto:
            a = await auto.start(uniq, "g", handler, member="a", lease_ttl=5.0)
            b = await auto.start(uniq, "g", handler, member="b", lease_ttl=5.0)
            await a.wait_settled(10)
            await b.wait_settled(10)
            await asyncio.to_thread(fresh_server.restart)

            async def joined():
                try:
                    return await auto.start(uniq, "g", handler, member="c", lease_ttl=5.0)
                except Exception:  # JetStream not ready yet after the restart
                    return None

            c = await wait_for(joined, 15, interval=0.1, what="c joined after the restart")
            await wait_for(
                lambda: (
                    all(i.partitions for i in (a, b, c))
                    and sorted(a.partitions + b.partitions + c.partitions) == list(range(6))
                ),
                4,
                interval=0.01,
                what="the three members' partitions in every instance",
            )
    finally:
        await nc.close()


def test_the_readme_states_the_debounce_the_code_uses():
    """The README says when joins and leaves make one rebalance: within the debounce of each other."""
    from pathlib import Path

    from pcgroups.elastic._membership import DEFAULT_DEBOUNCE

    readme = " ".join((Path(__file__).resolve().parent.parent / "README.md").read_text().split())
    assert (
        f"once the leases have been quiet for {DEFAULT_DEBOUNCE:g} s: instances started (or stopped) within "
        f"{DEFAULT_DEBOUNCE:g} s of each other"
    ) in readme
