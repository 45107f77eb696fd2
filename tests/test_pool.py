"""The worker pool through the library, against a real nats-server: a dispatching member instance
(``dispatch=True``) and workers (``serve_worker``) in this process, each on a connection of its own.
Processes killed and stopped at will are tests/test_chaos.py's pool scenarios; the CLI is tests/test_cli_pool.py.
"""

from __future__ import annotations

import asyncio
import random

import nats
import pytest
from nats.js.api import StreamConfig

from pcgroups import RetryPolicy, serve_worker, static_consume
from pcgroups.errors import ConfigError
from pcgroups.pool._wire import HEARTBEAT, STATUS_SUBJECT, decode

from .helpers.groups import one_partition_group, publish
from .helpers.support import wait_for


async def test_workers_run_each_key_in_order_one_at_a_time_within_their_capacities(nc, js, uniq, connections):
    await one_partition_group(js, nc, uniq)
    rng = random.Random(3)
    keys = [f"k{rng.randrange(12)}" for _ in range(300)]
    running: dict[str, str] = {}
    overlaps: list[str] = []
    done: dict[str, list[int]] = {}
    at_once: dict[str, int] = {}
    peak: dict[str, int] = {}

    def handler_of(name: str):
        async def handler(msg):
            k = msg.subject
            if k in running:
                overlaps.append(k)
            running[k] = name
            at_once[name] = at_once.get(name, 0) + 1
            peak[name] = max(peak.get(name, 0), at_once[name])
            await asyncio.sleep(rng.random() * 0.01)
            del running[k]
            at_once[name] -= 1
            done.setdefault(k, []).append(int(msg.data))
            await msg.ack()

        return handler

    d = await static_consume(await connections(), uniq, "g", "m", dispatch=True)
    workers = [
        await serve_worker(await connections(), "static", uniq, "g", handler_of(f"w{i}"), name=f"w{i}", capacity=c)
        for i, c in enumerate((1, 2, 3))
    ]
    try:
        for w in workers:
            await w.wait_for_consuming(10)
        await publish(js, uniq, keys)
        await wait_for(lambda: sum(map(len, done.values())) == len(keys), 30, what="every message handled")
        # the last outcomes reach the dispatcher a moment after the handlers returned
        await wait_for(lambda: (d.pool_status() or {}).get("handled") == len(keys), 10, what="every outcome")
        status = d.pool_status()
    finally:
        for w in workers:
            await w.stop()
        await d.stop()
    assert overlaps == []
    for k, seqs in done.items():
        assert seqs == [i for i, kk in enumerate(keys) if kk == k], f"key {k} out of order"
    assert all(peak[f"w{i}"] <= c for i, c in enumerate((1, 2, 3))), peak
    assert sum(w.handled for w in workers) == len(keys) and all(w.handled > 0 for w in workers)
    assert status is not None and status["slots"] == 6 and status["handled"] == len(keys)
    assert sorted(w["name"] for w in status["workers"]) == ["w0", "w1", "w2"]


async def test_a_failing_worker_call_is_retried_in_place_then_dead_lettered(nc, js, uniq, connections):
    """A handler that raises (or naks) at a worker: the dispatcher retries the message in place (its key waits),
    then dead-letters it after max_deliver, and the key moves on."""
    await one_partition_group(js, nc, uniq)
    await js.add_stream(StreamConfig(name=f"{uniq}-dlq", subjects=[f"dlq.{uniq}"]))  # a dead letter needs a stream
    dead = await nc.subscribe(f"dlq.{uniq}")
    calls: list[tuple[str, int]] = []

    async def handler(msg):
        calls.append((msg.subject, int(msg.data)))
        if msg.subject == "bad":
            raise RuntimeError("poison")
        if msg.subject == "flaky" and calls.count(("flaky", int(msg.data))) == 1:
            await msg.nak(0.01)
            return
        await msg.ack()

    d = await static_consume(
        await connections(),
        uniq,
        "g",
        "m",
        dispatch=True,
        retry=RetryPolicy(max_deliver=3, backoff=0.01, dead_letter_subject=f"dlq.{uniq}"),
    )
    w = await serve_worker(await connections(), "static", uniq, "g", handler, name="w", capacity=2)
    try:
        await w.wait_for_consuming(10)
        await publish(js, uniq, ["bad", "flaky", "bad", "ok"])
        letters = [await dead.next_msg(timeout=10), await dead.next_msg(timeout=10)]
        await wait_for(lambda: ("ok", 3) in calls, 10, what="the key moved on")
    finally:
        await w.stop()
        await d.stop()
    assert [c for c in calls if c[0] == "bad"] == [("bad", 0)] * 3 + [("bad", 2)] * 3
    assert [c for c in calls if c[0] == "flaky"] == [("flaky", 1)] * 2
    assert [x.data for x in letters] == [b"0", b"2"]
    assert all("poison" in x.headers["Pcg-Dead-Reason"] and x.headers["Pcg-Deliveries"] == "3" for x in letters)
    assert not any(
        k.startswith("Pcg-")
        and k
        not in ("Pcg-Dead-Reason", "Pcg-Subject", "Pcg-Stream", "Pcg-Consumer", "Pcg-Stream-Seq", "Pcg-Deliveries")
        for x in letters
        for k in x.headers
    )


