"""Key-level concurrency inside one member instance (concurrency=K): per-key order and exclusivity,
fairness under a burst, retries in place, dead-lettering."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time

import nats
import pytest
from nats.js.api import DiscardPolicy, StreamConfig

from pcgroups import (
    ConsumerConfig,
    PartitioningFilter,
    RetryPolicy,
    add_members,
    create_elastic,
    elastic_consume,
    static_consume,
    static_member_step_down,
)
from pcgroups.consume._window import PULL_BYTES, WINDOW_BYTES, WINDOW_SHRINK_AFTER, MessageSize, Window
from pcgroups.ops import InstanceMetrics
from tests.helpers.groups import one_partition_group, publish

from .helpers.support import wait_for

WINDOW = ConsumerConfig(max_ack_pending=2000, ack_wait=2)
TAKEOVER_LOGGED = "unacked message(s) of the earlier holder"  # what PullSession._take_over logs when it waited


async def test_per_key_order_and_exclusivity_with_random_work(nc, js, uniq):
    await one_partition_group(js, nc, uniq)
    rng = random.Random(7)
    keys = [f"k{rng.randrange(20)}" for _ in range(600)]
    running: dict[str, int] = {}
    overlaps = []
    done: dict[str, list[int]] = {}
    peak = [0]

    async def handler(msg):
        k = msg.subject
        if running.get(k):
            overlaps.append(k)
        running[k] = 1
        peak[0] = max(peak[0], sum(running.values()))
        await asyncio.sleep(rng.random() * 0.01)
        running[k] = 0
        done.setdefault(k, []).append(int(msg.data))
        await msg.ack()

    inst = await static_consume(nc, uniq, "g", "m", handler, config=WINDOW, concurrency=8)
    try:
        await publish(js, uniq, keys)
        await wait_for(lambda: sum(map(len, done.values())) == len(keys), 30, what="all processed")
    finally:
        await inst.stop()
    assert overlaps == []
    for k, seqs in done.items():
        assert seqs == sorted(seqs), f"key {k} out of order"
        assert seqs == [i for i, kk in enumerate(keys) if kk == k]
    assert 2 <= peak[0] <= 8


@pytest.mark.parametrize("config", [None, WINDOW], ids=["fair-by-default", "window-2000"])
async def test_a_burst_on_one_key_does_not_delay_other_keys(nc, js, uniq, config):
    """A burst on one key far past the base window (4 per slot): the window grows until other keys' messages
    come in (default: up to 16384), so they are handled while the burst is still at its start, not after it."""
    await one_partition_group(js, nc, uniq)
    burst = 1500
    a_done = [0]
    others_done_at: dict[str, int] = {}  # how many of the burst were done when each other key was handled

    async def handler(msg):
        await asyncio.sleep(0.01)
        if msg.subject == "A":
            a_done[0] += 1
        else:
            others_done_at[msg.subject] = a_done[0]
        await msg.ack()

    await publish(js, uniq, ["A"] * burst + [f"o{i}" for i in range(40)])
    inst = await static_consume(nc, uniq, "g", "m", handler, config=config, concurrency=8)
    try:
        await wait_for(lambda: len(others_done_at) == 40, 30, what="every other key handled")
    finally:
        await inst.stop()
    # in partition order none would come before the whole burst; the burst's key runs one at a time (10 ms each)
    assert max(others_done_at.values()) < burst // 3, sorted(others_done_at.values())


async def test_a_burst_of_large_messages_is_held_within_a_byte_budget(nats_server, nc, js, uniq):
    """256 KB messages, a burst on one key past what WINDOW_BYTES holds: the instance holds (and the server
    has delivered unacked) no more than WINDOW_BYTES of them, its pulls stay under the 64 MiB the server
    lets wait for one client (no slow-consumer disconnect), and other keys still come before the burst ends."""
    await one_partition_group(js, nc, uniq)
    size, burst = 256 * 1024, 320
    body = b"x" * size
    await publish(js, uniq, ["A"] * burst + [f"o{i}" for i in range(10)], body=body)
    disconnects = []

    async def disconnected():
        disconnects.append(time.monotonic())

    conn = await nats.connect(nats_server.url, disconnected_cb=disconnected, max_reconnect_attempts=-1)
    a_done, others_done_at, peak = [0], {}, [0]

    async def handler(msg):
        await asyncio.sleep(0.005)
        if msg.subject == "A":
            a_done[0] += 1
        else:
            others_done_at[msg.subject] = a_done[0]
        await msg.ack()

    inst = await static_consume(conn, uniq, "g", "m", handler, concurrency=8)
    try:

        async def sample() -> bool:
            info = await js.consumer_info(uniq, "g-m")
            peak[0] = max(peak[0], info.num_ack_pending)
            return a_done[0] == burst and len(others_done_at) == 10

        await wait_for(sample, 60, interval=0.05, what="the burst and the other keys handled")
        assert disconnects == []  # (closing the connection at the end counts as one)
    finally:
        await inst.stop()
        await conn.close()
    assert peak[0] <= WINDOW_BYTES // size, peak
    assert max(others_done_at.values()) < burst // 2, sorted(others_done_at.values())


def test_message_size_bounds_counts_by_bytes():
    """scheduler.MessageSize (pure): no bound before a message is seen, then as many as the budget holds at
    the running average (one at least); the window's room follows it."""
    sizes = MessageSize()
    assert sizes.fit(500, PULL_BYTES) == 500
    sizes.saw(1024 * 1024)
    assert sizes.fit(500, PULL_BYTES) == PULL_BYTES // (1024 * 1024) and sizes.fit(500, 10) == 1
    w = Window(32, 16384, sizes)
    w.size = 16384
    assert w.room(0) == WINDOW_BYTES // (1024 * 1024) and w.room(64) == 0
    for _ in range(200):
        sizes.saw(100)
    assert sizes.fit(500, PULL_BYTES) == 500 and w.room(0) == 16384


