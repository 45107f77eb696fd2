"""Group status (Kafka ``--describe``) of live static and elastic groups on a real nats-server."""

from __future__ import annotations

import asyncio
import io
import json
import re
from datetime import UTC, datetime

from nats.js.api import StreamConfig, SubjectTransform
from rich.console import Console

from cg.status import plain_lines, render_status, watch
from pcgroups import (
    ConsumerConfig,
    PartitioningFilter,
    add_members,
    create_elastic,
    create_static,
    elastic_consume,
    static_consume,
)
from pcgroups.ops._status import elastic_status, parse_timestamp, static_status
from pcgroups.partitions import partition_of_subject

from .helpers.support import wait_for

FAST = ConsumerConfig(max_ack_pending=1, ack_wait=2)


def blocking_handler(gate: asyncio.Event, seen: list):
    async def handler(msg):
        seen.append(msg.partition)
        await gate.wait()
        await msg.ack()

    return handler


def acking_handler(seen: list):
    async def handler(msg):
        seen.append(msg.partition)
        await msg.ack()

    return handler


def test_parse_timestamp():
    assert parse_timestamp("0001-01-01T00:00:00Z") is None
    assert parse_timestamp(None) is None and parse_timestamp("junk") is None
    t = parse_timestamp("2026-11-22T09:01:46.954461466Z")
    assert t == datetime(2026, 11, 22, 9, 1, 46, 954461, tzinfo=UTC)


async def test_static_status_shows_owners_pins_and_pending(nc, js, uniq):
    # 3 partitions, members m1 m2: m1 owns 0 and 2, m2 owns 1. Publishing to <uniq>.<p>.<key> targets partition p.
    await js.add_stream(
        StreamConfig(
            name=uniq,
            subjects=[f"{uniq}.*.*"],
            subject_transform=SubjectTransform(
                src=f"{uniq}.*.*", dest=f"{{{{wildcard(1)}}}}.{uniq}.{{{{wildcard(2)}}}}"
            ),
        )
    )
    await create_static(nc, uniq, "g", 3, members=["m1", "m2"])
    gate, seen1, seen2 = asyncio.Event(), [], []
    m1 = await static_consume(nc, uniq, "g", "m1", blocking_handler(gate, seen1), config=FAST)
    m2 = await static_consume(nc, uniq, "g", "m2", acking_handler(seen2), config=FAST)
    try:
        for i in range(4):
            await js.publish(f"{uniq}.0.k{i}", b"x")
        for i in range(3):
            await js.publish(f"{uniq}.2.k{i}", b"x")
        last_m2 = 0
        for i in range(5):
            last_m2 = (await js.publish(f"{uniq}.1.k{i}", b"x")).seq
        await wait_for(lambda: len(seen2) == 5 and len(seen1) == 1, 5, what="m2 done, m1 holding one")

        async def settled():
            st = await static_status(nc, uniq, "g")
            return st if st.member("m2").ack_floor == last_m2 and st.member("m1").ack_pending == 1 else None

        st = await wait_for(settled, 5, what="acks seen by the server")
        assert (st.flavour, st.stream, st.group, st.consumer_stream, st.max_members, st.mode) == (
            "static",
            uniq,
            "g",
            uniq,
            3,
            "balanced",
        )
        assert [p.member for p in st.partitions] == ["m1", "m2", "m1"]
        ms1, ms2 = st.member("m1"), st.member("m2")
        assert ms1.partitions == [0, 2] and ms2.partitions == [1]
        assert ms1.consumer == "g-m1" and ms1.exists and ms1.active
        assert ms1.pinned_id == m1.session.pin_id and ms2.pinned_id == m2.session.pin_id
        assert ms1.pinned_since is not None and (datetime.now(UTC) - ms1.pinned_since).total_seconds() < 30
        assert (ms1.pending, ms1.ack_pending) == (6, 1)  # 7 messages, one in flight
        assert (ms2.pending, ms2.ack_pending, ms2.redelivered, ms2.ack_floor) == (0, 0, 0, last_m2)
        p0, p1, _p2 = st.partitions
        assert p0.pinned_id == ms1.pinned_id and p1.pinned_id == ms2.pinned_id
        assert (p0.pending, p0.pending_exact) == (6, False)  # m1's total: it owns two partitions
        assert (p1.pending, p1.pending_exact) == (0, True)
        assert st.last_seq == 12 and st.messages == 12 and st.pending == 6
        assert st.requests <= 5

        exact = await static_status(nc, uniq, "g", per_partition=True)
        e0, e1, e2 = exact.partitions
        assert (e0.pending, e0.pending_exact) == (3, True)  # k1..k3 of partition 0 (k0 is in flight)
        assert (e2.pending, e2.pending_exact) == (3, True)
        assert e1.pending == 0
        # the counting consumers are gone
        names = [name async for name in _consumer_names(js, uniq)]
        assert sorted(names) == ["g-m1", "g-m2"]

        # rendering: JSON, plain lines, rich table
        buf = io.StringIO()
        render_status(st, Console(file=buf), json=True)
        doc = json.loads(buf.getvalue())
        assert doc["partitions"][0]["member"] == "m1" and doc["members"][0]["pinned_id"] == ms1.pinned_id
        assert doc["members"][0]["pinned_since"].endswith("Z")
        # plain lines: one row per member, its totals once; its pin id at the end
        lines = plain_lines(st)
        assert lines[1].split() == [
            "MEMBER",
            "PARTITIONS",
            "PINNED-FOR",
            "PENDING",
            "UNACKED",
            "REDELIVERED",
            "ACKED-TO-SEQ",
            "PIN-ID",
            "HELD-BY",
        ]
        row1, row2 = (re.split(r"\s{2,}", line) for line in lines[2:4])
        assert row1[:2] == ["m1", "0 2"] and row1[3:7] == ["6", "1", "0", str(ms1.ack_floor)]
        assert row1[7] == ms1.pinned_id and row2[:2] == ["m2", "1"] and row2[3:7] == ["0", "0", "0", str(last_m2)]
        assert not any(line.startswith("PARTITION ") for line in lines)  # pending not counted per partition
        exact_lines = plain_lines(exact)
        start = exact_lines.index(next(x for x in exact_lines if x.startswith("PARTITION ")))
        assert [x.split() for x in exact_lines[start + 1 : start + 4]] == [
            ["0", "m1", "3"],
            ["1", "m2", "0"],
            ["2", "m1", "3"],
        ]
        buf = io.StringIO()
        render_status(
            st, Console(file=buf, width=200, force_terminal=True), pretty=True, instances={ms1.pinned_id: "m1-a"}
        )
        assert ms1.pinned_id in buf.getvalue() and "m1-a" in buf.getvalue()
        buf = io.StringIO()
        render_status(st, Console(file=buf, width=200))  # not a terminal: plain lines
        assert buf.getvalue().splitlines()[1].startswith("MEMBER")
    finally:
        gate.set()
        await m1.stop()
        await m2.stop()


