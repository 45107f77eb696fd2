"""A message its handler can not process, on every path (one at a time, key-level concurrency, the worker pool),
static and elastic: it ends no instance, is tried max_deliver times, lands in the group's dead-letter stream with
its reason; parked keys keep their later messages behind it, in order; a replay (lane R, written here as the
operator's replay writes it) runs them in order and frees the key; a failover keeps a key parked."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest
from nats.js.api import StreamConfig, SubjectTransform

from pcgroups import (
    ConsumerConfig,
    PartitioningFilter,
    RetryPolicy,
    add_members,
    create_elastic,
    create_static,
    delete_elastic,
    delete_static,
    elastic_consume,
    serve_worker,
    static_consume,
)
from pcgroups.deadletters import (
    HEADER_DELIVERIES,
    HEADER_KEY,
    HEADER_MEMBER,
    HEADER_ORIGIN_SEQ,
    HEADER_ORIGIN_STREAM,
    HEADER_PARKED,
    HEADER_PARTITIONED_SUBJECT,
    HEADER_REASON,
    HEADER_REPLAYED,
    HEADER_SUBJECT,
    HEADER_TIME,
    LANE_DEAD,
    LANE_REPLAY,
    REASON_LIMIT,
    Entry,
    copied_headers,
    dead_letter_stream,
    dead_letter_subject,
    delete_entry,
    key_token,
    letter_headers,
    next_entry,
    restored_headers,
)
from pcgroups.errors import ConfigError, NotFoundError
from pcgroups.jetstream._api import JetStreamApi, pinned_client_id
from pcgroups.ops import InstanceMetrics

from .helpers.deadletters import make_dead_letter_stream, write_dead_letter
from .helpers.support import wait_for

ACK_WAIT = 2.0
MODES = ["strict", "keyed", "dispatch"]
FLAVOURS = ["static", "elastic"]


def api_of(nc) -> JetStreamApi:
    return JetStreamApi(nc)


async def make_group(js, nc, flavour: str, stream: str) -> None:
    """One partition, member m: the handler's subject is ``<key>`` (static) or ``<stream>.<key>`` (elastic), its key
    ``<key>`` either way."""
    if flavour == "static":
        await js.add_stream(
            StreamConfig(
                name=stream,
                subjects=[f"{stream}.>"],
                subject_transform=SubjectTransform(src=f"{stream}.*", dest="0.{{wildcard(1)}}"),
            )
        )
        await create_static(nc, stream, "g", 1, members=["m"])
    else:
        await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.*"]))
        await create_elastic(nc, stream, "g", 1, partitioning_filters=[PartitioningFilter(f"{stream}.*", [1])])
        await add_members(nc, stream, "g", ["m"])


async def entries(nc, flavour: str, stream: str) -> list[Entry]:
    """The group's dead letters, in stream order."""
    api, name = api_of(nc), dead_letter_stream(flavour, stream, "g")
    out: list[Entry] = []
    seq = 1
    try:
        while (e := await next_entry(api, name, f"$PCG.DLQ.{flavour}.{stream}.g.>", seq)) is not None:
            out.append(e)
            seq = e.seq + 1
    except NotFoundError:  # no stream (yet)
        pass
    return out


async def replay(nc, flavour: str, stream: str, keys: list[str] | None = None) -> list[int]:
    """What the operator's replay does: each chosen dead letter, in order, copied to lane R (its own message id: the
    stream would take the dead letter's as a duplicate), then deleted from lane D. Returns the new sequences."""
    api, name = api_of(nc), dead_letter_stream(flavour, stream, "g")
    moved = []
    for e in await entries(nc, flavour, stream):
        if e.lane != LANE_DEAD or (keys is not None and e.key not in keys):
            continue
        headers = {k: v for k, v in e.headers.items() if k != "Nats-Msg-Id"}
        subject = f"$PCG.DLQ.{flavour}.{stream}.g.{LANE_REPLAY}.{e.partition}.{e.token}"
        ack = await api.publish(subject, e.data, headers)
        moved.append(ack["seq"])
        assert await delete_entry(api, name, e.seq)
    return moved