def test_the_window_grows_while_starved_and_full_and_shrinks_back():
    """scheduler.Window (pure): doubles up to the cap while full and starved, halves back to the base after a
    quarter-full spell of WINDOW_SHRINK_AFTER, and makes room for a take-over within the cap."""
    w = Window(32, 1000)
    assert w.room(10) == 22 and w.room(40) == 0
    w.update(32, starved=False, now=0.0)
    assert w.size == 32  # full but a slot has work: no growth
    w.update(20, starved=True, now=0.0)
    assert w.size == 32  # starved but a quarter free: pull first
    for _ in range(10):
        w.update(w.size, starved=True, now=0.0)
    assert w.size == 1000  # capped
    w.update(100, starved=False, now=1.0)
    w.update(100, starved=False, now=1.0 + WINDOW_SHRINK_AFTER)
    assert w.size == 500
    for i in range(2, 20):
        w.update(0, starved=False, now=1.0 + i * WINDOW_SHRINK_AFTER)
    assert w.size == 32
    w.at_least(5000)
    assert w.size == 1000
    assert Window(64, 16).size == 16  # the cap wins over the base


def test_the_window_grows_while_hungry_up_to_a_batch_and_shrinks_once_fed():
    """scheduler.Window (pure): a pull used up with the handlers out of work doubles it up to ``reach`` (the batch),
    a quarter-free window included; a second without a hungry decision (the handlers are the bottleneck) halves it
    back to the base, which the starved rule and the take-over's room are not held to."""
    w = Window(32, 16384, reach=500)
    w.update(0, starved=False, now=0.0, hungry=True)
    assert w.size == 64
    for i in range(10):
        w.update(3, starved=False, now=0.1 * i, hungry=True)
    assert w.size == 500  # the batch, not the cap
    w.update(400, starved=False, now=1.0)
    assert w.size == 500  # fed for less than WINDOW_SHRINK_AFTER
    w.update(400, starved=True, now=0.9 + WINDOW_SHRINK_AFTER)
    assert w.size == 1000  # starved and full: the starved rule as before
    w.update(900, starved=False, now=1.0 + WINDOW_SHRINK_AFTER)
    assert w.size == 1000  # above the batch: only the quarter-full rule shrinks it
    w.size = 500
    sizes = []
    for i in range(1, 8):
        w.update(400, starved=False, now=1.0 + (i + 1) * WINDOW_SHRINK_AFTER)
        sizes.append(w.size)
    assert sizes == [250, 125, 62, 32, 32, 32, 32]
    assert Window(32, 100, reach=500).reach == 100 and Window(32, 16384, reach=8).reach == 32
    w.at_least(2000)
    w.update(1900, starved=False, now=100.0)
    assert w.size == 2000  # a take-over's room stays