async def test_a_worker_waits_for_a_dispatching_member_then_enrols(nc, js, uniq, connections):
    await one_partition_group(js, nc, uniq)
    said: list[str] = []
    handled: list[str] = []

    async def handler(msg):
        handled.append(msg.subject)
        await msg.ack()

    w = await serve_worker(
        await connections(),
        "static",
        uniq,
        "g",
        handler,
        name="early",
        on_event=lambda ev: said.append(f"{ev.kind}:{ev.detail}"),
    )
    try:
        await wait_for(lambda: said, 10, what="the worker says it waits")
        assert said == [f"no-dispatcher:static group g on {uniq}"] and not w.consuming
        await publish(js, uniq, ["a"])
        d = await static_consume(await connections(), uniq, "g", "m", dispatch=True)
        await w.wait_for_consuming(10)
        await wait_for(lambda: handled == ["a"], 10, what="the message handled")
        assert said[-1] == "enrolled:m"
        await d.stop()
    finally:
        await w.stop()


async def test_a_burst_on_one_key_does_not_hold_back_other_keys_at_the_workers(nc, js, uniq, connections):
    """Fairness across processes: the dispatcher's window grows past a burst on one key, so the workers get other
    keys' messages while the burst is still at its start."""
    await one_partition_group(js, nc, uniq)
    burst = 600
    a_done = [0]
    others_at: dict[str, int] = {}

    async def handler(msg):
        await asyncio.sleep(0.01)
        if msg.subject == "A":
            a_done[0] += 1
        else:
            others_at[msg.subject] = a_done[0]
        await msg.ack()

    await publish(js, uniq, ["A"] * burst + [f"o{i}" for i in range(30)])
    d = await static_consume(await connections(), uniq, "g", "m", dispatch=True)
    workers = [
        await serve_worker(await connections(), "static", uniq, "g", handler, name=f"w{i}", capacity=4)
        for i in range(2)
    ]
    try:
        await wait_for(lambda: len(others_at) == 30, 30, what="every other key handled")
    finally:
        for w in workers:
            await w.stop()
        await d.stop()
    assert max(others_at.values()) < burst // 3, sorted(others_at.values())


async def test_a_worker_gets_its_next_message_when_its_call_ends_not_at_its_next_heartbeat(nc, js, uniq, connections):
    """A heartbeat sent while the worker runs our call says busy 1; the call's outcome that follows frees the slot at
    once (the heartbeat's busy counts our call, which has ended), not only when the next heartbeat says busy 0."""
    await one_partition_group(js, nc, uniq)
    beats = await nc.subscribe(f"$PCG.POOL.static.{uniq}.g.HB")
    await nc.flush()
    started: dict[str, float] = {}
    ended: dict[str, float] = {}

    async def handler(msg):
        started[msg.subject] = now = asyncio.get_running_loop().time()
        if msg.subject == "first":  # return right after a periodic heartbeat that counts this call
            while (
                decode((await beats.next_msg(timeout=5)).data)["busy"] != 1
                or asyncio.get_running_loop().time() - now < 1.2 * HEARTBEAT
            ):
                pass
        await msg.ack()
        ended[msg.subject] = asyncio.get_running_loop().time()

    d = await static_consume(await connections(), uniq, "g", "m", dispatch=True)
    w = await serve_worker(await connections(), "static", uniq, "g", handler, name="w", capacity=1)
    try:
        await w.wait_for_consuming(10)
        await publish(js, uniq, ["first", "second"])
        await wait_for(lambda: "second" in ended, 10, what="both handled")
    finally:
        await w.stop()
        await d.stop()
    assert started["second"] - ended["first"] < HEARTBEAT / 2, started["second"] - ended["first"]


