"""Elastic groups over several streams (pcgroups.elastic._sources and the elastic functions that use it):
aggregate groups, one stream per partition, streams added and removed under running members,
joining by name, start positions. Real nats-servers; instances in-process or (SIGKILL) as processes.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from datetime import UTC, datetime

import nats
import nats.js.errors
import pytest

from pcgroups import (
    ConsumerConfig,
    ElasticSpec,
    GroupExistsError,
    PartitioningFilter,
    add_members,
    add_source,
    create_elastic,
    elastic_consume,
    get_elastic_config,
    get_elastic_layout,
    remove_source,
    work_queue_name,
)
from pcgroups.elastic._sources import Layout, SourceStream, Start, assign_filters, layout_of, source_config
from pcgroups.errors import ConfigError, NotFoundError
from pcgroups.jetstream._store import ELASTIC_BUCKET
from pcgroups.partitions import elastic_member_filters, partition_of_subject
from pcgroups.testing._checker import Recorder

from .helpers.support import wait_for

FAST = ConsumerConfig(max_ack_pending=1, ack_wait=1)


def pf(filter: str, *wildcards: int) -> PartitioningFilter:
    return PartitioningFilter(filter, list(wildcards))


# --- pure: start positions, source entries, layouts, filter assignment -----------------------------------------
def test_start_positions_parse_and_print():
    assert Start.parse("all") == Start() and Start.parse("new").kind == "new"
    assert Start.parse("seq:42") == Start("seq", seq=42) and str(Start.parse("seq:42")) == "seq:42"
    when = Start.parse("time:2026-11-25T08:00:00Z")
    assert when.time == datetime(2026, 11, 25, 8, tzinfo=UTC) and str(when) == "time:2026-11-25T08:00:00Z"
    for bad in ("", "old", "seq:0", "seq:x", "time:yesterday", "time:2026-11-25T08:00:00"):
        with pytest.raises(ConfigError, match="use all, new, seq:N"):
            Start.parse(bad)


def test_source_entries_and_layout_round_trip():
    one = SourceStream("ORDERS", (pf("orders.*", 1),))
    assert source_config(one, 8) == {
        "name": "ORDERS",
        "subject_transforms": [{"src": "orders.*", "dest": "{{Partition(8,1)}}.orders.{{Wildcard(1)}}"}],
    }  # the reference's, byte for byte
    part = SourceStream("LOGS_3", (), 3, start_seq=7)
    assert source_config(part, 10) == {
        "name": "LOGS_3",
        "opt_start_seq": 7,
        "subject_transforms": [{"src": ">", "dest": "3.>"}],
    }
    whole = SourceStream("X", (), None, start_time="2026-11-25T08:00:00Z")
    assert source_config(whole, 4)["subject_transforms"] == [{"src": ">", "dest": "{{Partition(4)}}.>"}]
    layout = Layout((one, SourceStream("PAY", (pf("payments.*", 1),), None, start_seq=5)))
    wq = {"sources": [source_config(s, 8) for s in layout.streams]}
    assert layout_of(wq, [pf("orders.*", 1), pf("payments.*", 1)]) == layout
    assert (
        layout.kind == "aggregate" and Layout((one,)).kind == "stream" and Layout((part,)).kind == "partition-streams"
    )
    assert (
        layout.stream("PAY").start == "seq:5" and layout.stream("PAY").describe() == "PAY (payments.* by 1) from seq:5"
    )


def test_filters_go_to_the_one_stream_whose_subjects_they_match():
    configs = {"O": {"subjects": ["orders.*"]}, "P": {"subjects": ["payments.>"]}}
    got = assign_filters([pf("payments.*.x", 1), pf("orders.*", 1)], configs)
    assert got == {"O": [pf("orders.*", 1)], "P": [pf("payments.*.x", 1)]}
    with pytest.raises(ConfigError, match=r"refunds\.\* matches no subject of the group's streams"):
        assign_filters([pf("refunds.*", 1), pf("orders.*", 1)], configs)
    with pytest.raises(ConfigError, match="matches subjects of O and P, more than one"):
        assign_filters([pf("*.*", 1)], configs)
    with pytest.raises(ConfigError, match="no partitioning filter matches the subjects of stream P"):
        assign_filters([pf("orders.*", 1)], configs)
    assert assign_filters([], configs) == {"O": [], "P": []}  # whole subjects hashed, stream by stream


# --- helpers ----------------------------------------------------------------------------------------------------
async def _streams(js, *specs: tuple[str, list[str]]) -> None:
    for name, subjects in specs:
        await js.add_stream(name=name, subjects=subjects)


async def _wq_subjects(js, stream: str, group: str, want: int) -> list[str]:
    """The subjects stored in the group's work queue, once ``want`` messages are there."""
    api_info = {}

    async def enough():
        msg = await js._nc.request(
            f"$JS.API.STREAM.INFO.{work_queue_name(stream, group)}",
            json.dumps({"subjects_filter": ">"}).encode(),
            timeout=5,
        )
        api_info.update(json.loads(msg.data))
        return api_info.get("state", {}).get("messages", 0) >= want

    await wait_for(enough, timeout=10, what=f"{want} messages in the work queue")
    return sorted(api_info["state"].get("subjects", {}))


