"""Rebalance hooks, instance events and ``async for`` iteration against a real nats-server.

Each test records what happened with monotonic timestamps (hooks called, handlers started and ended,
events) and checks the hooks' promises: ``on_assigned`` before the first message of partitions
gained, ``on_revoked`` after the in-flight handlers of partitions given up finished, each event once
per change; a failing hook ends the instance with its error; iteration keeps order and acks.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import nats
import pytest
from nats.js.api import StreamConfig, SubjectTransform

from pcgroups import (
    ConfigError,
    ConsumeContext,
    ConsumerConfig,
    JetStreamApi,
    PartitioningFilter,
    add_members,
    create_elastic,
    create_static,
    delete_members,
    elastic_consume,
    static_consume,
    static_member_step_down,
)
from pcgroups.events import InstanceEvent

from .helpers.faultproxy import FaultProxy
from .helpers.support import wait_for

FAST = ConsumerConfig(max_ack_pending=1, ack_wait=1)  # PinnedTTL 1 s


class Journal:
    """What every instance of a test did, in order: (time, instance, what, detail)."""

    def __init__(self) -> None:
        self.items: list[tuple[float, str, str, object]] = []

    def note(self, who: str, what: str, detail: object = None) -> None:
        self.items.append((time.monotonic(), who, what, detail))

    def hooks(self, who: str) -> dict:
        async def assigned(parts: set[int]) -> None:
            self.note(who, "assigned", frozenset(parts))

        def revoked(parts: set[int]) -> None:  # a plain function is called too
            self.note(who, "revoked", frozenset(parts))

        def event(ev: InstanceEvent) -> None:
            self.note(who, "event", ev)

        return {"on_assigned": assigned, "on_revoked": revoked, "on_event": event}

    def handler(self, who: str, work: float = 0.0):
        async def handle(msg) -> None:
            self.note(who, "start", msg.partition)
            if work:
                await asyncio.sleep(work)
            await msg.ack()
            self.note(who, "end", msg.partition)

        return handle

    def of(self, who: str, what: str | None = None) -> list[tuple[float, str, object]]:
        return [(t, w, d) for t, i, w, d in self.items if i == who and (what is None or w == what)]

    def events(self, who: str) -> list[tuple[str, tuple[int, ...]]]:
        return [(d.kind, d.partitions) for _, w, d in self.of(who, "event")]

    def first(self, who: str, what: str, pred=lambda d: True) -> float:
        return next(t for t, w, d in self.of(who, what) if pred(d))

    def check_promises(self, who: str) -> None:
        """Every handler of ``who`` started on a partition it was told it owns (on_assigned, not revoked
        since), and no handler of it ran when on_revoked was called."""
        owned: set[int] = set()
        running = 0
        for _, what, detail in self.of(who):
            if what == "assigned":
                owned |= detail
            elif what == "revoked":
                assert running == 0, f"{who}: on_revoked({set(detail)}) with a handler running"
                owned -= detail
            elif what == "start":
                assert detail in owned, f"{who}: a handler of partition {detail} started, owned {owned}"
                running += 1
            elif what == "end":
                running -= 1


async def static_group(js, nc, uniq: str, partitions: int = 2) -> None:
    await js.add_stream(
        StreamConfig(
            name=uniq,
            subjects=[f"{uniq}.*"],
            subject_transform=SubjectTransform(
                src=f"{uniq}.*", dest=f"{{{{partition({partitions},1)}}}}.{uniq}.{{{{wildcard(1)}}}}"
            ),
        )
    )
    await create_static(nc, uniq, "g", partitions, members=["m1"])


async def test_static_failover_hooks_order_and_events(nc, js, uniq):
    """Stop the pinned instance with a handler in flight: its on_revoked comes after that handler ended; the
    standby says standby, then gets on_assigned before its first message, then pinned."""
    await static_group(js, nc, uniq)
    j = Journal()
    a = await static_consume(nc, uniq, "g", "m1", j.handler("a", work=0.6), config=FAST, **j.hooks("a"))
    await a.wait_for_consuming(10)
    await js.publish(f"{uniq}.x", b"warm-up")  # the server gives the pin with a message
    await wait_for(lambda: len(j.of("a", "end")) == 1, 10, what="a handled the first message")
    assert a.pinned
    b = await static_consume(nc, uniq, "g", "m1", j.handler("b"), config=FAST, **j.hooks("b"))
    try:
        await wait_for(lambda: ("standby", (0, 1)) in j.events("b"), 10, what="b standby")
        await js.publish(f"{uniq}.y", b"in flight")
        await wait_for(lambda: len(j.of("a", "start")) == 2, 10, what="a's second handler started")
        await a.stop()
        assert await a.done() is None
        for i in range(4):
            await js.publish(f"{uniq}.k{i}", b"after")
        await wait_for(lambda: len(j.of("b", "end")) == 4, 15, what="b handled what came after")
    finally:
        await b.stop()
    assert j.events("a") == [("pinned", (0, 1))]  # a stop is no lost pin
    assert [w for _, w, _ in j.of("a") if w in ("assigned", "revoked")] == ["assigned", "revoked"]
    assert j.first("a", "revoked") >= j.of("a", "end")[-1][0]  # after the in-flight handler
    assert j.of("a", "end")[-1][0] - j.of("a", "start")[-1][0] >= 0.55  # which ran to its end
    assert j.events("b") == [("standby", (0, 1)), ("pinned", (0, 1))]
    assert j.first("b", "assigned") <= j.first("b", "start")
    j.check_promises("a")
    j.check_promises("b")
    assert j.of("b", "assigned")[0][2] == {0, 1}
    assert j.of("b", "revoked")[-1][2] == {0, 1}  # on stop


async def test_step_down_moves_the_hooks_with_the_pin(nc, js, uniq):
    await static_group(js, nc, uniq)
    j = Journal()
    a = await static_consume(nc, uniq, "g", "m1", j.handler("a"), config=FAST, **j.hooks("a"))
    b = await static_consume(nc, uniq, "g", "m1", j.handler("b"), config=FAST, **j.hooks("b"))
    try:
        await a.wait_for_consuming(10)
        await b.wait_for_consuming(10)
        await js.publish(f"{uniq}.first", b"x")  # the server gives the pin with a message
        await wait_for(
            lambda: (
                {
                    j.events("a")[-1:][0][0] if j.events("a") else None,
                    j.events("b")[-1:][0][0] if j.events("b") else None,
                }
                == {"pinned", "standby"}
            ),
            10,
            what="one pinned, one standby",
        )
        holder, other = ("a", "b") if j.events("a")[-1][0] == "pinned" else ("b", "a")
        await static_member_step_down(nc, uniq, "g", "m1")
        for i in range(6):
            await js.publish(f"{uniq}.s{i}", b"x")
        await wait_for(lambda: len(j.of("a", "end")) + len(j.of("b", "end")) == 7, 15, what="7 handled")
        await wait_for(lambda: j.events(holder)[-1][0] == "standby", 10, what="the old holder standby")
    finally:
        await a.stop()
        await b.stop()
    # The server may give the pin back to the same instance; either way each change is said once, and
    # the hooks kept their promises around the move.
    for who in (holder, other):
        kinds = [k for k, _ in j.events(who)]
        assert all(x != y for x, y in itertools.pairwise(kinds)), kinds
        j.check_promises(who)
    assert "lost-pin" in [k for k, _ in j.events(holder)]
    assert [w for _, w, _ in j.of(holder) if w in ("assigned", "revoked")][:2] == ["assigned", "revoked"]


async def publish(js, stream: str, prefix: str, n: int) -> None:
    for i in range(n):
        await js.publish(f"{stream}.{prefix}{i}", b"x")


def handled(j: Journal) -> int:
    return len(j.of("m1", "end")) + len(j.of("m2", "end"))


async def elastic_group(js, nc, uniq: str, partitions: int = 4) -> None:
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.*"]))
    await create_elastic(nc, uniq, "g", partitions, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])


async def test_elastic_add_and_drop_call_the_hooks_for_what_moves(nc, js, uniq):
    await elastic_group(js, nc, uniq)
    j = Journal()
    m1 = await elastic_consume(nc, uniq, "g", "m1", j.handler("m1", work=0.05), config=FAST, **j.hooks("m1"))
    m2 = await elastic_consume(nc, uniq, "g", "m2", j.handler("m2", work=0.05), config=FAST, **j.hooks("m2"))
    try:
        await wait_for(lambda: j.events("m2") == [("not-a-member", ())], 10, what="m2 not a member")
        await add_members(nc, uniq, "g", ["m1"])
        await publish(js, uniq, "a", 10)  # the server gives the pin with a message
        await wait_for(lambda: ("pinned", (0, 1, 2, 3)) in j.events("m1"), 10, what="m1 pinned")
        await wait_for(lambda: handled(j) == 10, 10, what="10 handled")
        await publish(js, uniq, "b", 10)  # in flight while m2 joins
        await add_members(nc, uniq, "g", ["m2"])
        await publish(js, uniq, "c", 10)
        await wait_for(lambda: ("pinned", (2, 3)) in j.events("m2"), 15, what="m2 pinned on 2 3")
        await wait_for(lambda: handled(j) == 30, 20, what="30 handled")
        await publish(js, uniq, "d", 10)  # in flight while m2 is dropped
        await delete_members(nc, uniq, "g", ["m2"])
        await wait_for(
            lambda: ("partitions", (0, 1, 2, 3)) in j.events("m1") and j.of("m2", "revoked"), 15, what="m1 back on 0-3"
        )
        await publish(js, uniq, "e", 10)
        await wait_for(lambda: handled(j) == 50, 20, what="50 handled")
    finally:
        await m1.stop()
        await m2.stop()
    assert j.events("m1") == [
        ("not-a-member", ()),
        ("added", (0, 1, 2, 3)),
        ("pinned", (0, 1, 2, 3)),
        ("partitions", (0, 1)),
        ("partitions", (0, 1, 2, 3)),
    ]
    assert j.events("m2") == [("not-a-member", ()), ("added", (2, 3)), ("pinned", (2, 3)), ("dropped", ())]
    hooks1 = [(w, set(d)) for _, w, d in j.of("m1") if w in ("assigned", "revoked")]
    assert hooks1 == [("assigned", {0, 1, 2, 3}), ("revoked", {2, 3}), ("assigned", {2, 3}), ("revoked", {0, 1, 2, 3})]
    j.check_promises("m1")
    j.check_promises("m2")
    hooks2 = [(w, set(d)) for _, w, d in j.of("m2") if w in ("assigned", "revoked")]
    assert hooks2 == [("assigned", {2, 3}), ("revoked", {2, 3})]
    # Each instance kept the promises (check_promises); across them: m1 let 2 3 go before m2 was told it
    # has them, and m2 let them go before m1 was told it has them again.
    assert j.first("m1", "revoked") <= j.first("m2", "assigned") <= j.first("m2", "start")
    assert j.first("m2", "revoked") <= j.of("m1", "assigned")[1][0]


@pytest.mark.parametrize("hook", ["on_assigned", "on_revoked", "on_event"])
async def test_a_failing_hook_ends_the_instance_with_its_error(nc, js, uniq, hook):
    await static_group(js, nc, uniq)
    j = Journal()

    def boom(*_):
        raise RuntimeError(f"{hook} says no")

    inst = await static_consume(nc, uniq, "g", "m1", j.handler("a"), config=FAST, **{hook: boom})
    await js.publish(f"{uniq}.x", b"x")
    if hook == "on_revoked":
        await wait_for(lambda: len(j.of("a", "end")) == 1, 10, what="a message handled")
        await inst.stop()
    error = await asyncio.wait_for(inst.done(), 10)
    assert isinstance(error, RuntimeError) and str(error) == f"{hook} says no"
    if hook != "on_revoked":
        assert j.of("a", "start") == []  # nothing was handed out: the hook runs first


async def test_async_for_keeps_order_acks_after_the_body_and_not_after_an_exception(nc, js, uniq):
    await static_group(js, nc, uniq, partitions=1)
    for i in range(5):
        await js.publish(f"{uniq}.k", str(i).encode())
    consumer = "g-m1"
    got: list[bytes] = []
    floors: list[int] = []
    inst = await static_consume(nc, uniq, "g", "m1", config=FAST)
    assert isinstance(inst, ConsumeContext)  # the protocol every consume context satisfies
    with pytest.raises(ValueError, match="body failed"):
        async with inst:
            async for msg in inst:
                got.append(msg.data)
                floors.append((await js.consumer_info(uniq, consumer)).ack_floor.stream_seq)
                if msg.data == b"3":
                    raise ValueError("body failed")
    assert await inst.done() is None
    assert got == [b"0", b"1", b"2", b"3"]
    assert floors == [0, 1, 2, 3]  # each message acked once the loop asked for the next one
    info = await js.consumer_info(uniq, consumer)
    assert info.ack_floor.stream_seq == 3  # message 3 was not acked
    rest: list[bytes] = []
    async with static_consume(nc, uniq, "g", "m1", None, config=FAST) as again:  # no await needed
        async for msg in again:
            rest.append(msg.data)
            if msg.data == b"4":
                again.stop()  # the loop ends when the instance does
    assert rest == [b"3", b"4"]  # redelivered first, in order
    await wait_for(lambda: _acked(js, uniq, consumer, 5), 10, what="everything acked")
    with_handler = await static_consume(nc, uniq, "g", "m1", Journal().handler("x"), config=FAST)
    async with with_handler:
        with pytest.raises(ConfigError, match="handler=None"):
            aiter(with_handler)


async def _acked(js, stream: str, consumer: str, seq: int) -> bool:
    return (await js.consumer_info(stream, consumer)).ack_floor.stream_seq == seq


async def test_connection_events_chain_the_clients_callbacks(nats_server, nc, js, uniq):
    await static_group(js, nc, uniq)
    seen: list[str] = []

    async def users_cb() -> None:
        seen.append("user's disconnected_cb")

    async with FaultProxy(nats_server.port) as proxy:
        conn = await nats.connect(
            proxy.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1, disconnected_cb=users_cb
        )
        j = Journal()
        inst = await static_consume(conn, uniq, "g", "m1", j.handler("a"), config=FAST, **j.hooks("a"))
        try:
            await inst.wait_for_consuming(10)
            await js.publish(f"{uniq}.x", b"x")
            await wait_for(lambda: j.events("a") == [("pinned", (0, 1))], 10, what="pinned")
            proxy.close_connections()
            await wait_for(lambda: [k for k, _ in j.events("a")][-1] == "reconnected", 10, what="reconnected")
        finally:
            await inst.stop()
            await conn.close()
    kinds = [k for k, _ in j.events("a")]
    assert kinds[:3] == ["pinned", "disconnected", "reconnected"], kinds
    details = [d.detail for _, w, d in j.of("a", "event") if d.kind in ("disconnected", "reconnected")]
    assert details[:2] == [proxy.url, proxy.url]
    assert seen[:1] == ["user's disconnected_cb"]  # still called (again on close)


async def test_automatic_membership_passes_the_hooks_to_its_member_instance(nc, js, uniq):
    """A second instance joins: only the partitions that move are revoked from the first and assigned to
    the second; when it leaves they come back the same way."""
    await elastic_group(js, nc, uniq)
    j = Journal()

    def start(who: str):
        return elastic_consume(nc, uniq, "g", "", j.handler(who), auto=True, lease_ttl=2, config=FAST, **j.hooks(who))

    a = await start("m1")
    await a.wait_settled(10)
    await publish(js, uniq, "a", 8)
    await wait_for(lambda: j.events("m1")[-1:] == [("pinned", (0, 1, 2, 3))], 10, what="a pinned on 0-3")
    b = await start("m2")
    try:
        await b.wait_settled(10)
        await wait_for(lambda: j.of("m1", "revoked"), 10, what="a gave partitions up")
        await publish(js, uniq, "b", 16)
        await wait_for(lambda: j.of("m2", "assigned"), 10, what="b was told")
    finally:
        await b.stop()
    await wait_for(lambda: len(j.of("m1", "assigned")) == 2, 10, what="a got them back")
    await a.stop()
    moved = j.of("m1", "revoked")[0][2]
    assert moved and len(moved) == 2  # sticky: half of 4, and only those
    assert j.of("m2", "assigned")[0][2] == moved and j.of("m1", "assigned")[1][2] == moved
    assert [k for k, _ in j.events("m2")][:3] == ["not-a-member", "added", "pinned"]
    assert ("partitions", tuple(sorted({0, 1, 2, 3} - moved))) in j.events("m1")
    for who in ("m1", "m2"):
        j.check_promises(who)


async def test_a_lone_instance_through_a_server_restart_claims_no_take_over(fresh_server, uniq):
    """The only instance of its member, pinned when the server restarts: the server's pin after the
    restart is a new one, and nobody else holds it, so no ``lost-pin`` ("another instance took over")."""
    nc = await nats.connect(fresh_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    js = nc.jetstream()
    j = Journal()
    inst = None
    try:
        await elastic_group(js, nc, uniq)
        await add_members(nc, uniq, "g", ["m1"])
        inst = await elastic_consume(nc, uniq, "g", "m1", j.handler("m1"), config=FAST, **j.hooks("m1"))
        await publish(js, uniq, "a", 4)
        await wait_for(lambda: len(j.of("m1", "end")) == 4, 10, what="4 handled")
        await asyncio.to_thread(fresh_server.restart)
        await wait_for(lambda: ("reconnected", ()) in j.events("m1"), 15, what="reconnected")

        async def published() -> bool:
            try:
                await js.publish(f"{uniq}.b", b"after")
                return True
            except Exception:  # JetStream not ready yet after the restart
                return False

        await wait_for(published, 15, interval=0.2, what="a publish after the restart")
        await wait_for(lambda: len(j.of("m1", "end")) == 5, 20, what="handled after the restart")
        await asyncio.sleep(0)
        assert inst.pinned
    finally:
        if inst is not None:
            await inst.stop()
        await nc.close()
    kinds = [k for k, _ in j.events("m1")]
    assert "lost-pin" not in kinds and "standby" not in kinds, j.events("m1")
    # "pinned" may be said again after the restart: when the instance looked between the restart and the
    # first delivery under the server's new pin, it saw nobody pinned ("unpinned", its partitions revoked
    # meanwhile, no line said), and the new pin is then said as such
    pinned = [e for e in j.events("m1") if e[0] == "pinned"]
    assert pinned and set(pinned) == {("pinned", (0, 1, 2, 3))}, j.events("m1")
    j.check_promises("m1")


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_a_stop_during_a_call_that_outlasts_the_pin_keeps_the_pin_and_acks(nc, js, uniq, concurrency):
    """stop() lets a call in flight finish (within AckWait, 1 s). Pulls stop, but the call must still find
    its pin held when it ends, 0.9 s after the stop (past the 0.9 x PinnedTTL without a pull that puts a pin
    in doubt), and ack: not superseded, not redelivered. A stopping instance keeps renewing its pin."""
    await elastic_group(js, nc, uniq)
    await add_members(nc, uniq, "g", ["m1"])
    seen: list[bool] = []
    started = asyncio.Event()

    async def handle(msg) -> None:
        started.set()
        await asyncio.sleep(1.9)
        seen.append(msg.superseded)
        if not msg.superseded:
            await msg.ack_sync()

    inst = await elastic_consume(nc, uniq, "g", "m1", handle, config=FAST, concurrency=concurrency)
    await publish(js, uniq, "a", 1)
    await asyncio.wait_for(started.wait(), 10)
    await asyncio.sleep(1.0)  # the call has run 1 s (its pin renewed meanwhile) when the stop comes
    await inst.stop()
    assert seen == [False]
    info = await js.consumer_info(f"{uniq}-g", "m1")
    assert info.num_ack_pending == 0 and info.num_redelivered == 0 and info.ack_floor.stream_seq == 1, info


async def test_the_pinned_event_comes_before_the_first_handler_with_on_event_alone(nc, js, uniq):
    """Messages wait when the instance starts; only ``on_event`` is given (no ``on_assigned``): the
    ``pinned`` event is still said before the first handler starts, start after start."""
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.*"]))
    for round_ in range(3):
        group = f"g{round_}"  # a group each: a stopped instance's pin outlives it for a PinnedTTL
        await create_elastic(nc, uniq, group, 2, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])
        await add_members(nc, uniq, group, ["m1"])
        await publish(js, uniq, f"r{round_}", 4)
        j = Journal()
        inst = await elastic_consume(
            nc, uniq, group, "m1", j.handler("m1"), config=FAST, on_event=j.hooks("m1")["on_event"]
        )
        try:
            await wait_for(lambda j=j: len(j.of("m1", "end")) >= 4, 10, what="4 handled")
        finally:
            await inst.stop()
        assert j.events("m1")[0] == ("pinned", (0, 1))
        assert j.first("m1", "event", lambda ev: ev.kind == "pinned") <= j.first("m1", "start")


@pytest.mark.parametrize("flavour", ["static", "elastic"])
async def test_a_config_change_after_a_server_restart_reaches_the_instance_within_2s(fresh_server, uniq, flavour):
    """The server loses the config watch's consumer (in memory) when it restarts; nats-py would notice only
    after two missed heartbeats (10-20 s). The watch starts again at the reconnect: a config written after
    it reaches the instance within 2 s (static: the change ends it; elastic: it follows)."""
    nc = await nats.connect(fresh_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    admin = await nats.connect(fresh_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    js = nc.jetstream()
    j = Journal()
    inst = None
    try:
        if flavour == "static":
            await static_group(js, nc, uniq)
            inst = await static_consume(nc, uniq, "g", "m1", j.handler("m1"), config=FAST, **j.hooks("m1"))
        else:
            await elastic_group(js, nc, uniq)
            await add_members(nc, uniq, "g", ["m1"])
            inst = await elastic_consume(nc, uniq, "g", "m1", j.handler("m1"), config=FAST, **j.hooks("m1"))
        await inst.wait_for_consuming(10)
        await asyncio.to_thread(fresh_server.restart)
        await wait_for(lambda: ("reconnected", ()) in j.events("m1"), 15, what="reconnected")

        async def changed() -> bool:
            try:
                if flavour == "static":
                    kv = await admin.jetstream().key_value("static-consumer-groups")
                    await kv.put(f"{uniq}.g", b'{"max_members":2,"members":["m1","m2"]}')
                else:
                    await add_members(admin, uniq, "g", ["m2"])
                return True
            except Exception:  # JetStream not ready yet after the restart
                return False

        await wait_for(changed, 15, interval=0.1, what="the config written after the restart")
        written = time.monotonic()
        if flavour == "static":
            assert isinstance(await asyncio.wait_for(inst.done(), 2), Exception)
            seen = time.monotonic()
        else:
            await wait_for(
                lambda: any(k == "partitions" for k, _ in j.events("m1")), 2, interval=0.01, what="the new partitions"
            )
            seen = j.first("m1", "event", lambda ev: ev.kind == "partitions")
        assert seen - written < 2.0
    finally:
        if inst is not None:
            await inst.stop()
        await nc.close()
        await admin.close()


async def test_a_consume_started_while_the_server_is_down_waits_for_it(fresh_server, uniq):
    """static_consume with the server gone (the client reconnecting): it says ``unavailable`` once, keeps
    trying, and returns a running instance once the server is back."""
    nc = await nats.connect(fresh_server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    js = nc.jetstream()
    j = Journal()
    inst = None
    try:
        await static_group(js, nc, uniq)
        await publish(js, uniq, "a", 2)
        await asyncio.to_thread(fresh_server.stop)
        start = asyncio.ensure_future(
            static_consume(
                nc, uniq, "g", "m1", j.handler("m1"), config=FAST, api=JetStreamApi(nc, timeout=0.5), **j.hooks("m1")
            )
        )
        await wait_for(lambda: any(k == "unavailable" for k, _ in j.events("m1")), 10, what="unavailable")
        assert not start.done()
        await asyncio.to_thread(fresh_server.start)
        inst = await asyncio.wait_for(start, 20)
        await wait_for(lambda: len(j.of("m1", "end")) == 2, 15, what="both messages handled")
    finally:
        if inst is not None:
            await inst.stop()
        await nc.close()
    said = [d for _, w, d in j.of("m1", "event") if d.kind == "unavailable"]
    assert len(said) == 1 and "timed out" in said[0].detail, said