async def test_status_requests_get_each_dispatching_instances_pool(nc, js, uniq, connections):
    await one_partition_group(js, nc, uniq)
    d = await static_consume(await connections(), uniq, "g", "m", dispatch=True, max_in_flight=3)
    w = await serve_worker(await connections(), "static", uniq, "g", lambda m: m.ack(), name="sw", capacity=5)
    try:
        await w.wait_for_consuming(10)
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        await nc.publish(STATUS_SUBJECT, b"", reply=inbox)
        answer = decode((await sub.next_msg(timeout=5)).data)
    finally:
        await w.stop()
        await d.stop()
    assert answer is not None and (answer["stream"], answer["group"], answer["member"]) == (uniq, "g", "m")
    assert answer["slots"] == 3 and [x["name"] for x in answer["workers"]] == ["sw"]  # capped by max_in_flight


async def test_bad_pool_arguments_are_refused_before_anything_runs(nc, uniq):
    async def h(msg):
        pass

    with pytest.raises(ConfigError, match="runs no handler"):
        await static_consume(nc, uniq, "g", "m", h, dispatch=True)
    with pytest.raises(ConfigError, match="max_in_flight"):
        await static_consume(nc, uniq, "g", "m", dispatch=True, concurrency=4)
    with pytest.raises(ConfigError, match="invalid worker name"):
        await serve_worker(nc, "static", uniq, "g", h, name="a.b")
    with pytest.raises(ConfigError, match="capacity"):
        await serve_worker(nc, "static", uniq, "g", h, capacity=0)
    with pytest.raises(ConfigError, match="static or elastic"):
        await serve_worker(nc, "both", uniq, "g", h)


async def test_a_message_too_large_to_offer_is_retried_then_terminated_and_its_key_moves_on(nc, js, uniq, connections):
    """The offer adds its Pcg-* headers: a message that fitted the stream can exceed the server's max payload.
    It counts as a failed call (pcgroups.pool._dispatcher invariant 5): retried, then given up, here terminated
    (``drop``: its dead letter would not fit either, and would be held); the next message of its key is handled."""
    await one_partition_group(js, nc, uniq)
    handled: list[int] = []

    async def handler(msg):
        handled.append(len(msg.data))
        await msg.ack()

    d = await static_consume(
        await connections(), uniq, "g", "m", dispatch=True, retry=RetryPolicy(max_deliver=2, backoff=0.01, drop=True)
    )
    w = await serve_worker(await connections(), "static", uniq, "g", handler, name="w")
    try:
        await w.wait_for_consuming(10)
        big = nc.max_payload - 64  # fits the stream (with the publish's own headers), not an offer
        await js.publish(f"{uniq}.k", b"x" * big)
        await js.publish(f"{uniq}.k", b"small")
        await wait_for(lambda: handled == [5], 15, what="the next message of the key handled")

        async def settled():
            info = await js.consumer_info(uniq, "g-m")
            return info.num_ack_pending == 0 and info.num_pending == 0

        await wait_for(settled, 10, what="both settled on the server")
    finally:
        await w.stop()
        await d.stop()


async def test_an_automatic_member_dispatches_too(nc, js, uniq, connections):
    """elastic_consume(auto=True, dispatch=True): the automatic member's pinned instance hands its messages to
    the group's workers."""
    from pcgroups import PartitioningFilter, create_elastic, elastic_consume

    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.*"]))
    await create_elastic(nc, uniq, "g", 4, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])
    handled: list[str] = []

    async def handler(msg):
        handled.append(msg.subject)
        await msg.ack()

    d = await elastic_consume(await connections(), uniq, "g", "", auto=True, dispatch=True)
    w = await serve_worker(await connections(), "elastic", uniq, "g", handler, name="aw", capacity=2)
    try:
        await w.wait_for_consuming(10)
        await d.wait_for_consuming(10)
        for i in range(20):
            await js.publish(f"{uniq}.k{i}", b"x")
        await wait_for(lambda: len(handled) == 20, 20, what="20 handled by the worker")
        status = d.pool_status()
    finally:
        await w.stop()
        await d.stop()
    assert sorted(handled) == sorted(f"{uniq}.k{i}" for i in range(20))
    assert status is not None and status["member"] == d.member_name and status["member"].startswith("auto-")