async def _go_member_reads(nc, stream: str, group: str, members: list[str], total: int) -> dict[str, list[str]]:
    """What Go members would read: one plain consumer per member with exactly the filter subjects the reference
    derives from the stored config (``elastic_member_filters`` is its algorithm), fetched without acking."""
    cfg = await get_elastic_config(nc, stream, group)
    js = nc.jetstream()
    got: dict[str, list[str]] = {}
    for m in members:
        filters = elastic_member_filters(cfg, m)
        info = await js.add_consumer(
            work_queue_name(stream, group), durable_name=f"go-{m}", filter_subjects=filters, ack_policy="explicit"
        )
        sub = await js.pull_subscribe_bind(info.name, stream=work_queue_name(stream, group))
        got[m] = []
        while True:
            try:
                msgs = await sub.fetch(100, timeout=0.5)
            except (TimeoutError, nats.errors.TimeoutError):  # nats-py raises either
                break
            got[m] += [x.subject for x in msgs]
        await sub.unsubscribe()
        await js.delete_consumer(work_queue_name(stream, group), f"go-{m}")
    assert sum(len(v) for v in got.values()) == total, got
    return got


# --- aggregate groups ---------------------------------------------------------------------------------------------
async def test_an_aggregate_group_puts_each_key_of_both_streams_in_one_partition(nc, js, uniq):
    o, p = f"{uniq}O", f"{uniq}P"
    await _streams(js, (o, [f"{uniq}.orders.*"]), (p, [f"{uniq}.payments.*"]))
    customers = [f"c{i}" for i in range(12)]
    for c in customers:
        await js.publish(f"{uniq}.orders.{c}", b"o")
        await js.publish(f"{uniq}.payments.{c}", b"p")
    filters = [pf(f"{uniq}.orders.*", 1), pf(f"{uniq}.payments.*", 1)]
    cfg = await create_elastic(nc, o, "billing", 4, partitioning_filters=filters, sources=[p])
    # The stored value is the reference's fields only: the union of the streams' filters.
    raw = (await (await js.key_value(ELASTIC_BUCKET)).get(f"{o}.billing")).value
    assert raw == cfg.to_json() and set(json.loads(raw)) == {"max_members", "partitioning_filters"}
    layout = await get_elastic_layout(nc, o, "billing")
    assert layout.kind == "aggregate" and layout.names == [o, p]
    assert [s.filters for s in layout.streams] == [(filters[0],), (filters[1],)]
    subjects = await _wq_subjects(js, o, "billing", 2 * len(customers))
    for c in customers:
        want = partition_of_subject(f"{uniq}.orders.{c}", 4, [1], f"{uniq}.orders.*")
        assert f"{want}.{uniq}.orders.{c}" in subjects and f"{want}.{uniq}.payments.{c}" in subjects
    # A Go member derives <p>.<filter> for each filter: those select both streams' messages of its partitions.
    await add_members(nc, o, "billing", ["m1", "m2"])
    got = await _go_member_reads(nc, o, "billing", ["m1", "m2"], 2 * len(customers))
    for m, subs in got.items():
        owned = {int(s.split(".", 1)[0]) for s in subs}
        assert owned <= set(
            int(f.split(".", 1)[0]) for f in elastic_member_filters(await get_elastic_config(nc, o, "billing"), m)
        )