async def _consumer_names(js, stream):
    for info in await js.consumers_info(stream):
        yield info.name


async def test_elastic_status_counts_pending_per_partition(nc, js, uniq):
    # 4 partitions by the key token; e1 owns 0 1 (running, blocked), e2 owns 2 3 (no instance yet)
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.*"]))
    await create_elastic(nc, uniq, "eg", 4, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])
    await add_members(nc, uniq, "eg", ["e1", "e2"])
    gate, seen = asyncio.Event(), []
    e1 = await elastic_consume(nc, uniq, "eg", "e1", blocking_handler(gate, seen), config=FAST)
    try:
        await e1.wait_for_consuming(5)
        want = {0: 0, 1: 0, 2: 0, 3: 0}
        for i in range(40):
            subject = f"{uniq}.k{i}"
            want[partition_of_subject(subject, 4, [1], f"{uniq}.*")] += 1
            await js.publish(subject, b"x")
        assert all(want.values())
        await wait_for(lambda: len(seen) == 1, 5, what="e1 holds one message")

        async def settled():
            st = await elastic_status(nc, uniq, "eg")
            return st if st.source_lag == 0 and sum(p.pending for p in st.partitions) == 40 else None

        st = await wait_for(settled, 5, what="all 40 sourced")
        assert (st.flavour, st.consumer_stream, st.max_members, st.filters) == (
            "elastic",
            f"{uniq}-eg",
            4,
            [f"{uniq}.*"],
        )
        assert [p.member for p in st.partitions] == ["e1", "e1", "e2", "e2"]
        assert {p.partition: p.pending for p in st.partitions} == want
        assert all(p.pending_exact for p in st.partitions)
        ms1, ms2 = st.member("e1"), st.member("e2")
        assert ms1.exists and ms1.active and ms1.pinned_id == e1.session.pin_id and ms1.ack_pending == 1
        assert ms1.pending == want[0] + want[1] - 1
        assert not ms2.exists and not ms2.active and ms2.pinned_id is None and ms2.pending is None
        assert st.partitions[2].consumer is None and st.partitions[2].pinned_id is None
        assert st.messages == 40 and st.requests <= 5

        # the owner of 2 and 3 joins: they drain; e1 goes on once released
        e2_seen: list = []
        e2 = await elastic_consume(nc, uniq, "eg", "e2", acking_handler(e2_seen), config=FAST)
        try:
            await wait_for(lambda: len(e2_seen) == want[2] + want[3], 5, what="e2 drained its partitions")

            async def drained():
                s = await elastic_status(nc, uniq, "eg")
                return s if s.partitions[2].pending == 0 and s.partitions[3].pending == 0 else None

            st2 = await wait_for(drained, 5, what="2 and 3 empty")
            assert st2.member("e2").pinned_id == e2.session.pin_id and st2.member("e2").active
            assert st2.partitions[0].pending == want[0]

            # watch: two refreshes into a pipe, as JSON lines
            buf = io.StringIO()
            n = await watch(
                lambda: elastic_status(nc, uniq, "eg"), Console(file=buf), interval=0.05, json=True, iterations=2
            )
            docs = [json.loads(line) for line in buf.getvalue().splitlines()]
            assert n == 2 and len(docs) == 2 and docs[0]["group"] == "eg"
            buf = io.StringIO()
            await watch(
                lambda: elastic_status(nc, uniq, "eg"),
                Console(file=buf, width=200, force_terminal=True),
                interval=0.05,
                iterations=2,
            )
            assert "refreshing every 0.05s" in buf.getvalue()
        finally:
            await e2.stop()
    finally:
        gate.set()
        await e1.stop()