async def test_failed_handler_retries_in_place_and_keeps_key_order(nc, js, uniq):
    await one_partition_group(js, nc, uniq)
    order: dict[str, list[int]] = {}
    failures = {"A": 2}

    async def handler(msg):
        n = int(msg.data)
        if msg.subject == "A" and n == 0 and failures["A"] > 0:
            failures["A"] -= 1
            raise RuntimeError("transient")
        if msg.subject == "B" and n == 1 and not order.get("B-naked"):
            order["B-naked"] = [1]
            await msg.nak()
            return
        order.setdefault(msg.subject, []).append(n)
        await msg.ack()

    inst = await static_consume(
        nc, uniq, "g", "m", handler, config=WINDOW, concurrency=4, retry=RetryPolicy(max_deliver=10, backoff=0.05)
    )
    try:
        await publish(js, uniq, ["A", "B", "A", "B", "A", "B"])
        await wait_for(lambda: len(order.get("A", [])) == 3 and len(order.get("B", [])) == 3, 10, what="6 acks")
    finally:
        await inst.stop()
    assert order["A"] == [0, 2, 4]
    assert order["B"] == [1, 3, 5]
    assert failures["A"] == 0


async def dead_letters(js, stream: str) -> list:
    """The messages of ``stream``, in order."""
    state = (await js.stream_info(stream)).state
    return (
        [await js.get_msg(stream, seq) for seq in range(state.first_seq, state.last_seq + 1)] if state.messages else []
    )


async def test_poison_message_is_dead_lettered_and_its_key_moves_on(nc, js, uniq):
    await one_partition_group(js, nc, uniq)
    await js.add_stream(StreamConfig(name=f"{uniq}-dlq", subjects=[f"dlq.{uniq}"]))
    ok: list[int] = []

    async def handler(msg):
        if int(msg.data) == 0:
            raise ValueError("poison")
        ok.append(int(msg.data))
        await msg.ack()

    inst = await static_consume(
        nc,
        uniq,
        "g",
        "m",
        handler,
        config=WINDOW,
        concurrency=2,
        retry=RetryPolicy(max_deliver=3, backoff=0.02, dead_letter_subject=f"dlq.{uniq}"),
    )
    try:
        await js.publish(f"{uniq}.P", b"0", headers={"X-Test": "yes", "Nats-Msg-Id": f"{uniq}-0"})
        await js.publish(f"{uniq}.P", b"1")
        await js.publish(f"{uniq}.P", b"2")
        await wait_for(lambda: len(ok) == 2, 10, what="the rest of the key")
    finally:
        await inst.stop()
    [msg] = await dead_letters(js, f"{uniq}-dlq")
    assert msg.data == b"0"
    assert msg.headers["X-Test"] == "yes"
    assert msg.headers["Pcg-Orig-Nats-Msg-Id"] == f"{uniq}-0" and "Nats-Msg-Id" not in msg.headers
    assert "poison" in msg.headers["Pcg-Dead-Reason"]
    assert msg.headers["Pcg-Deliveries"] == "3"
    assert msg.headers["Pcg-Subject"] == "P"

    async def all_settled():  # the server applies acks asynchronously: poll, do not race it
        info = await js.consumer_info(uniq, "g-m")
        return info.num_ack_pending == 0 and info.num_pending == 0

    await wait_for(all_settled, 5, what="the acks and the +TERM applied")