@dataclass
class Member:
    """Member m of a one-partition group: two instances (dispatching ones and a worker on the pool path), a handler
    that records every call and fails on what ``failing`` says."""

    flavour: str
    stream: str
    mode: str
    retry: RetryPolicy
    calls: list[tuple[str, str]] = field(default_factory=list)  # (key, data) of every call
    acked: list[tuple[str, str]] = field(default_factory=list)
    failing: set[str] = field(default_factory=lambda: {"poison"})
    events: list[Any] = field(default_factory=list)
    instances: list[Any] = field(default_factory=list)
    workers: list[Any] = field(default_factory=list)

    def key(self, msg) -> str:
        return msg.subject.rsplit(".", 1)[-1]

    async def handler(self, msg) -> None:
        data = msg.data.decode()
        self.calls.append((self.key(msg), data))
        if data in self.failing:
            raise ValueError(data)
        await msg.ack()
        self.acked.append((self.key(msg), data))

    def done(self, key: str) -> list[str]:
        return [d for k, d in self.acked if k == key]

    def tries(self, data: str) -> int:
        return sum(1 for _, d in self.calls if d == data)

    async def start(self, connections, n: int = 2, **kw: Any) -> None:
        strict = self.mode == "strict"
        config = ConsumerConfig(ack_wait=ACK_WAIT, max_ack_pending=1 if strict else 0)
        options: dict[str, Any] = {"config": config, "retry": self.retry, "on_event": self.events.append, **kw}
        if self.mode == "dispatch":
            options["dispatch"] = True
        else:
            options["handler"] = self.handler
            options["concurrency"] = 4 if self.mode == "keyed" else 1
        consume = static_consume if self.flavour == "static" else elastic_consume
        for _ in range(n):
            inst = await consume(await connections(), self.stream, "g", "m", **options)
            self.instances.append(inst)
            await inst.wait_for_consuming(10)
        if self.mode == "dispatch":
            w = await serve_worker(
                await connections(),
                self.flavour,
                self.stream,
                "g",
                self.handler,
                name="w",
                capacity=2,
                ack_wait=ACK_WAIT,
            )
            self.workers.append(w)
            await w.wait_for_consuming(10)

    def pinned(self) -> Any:
        return next(i for i in self.instances if i.pinned)

    def running(self) -> bool:
        return all(not i._done.done() for i in self.instances)

    async def stop(self) -> None:
        for w in self.workers:
            await w.stop()
        for i in self.instances:
            await i.stop()

    def kinds(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.kind == kind]


async def publish(js, stream: str, items: list[tuple[str, str]]) -> list[int]:
    return [(await js.publish(f"{stream}.{k}", d.encode())).seq for k, d in items]


TRAFFIC = [("a", "a0"), ("b", "b0"), ("a", "poison"), ("b", "b1"), ("a", "a1"), ("c", "c0"), ("a", "a2")]


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("mode", MODES)
async def test_a_message_that_always_fails_ends_no_instance_and_is_dead_lettered(
    nc, js, uniq, connections, mode, flavour
):
    """Two instances of m; a message that always fails is tried exactly max_deliver times and lands in the group's
    dead-letter stream with its reason (a failed event per attempt, then dead-lettered); every other message is handled,
    each key in order (the whole partition in order on the strict path); both instances still run."""
    await make_group(js, nc, flavour, uniq)
    m = Member(flavour, uniq, mode, RetryPolicy(max_deliver=3, backoff=0.05))
    await m.start(connections)
    try:
        seqs = await publish(js, uniq, TRAFFIC)
        await wait_for(lambda: len(m.acked) == len(TRAFFIC) - 1, 20, what="every other message handled")
        [letter] = await wait_for(lambda: entries(nc, flavour, uniq), 10, what="the dead letter")
        await wait_for(lambda: m.kinds("dead-lettered"), 5, what="the dead-lettered event")
        assert m.running() and len(m.instances) == 2
    finally:
        await m.stop()
    assert m.tries("poison") == 3
    assert m.done("a") == ["a0", "a1", "a2"] and m.done("b") == ["b0", "b1"] and m.done("c") == ["c0"]
    if mode == "strict":
        assert [d for _, d in m.acked] == [d for _, d in TRAFFIC if d != "poison"]
    h = letter.headers
    assert letter.data == b"poison" and letter.lane == LANE_DEAD and letter.partition == 0
    assert letter.token == key_token("a") and letter.key == "a" and h[HEADER_KEY] == "a"
    assert h[HEADER_REASON] == "ValueError: poison" and h[HEADER_DELIVERIES] == "3" and h[HEADER_MEMBER] == "m"
    if flavour == "static":
        assert h[HEADER_ORIGIN_STREAM] == uniq and h[HEADER_ORIGIN_SEQ] == str(seqs[2])
    else:
        assert h[HEADER_ORIGIN_STREAM] == f"{uniq}-g"  # the work queue's sequence
    assert h[HEADER_SUBJECT] == ("a" if flavour == "static" else f"{uniq}.a") and HEADER_PARKED not in h
    assert h[HEADER_PARTITIONED_SUBJECT].startswith("0.") and h[HEADER_TIME].endswith("Z")
    failed = m.kinds("failed")
    assert len(failed) == 3 and all("ValueError: poison" in e.detail for e in failed)
    assert "attempt 3 of 3" in failed[-1].detail and failed[-1].detail.endswith("given up")
    [dead] = m.kinds("dead-lettered")
    assert "after 3 deliveries" in dead.detail and dead.partitions == (0,)


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("mode", MODES)
async def test_parked_keys_follow_their_first_dead_letter_in_order_then_a_replay_frees_them(
    nc, js, uniq, connections, mode, flavour
):
    """park_keys: key a's messages after its dead letter do not run: they follow it into the dead-letter stream, in
    order, while b and c flow. The operator's replay (lane R) runs them in order, deletes them, and frees the key:
    its next message runs."""
    await make_group(js, nc, flavour, uniq)
    m = Member(flavour, uniq, mode, RetryPolicy(max_deliver=2, backoff=0.05, park_keys=True))
    await m.start(connections)
    try:
        await publish(js, uniq, TRAFFIC)
        await wait_for(lambda: len(m.acked) == 4, 20, what="a0 and the other keys")
        letters = await wait_for(
            lambda: _having(entries(nc, flavour, uniq), 3), 10, what="the dead letter and its two followers"
        )
        assert [e.data for e in letters] == [b"poison", b"a1", b"a2"]
        assert [e.headers.get(HEADER_PARKED) for e in letters] == [None, "1", "1"]
        assert [e.headers[HEADER_DELIVERIES] for e in letters] == ["2", "0", "0"]
        assert m.tries("a1") == m.tries("a2") == 0 and m.tries("poison") == 2
        assert m.done("a") == ["a0"] and m.done("b") == ["b0", "b1"] and m.done("c") == ["c0"]
        [parked] = m.kinds("parked")
        assert "'a'" in parked.detail

        await publish(js, uniq, [("a", "a3"), ("b", "b2")])  # still parked: a3 follows, b2 runs
        await wait_for(lambda: m.done("b") == ["b0", "b1", "b2"], 10, what="b2")
        await wait_for(lambda: _having(entries(nc, flavour, uniq), 4), 10, what="a3 follows")

        m.failing.clear()  # fixed
        moved = await replay(nc, flavour, uniq)
        assert len(moved) == 4
        await wait_for(lambda: m.done("a") == ["a0", "poison", "a1", "a2", "a3"], 20, what="the replay, in order")
        await wait_for(lambda: _none(entries(nc, flavour, uniq)), 10, what="the dead letters deleted")
        await wait_for(lambda: m.kinds("unparked"), 5, what="unparked")
        await publish(js, uniq, [("a", "a4")])
        await wait_for(lambda: m.done("a")[-1:] == ["a4"], 10, what="the key flows again")
        assert m.running()
    finally:
        await m.stop()
    replayed = [c for c in m.calls if c[1] in ("poison", "a1", "a2", "a3")]
    assert replayed[-4:] == [("a", "poison"), ("a", "a1"), ("a", "a2"), ("a", "a3")]