async def test_a_dispatcher_stopped_under_a_long_call_leaves_it_to_its_worker(nc, js, uniq, connections):
    """The dispatching instance stops while a worker runs a call longer than AckWait (it waits AckWait, then
    ends): the call goes on with +WPI and acks; the next instance of the member takes over and waits for it, so
    the message runs once and the key's next message after it."""
    from pcgroups import ConsumerConfig

    await one_partition_group(js, nc, uniq)
    calls: list[tuple[str, float, float]] = []

    async def handler(msg):
        start = asyncio.get_running_loop().time()
        await asyncio.sleep(2.5 if msg.data == b"0" else 0.01)
        await msg.ack()
        calls.append((msg.data.decode(), start, asyncio.get_running_loop().time()))

    cfg = ConsumerConfig(ack_wait=1.0)
    d1 = await static_consume(await connections(), uniq, "g", "m", dispatch=True, config=cfg)
    w = await serve_worker(await connections(), "static", uniq, "g", handler, name="w", capacity=2, ack_wait=1.0)
    try:
        await w.wait_for_consuming(10)
        await js.publish(f"{uniq}.k", b"0")
        await wait_for(lambda: w.busy == 1, 10, what="the long call under way")
        await d1.stop()
        d2 = await static_consume(await connections(), uniq, "g", "m", dispatch=True, config=cfg)
        await js.publish(f"{uniq}.k", b"1")
        await wait_for(lambda: len(calls) == 2, 15, what="both messages handled")
        await d2.stop()
    finally:
        await w.stop()
    assert [c[0] for c in calls] == ["0", "1"] and calls[1][1] >= calls[0][2]  # once each, in order, apart


async def test_an_outcome_read_after_the_heartbeat_that_no_longer_lists_its_call_is_not_taken_for_a_lost_offer(
    nc, js, uniq, connections
):
    """A worker's outcome and its next heartbeat come on different subscriptions, so the dispatcher may read the
    heartbeat that no longer lists a call that just ended before that call's outcome. A worker of raw NATS sends
    them in that order: the dispatcher must not take the call for a lost offer and offer it again (it was acked)."""
    from pcgroups.pool._wire import OFFER_GRACE, encode

    await one_partition_group(js, nc, uniq)
    d = await static_consume(await connections(), uniq, "g", "m", dispatch=True)
    pool_prefix = f"$PCG.POOL.static.{uniq}.g"
    offers = await nc.subscribe(f"{pool_prefix}.W.fw.f00d.work")
    await nc.flush()
    held: dict[str, list[int]] = {}
    beats = [0]

    async def beat() -> None:
        beats[0] += 1
        await nc.publish(
            f"{pool_prefix}.HB",
            encode(
                {
                    "name": "fw",
                    "id": "f00d",
                    "capacity": 1,
                    "n": beats[0],
                    "busy": sum(map(len, held.values())),
                    "held": held,
                }
            ),
            reply=f"{pool_prefix}.W.fw.f00d.hb",
        )

    async def beating() -> None:
        while True:
            await beat()
            await asyncio.sleep(HEARTBEAT)

    beating_task = asyncio.create_task(beating())
    try:
        await js.publish(f"{uniq}.k", b"x")
        offer = await offers.next_msg(timeout=10)
        headers = offer.headers or {}
        seq = int(headers["Pcg-Delivery"].split(".")[3])
        held[headers["Pcg-Offer"].split()[0]] = [seq]
        await beat()
        await asyncio.sleep(OFFER_GRACE + HEARTBEAT)  # the call runs past the grace, listed by every heartbeat
        held.clear()
        await beat()  # the heartbeat that no longer lists it, then the outcome
        await nc.publish(offer.reply, encode({"outcome": "ack"}))
        await nc.flush()
        with pytest.raises(nats.errors.TimeoutError):  # offered again: taken for lost
            again = await offers.next_msg(timeout=3 * HEARTBEAT)
            pytest.fail(f"offered again: {again.headers}")
        info = await js.consumer_info(uniq, "g-m")
        assert info.num_ack_pending == 0 and info.num_redelivered == 0, info
    finally:
        beating_task.cancel()
        await d.stop()