async def test_an_elastic_groups_dead_letter_is_stored_without_the_source_header(nc, js, uniq):
    """A work-queue message carries Nats-Stream-Source, which JetStream refuses on a publish (err 10227): the
    dead letter keeps it as Pcg-Orig-Nats-Stream-Source, and is stored."""
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.>"]))
    await js.add_stream(StreamConfig(name=f"{uniq}-dlq", subjects=[f"dlq.{uniq}"]))
    await create_elastic(nc, uniq, "g", 1, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])
    await add_members(nc, uniq, "g", ["m"])
    ok: list[bytes] = []

    async def handler(msg):
        if msg.data.startswith(b"poison"):
            raise ValueError("poison")
        ok.append(msg.data)
        await msg.ack()

    inst = await elastic_consume(
        nc,
        uniq,
        "g",
        "m",
        handler,
        config=WINDOW,
        concurrency=2,
        retry=RetryPolicy(max_deliver=2, backoff=0.02, dead_letter_subject=f"dlq.{uniq}"),
    )
    try:
        for i in range(3):
            await js.publish(f"{uniq}.k", b"poison %d" % i)
        await js.publish(f"{uniq}.k", b"fine")
        await wait_for(lambda: ok == [b"fine"], 10, what="the key moves on past the three")
    finally:
        await inst.stop()
    letters = await dead_letters(js, f"{uniq}-dlq")
    assert [m.data for m in letters] == [b"poison 0", b"poison 1", b"poison 2"]
    for m in letters:
        assert "Nats-Stream-Source" not in m.headers
        assert m.headers["Pcg-Orig-Nats-Stream-Source"].startswith(uniq)
        assert m.headers["Pcg-Stream"] == f"{uniq}-g" and m.headers["Pcg-Subject"] == f"{uniq}.k"


async def test_a_refused_dead_letter_holds_its_message_and_key_until_a_stream_takes_it(nc, js, uniq, caplog):
    """No stream on the dead-letter subject, then a full one (discard new): each refusal is an error line naming
    the subject and the reason, and a dead-letter-refused event; the message is not terminated and its key
    waits. Once the stream has room the dead letter is stored, then the message terminated."""
    await one_partition_group(js, nc, uniq)
    dlq = f"dlq.{uniq}"
    events: list = []
    metrics = InstanceMetrics("static", uniq, "g", "m")
    ok: list[int] = []

    def on_event(ev):
        events.append(ev)
        metrics.on_event(ev)

    def refusals(fragment: str) -> list:
        return [e for e in events if e.kind == "dead-letter-refused" and fragment in e.detail]

    async def handler(msg):
        if int(msg.data) == 0:
            raise ValueError("poison")
        ok.append(int(msg.data))
        await msg.ack()

    inst = await static_consume(
        nc,
        uniq,
        "g",
        "m",
        handler,
        config=WINDOW,
        concurrency=2,
        on_event=on_event,
        retry=RetryPolicy(max_deliver=2, backoff=0.02, max_backoff=0.2, dead_letter_subject=dlq),
    )
    try:
        await publish(js, uniq, ["P", "P", "Q"])
        await wait_for(
            lambda: ok == [2] and len(refusals("no stream takes the subject")) >= 2,
            10,
            what="two refusals without a stream, the other key handled",
        )
        assert f"message 1 (P) to {dlq}" in refusals("no stream")[0].detail
        lines = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert any(f"not dead-lettered: {dlq} refused it: no stream takes the subject" in line for line in lines)

        await js.add_stream(StreamConfig(name=f"{uniq}-dlq", subjects=[dlq], max_msgs=1, discard=DiscardPolicy.NEW))
        await js.publish(dlq, b"earlier")
        await wait_for(lambda: len(refusals("maximum messages exceeded")) >= 2, 10, what="refused by a full stream")
        info = await js.consumer_info(uniq, "g-m")
        assert ok == [2] and info.num_ack_pending == 2  # held: not terminated, and P's next message waits
        get = metrics.registry.get_sample_value
        labels = {"flavour": "static", "stream": uniq, "group": "g", "member": "m"}
        assert get("pcgroups_instance_dead_letters_refused_total", labels) == len(refusals(""))

        await js.purge_stream(f"{uniq}-dlq")
        await wait_for(lambda: ok == [2, 1], 10, what="the dead letter stored, the key moves on")
    finally:
        await inst.stop()
    [letter] = await dead_letters(js, f"{uniq}-dlq")
    assert letter.data == b"0" and letter.headers["Pcg-Stream-Seq"] == "1"

    async def all_settled():
        info = await js.consumer_info(uniq, "g-m")
        return info.num_ack_pending == 0 and info.num_pending == 0

    await wait_for(all_settled, 5, what="the +TERM applied")