async def test_create_refuses_what_cannot_be_an_aggregate_group_and_leaves_nothing(nc, js, uniq):
    o, p = f"{uniq}O", f"{uniq}P"
    await _streams(js, (o, [f"{uniq}.orders.*"]), (p, [f"{uniq}.payments.*"]))
    good = [pf(f"{uniq}.orders.*", 1), pf(f"{uniq}.payments.*", 1)]
    cases = [
        (
            dict(partitioning_filters=[*good, pf(f"{uniq}.refunds.*", 1)], sources=[p]),
            ConfigError,
            f"{uniq}.refunds.* matches no subject of the group's streams",
        ),
        (dict(partitioning_filters=[pf(f"{uniq}.*.*", 1)], sources=[p]), ConfigError, "more than one of"),
        (
            dict(partitioning_filters=good[:1], sources=[p]),
            ConfigError,
            f"no partitioning filter matches the subjects of stream {p}",
        ),
        (
            dict(partitioning_filters=good, sources=[f"{uniq}NOPE"]),
            NotFoundError,
            f"source stream does not exist: {uniq}NOPE",
        ),
        (dict(partitioning_filters=good, sources=[p, p]), ConfigError, f"stream {p} is listed more than once"),
    ]
    for kwargs, error, text in cases:
        with pytest.raises(error, match=text.replace("*", r"\*").replace(".", r"\.")):
            await create_elastic(nc, o, "g", 4, **kwargs)
        with pytest.raises(nats.js.errors.NotFoundError):
            await js.stream_info(work_queue_name(o, "g"))
        with pytest.raises(NotFoundError):
            await get_elastic_config(nc, o, "g")
    await create_elastic(nc, o, "g", 4, partitioning_filters=good, sources=[p])
    await create_elastic(nc, o, "g", 4, partitioning_filters=good, sources=[p], start="new")  # same shape: idempotent
    with pytest.raises(
        GroupExistsError,
        match=rf"partitioning filters: \[{uniq}\.orders\.\* by 1, "
        rf"{uniq}\.payments\.\* by 1\] now, \[{uniq}\.orders\.\* by 1\] asked",
    ):
        await create_elastic(nc, o, "g", 4, partitioning_filters=good[:1])