class RawDispatcher:
    """A dispatching instance of raw NATS (id ``d``, member ``m``): it answers a worker's heartbeats as told and sends
    it offers of made-up deliveries, each with a reply subject of its own (pcgroups.pool's wire)."""

    def __init__(self, nc, stream: str, d: str) -> None:
        self.nc, self.stream, self.d = nc, stream, d
        self.prefix = f"$PCG.POOL.static.{stream}.g"
        self.beats: list[dict] = []
        self.answering = True
        self.held: list[int] = []
        self.offers = 0

    async def start(self) -> RawDispatcher:
        from pcgroups.pool._wire import Answer, decode

        async def on_beat(msg) -> None:
            hb = decode(msg.data)
            if hb is None:
                return
            self.beats.append(hb)
            if self.answering:
                await self.nc.publish(
                    f"{self.prefix}.W.{hb['name']}.{hb['id']}.hb",
                    Answer(self.d, "m", hb["n"], self.offers, frozenset(self.held), frozenset()).encode(),
                )

        self.replies = await self.nc.subscribe(f"{self.prefix}.D.{self.d}.R.*")
        await self.nc.subscribe(f"{self.prefix}.HB", cb=on_beat)
        await self.nc.flush()
        return self

    async def offer(self, seq: int, deliveries: int = 1, cseq: int | None = None) -> str:
        """Offer stream sequence ``seq`` to the worker of the last heartbeat; the offer's reply subject."""
        hb = self.beats[-1]
        self.offers += 1
        self.held.append(seq)
        reply = f"{self.prefix}.D.{self.d}.R.{self.offers}-00000000000000{self.offers:02d}"
        headers = {
            "Pcg-Partitioned-Subject": f"0.{self.stream}.k",
            "Pcg-Offer": f"{self.d} m {hb['n']}",
            "Pcg-Delivery": f"{self.stream}.g-m.{deliveries}.{seq}.{cseq or seq}.0.0",
        }
        await self.nc.publish(f"{self.prefix}.W.{hb['name']}.{hb['id']}.work", b"x", reply=reply, headers=headers)
        return reply

    async def reply(self, timeout: float = 5.0) -> tuple[str, dict]:
        from pcgroups.pool._wire import decode

        msg = await self.replies.next_msg(timeout=timeout)
        return msg.subject, decode(msg.data) or {}


async def test_a_worker_adopts_a_running_call_and_answers_a_redelivery_of_an_ended_one_without_running_it(
    nc, uniq, connections
):
    """pcgroups.pool._wire invariant 1 at the worker, against dispatchers of raw NATS: a second offer of a stream
    sequence it runs takes the call over (one handler call; its ack goes to the second offer's reply subject), and a
    redelivery's offer of a call that ended with an ack its dispatcher never confirmed (it stopped answering) gets
    that ack at once, the handler not run again; a first delivery of it again (a RESET) runs again."""
    go = asyncio.Event()
    calls: list[int] = []

    async def handler(msg):
        calls.append(msg.sequence)
        if msg.sequence == 7:
            await go.wait()
        await msg.ack()

    d1 = await RawDispatcher(await connections(), uniq, "d1").start()
    d2 = await RawDispatcher(await connections(), uniq, "d2").start()
    w = await serve_worker(await connections(), "static", uniq, "g", handler, name="w", capacity=1)
    try:
        await w.wait_for_consuming(10)
        await d1.offer(7)
        await wait_for(lambda: calls == [7], 5, what="the call running")
        d1.answering = False  # d1 died: d2 holds the pin and the redelivery
        await wait_for(
            lambda: any(b.get("held") == {"d1": [7]} for b in d2.beats[-2:]), 5, what="a heartbeat listing the call"
        )
        second = await d2.offer(7, deliveries=2, cseq=20)
        await wait_for(lambda: any(b.get("held") == {"d2": [7]} for b in d2.beats[-2:]), 5, what="the call adopted")
        go.set()
        subject, outcome = await d2.reply()
        assert (subject, outcome["outcome"]) == (second, "ack") and calls == [7]
        # an ack d2 does not confirm (it stops answering): kept, listed once d2 misses an answer
        d2.answering = False
        await wait_for(lambda: d2.beats[-1].get("done") == {"7": "ack"}, 5, what="the outcome listed")
        third = await d1.offer(7, deliveries=3, cseq=21)
        subject, outcome = await d1.reply()
        assert (subject, outcome["outcome"]) == (third, "ack") and calls == [7]  # not run again
        await d1.offer(7, deliveries=1, cseq=1)  # a RESET delivers it as new: run again
        subject, outcome = await d1.reply()
        assert outcome["outcome"] == "ack" and calls == [7, 7]
    finally:
        go.set()
        await w.stop()