async def test_a_fresh_pin_does_not_wait(nc, js, uniq, caplog):
    """Taking a pin with nothing of an earlier owner outstanding (start-up over a backlog, then a
    step-down after everything was acked) waits for nothing: each message is delivered once."""
    caplog.set_level(logging.INFO, logger="pcgroups")
    await one_partition_group(js, nc, uniq)
    keys = [f"k{i % 25}" for i in range(500)]
    await publish(js, uniq, keys)  # a backlog before any instance pulls
    done: dict[str, list[int]] = {}
    deliveries: list[int] = []
    pins: list[str] = []

    async def handler(msg):
        deliveries.append(msg.metadata.num_delivered)
        pins.append(msg.pin_id)
        await asyncio.sleep(0.001)
        done.setdefault(msg.subject, []).append(int(msg.data))
        await msg.ack()

    a = await static_consume(nc, uniq, "g", "m", handler, config=WINDOW, concurrency=8)
    b = await static_consume(nc, uniq, "g", "m", handler, config=WINDOW, concurrency=8)
    try:
        await wait_for(lambda: len(deliveries) == len(keys), 20, what="the backlog processed")
        first_pins = set(pins)
        await static_member_step_down(nc, uniq, "g", "m")
        more = [f"k{i % 25}" for i in range(len(keys), len(keys) + 200)]
        await publish(js, uniq, more, start=len(keys))
        keys += more
        await wait_for(lambda: len(deliveries) == len(keys), 20, what="the rest processed")
    finally:
        await a.stop()
        await b.stop()
    assert len(first_pins) == 1 and not set(pins[-len(more) :]) & first_pins, "the step-down moved the pin"
    waits = [r.getMessage() for r in caplog.records if TAKEOVER_LOGGED in r.getMessage()]
    assert waits == [], waits
    assert deliveries == [1] * len(keys)
    for k, got in done.items():
        assert got == [i for i, kk in enumerate(keys) if kk == k], f"key {k} out of order"


async def test_stop_starts_no_new_handler_with_key_concurrency(nc, js, uniq):
    """stop() with K handlers running: they finish (acked), and no task chains into a next key."""
    await one_partition_group(js, nc, uniq)
    await publish(js, uniq, [f"k{i % 10}" for i in range(400)])
    runs: list[list] = []  # [start, end or None]

    async def handler(msg):
        run = [time.monotonic(), None]
        runs.append(run)
        await asyncio.sleep(0.02)
        await msg.ack()
        run[1] = time.monotonic()

    inst = await static_consume(nc, uniq, "g", "m", handler, config=WINDOW, concurrency=4)
    try:
        await wait_for(lambda: sum(r[1] is not None for r in runs) >= 20, 10, what="processing")
        t = time.monotonic()
        await asyncio.wait_for(inst.stop(), 5)
        took = time.monotonic() - t
    finally:
        await asyncio.wait_for(inst.stop(), 5)
    assert [r for r in runs if r[1] is None] == [], "a handler was cancelled mid-run"
    started_after = [r for r in runs if r[0] > t]
    assert not started_after and took < 0.5, f"{len(started_after)} handlers started after stop(); took {took:.2f}s"