async def _having(coro, n: int):
    got = await coro
    return got if len(got) >= n else None


async def _none(coro) -> bool:
    return not await coro


async def test_an_elastic_parked_key_is_replayed_through_the_work_queue_instance(nc, js, uniq, connections):
    """The same on an elastic group: the dead letters hold the work queue's sequences and subjects; a replayed message
    reaches its handler with the headers it was published with (and Pcg-Replayed)."""
    await make_group(js, nc, "elastic", uniq)
    m = Member("elastic", uniq, "keyed", RetryPolicy(max_deliver=2, backoff=0.05, park_keys=True))
    seen: list[dict[str, str]] = []
    handler = m.handler

    async def recording(msg) -> None:
        seen.append(dict(msg.headers or {}))
        await handler(msg)

    m.handler = recording  # type: ignore[method-assign]
    await m.start(connections, n=1)
    try:
        await js.publish(f"{uniq}.a", b"poison", headers={"X-Mine": "1", "Nats-Msg-Id": f"{uniq}-p"})
        await publish(js, uniq, [("a", "a1"), ("b", "b0")])
        letters = await wait_for(lambda: _having(entries(nc, "elastic", uniq), 2), 15, what="dead and parked")
        assert [e.origin_stream for e in letters] == [f"{uniq}-g"] * 2
        assert letters[0].headers["Pcg-Orig-Nats-Msg-Id"] == f"{uniq}-p" and letters[0].headers["X-Mine"] == "1"
        m.failing.clear()
        await replay(nc, "elastic", uniq)
        await wait_for(lambda: m.done("a") == ["poison", "a1"], 20, what="replayed in order")
        await wait_for(lambda: _none(entries(nc, "elastic", uniq)), 10, what="deleted")
    finally:
        await m.stop()
    replayed = seen[-2]
    assert replayed["X-Mine"] == "1" and replayed["Nats-Msg-Id"] == f"{uniq}-p" and HEADER_REPLAYED in replayed
    assert not any(k.startswith("Pcg-") and k != HEADER_REPLAYED for k in replayed)

    async def empty_queue() -> bool:
        return (await js.stream_info(f"{uniq}-g")).state.messages == 0

    await wait_for(empty_queue, 10, what="the work queue emptied (acked and terminated)")