@pytest.mark.slow
async def test_an_aggregate_group_keeps_each_customer_in_arrival_order_through_a_join_and_a_sigkill(
    nats_server, nc, js, uniq
):
    """Customer keys published alternately to two streams: each customer's messages are handled by one member at a
    time, in work-queue (arrival) order, nothing lost, while a member joins and m1's pinned instance is SIGKILLed."""
    o, p = f"{uniq}O", f"{uniq}P"
    await _streams(js, (o, [f"{uniq}.orders.*"]), (p, [f"{uniq}.payments.*"]))
    await create_elastic(
        nc, o, "billing", 6, partitioning_filters=[pf(f"{uniq}.orders.*", 1), pf(f"{uniq}.payments.*", 1)], sources=[p]
    )
    await add_members(nc, o, "billing", ["m1", "m2"])
    rec = Recorder()
    procs: dict[str, asyncio.subprocess.Process] = {}
    readers = []

    async def spawn(member: str, name: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.member_proc",
            nats_server.url,
            "elastic",
            o,
            "billing",
            member,
            "--ack-wait",
            "1",
            "--work",
            "0.005",
            "--instance",
            name,
            "--key",
            "stream",
            "--ack",
            "plain",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        procs[name] = proc
        ready = asyncio.get_running_loop().create_future()

        async def read():
            async for line in proc.stdout:
                if b'"ready"' in line and not ready.done():
                    ready.set_result(None)
                rec.feed(line)

        readers.append(asyncio.create_task(read()))
        await asyncio.wait_for(ready, 20)

    published: set[str] = set()

    async def publish(n: int) -> None:
        for i in range(n):
            c = f"c{i % 10}"
            stream, subject = (o, f"{uniq}.orders.{c}") if i % 2 == 0 else (p, f"{uniq}.payments.{c}")
            ack = await js.publish(subject, b"x")
            published.add(f"{stream}:{ack.seq}")
            await asyncio.sleep(0.004)

    try:
        await asyncio.gather(spawn("m1", "m1-a"), spawn("m1", "m1-b"), spawn("m2", "m2-a"))
        await publish(150)
        await add_members(nc, o, "billing", ["m3"])
        await spawn("m3", "m3-a")
        await publish(150)
        victim = next(n for n in ("m1-a", "m1-b") if any(c.instance == n for c in rec.calls[-40:]))
        procs[victim].send_signal(signal.SIGKILL)
        killed_at = time.time()
        await procs[victim].wait()
        rec.close_instance(victim)
        standby = "m1-b" if victim == "m1-a" else "m1-a"
        await publish(150)
        await wait_for(lambda: published <= rec.acked_keys(), timeout=40, what="every message handled")
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        for r in readers:
            r.cancel()
    rec.check(published).assert_ok()  # nothing lost, no overlap on a partition, work-queue order per partition
    # Each customer's acked messages, in handling order, follow their work-queue order across both streams.
    by_customer: dict[str, list[int]] = {}
    for call in sorted(rec.acked_calls(), key=lambda c: c.start):
        by_customer.setdefault(call.subject.rsplit(".", 1)[1], []).append(call.order)
    for seqs in by_customer.values():
        firsts = list(dict.fromkeys(seqs))
        assert firsts == sorted(firsts)
    assert {c.member for c in rec.acked_calls()} == {"m1", "m2", "m3"}
    assert rec.count(instance=standby, since=killed_at) > 0  # the standby took m1's partitions over


# --- partition streams --------------------------------------------------------------------------------------------
async def test_partition_streams_each_stream_is_one_partition_and_moves_whole(nc, js, uniq):
    names = [f"{uniq}L{i}" for i in range(4)]
    await _streams(js, *((n, [f"{uniq}.p{i}.>"]) for i, n in enumerate(names)))
    for i in range(4):
        for k in range(5):
            await js.publish(f"{uniq}.p{i}.host{k}.line", f"{i}-{k}".encode())
    name = f"{uniq}LOGS"  # not a stream: only the group's name
    cfg = await create_elastic(nc, name, "shipper", 4, partition_streams=names)
    assert cfg.partitioning_filters is None
    layout = await get_elastic_layout(nc, name, "shipper")
    assert layout.kind == "partition-streams" and [s.partition for s in layout.streams] == [0, 1, 2, 3]
    subjects = await _wq_subjects(js, name, "shipper", 20)
    assert all(s.startswith(f"{s.split('.')[2][1]}.{uniq}.p") for s in subjects), subjects
    await add_members(nc, name, "shipper", ["m1", "m2"])
    # Go members: no partitioning filters, so <p>.> for each owned partition: whole streams.
    got = await _go_member_reads(nc, name, "shipper", ["m1", "m2"], 20)
    assert {s.split(".")[2] for s in got["m1"]} == {"p0", "p1"} and {s.split(".")[2] for s in got["m2"]} == {"p2", "p3"}

    seen: list[tuple[str, int, str]] = []

    def handler_for(member: str):
        async def handle(msg):
            seen.append((member, msg.partition, msg.data.decode()))
            await msg.ack()

        return handle

    insts = [await elastic_consume(nc, name, "shipper", m, handler_for(m), config=FAST) for m in ("m1", "m2", "m3")]
    try:
        await wait_for(lambda: len(seen) >= 20, timeout=15, what="the backlog")
        await add_members(nc, name, "shipper", ["m3"])
        await wait_for(lambda: insts[2].partitions == [2] and insts[2].consuming, timeout=10, what="m3 joined")
        start = len(seen)
        for i in range(4):
            for k in range(5, 10):
                await js.publish(f"{uniq}.p{i}.host{k}.line", f"{i}-{k}".encode())
        await wait_for(lambda: len(seen) >= start + 20, timeout=15, what="the new lines")
    finally:
        for inst in insts:
            await inst.stop()
    owner = {0: "m1", 1: "m2", 2: "m3", 3: "m1"}  # balanced: 4 // 3 = 1 each, the leftover to m1
    assert all(m == owner[part] for m, part, _ in seen[start:])
    for i in range(4):
        lines = [d for _, part, d in seen if part == i]
        assert lines == [f"{i}-{k}" for k in range(10)]  # every line of stream i, in order, in partition i


async def test_partition_streams_must_match_the_partition_count(nc, js, uniq):
    names = [f"{uniq}L{i}" for i in range(3)]
    await _streams(js, *((n, [f"{uniq}.p{i}.>"]) for i, n in enumerate(names)))
    with pytest.raises(ConfigError, match="3 partition streams given for 4 partitions"):
        await create_elastic(nc, f"{uniq}LOGS", "s", 4, partition_streams=names)
    with pytest.raises(ConfigError, match="takes no partitioning filters"):
        await create_elastic(nc, f"{uniq}LOGS", "s", 3, partition_streams=names, partitioning_filters=[pf(">")])
    with pytest.raises(NotFoundError, match=f"partition stream 2 does not exist: {uniq}NOPE"):
        await create_elastic(nc, f"{uniq}LOGS", "s", 3, partition_streams=[*names[:2], f"{uniq}NOPE"])
    with pytest.raises(NotFoundError):
        await get_elastic_config(nc, f"{uniq}LOGS", "s")


# --- streams added and removed while members run ---------------------------------------------------------------------
async def test_a_stream_added_and_removed_under_running_members_loses_and_repeats_nothing(nc, js, uniq):
    o, p = f"{uniq}O", f"{uniq}P"
    await _streams(js, (o, [f"{uniq}.orders.*"]), (p, [f"{uniq}.payments.*"]))
    await create_elastic(nc, o, "g", 4, partitioning_filters=[pf(f"{uniq}.orders.*", 1)])
    await add_members(nc, o, "g", ["m1", "m2"])
    handled: list[tuple[str, str, int]] = []  # (member, origin stream, origin seq)

    def handler_for(member: str):
        async def handle(msg):
            stream, seq = msg.headers["Nats-Stream-Source"].split(" ")[:2]
            handled.append((member, stream, int(seq)))
            await msg.ack()

        return handle

    insts = [await elastic_consume(nc, o, "g", m, handler_for(m), config=FAST) for m in ("m1", "m2")]
    sent = {o: [], p: []}

    async def send(stream: str, n: int) -> None:
        part = "orders" if stream == o else "payments"
        for i in range(n):
            sent[stream].append((await js.publish(f"{uniq}.{part}.c{i % 7}", b"x")).seq)

    try:
        await send(p, 20)  # a backlog in the stream to add
        await send(o, 20)
        layout = await add_source(nc, o, "g", p, partitioning_filters=[pf(f"{uniq}.payments.*", 1)])
        assert layout.names == [o, p] and layout.stream(p).start == "all"  # started at 1, then plain again
        await send(o, 20)
        await send(p, 20)
        try:
            await wait_for(lambda: len(handled) >= 80, timeout=20, what="both streams handled")
        except AssertionError:
            info = await nc.request(f"$JS.API.STREAM.INFO.{work_queue_name(o, 'g')}", b'{"subjects_filter":">"}')
            print("DEBUG wq", info.data.decode())
            for m in ("m1", "m2"):
                ci = await nc.request(f"$JS.API.CONSUMER.INFO.{work_queue_name(o, 'g')}.{m}", b"")
                print("DEBUG consumer", ci.data.decode())
            print("DEBUG handled", handled)
            raise
        layout = await remove_source(nc, o, "g", p, timeout=10)
        assert layout.names == [o]
        assert (await get_elastic_config(nc, o, "g")).partitioning_filters == [pf(f"{uniq}.orders.*", 1)]
        await send(o, 10)
        await send(p, 10)  # no longer part of the group
        await wait_for(lambda: len([h for h in handled if h[1] == o]) >= 50, timeout=20, what="orders")
        assert all(inst.consuming for inst in insts)  # they followed both changes
    finally:
        for inst in insts:
            await inst.stop()
    from_o = [s for _, st, s in handled if st == o]
    from_p = [s for _, st, s in handled if st == p]
    assert sorted(from_o) == sent[o]  # nothing lost, nothing repeated
    assert sorted(from_p) == sent[p][:40]  # the backlog and what came while it was a source, once each
    wq = await js.stream_info(work_queue_name(o, "g"))
    assert [s.name for s in wq.config.sources] == [o]


async def test_removing_a_stream_with_queued_messages_and_no_member_running(nc, js, uniq):
    o, p = f"{uniq}O", f"{uniq}P"
    await _streams(js, (o, [f"{uniq}.orders.*"]), (p, [f"{uniq}.payments.*"]))
    await create_elastic(
        nc, o, "g", 2, partitioning_filters=[pf(f"{uniq}.orders.*", 1), pf(f"{uniq}.payments.*", 1)], sources=[p]
    )
    for i in range(3):
        await js.publish(f"{uniq}.payments.c{i}", b"x")
        await js.publish(f"{uniq}.orders.c{i}", b"x")
    await _wq_subjects(js, o, "g", 6)
    with pytest.raises(Exception, match=f"stream {p} is no longer sourced, but messages of it are still queued"):
        await remove_source(nc, o, "g", p, timeout=0.3)
    assert len((await get_elastic_config(nc, o, "g")).partitioning_filters) == 2  # resumable: filters kept
    layout = await remove_source(nc, o, "g", p, discard=True)  # the re-run finishes it
    assert layout.names == [o]
    assert (await get_elastic_config(nc, o, "g")).partitioning_filters == [pf(f"{uniq}.orders.*", 1)]
    assert (await js.stream_info(work_queue_name(o, "g"))).state.messages == 3
    with pytest.raises(NotFoundError, match=f"stream {p} is not a stream of elastic consumer group g"):
        await remove_source(nc, o, "g", p)
    with pytest.raises(ConfigError, match=f"stream {o} is the only stream"):
        await remove_source(nc, o, "g", o)


async def test_adding_a_stream_refuses_bad_input_and_changes_nothing(nc, js, uniq):
    o, p = f"{uniq}O", f"{uniq}P"
    await _streams(js, (o, [f"{uniq}.orders.*"]), (p, [f"{uniq}.payments.*"]))
    await create_elastic(nc, o, "g", 2, partitioning_filters=[pf(f"{uniq}.orders.*", 1)])
    before = (await get_elastic_config(nc, o, "g"), await get_elastic_layout(nc, o, "g"))
    for kwargs, text in [
        (dict(source=p), "partitions by filters"),
        (dict(source=p, partitioning_filters=[pf("*.orders.*", 2)]), "matches subjects of another stream"),
        (dict(source=f"{uniq}NOPE", partitioning_filters=[pf("x.*", 1)]), "stream to add does not exist"),
        (dict(source=o, partitioning_filters=[pf(f"{uniq}.orders.*", 1)]), "already a stream"),
        (dict(source=p, partitioning_filters=[pf(f"{uniq}.payments.*", 1)], start="yesterday"), "invalid start"),
    ]:
        with pytest.raises((ConfigError, NotFoundError), match=text):
            await add_source(nc, o, "g", **kwargs)
        assert (await get_elastic_config(nc, o, "g"), await get_elastic_layout(nc, o, "g")) == before


async def test_a_deleted_source_stream_leaves_the_other_streams_flowing(nc, js, uniq):
    o, p = f"{uniq}O", f"{uniq}P"
    await _streams(js, (o, [f"{uniq}.orders.*"]), (p, [f"{uniq}.payments.*"]))
    await create_elastic(
        nc, o, "g", 2, partitioning_filters=[pf(f"{uniq}.orders.*", 1), pf(f"{uniq}.payments.*", 1)], sources=[p]
    )
    await add_members(nc, o, "g", ["m1"])
    got: list[str] = []

    async def handle(msg):
        got.append(msg.subject)
        await msg.ack()

    inst = await elastic_consume(nc, o, "g", "m1", handle, config=FAST)
    try:
        await js.publish(f"{uniq}.payments.c1", b"x")
        await wait_for(lambda: len(got) == 1, timeout=10, what="a payment")
        await js.delete_stream(p)
        for i in range(5):
            await js.publish(f"{uniq}.orders.c{i}", b"x")
        await wait_for(lambda: len(got) == 6, timeout=10, what="orders after the source stream went away")
        assert inst.consuming
        assert (await remove_source(nc, o, "g", p)).names == [o]  # its filters tell its queued messages apart
    finally:
        await inst.stop()


# --- start positions and joining by name ----------------------------------------------------------------------------
async def test_start_new_seq_and_time(nc, js, uniq):
    o = f"{uniq}O"
    await _streams(js, (o, [f"{uniq}.o.*"]))
    for i in range(5):
        await js.publish(f"{uniq}.o.c{i}", b"old")
    await asyncio.sleep(0.02)
    middle = datetime.now(UTC)
    for i in range(5, 8):
        await js.publish(f"{uniq}.o.c{i}", b"new")
    cases = {"all": 9, "new": 1, "seq:7": 3, f"time:{middle.isoformat()}": 4}  # with the late message
    for n, start in enumerate(cases):
        await create_elastic(nc, o, f"g{n}", 2, partitioning_filters=[pf(f"{uniq}.o.*", 1)], start=start)
    await js.publish(f"{uniq}.o.late", b"late")
    for n, (start, want) in enumerate(cases.items()):
        subjects = await _wq_subjects(js, o, f"g{n}", want)
        assert len(subjects) == want and any(s.endswith(".late") for s in subjects), (start, subjects)
    raw = (await js.stream_info(work_queue_name(o, "g0"))).config.sources[0]
    assert raw.opt_start_seq is None and raw.opt_start_time is None  # the default is the reference's source entry


async def test_instances_started_together_create_one_group_and_all_join(fresh_server):
    async with await nats.connect(fresh_server.url) as nc:
        await nc.jetstream().add_stream(name="ORDERS", subjects=["orders.*"])
        spec = ElasticSpec(4, [pf("orders.*", 1)], start="new")

        async def handle(msg):
            await msg.ack()

        insts = await asyncio.gather(
            *(
                elastic_consume(nc, "ORDERS", "billing", "", handle, auto=True, lease_ttl=2, config=FAST, create=spec)
                for _ in range(3)
            )
        )
        try:
            for inst in insts:
                await inst.wait_settled(timeout=15)
            assert sorted(p for inst in insts for p in inst.partitions) == [0, 1, 2, 3]
            assert len({inst.member_name for inst in insts}) == 3
            # The bucket's subjects, from the stream's state (nats-py's kv.keys() watch can come back empty
            # while a key is being rewritten: the members' rebalance writes it meanwhile).
            bucket = await nc.jetstream().stream_info(f"KV_{ELASTIC_BUCKET}", subjects_filter=">")
            assert sorted(bucket.state.subjects or {}) == [f"$KV.{ELASTIC_BUCKET}.ORDERS.billing"]
            streams = await nc.jetstream().streams_info()
            assert sorted(s.config.name for s in streams) == [
                "KV_elastic-consumer-groups",
                "KV_pcgroups-leases",
                "ORDERS",
                "ORDERS-billing",
                "ORDERS~billing~elastic~dlq",  # made with the group
            ]
            with pytest.raises(GroupExistsError, match="partitions: 4 now, 6 asked"):
                await elastic_consume(
                    nc,
                    "ORDERS",
                    "billing",
                    "",
                    handle,
                    auto=True,
                    config=FAST,
                    create=ElasticSpec(6, [pf("orders.*", 1)]),
                )
        finally:
            await asyncio.gather(*(inst.stop() for inst in insts))
    with pytest.raises(ConfigError, match="needs automatic membership"):
        await elastic_consume(None, "ORDERS", "billing", "m1", handle, create=spec)