async def test_a_copy_redelivered_while_it_waited_is_not_handled_again(nc, js, uniq):
    """Without +WPI a message waiting behind its key's slow handler is redelivered after AckWait; the
    copy queues behind it and, once the first copy is acked, is acked again but not handled again."""
    await one_partition_group(js, nc, uniq)
    handled: list[int] = []
    deliveries: list[int] = []

    async def handler(msg):
        deliveries.append(msg.metadata.num_delivered)
        if int(msg.data) == 0:
            await asyncio.sleep(1.5)  # past AckWait, and no in_progress()
        handled.append(int(msg.data))
        await msg.ack()

    inst = await static_consume(
        nc,
        uniq,
        "g",
        "m",
        handler,
        config=ConsumerConfig(max_ack_pending=100, ack_wait=1),
        concurrency=2,
        auto_in_progress=False,
    )
    try:
        await publish(js, uniq, ["A", "A"])

        async def settled():
            info = await js.consumer_info(uniq, "g-m")
            return (
                info.num_ack_pending == 0
                and info.delivered.consumer_seq >= 3  # a copy came, all acked
                and not inst.session.busy
            )

        await wait_for(settled, 10, what=f"the copy settled (handled {handled})")
    finally:
        await inst.stop()
    assert handled == [0, 1] and deliveries == [1, 1], (handled, deliveries)


def _spawn(url, stream, *extra, stderr=None):
    import os
    import subprocess
    import sys

    return subprocess.Popen(
        [sys.executable, "-m", "tests.member_proc", url, "static", stream, "g", "m", *extra],
        stdout=subprocess.PIPE,
        stderr=stderr if stderr is not None else subprocess.DEVNULL,
        text=True,
        cwd=os.path.dirname(os.path.dirname(__file__)),
    )


async def test_sigkill_in_a_burst_keeps_per_key_order_after_the_take_over(nc, js, uniq, nats_server, tmp_path):
    """The survivor takes the pin with the victim's messages unacked: it waits until they come to it (their
    AckWait ran out; the victim, pinned on a fresh consumer, did not wait) and every key keeps its order."""
    import signal

    await one_partition_group(js, nc, uniq)
    args = ("--concurrency", "4", "--max-ack-pending", "500", "--work", "0.02", "--ack-wait", "1")
    async with _member_procs(nats_server.url, uniq, args, tmp_path) as (procs, events):
        keys = [f"k{i % 10}" for i in range(400)]
        await publish(js, uniq, keys)
        await wait_for(lambda: sum(e["ev"] == "end" for ev in events for e in ev) >= 60, 20, what="a burst under way")
        victim = 0 if any(e["ev"] == "end" for e in events[0]) else 1
        procs[victim].send_signal(signal.SIGKILL)
        want = set(range(len(keys)))
        try:
            await wait_for(
                lambda: _processed(js, uniq, events, victim, len(keys)),
                40,
                what="every message processed after the take-over",
            )
        except AssertionError:
            got = {int(e["seq"]) - 1 for ev in events for e in ev if e["ev"] == "end"}
            info = await js.consumer_info(uniq, "g-m")
            print(
                "missing",
                sorted(want - got)[:20],
                len(want - got),
                "victim",
                victim,
                [len(ev) for ev in events],
                info.num_ack_pending,
                info.num_pending,
                info.ack_floor,
                info.delivered,
                events[1 - victim][-3:],
            )
            for i, ev in enumerate(events):
                print("proc", i, [e for e in ev if e.get("seq", 0) - 1 in want - got])
            for i in range(2):
                print("log", i, (tmp_path / f"proc{i}.log").read_text()[-3000:])
            raise
        survivor = [e for e in events[1 - victim] if e["ev"] == "end"]
        per_key: dict[str, list[int]] = {}
        for e in survivor:
            per_key.setdefault(e["subject"], []).append(e["seq"])
        for k, seqs in per_key.items():
            assert seqs == sorted(seqs), f"survivor processed key {k} out of order: {seqs}"
        # every key's first successes, across both instances, follow stream order
        first: dict[int, float] = {}
        for ev in events:
            for e in ev:
                if e["ev"] == "end":
                    first[e["seq"]] = min(first.get(e["seq"], e["t"]), e["t"])
        for k in set(keys):
            seqs = [s for s in sorted(first, key=first.get) if keys[s - 1] == k]
            assert seqs == sorted(seqs), f"key {k}: first successes out of order"
        # (a fresh pin waiting for nothing is test_a_fresh_pin_does_not_wait's: here the pin may move once between
        # the two at the start, under load)
        waits = (tmp_path / f"proc{1 - victim}.log").read_text().count(TAKEOVER_LOGGED)
        assert waits >= 1, "the take-over with unacked messages waits for them"