async def test_strict_park_keys_lets_the_other_keys_of_the_partition_flow(nc, js, uniq, connections):
    """On the strict path (max_ack_pending 1) the key is the key function's: a parked key's messages follow it into the
    stream, the partition's other keys go on in order."""
    await make_group(js, nc, "static", uniq)
    m = Member("static", uniq, "strict", RetryPolicy(max_deliver=2, backoff=0.05, park_keys=True))
    await m.start(connections, n=1)
    try:
        await publish(js, uniq, TRAFFIC)
        await wait_for(lambda: len(m.acked) == 4, 20, what="the other keys")
        letters = await wait_for(lambda: _having(entries(nc, "static", uniq), 3), 10, what="a parked")
    finally:
        await m.stop()
    assert [d for _, d in m.acked] == ["a0", "b0", "b1", "c0"]
    assert [e.data for e in letters] == [b"poison", b"a1", b"a2"]


@pytest.mark.parametrize("mode", ["strict", "keyed"])
async def test_a_failover_keeps_a_key_parked(nc, js, uniq, connections, mode):
    """The pinned instance stops while key a is parked: the standby that takes over knows it (the dead-letter stream is
    the record), so a's next message follows it, and b's runs."""
    await make_group(js, nc, "static", uniq)
    m = Member("static", uniq, mode, RetryPolicy(max_deliver=2, backoff=0.05, park_keys=True))
    await m.start(connections)
    try:
        await publish(js, uniq, [("a", "poison"), ("b", "b0")])
        await wait_for(lambda: _having(entries(nc, "static", uniq), 1), 15, what="a parked")
        await wait_for(lambda: m.done("b") == ["b0"], 10, what="b0")
        first = m.pinned()
        await first.stop()  # its standby takes over (the server gives it the pin with the next message)
        await publish(js, uniq, [("a", "a1"), ("b", "b1")])
        await wait_for(lambda: m.done("b") == ["b0", "b1"], 15, what="b1 on the new pin")
        assert any(i.pinned for i in m.instances if i is not first)
        letters = await wait_for(lambda: _having(entries(nc, "static", uniq), 2), 10, what="a1 follows")
    finally:
        await m.stop()
    assert [e.data for e in letters] == [b"poison", b"a1"] and m.tries("a1") == 0


async def test_each_member_replays_the_dead_letters_of_its_own_partitions(nc, js, uniq, connections):
    """Two members, a partition each: a replay of both partitions' dead letters runs each entry once, at the member
    that owns its partition (lane R is read by every member's pinned instance; each hands out only its own)."""
    from pcgroups import partition_of_subject

    await js.add_stream(
        StreamConfig(
            name=uniq,
            subjects=[f"{uniq}.*"],
            subject_transform=SubjectTransform(src=f"{uniq}.*", dest="{{partition(2,1)}}.{{wildcard(1)}}"),
        )
    )
    await create_static(nc, uniq, "g", 2, members=["m1", "m2"])
    keys = {partition_of_subject(f"{uniq}.k{i}", 2, [1], f"{uniq}.*"): f"k{i}" for i in range(20)}
    ran: dict[str, list[str]] = {"m1": [], "m2": []}
    fixed = asyncio.Event()

    def handler_of(member: str):
        async def handler(msg) -> None:
            if not fixed.is_set():
                raise ValueError("not yet")
            ran[member].append(msg.data.decode())
            await msg.ack()

        return handler

    retry = RetryPolicy(max_deliver=1)
    config = ConsumerConfig(ack_wait=ACK_WAIT, max_ack_pending=1)
    insts = [
        await static_consume(await connections(), uniq, "g", m, handler_of(m), config=config, retry=retry)
        for m in ("m1", "m2")
    ]
    try:
        await js.publish(f"{uniq}.{keys[0]}", b"p0")
        await js.publish(f"{uniq}.{keys[1]}", b"p1")
        await wait_for(lambda: _having(entries(nc, "static", uniq), 2), 15, what="both dead-lettered")
        fixed.set()
        await replay(nc, "static", uniq)
        await wait_for(lambda: ran == {"m1": ["p0"], "m2": ["p1"]}, 20, what="each replayed by its owner")
        await wait_for(lambda: _none(entries(nc, "static", uniq)), 10, what="deleted")
    finally:
        for inst in insts:
            await inst.stop()