async def test_static_per_partition_counts_only_the_group_filters_and_members_not_joined_yet(nc, js, uniq):
    await js.add_stream(
        StreamConfig(
            name=uniq,
            subjects=[f"{uniq}.*.*.*"],
            subject_transform=SubjectTransform(
                src=f"{uniq}.*.*.*", dest=f"{{{{wildcard(1)}}}}.{uniq}.{{{{wildcard(2)}}}}.{{{{wildcard(3)}}}}"
            ),
        )
    )
    await create_static(nc, uniq, "g", 2, filters=[f"{uniq}.foo.*"], members=["m1"])  # m1 owns 0 and 1
    for p, kind, n in ((0, "foo", 3), (0, "bad", 5), (1, "foo", 2), (1, "bad", 1)):
        for i in range(n):
            await js.publish(f"{uniq}.{p}.{kind}.k{i}", b"x")
    st = await static_status(nc, uniq, "g")
    assert [p.pending for p in st.partitions] == [None, None] and not st.member("m1").exists
    exact = await static_status(nc, uniq, "g", per_partition=True)
    assert [(p.pending, p.pending_exact) for p in exact.partitions] == [(3, True), (2, True)]
    assert [name async for name in _consumer_names(js, uniq)] == []


async def test_a_lease_carries_the_pin_its_instance_holds(nc, js, uniq):
    """Automatic membership: two instances of one named member; the lease of the pinned one names the pin
    the member's consumer reports, the standby's names none (refreshed at each renewal)."""
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.*"]))
    await create_elastic(nc, uniq, "ag", 2, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])
    a = await elastic_consume(nc, uniq, "ag", "m1", acking_handler([]), auto=True, lease_ttl=1.5, config=FAST)
    b = await elastic_consume(nc, uniq, "ag", "m1", acking_handler([]), auto=True, lease_ttl=1.5, config=FAST)
    try:
        await a.wait_for_consuming(10)
        await b.wait_for_consuming(10)
        for i in range(4):  # the server pins an instance when it delivers a message
            await js.publish(f"{uniq}.k{i}", b"x")

        async def matched():
            st = await elastic_status(nc, uniq, "ag")
            pin = st.member("m1").pinned_id if st.member("m1") else None
            pins = sorted(x.pin for x in st.leases)
            return st if pin and pins == ["", pin] else None

        st = await wait_for(matched, 10, what="the pinned instance's lease naming its pin")
        holder = a if a.pinned else b
        lease = next(x for x in st.leases if x.pin)
        assert lease.instance == holder.instance_id and lease.pid > 0
        buf = io.StringIO()
        render_status(st, Console(file=buf, width=80, force_terminal=True), pretty=True)
        row = next(line for line in buf.getvalue().splitlines() if lease.instance in line)
        assert lease.pin in row and str(lease.pid) in row
    finally:
        await a.stop()
        await b.stop()