@contextlib.asynccontextmanager
async def _member_procs(url: str, stream: str, args: tuple[str, ...], tmp_path, n: int = 2):
    """``n`` instances of member m (tests.member_proc ``args``), ready; yields the processes and their JSON lines as
    they come (a list each); stderr goes to ``tmp_path/proc<i>.log``. Every process ends with the block."""
    import json
    import subprocess

    procs = []
    for i in range(n):
        with open(tmp_path / f"proc{i}.log", "w") as log:  # the process has its own copy
            procs.append(_spawn(url, stream, *args, stderr=log))
    events: list[list[dict]] = [[] for _ in range(n)]
    loop = asyncio.get_running_loop()

    async def read(proc, sink):
        while True:
            line = await loop.run_in_executor(None, proc.stdout.readline)
            if not line:
                return
            sink.append(json.loads(line))

    readers = [asyncio.ensure_future(read(p, e)) for p, e in zip(procs, events, strict=False)]
    try:
        await wait_for(lambda: all(any(e["ev"] == "ready" for e in ev) for ev in events), 20, what="ready")
        yield procs, events
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        for r in readers:
            await asyncio.wait_for(r, 5)


async def _processed(js, stream: str, events: list[list[dict]], victim: int, count: int) -> bool:
    """Every one of the ``count`` messages ended at one instance or another. The victim may have been killed after
    its ack reached the server but before it printed "end" (up to K messages, started by it and never
    redelivered): those count once the consumer says nothing is pending."""
    want = set(range(1, count + 1))
    ended = {int(e["seq"]) for ev in events for e in ev if e["ev"] == "end"}
    if ended >= want:
        return True
    if not want - ended <= {int(e["seq"]) for e in events[victim] if e["ev"] == "start"}:
        return False
    info = await js.consumer_info(stream, "g-m")
    return info.num_ack_pending == 0 and info.num_pending == 0


def _per_key_in_order(events: list[dict]) -> dict[str, list[int]]:
    """The keys whose messages ended out of stream order in ``events`` (one instance's lines), with their order."""
    per_key: dict[str, list[int]] = {}
    for e in events:
        if e["ev"] == "end":
            per_key.setdefault(e["subject"], []).append(e["seq"])
    return {k: seqs for k, seqs in per_key.items() if seqs != sorted(seqs)}


async def test_a_take_over_behind_new_traffic_ends_when_the_earlier_holders_messages_are_here(
    nc, js, uniq, nats_server, tmp_path
):
    """Messages published after the pinned instance died fill the survivor's first pulls, and the victim's messages
    come back afterwards, a few at a time, as their AckWait runs out. The take-over pulls for them as they come (not
    one per keep-alive pull), so it ends once they are all here, well before its deadline, and keys keep their
    order."""
    import signal

    await one_partition_group(js, nc, uniq)
    args = ("--concurrency", "4", "--max-ack-pending", "0", "--work", "0.005", "--ack-wait", "3", "--ack", "plain")
    async with _member_procs(nats_server.url, uniq, args, tmp_path) as (procs, events):
        burst = 600
        await publish(js, uniq, ["A"] * burst)
        await wait_for(lambda: sum(e["ev"] == "end" for ev in events for e in ev) >= 50, 20, what="the burst under way")
        victim = 0 if any(e["ev"] == "end" for e in events[0]) else 1
        procs[victim].send_signal(signal.SIGKILL)
        sent, until = 0, time.monotonic() + 4.0  # past PinnedTTL (3 s): the pin moves while traffic comes
        while time.monotonic() < until:
            await js.publish(f"{uniq}.o{sent % 20}", b"x")
            sent += 1
            await asyncio.sleep(0.005)
        await wait_for(
            lambda: _processed(js, uniq, events, victim, burst + sent),
            30,
            what="every message processed after the take-over",
        )
    log = (tmp_path / f"proc{1 - victim}.log").read_text()
    assert TAKEOVER_LOGGED in log and "anyway" not in log, log[-2000:]
    assert _per_key_in_order(events[1 - victim]) == {}