@pytest.mark.parametrize("mode", MODES)
async def test_an_idle_members_replay_runs_once_and_in_order_in_one_of_its_instances(nc, js, uniq, connections, mode):
    """No message comes to the member, so none of its two instances is ever pinned (the server gives the pin with a
    message): one of them takes the member's replay lease and runs lane R, each entry once and in order, and releases
    the lease once nothing is left: the dead-letter stream ends empty."""
    await make_group(js, nc, "static", uniq)
    name = await make_dead_letter_stream(nc, "static", uniq, "g")
    m = Member("static", uniq, mode, RetryPolicy(max_deliver=2, backoff=0.05, park_keys=True))
    await m.start(connections)
    try:
        for i in range(5):
            await write_dead_letter(
                nc,
                "static",
                uniq,
                "g",
                partition=0,
                key="a",
                subject="a",
                origin_seq=i + 1,
                member="m",
                lane=LANE_REPLAY,
                data=f"a{i}".encode(),
            )
        await wait_for(lambda: _none(entries(nc, "static", uniq)), 20, what="the replay run and its lease released")
        state = (await api_of(nc).stream_info(name))["state"]
        assert state["messages"] == 0, state
        assert m.calls == [("a", f"a{i}") for i in range(5)], m.calls
        assert not any(i.pinned for i in m.instances)  # the idle case: nobody had the pin
    finally:
        await m.stop()


@dataclass
class Call:
    """One handler call: which instance ran it, the message, when it started and ended."""

    instance: int
    key: str
    data: str
    start: float
    end: float = 0.0


@dataclass
class Timed:
    """Member m of a one-partition group with two instances, idle: a handler that records every call per instance
    (replayed messages of key a take ``work`` seconds, the rest none; a call stops without an ack once superseded, as
    a long handler should)."""

    mode: str
    work: float = 0.25
    calls: list[Call] = field(default_factory=list)
    instances: list[Any] = field(default_factory=list)
    conns: list[Any] = field(default_factory=list)

    def handler_of(self, index: int):
        async def handler(msg) -> None:
            key = msg.subject.rsplit(".", 1)[-1]
            call = Call(index, key, msg.data.decode(), asyncio.get_running_loop().time())
            self.calls.append(call)
            try:
                if key == "a":
                    until = call.start + self.work
                    while asyncio.get_running_loop().time() < until:
                        if msg.superseded:
                            return  # not ours any more: stop, and do not ack (it runs again)
                        await asyncio.sleep(0.02)
                await msg.ack()
            finally:
                call.end = asyncio.get_running_loop().time()

        return handler

    async def start(self, connections, uniq: str) -> None:
        config = ConsumerConfig(ack_wait=ACK_WAIT, max_ack_pending=1 if self.mode == "strict" else 0)
        retry = RetryPolicy(max_deliver=2, backoff=0.05, park_keys=True)
        for i in range(2):
            nc = await connections()
            inst = await static_consume(
                nc,
                uniq,
                "g",
                "m",
                self.handler_of(i),
                config=config,
                retry=retry,
                concurrency=4 if self.mode == "keyed" else 1,
            )
            self.conns.append(nc)
            self.instances.append(inst)
            await inst.wait_for_consuming(10)

    def of(self, key: str) -> list[Call]:
        return [c for c in self.calls if c.key == key]

    def ended(self, key: str) -> list[str]:
        """The data of the calls of ``key`` that ended, in the order they ended."""
        return [c.data for c in sorted(self.of(key), key=lambda c: c.end) if c.end]

    def assert_one_at_a_time_in_order(self, n: int) -> None:
        """Key a's calls never overlap, and run its entries in order: a call runs again only the entry the call
        before it ran (one dropped mid-run), never an earlier one or one ahead of an unfinished one."""
        runs = sorted(self.of("a"), key=lambda c: c.start)
        for before, after in itertools.pairwise(runs):
            assert after.start >= before.end, f"overlap: {before} and {after}"
        ran = [c.data for c in runs]
        assert [d for i, d in enumerate(ran) if i == 0 or ran[i - 1] != d] == [f"a{i}" for i in range(n)], ran

    async def stop(self) -> None:
        for i in self.instances:
            await i.stop()


async def write_replays(nc, uniq: str, n: int) -> None:
    for i in range(n):
        await write_dead_letter(
            nc,
            "static",
            uniq,
            "g",
            partition=0,
            key="a",
            subject="a",
            origin_seq=i + 1,
            member="m",
            lane=LANE_REPLAY,
            data=f"a{i}".encode(),
        )


async def pinned_now(api, instances: list[Any]) -> Any:
    """The instance holding the member's pin, once consumer info shows it and the instance got it (None before)."""
    s = instances[0].session
    pin = pinned_client_id(await api.consumer_info(s.stream, s.consumer))
    return next((i for i in instances if pin is not None and i.session.pin_id == pin), None)


async def stream_empty(nc, name: str) -> bool:
    return (await api_of(nc).stream_info(name))["state"]["messages"] == 0