async def test_an_offer_goes_to_the_worker_whose_heartbeat_lists_its_sequence_even_when_it_is_full(
    nc, js, uniq, connections
):
    """pcgroups.pool._dispatcher invariant 6: a message a worker's heartbeat lists (running for another instance, whose
    successor this dispatcher is) is offered to that worker, which is full, not to the free one."""
    from pcgroups.pool._wire import Heartbeat

    await one_partition_group(js, nc, uniq)
    d = await static_consume(await connections(), uniq, "g", "m", dispatch=True)
    prefix = f"$PCG.POOL.static.{uniq}.g"
    offers = {name: await nc.subscribe(f"{prefix}.W.{name}.0000000{i}.work") for i, name in enumerate(("full", "free"))}
    await nc.flush()

    async def beating() -> None:
        n = 0
        while True:
            n += 1
            await nc.publish(
                f"{prefix}.HB",
                Heartbeat("full", "00000000", 1, busy=1, n=n, held={"gone": [1]}).encode(),
                reply=f"{prefix}.W.full.00000000.hb",
            )
            await nc.publish(
                f"{prefix}.HB", Heartbeat("free", "00000001", 1, n=n).encode(), reply=f"{prefix}.W.free.00000001.hb"
            )
            await asyncio.sleep(HEARTBEAT)

    beats = asyncio.create_task(beating())
    try:
        await wait_for(lambda: len((d.pool_status() or {}).get("workers", [])) == 2, 10, what="both workers known")
        await js.publish(f"{uniq}.k", b"x")  # stream sequence 1
        offer = await offers["full"].next_msg(timeout=10)
        assert offer.headers["Pcg-Delivery"].split(".")[3] == "1"
        with pytest.raises(nats.errors.TimeoutError):
            await offers["free"].next_msg(timeout=0.5)
    finally:
        beats.cancel()
        await d.stop()


async def test_a_stopping_worker_beats_while_its_calls_finish(nc, js, uniq, connections):
    """A worker stopped during a call longer than REVOKE_AFTER goes on sending heartbeats until the call ends: its
    dispatcher does not take it for gone and offer the message to another worker (handled twice)."""
    from pcgroups.pool._wire import REVOKE_AFTER

    await one_partition_group(js, nc, uniq)
    calls: list[str] = []
    events: list = []

    def handler_of(name: str):
        async def handler(msg):
            calls.append(name)
            await asyncio.sleep(REVOKE_AFTER + 1.5)
            await msg.ack()

        return handler

    d = await static_consume(await connections(), uniq, "g", "m", dispatch=True, on_event=events.append)
    w1 = await serve_worker(await connections(), "static", uniq, "g", handler_of("w1"), name="w1")
    try:
        await w1.wait_for_consuming(10)
        await js.publish(f"{uniq}.k", b"x")
        await wait_for(lambda: calls == ["w1"], 10, what="the call under way")
        stopping = asyncio.ensure_future(w1.stop())
        w2 = await serve_worker(await connections(), "static", uniq, "g", handler_of("w2"), name="w2")
        assert await asyncio.wait_for(stopping, 15) is None
        await asyncio.sleep(HEARTBEAT * 2)
        await w2.stop()
        info = await js.consumer_info(uniq, "g-m")
    finally:
        await d.stop()
    left = [e.detail for e in events if e.kind == "worker-left"]
    assert calls == ["w1"] and left[:1] == ["w1: stopped"], (calls, left)
    assert info.num_ack_pending == 0 and info.num_redelivered == 0, info