@pytest.mark.parametrize("pinned", ["holder", "other"])
@pytest.mark.parametrize("mode", ["strict", "keyed"])
async def test_a_pin_given_mid_replay_takes_lane_r_over_without_overlap_or_loss(
    nc, js, uniq, connections, mode, pinned
):
    """An idle member's replay runs in the instance holding its lease; mid-replay a live message of another key pins
    one of the two instances (steered with unpins: the lease holder, or the other one). Lane R goes on in the pinned
    instance: every entry runs and is deleted, its successful runs in order and one at a time (a run the pin dropped
    may run again, never beside another), the live messages are handled, and no lease is left behind."""
    await make_group(js, nc, "static", uniq)
    name = await make_dead_letter_stream(nc, "static", uniq, "g")
    m = Timed(mode)
    await m.start(connections, uniq)
    api = api_of(nc)
    try:
        await write_replays(nc, uniq, 6)
        [first] = await wait_for(lambda: m.of("a")[:1], 20, what="the first replayed call")
        target = m.instances[first.instance if pinned == "holder" else 1 - first.instance]
        session = target.session
        live = 0
        while True:  # the server pins whoever's pull comes first: unpin until it is the target
            assert live < 12, "the server never pinned the chosen instance"
            await js.publish(f"{uniq}.z", f"z{live}".encode())
            live += 1
            if await wait_for(lambda: pinned_now(api, m.instances), 10, what="a pin") is target:
                break
            await api.unpin(session.stream, session.consumer)
        await wait_for(lambda: len(m.ended("a")) >= 6, 30, what="the replay")
        await wait_for(lambda: _none(entries(nc, "static", uniq)), 10, what="the entries deleted")
        await wait_for(lambda: stream_empty(nc, name), 10, what="the lease released")
        await wait_for(lambda: len(m.ended("z")) >= live, 10, what="the live messages")
        assert target.pinned
    finally:
        await m.stop()
    m.assert_one_at_a_time_in_order(6)
    assert sorted(c.data for c in m.of("z")) == sorted(f"z{i}" for i in range(live))
    tail = [c for c in m.of("a") if c.start > first.start]
    assert any(c.instance == m.instances.index(target) for c in tail), m.calls  # lane R went on in the pinned one


async def test_a_pinned_lease_holder_that_loses_its_pin_mid_replay_hands_lane_r_over(nc, js, uniq, connections):
    """The pinned instance runs a long replayed call when the pin moves to the other instance: it learns so up to a
    pull later, drops the call and releases the lease, which supersedes the call (it stops, not acked, and runs
    again); the new pin holder runs lane R once it held the pin for AckWait, never beside the dropped call: the
    replay ends in order, nothing lost, no lease left."""
    await make_group(js, nc, "static", uniq)
    name = await make_dead_letter_stream(nc, "static", uniq, "g")
    m = Timed("keyed", work=1.5 * ACK_WAIT)
    await m.start(connections, uniq)
    api = api_of(nc)
    session = m.instances[0].session
    live = 0

    async def pin(target) -> None:
        nonlocal live
        while True:  # unpin until the server pins the target
            assert live < 12, "the server never pinned the chosen instance"
            await js.publish(f"{uniq}.z", f"z{live}".encode())
            live += 1
            if await wait_for(lambda: pinned_now(api, m.instances), 10, what="a pin") is target:
                return
            await api.unpin(session.stream, session.consumer)

    try:
        await write_replays(nc, uniq, 3)
        [first] = await wait_for(lambda: m.of("a")[:1], 20, what="the first replayed call")
        holder = m.instances[first.instance]
        await pin(holder)
        pinned_call = await wait_for(
            lambda: next((c for c in m.of("a") if c.start > first.start and c.instance == first.instance), None),
            20,
            what="a replayed call in the pinned instance",
        )
        await api.unpin(session.stream, session.consumer)
        await pin(m.instances[1 - first.instance])
        await wait_for(lambda: len(m.ended("a")) >= 4 and m.of("a")[-1].end, 40, what="the replay")
        await wait_for(lambda: _none(entries(nc, "static", uniq)), 10, what="the entries deleted")
        await wait_for(lambda: stream_empty(nc, name), 10, what="the lease released")
    finally:
        await m.stop()
    m.assert_one_at_a_time_in_order(3)
    assert pinned_call.end - pinned_call.start < m.work  # dropped mid-call


@pytest.mark.parametrize("how", ["stop", "crash"])
async def test_a_lease_holder_that_ends_mid_replay_is_taken_over_by_its_idle_sibling(nc, js, uniq, connections, how):
    """The instance running an idle member's replay ends mid-replay: stopped (its call finishes, the lease is
    released: the other takes it at once), or its connection gone (the lease is left: the other takes it over after
    TTL + AckWait and runs the interrupted entry again). The other instance finishes the entries, in order, one at
    a time, none lost, and releases the lease."""
    await make_group(js, nc, "static", uniq)
    name = await make_dead_letter_stream(nc, "static", uniq, "g")
    m = Timed("keyed")
    await m.start(connections, uniq)
    try:
        await write_replays(nc, uniq, 6)
        calls = await wait_for(lambda: _having_now(m.of("a"), 2), 20, what="two replayed calls")
        gone = calls[1].instance
        if how == "stop":
            await m.instances[gone].stop()
        else:
            await m.conns[gone].close()
        await wait_for(lambda: len({c.data for c in m.of("a") if c.end}) == 6, 20, what="the rest of the replay")
        await wait_for(lambda: _none(entries(nc, "static", uniq)), 10, what="the entries deleted")
        await wait_for(lambda: stream_empty(nc, name), 10, what="the lease released")
    finally:
        await m.stop()
    m.assert_one_at_a_time_in_order(6)
    after = [c for c in m.of("a") if c.start > calls[1].start]
    assert after and all(c.instance == 1 - gone for c in after), m.calls
    if how == "crash":  # its call could not delete its entry: it runs again, after the take-over's wait
        assert after[0].data == calls[1].data and after[0].start - calls[1].end >= ACK_WAIT, m.calls


def _having_now(items: list, n: int) -> list | None:
    return items if len(items) >= n else None


async def test_a_purged_key_flows_again(nc, js, uniq, connections):
    """An operator's purge (the dead letters deleted) frees the key: the next message asks the stream, finds none,
    and runs (unparked)."""
    await make_group(js, nc, "static", uniq)
    m = Member("static", uniq, "keyed", RetryPolicy(max_deliver=1, park_keys=True))
    await m.start(connections, n=1)
    try:
        await publish(js, uniq, [("a", "poison"), ("a", "a1")])
        letters = await wait_for(lambda: _having(entries(nc, "static", uniq), 2), 15, what="parked")
        for e in letters:
            await delete_entry(api_of(nc), dead_letter_stream("static", uniq, "g"), e.seq)
        await publish(js, uniq, [("a", "a2")])
        await wait_for(lambda: m.done("a") == ["a2"], 10, what="a2 runs")
        assert m.kinds("unparked")
    finally:
        await m.stop()


async def test_with_defaults_a_failing_message_is_held_until_the_dead_letter_stream_takes_it(
    nc, js, uniq, connections, caplog
):
    """The default policy (max_deliver 5) on the strict path: the group's dead-letter stream is full (an operator's
    limit, discard new): the message is held, each refusal said, the partition waits; once there is room the dead
    letter is stored, then the message terminated, and the partition goes on. Never gone."""
    await make_group(js, nc, "static", uniq)
    name = dead_letter_stream("static", uniq, "g")
    info = await js.stream_info(name)
    info.config.max_msgs = 1
    await js.update_stream(info.config)
    await api_of(nc).publish(dead_letter_subject("static", uniq, "g", LANE_DEAD, 0, "other"), b"earlier")
    metrics = InstanceMetrics("static", uniq, "g", "m")
    m = Member("static", uniq, "strict", RetryPolicy(backoff=0.02, max_backoff=0.2))
    m.events = []

    def told(ev) -> None:
        m.events.append(ev)
        metrics.on_event(ev)

    await m.start(connections, n=1, on_event=told)
    metrics.watch_dead_letters(m.instances[0].dead_letter_status)
    get = metrics.registry.get_sample_value
    labels = {"flavour": "static", "stream": uniq, "group": "g", "member": "m"}
    try:
        await publish(js, uniq, [("a", "poison"), ("b", "b0")])
        await wait_for(lambda: len(m.kinds("dead-letter-refused")) >= 2, 15, what="refused while full")
        assert m.tries("poison") == 5 and m.acked == []  # the partition waits
        assert "maximum messages" in m.kinds("dead-letter-refused")[-1].detail
        assert get("pcgroups_instance_oldest_failing_seconds", labels) > 0
        info.config.max_msgs = -1
        await js.update_stream(info.config)
        await wait_for(lambda: m.done("b") == ["b0"], 15, what="stored, then the partition goes on")
        assert get("pcgroups_instance_oldest_failing_seconds", labels) == 0
    finally:
        await m.stop()
    assert [e.data for e in await entries(nc, "static", uniq)] == [b"earlier", b"poison"]
    assert any("not dead-lettered" in r.getMessage() and name in r.getMessage() for r in caplog.records)


async def test_a_dead_letter_another_stream_takes_is_refused_and_held(nc, js, uniq, connections, caplog):
    """A stream of the user's takes the dead-letter subjects: the group's own can not be made (a warning at create),
    and a dead letter that lands in the other stream does not count: refused, the message held, its key waiting."""
    await js.add_stream(StreamConfig(name=f"{uniq}X", subjects=[f"$PCG.DLQ.static.{uniq}.>"]))
    await make_group(js, nc, "static", uniq)
    assert any("was not made" in r.getMessage() for r in caplog.records)
    m = Member("static", uniq, "keyed", RetryPolicy(max_deliver=1, backoff=0.05, max_backoff=0.2))
    await m.start(connections, n=1)
    try:
        await publish(js, uniq, [("a", "poison"), ("a", "a1"), ("b", "b0")])
        await wait_for(lambda: len(m.kinds("dead-letter-refused")) >= 2, 15, what="refused")
        assert f"stream {uniq}X took it" in m.kinds("dead-letter-refused")[-1].detail
        await wait_for(lambda: m.done("b") == ["b0"], 10, what="the other key flows")
        assert m.done("a") == [] and not m.kinds("dead-lettered")
    finally:
        await m.stop()


async def test_drop_terminates_only_when_asked(nc, js, uniq, connections):
    await make_group(js, nc, "static", uniq)
    m = Member("static", uniq, "keyed", RetryPolicy(max_deliver=2, backoff=0.01, drop=True))
    await m.start(connections, n=1)
    try:
        await publish(js, uniq, [("a", "poison"), ("a", "a1")])
        await wait_for(lambda: m.done("a") == ["a1"], 10, what="dropped, the key moves on")
        await wait_for(lambda: m.kinds("terminated"), 5, what="said")
    finally:
        await m.stop()
    assert await entries(nc, "static", uniq) == []


async def test_a_group_made_before_dead_letter_streams_gets_one_on_first_need(nc, js, uniq, connections):
    """The stream is made with the group; one deleted (or a group of before) is made again by the member instance that
    needs it. Deleting the group keeps it unless asked."""
    await make_group(js, nc, "static", uniq)
    name = dead_letter_stream("static", uniq, "g")
    config = (await js.stream_info(name)).config
    assert config.subjects == [f"$PCG.DLQ.static.{uniq}.g.>"] and config.discard == "new"
    await js.delete_stream(name)
    m = Member("static", uniq, "strict", RetryPolicy(max_deliver=1))
    await m.start(connections, n=1)
    try:
        await publish(js, uniq, [("a", "poison")])
        await wait_for(lambda: _having(entries(nc, "static", uniq), 1), 10, what="made and stored")
    finally:
        await m.stop()
    await delete_static(nc, uniq, "g")
    assert (await js.stream_info(name)).state.messages == 1  # kept
    await create_static(nc, uniq, "g", 1, members=["m"])
    await delete_static(nc, uniq, "g", with_dead_letters=True)
    with pytest.raises(NotFoundError):
        await api_of(nc).stream_info(name)


async def test_an_elastic_groups_delete_keeps_its_dead_letters_unless_asked(nc, js, uniq):
    await make_group(js, nc, "elastic", uniq)
    name = dead_letter_stream("elastic", uniq, "g")
    await delete_elastic(nc, uniq, "g")
    await js.stream_info(name)
    await create_elastic(nc, uniq, "g", 1, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])
    await delete_elastic(nc, uniq, "g", with_dead_letters=True)
    with pytest.raises(NotFoundError):
        await api_of(nc).stream_info(name)


# --- the format, without a server ------------------------------------------------------------------------


def test_the_dead_letter_stream_name_never_collides_and_fits():
    assert dead_letter_stream("static", "ORDERS", "g-1") == "ORDERS~g-1~static~dlq"
    long = dead_letter_stream("elastic", "S" * 255, "g" * 255)
    assert len(long.encode()) == 255 and long.endswith("~elastic~dlq")
    assert long != dead_letter_stream("elastic", "S" * 255, "g" * 254 + "h")
    for name in (long, dead_letter_stream("static", "a-b", "c-d")):
        assert "~" in name.rsplit("-", 1)[-1]  # never <stream>-<group> (a group name has no ~)


def test_headers_are_copied_bounded_and_restored():
    original = {"X-A": "1", "Nats-Msg-Id": "m1", "Nats-Pin-Id": "pin", "Nats-Expected-Stream": "S"}
    copied = copied_headers(original)
    assert copied == {"X-A": "1", "Pcg-Orig-Nats-Msg-Id": "m1", "Pcg-Orig-Nats-Expected-Stream": "S"}
    letter = letter_headers(
        original,
        origin_stream="S",
        origin_seq=7,
        subject="a",
        partitioned_subject="0.a",
        member="m",
        key="a",
        deliveries=5,
        reason="ValueError: line one\r\nline two " + "x" * 5000,
    )
    assert "\n" not in letter[HEADER_REASON] and len(letter[HEADER_REASON].encode()) <= REASON_LIMIT
    assert letter[HEADER_REASON].startswith("ValueError: line one line two")
    assert restored_headers({**letter, "Nats-Msg-Id": "S:7"}) == {
        "X-A": "1",
        "Nats-Msg-Id": "m1",
        "Nats-Expected-Stream": "S",
    }


def test_a_policy_that_can_not_hold_is_refused():
    for kwargs in (
        {"max_deliver": -1},
        {"drop": True, "dead_letter_subject": "x"},
        {"park_keys": True, "drop": True},
        {"park_keys": True, "dead_letter_subject": "x"},
    ):
        with pytest.raises(ConfigError):
            RetryPolicy(**kwargs)
