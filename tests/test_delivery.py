"""Server-free unit tests of the consume loop's pure logic: the Delivery bridge's rules
(pcgroups/delivery.py) and the two dispatchers (pcgroups/scheduler.py) driven by hand-made messages.

Acks go to a recording publisher callable (no NATS server is faked: nothing here subscribes or
pulls). The pull loop, pins given by a real server, RESETs and redeliveries are covered by the server
suites (test_static, test_scheduler, test_elastic, test_chaos)."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from typing import Any

import pytest
from nats.aio.msg import Msg as NatsMsg

from pcgroups.consume._delivery import Delivery, RecentAcks
from pcgroups.consume._dispatchers import KeyedDispatcher, SerialDispatcher
from pcgroups.consume._keys import key_by_subject
from pcgroups.consume._msg import PIN_HEADER, Msg
from pcgroups.consume._retry import RetryPolicy
from pcgroups.errors import SupersededError

from .helpers.support import wait_for

PIN = "pin-a"


class Wire:
    """Records what a Delivery sends on ack subjects (a publisher and a request callable)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, body: bytes) -> None:
        self.sent.append((subject, body))

    async def request(self, subject: str, body: bytes, timeout: float) -> None:
        self.sent.append((subject, body))

    def bodies(self, seq: int) -> list[bytes]:
        """What was sent for stream sequence ``seq``."""
        return [b for s, b in self.sent if s.split(".")[5] == str(seq)]


def delivery(wire: Wire, *, margin: float = 60.0) -> Delivery:
    d = Delivery(wire.publish, wire.request, pin_margin=margin)
    d.pin_given(PIN, time.monotonic())
    return d


def raw(
    seq: int, subject: str = "0.orders.k1", *, deliveries: int = 1, cseq: int | None = None, pin: str | None = PIN
) -> NatsMsg:
    reply = f"$JS.ACK.S.C.{deliveries}.{seq}.{seq if cseq is None else cseq}.1700000000000000000.0"
    return NatsMsg(
        _client=None,
        subject=subject,
        reply=reply,
        data=str(seq).encode(),  # type: ignore[arg-type]
        headers={PIN_HEADER: pin} if pin else None,
    )


def msg(d: Delivery, dispatcher: Any, seq: int, subject: str = "0.orders.k1", **kw: Any) -> Msg:
    pin = kw.get("pin", PIN)
    return Msg(raw(seq, subject, **kw), d, dispatcher, pin)


async def running(coro: Any) -> asyncio.Task[None]:
    task = asyncio.create_task(coro)
    await asyncio.sleep(0)
    return task


async def turns(n: int = 20) -> None:
    """Let every ready task run a few times (to show that something does NOT happen; no clock involved)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def stopped(d: Delivery, task: asyncio.Task[None]) -> None:
    d.close()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# --- Msg -----------------------------------------------------------------------------------


async def test_msg_reads_its_numbers_from_the_ack_subject_and_strips_the_partition():
    d = delivery(Wire())
    m = msg(d, None, 10, "3.orders.k1", deliveries=2, cseq=5)
    assert (m.deliveries, m.stream_sequence, m.consumer_sequence, m.sequence) == (2, 10, 5, 10)
    assert (m.subject, m.partition, m.partitioned_subject, m.pin_id) == ("orders.k1", 3, "3.orders.k1", PIN)
    assert m.metadata.num_delivered == 2


async def test_acks_go_to_the_ack_subject_and_only_an_ack_is_remembered():
    wire = Wire()
    d = delivery(wire)
    a, b, c = (msg(d, None, seq) for seq in (1, 2, 3))
    await a.in_progress()
    assert not a.settled
    await a.ack()
    await b.term("bad")
    await c.ack_sync()
    assert a.settled and b.settled
    assert wire.bodies(1) == [b"+WPI", b"+ACK"] and wire.bodies(2) == [b"+TERM bad"] and wire.bodies(3) == [b"+ACK"]
    assert d.last_acked() == 3
    d2 = delivery(Wire())
    await msg(d2, None, 2).term()
    assert d2.last_acked() is None


async def test_an_ack_from_a_sync_handlers_thread_blocks_until_sent():
    wire = Wire()
    d = delivery(wire)
    m = msg(d, None, 7)
    await asyncio.to_thread(m.ack)  # a worker thread: ack() returns once the loop has sent it
    assert wire.bodies(7) == [b"+ACK"] and m.settled


def test_recent_acks_remember_only_the_last_ones():
    acks = RecentAcks(3)
    for seq in (1, 2, 2, 3, 4):
        acks.add(seq)
    assert 1 not in acks and all(s in acks for s in (2, 3, 4)) and len(acks) == 3


# --- Delivery: the rules ---------------------------------------------------------------------


async def test_a_message_of_another_pin_is_never_handed_out_but_nakd():
    wire = Wire()
    d = delivery(wire)
    assert await d.deliver(msg(d, None, 1, pin="old"))
    assert await d.deliver(msg(d, None, 2))
    assert await d.take() is None
    assert wire.bodies(1) == [b"-NAK"]
    m = await d.take()
    assert m is not None and m.stream_sequence == 2
    assert await d.take() is None and d.buffered == 0
    # the one-at-a-time dispatcher's take: the message of another pin comes back to be nak'd, nothing sent yet
    assert await d.deliver(msg(d, None, 3, pin="old"))
    assert await d.deliver(msg(d, None, 4))
    none, other = d.take_nowait()
    assert none is None and other is not None and other.stream_sequence == 3 and wire.bodies(3) == []
    assert [x.stream_sequence if x else None for x in d.take_nowait()] == [4, None]


async def test_take_ready_hands_out_at_once_what_take_would_one_by_one():
    """The keyed dispatcher's take: every buffered message of the current pin, epoch and partitions in order, and
    those of another pin to nak (invariant 2, sent by the caller); the rest dropped; nothing during a take-over."""
    wire = Wire()
    d = delivery(wire)
    d.partitions = {0}
    for seq, subject, pin in ((1, "0.a", "old"), (2, "0.a", PIN), (3, "1.a", PIN), (4, "0.b", PIN)):
        assert await d.deliver(msg(d, None, seq, subject, pin=pin))
    ready, naks = d.take_ready()
    assert [m.stream_sequence for m in ready] == [2, 4] and [m.stream_sequence for m in naks] == [1]
    assert d.buffered == 0 and wire.sent == []
    assert await d.deliver(msg(d, None, 5, cseq=5)) and await d.deliver(msg(d, None, 6, cseq=1))  # a RESET
    assert [m.stream_sequence for m in d.take_ready()[0]] == [6]
    d.guarded = True
    d.pin_given("pin-b", time.monotonic())
    assert await d.deliver(msg(d, None, 7, cseq=2, pin="pin-b"))
    assert d.take_ready() == ([], []) and d.buffered == 1
    d.taken_over("pin-b")
    assert [m.stream_sequence for m in d.take_ready()[0]] == [7]


async def test_a_redelivery_of_an_acked_message_is_acked_again_never_handled():
    wire = Wire()
    d = delivery(wire)
    await msg(d, None, 5).ack()
    # arrives again after AckWait (the ack was lost): acked again, not buffered
    assert not await d.deliver(msg(d, None, 5, deliveries=2))
    assert d.buffered == 0 and wire.bodies(5) == [b"+ACK", b"+ACK"]
    # the pull side's receive() sends nothing itself: None tells it to ack again
    assert d.receive(msg(d, None, 5, deliveries=3)) is None and d.buffered == 0 and len(wire.bodies(5)) == 2
    # a first delivery of the same sequence (after a RESET) is handled: dedup is for redeliveries only
    assert await d.deliver(msg(d, None, 5))
    # redelivered while it waited, and acked meanwhile: skipped just before its handler would start
    waiting = msg(d, None, 6, deliveries=2)
    assert await d.deliver(waiting)
    await msg(d, None, 6).ack()
    assert await d.skip_acked(waiting) and wire.bodies(6) == [b"+ACK", b"+ACK"]
    assert not await d.skip_acked(msg(d, None, 8, deliveries=2))


async def test_after_expect_reset_only_the_resets_deliveries_are_buffered():
    d = delivery(Wire())
    await d.deliver(msg(d, None, 1))
    d.expect_reset()
    assert d.buffered == 0
    assert not await d.deliver(msg(d, None, 2, cseq=7))  # sent before the RESET
    assert await d.deliver(msg(d, None, 1, cseq=1))  # the RESET's first delivery
    assert await d.deliver(msg(d, None, 2, cseq=2))
    assert d.buffered == 2
    d.expect_reset()
    d.reset_failed()
    assert await d.deliver(msg(d, None, 3, cseq=3))


async def test_messages_of_partitions_given_up_are_not_handed_out():
    d = delivery(Wire())
    d.partitions = {1}
    await d.deliver(msg(d, None, 1, "0.a"))
    await d.deliver(msg(d, None, 2, "1.a"))
    assert await d.take() is None
    m = await d.take()
    assert m is not None and m.partition == 1


async def test_hold_release_halt_close():
    d = delivery(Wire())
    assert d.may_start()
    d.hold()
    assert not d.may_start()
    d.release()
    assert d.may_start()
    d.halt()
    d.release()  # a reset_and_resume after stop() does not undo it
    assert not d.may_start()
    d2 = delivery(Wire())
    d2.close()
    assert not d2.may_start() and d2.closed


async def test_the_pin_is_in_doubt_after_a_gap_in_the_pulls_until_confirmed():
    d = Delivery(Wire().publish, Wire().request, pin_margin=1.0)
    assert not d.pin_doubtful()  # no pin, no doubt
    long_ago = time.monotonic() - 5
    d.pin_given(PIN, long_ago)
    d.pulled(long_ago)
    assert d.pin_doubtful() and not d.may_start() and d.superseded(PIN)
    d.pulled(time.monotonic())  # the first pull after the gap does not end the doubt
    assert d.pin_doubtful() and not d.may_start()
    d.pin_confirmed(time.monotonic())  # consumer info still shows the pin
    assert not d.pin_doubtful() and d.may_start() and not d.superseded(PIN)
    assert d.superseded("other") and d.last_pull > long_ago
    d.pin_given(PIN, long_ago)
    d.pin_given("pin-b", time.monotonic())  # a delivery with a new pin: the server just gave it
    assert not d.pin_doubtful() and not d.superseded("pin-b")
    d.forget_pin()  # 423
    assert d.pin_id is None and not d.pin_doubtful()


async def test_a_lost_pins_messages_keep_wpi_and_are_not_superseded_for_the_grace():
    """Invariant 8: the new holder waits for the lost pin's calls (invariant 7), so for ``grace`` after the loss
    they may still ack; then their AckWait may run out and they are superseded."""
    d = Delivery(Wire().publish, Wire().request, pin_margin=60.0, grace=0.2)
    d.pin_given(PIN, time.monotonic())
    m = msg(d, None, 1)
    assert d.extend(m, time.monotonic()) and not m.superseded
    d.forget_pin()  # 423: a step-down
    assert d.extend(m, time.monotonic()) and not m.superseded and not d.current(m)
    await wait_for(lambda: m.superseded, 2, what="the grace ran out")
    assert not d.extend(m, time.monotonic())
    d.pin_given("pin-b", time.monotonic())  # ours again, with another pin
    n = msg(d, None, 2, pin="pin-b")
    assert d.extend(n, time.monotonic()) and not n.superseded and m.superseded
    d.pin_given("pin-c", time.monotonic())  # replaced without a 423: the same grace for n
    assert d.extend(n, time.monotonic()) and not n.superseded
    paused = Delivery(Wire().publish, Wire().request, pin_margin=1.0, grace=60.0)
    long_ago = time.monotonic() - 5
    paused.pin_given(PIN, long_ago)
    paused.pulled(long_ago)
    p = msg(paused, None, 3)
    paused.forget_pin()  # lost while in doubt (a pause): no grace
    assert p.superseded and not paused.extend(p, time.monotonic())


async def test_a_guarded_take_over_hands_out_nothing_then_the_buffer_in_stream_order_once_each():
    """Invariant 7: a new pin waits for taken_over(); then the buffer is in stream order, one copy per stream
    sequence (the last delivered), and what another pin brought is left out."""
    wire = Wire()
    d = Delivery(wire.publish, wire.request, pin_margin=60.0)
    d.guarded = True
    d.pin_given(PIN, time.monotonic())
    assert d.taking_over and not d.may_start()
    for seq, deliveries in ((7, 1), (8, 1), (3, 2), (5, 2), (3, 3)):  # naks of the earlier holder come late
        await d.deliver(msg(d, None, seq, deliveries=deliveries, cseq=10 + seq + deliveries))
    assert d.own_pending() == 4 and await d.take() is None and d.buffered == 5
    assert d.own_pending(upto=17) == 2  # as of a consumer info that had delivered up to consumer sequence 17
    d.taken_over("pin-other")  # not the current pin: nothing changes
    assert d.taking_over
    d.taken_over(PIN)
    assert not d.taking_over and d.may_start()
    taken = [await d.take() for _ in range(d.buffered)]
    assert [(m.stream_sequence, m.deliveries) for m in taken if m] == [(3, 3), (5, 2), (7, 1), (8, 1)]
    d.forget_pin()
    d.pin_given("pin-b", time.monotonic())  # every new pin is a take-over
    assert d.taking_over
    d.guarded = False
    d.pin_given("pin-c", time.monotonic())
    assert not d.taking_over and d.may_start()


async def test_a_take_over_counts_as_its_own_only_what_was_delivered_before_the_consumer_info_it_compares_with():
    """Invariant 7 compares the consumer's num_ack_pending with what was delivered here. Messages delivered after
    the server took that count (consumer sequences above its ``delivered``) are not in it: counted as ours, they
    would stand in for an earlier holder's messages still to come, and a key's newer message would start first."""
    d = delivery(Wire())
    d.guarded = True
    d.pin_given(PIN, time.monotonic())
    for seq, cseq in ((3, 11), (4, 12)):  # the earlier holder's, redelivered here
        await d.deliver(msg(d, None, seq, deliveries=2, cseq=cseq))
    # consumer info: 4 pending (two still with the earlier holder), delivered up to consumer sequence 12; then
    # two new messages arrive before the answer is read
    for seq, cseq in ((9, 13), (10, 14)):
        await d.deliver(msg(d, None, seq, cseq=cseq))
    assert d.own_pending(upto=12) == 2 and d.own_pending() == 4


async def test_wait_for_work_wakes_on_a_delivery_a_release_and_a_close():
    d = delivery(Wire())
    for poke in (lambda: asyncio.ensure_future(d.deliver(msg(d, None, 1))), d.release, d.wake, d.close):
        waiter = asyncio.ensure_future(d.wait_for_work())
        await asyncio.sleep(0)
        assert not waiter.done()
        poke()
        await asyncio.wait_for(waiter, 1)


# --- the serial dispatcher -------------------------------------------------------------------


def serial(
    d: Delivery, handler: Any, fatal: list[BaseException] | None = None, *, retry: RetryPolicy | None = None
) -> SerialDispatcher:
    return SerialDispatcher(
        d,
        handler,
        Consumer(),
        key=key_by_subject,
        retry=retry or RetryPolicy(backoff=0.001),
        on_fatal=(fatal if fatal is not None else []).append,
    )


async def test_serial_dispatcher_runs_one_at_a_time_in_order():
    wire = Wire()
    d = delivery(wire)
    seen: list[int] = []
    active = [0, 0]  # now, peak

    async def handler(m: Msg) -> None:
        active[0] += 1
        active[1] = max(active)
        await asyncio.sleep(0.001)
        seen.append(m.stream_sequence)
        active[0] -= 1
        await m.ack()

    disp = serial(d, handler)
    task = await running(disp.run())
    for seq in range(1, 21):
        await d.deliver(msg(d, disp, seq))
    await wait_for(lambda: len(seen) == 20, 5, what="20 messages handled")
    assert seen == list(range(1, 21)) and active[1] == 1
    assert all(wire.bodies(s) == [b"+ACK"] for s in seen)
    await wait_for(lambda: not disp.busy and not disp.running, 1, what="idle")
    await stopped(d, task)


async def test_serial_dispatcher_starts_nothing_while_held_or_the_pin_is_in_doubt():
    d = delivery(Wire())
    seen: list[int] = []

    async def handler(m: Msg) -> None:
        seen.append(m.stream_sequence)

    disp = serial(d, handler)
    task = await running(disp.run())
    d.hold()
    await d.deliver(msg(d, disp, 1))
    await turns()
    assert seen == [] and d.buffered == 1
    d.release()
    await wait_for(lambda: seen == [1], 2, what="handled after release")
    long_ago = time.monotonic() - 120  # a SIGSTOP longer than the margin
    d.pin_given(PIN, long_ago)
    d.pulled(long_ago)
    await d.deliver(msg(d, disp, 2))
    await turns()
    assert seen == [1]
    d.pin_confirmed(time.monotonic())
    await wait_for(lambda: seen == [1, 2], 2, what="handled once the pin is confirmed")
    await stopped(d, task)


async def test_a_serial_nak_is_retried_in_place_after_its_delay_and_nothing_goes_to_the_server():
    """One at a time, ``nak(delay)`` is retried in place (the partition waits: the next message runs after it), as
    with key-level concurrency; the server gets the ack only."""
    wire = Wire()
    d = delivery(wire)
    calls: list[tuple[int, float]] = []

    async def handler(m: Msg) -> None:
        calls.append((m.stream_sequence, time.monotonic()))
        if len(calls) == 1:
            await m.nak(0.2)
            return
        await m.ack()

    disp = serial(d, handler)
    task = await running(disp.run())
    await d.deliver(msg(d, disp, 1))
    await d.deliver(msg(d, disp, 2))
    await wait_for(lambda: len(calls) == 3, 2, what="the retry and the next message")
    assert [seq for seq, _ in calls] == [1, 1, 2] and calls[1][1] - calls[0][1] >= 0.2
    assert wire.bodies(1) == [b"+ACK"] and wire.bodies(2) == [b"+ACK"]
    await stopped(d, task)


async def test_a_failing_serial_handler_is_retried_then_dead_lettered_and_the_dispatcher_goes_on():
    """A handler that always raises does not end the serial dispatcher: its message is tried max_deliver times (the
    partition waiting behind it), dead-lettered (the stream's acknowledgement first), then terminated; the next
    message runs. While it waits for a retry it is held (busy, +WPI) but not running (a stop does not wait for it)."""
    wire = Wire()
    d = delivery(wire)
    fatal: list[BaseException] = []
    calls: list[int] = []
    consumer = Consumer()

    async def handler(m: Msg) -> None:
        calls.append(m.stream_sequence)
        if m.stream_sequence == 1:
            raise ValueError("boom")
        await m.ack()

    disp = SerialDispatcher(
        d,
        handler,
        consumer,
        key=key_by_subject,
        retry=RetryPolicy(max_deliver=3, backoff=0.3, dead_letter_subject="dlq"),
        on_fatal=fatal.append,
    )
    task = await running(disp.run())
    await d.deliver(msg(d, disp, 1))
    await d.deliver(msg(d, disp, 2))
    await wait_for(lambda: calls == [1], 2, what="the first attempt")
    await wait_for(lambda: disp.busy and not disp.running, 2, what="waiting for its retry")
    assert disp.overdue(time.monotonic() + 10, 1.0)  # its +WPI goes on
    await wait_for(lambda: calls == [1, 1, 1, 2], 5, what="three attempts, then the next message")
    [(subject, data, headers)] = consumer.dead
    assert subject == "dlq" and data == b"1" and headers["Pcg-Deliveries"] == "3"
    assert headers["Pcg-Dead-Reason"] == "ValueError: boom"
    assert wire.bodies(1) == [b"+TERM ValueError: boom"] and wire.bodies(2) == [b"+ACK"]
    assert fatal == [] and not task.done()
    await stopped(d, task)


async def test_a_stop_gives_back_a_message_waiting_for_its_retry_at_once():
    wire = Wire()
    d = delivery(wire)

    async def handler(m: Msg) -> None:
        raise ValueError("boom")

    disp = serial(d, handler, retry=RetryPolicy(backoff=30))
    task = await running(disp.run())
    await d.deliver(msg(d, disp, 1))
    await wait_for(lambda: disp.busy and not disp.running, 2, what="waiting for its retry")
    d.halt()
    await wait_for(lambda: wire.bodies(1) == [b"-NAK"], 2, what="nak'd at once")
    await wait_for(lambda: not disp.busy, 2, what="given back")
    await stopped(d, task)


async def test_an_error_that_is_not_an_exception_ends_the_serial_dispatcher():
    class Leave(BaseException):
        pass

    wire = Wire()
    d = delivery(wire)
    fatal: list[BaseException] = []

    async def handler(m: Msg) -> None:
        raise Leave

    disp = serial(d, handler, fatal)
    task = await running(disp.run())
    await d.deliver(msg(d, disp, 1))
    await asyncio.wait_for(task, 2)  # the dispatcher returns: the instance ends
    assert [type(e) for e in fatal] == [Leave] and wire.bodies(1) == [b"-NAK"] and not disp.running


async def test_serial_overdue_is_the_running_message_after_the_interval():
    d = delivery(Wire())
    gate = asyncio.Event()

    async def handler(m: Msg) -> None:
        await gate.wait()

    disp = serial(d, handler)
    task = await running(disp.run())
    await d.deliver(msg(d, disp, 1))
    await wait_for(lambda: disp.running, 2, what="the handler runs")
    now = time.monotonic()
    assert disp.overdue(now, 10.0) == []
    [m] = disp.overdue(now + 10.0, 10.0)
    assert m.stream_sequence == 1 and m.started > 0
    gate.set()
    await wait_for(lambda: not disp.running, 2, what="the handler ends")
    assert disp.overdue(now + 10.0, 10.0) == [] and disp.drop_queued() == []
    await stopped(d, task)


async def test_a_sync_handler_runs_in_a_worker_thread():
    from pcgroups.consume._dispatchers import as_handle

    d = delivery(Wire())
    threads: list[int] = []

    def handler(m: Msg) -> None:
        threads.append(threading.get_ident())
        m.ack()

    disp = serial(d, as_handle(handler))
    task = await running(disp.run())
    await d.deliver(msg(d, disp, 1))
    await wait_for(lambda: d.last_acked() == 1, 2, what="acked from the worker thread")
    assert threads and threads[0] != threading.get_ident()
    await stopped(d, task)


def test_a_callable_object_is_async_when_its_call_method_is():
    from pcgroups.consume._dispatchers import as_handle

    class Async:
        async def __call__(self, m: Msg) -> None: ...

    class Sync:
        def __call__(self, m: Msg) -> None: ...

    a, s = Async(), Sync()
    assert as_handle(a) is a
    assert as_handle(s) is not s and inspect.iscoroutinefunction(as_handle(s))


# --- the keyed dispatcher --------------------------------------------------------------------


class Consumer:
    """The keyed dispatcher's view of its consumer: recorded dead letters."""

    stream, consumer, label, max_payload = "S", "C", "S/C", 1024 * 1024

    def __init__(self) -> None:
        self.dead: list[tuple[str, bytes, dict[str, str]]] = []

    async def dead_letter(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        self.dead.append((subject, data, headers))


def keyed(
    d: Delivery,
    handler: Any,
    consumer: Consumer | None = None,
    *,
    concurrency: int = 2,
    retry: RetryPolicy | None = None,
) -> KeyedDispatcher:
    return KeyedDispatcher(
        d,
        handler,
        consumer or Consumer(),
        concurrency=concurrency,
        key=key_by_subject,
        retry=retry or RetryPolicy(backoff=0.001),
    )


async def test_keyed_dispatcher_keeps_key_order_and_exclusivity_within_its_concurrency():
    d = delivery(Wire())
    active: dict[str, int] = {}
    peak = [0]
    overlaps: list[str] = []
    seen: dict[str, list[int]] = {}

    async def handler(m: Msg) -> None:
        if active.get(m.subject):
            overlaps.append(m.subject)
        active[m.subject] = 1
        peak[0] = max(peak[0], sum(active.values()))
        await asyncio.sleep(0.001 * (m.stream_sequence % 3))
        seen.setdefault(m.subject, []).append(m.stream_sequence)
        active[m.subject] = 0
        await m.ack()

    disp = keyed(d, handler, concurrency=3)
    task = await running(disp.run())
    for seq in range(1, 61):
        await d.deliver(msg(d, disp, seq, f"0.k{seq % 5}"))
        if seq % 7 == 0:
            await turns(3)  # some arrive while their key's handler runs
    await wait_for(lambda: sum(map(len, seen.values())) == 60, 5, what="60 messages handled")
    assert overlaps == [] and peak[0] == 3
    assert all(v == sorted(v) for v in seen.values()) and len(seen) == 5
    await wait_for(lambda: not disp.busy, 1, what="idle")
    await stopped(d, task)


async def test_keyed_dispatcher_runs_handlers_that_return_at_once_without_a_task_each():
    """Messages arriving a few at a time, handlers that never suspend: one task per dispatcher pass at most (its
    chain takes the other ready keys), not one per ready key; every message handled once, in order per key."""
    d = delivery(Wire())
    seen: list[int] = []
    tasks = [0]
    loop = asyncio.get_running_loop()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        tasks[0] += getattr(coro, "__qualname__", "") == "KeyedDispatcher._run_one"
        return asyncio.Task(coro, loop=loop, **kw)

    async def handler(m: Msg) -> None:
        seen.append(m.stream_sequence)
        await m.ack()

    disp = keyed(d, handler, concurrency=64)
    task = await running(disp.run())
    loop.set_task_factory(factory)
    try:
        for batch in range(50):
            for seq in range(batch * 20 + 1, batch * 20 + 21):
                await d.deliver(msg(d, disp, seq, f"0.k{seq % 1000}"))
            await turns(3)
        await wait_for(lambda: len(seen) == 1000, 5, what="1,000 messages handled")
    finally:
        loop.set_task_factory(None)
    assert sorted(seen) == list(range(1, 1001)) and 0 < tasks[0] <= 50
    await stopped(d, task)


async def test_keyed_dispatcher_runs_handlers_that_wait_up_to_its_concurrency_at_once():
    d = delivery(Wire())
    gate = asyncio.Event()
    active = [0]
    peak = [0]

    async def handler(m: Msg) -> None:
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        await gate.wait()
        active[0] -= 1
        await m.ack()

    disp = keyed(d, handler, concurrency=4)
    task = await running(disp.run())
    for seq in range(1, 11):
        await d.deliver(msg(d, disp, seq, f"0.k{seq}"))
    await wait_for(lambda: active[0] == 4, 2, what="4 handlers waiting at once")
    await turns()
    assert peak[0] == 4
    gate.set()
    await wait_for(lambda: d.last_acked() is not None and not disp.busy, 2, what="all handled")
    assert peak[0] == 4
    await stopped(d, task)


async def test_keyed_nak_retries_in_place_and_the_key_waits():
    wire = Wire()
    d = delivery(wire)
    calls: list[int] = []

    async def handler(m: Msg) -> None:
        calls.append(m.stream_sequence)
        if calls.count(m.stream_sequence) == 1 and m.stream_sequence == 1:
            await m.nak(0.01)
            return
        await m.ack()

    disp = keyed(d, handler)
    task = await running(disp.run())
    await d.deliver(msg(d, disp, 1, "0.a"))
    await d.deliver(msg(d, disp, 2, "0.a"))
    await wait_for(lambda: len(calls) == 3, 2, what="the retry and the next message")
    assert calls == [1, 1, 2]
    assert wire.bodies(1) == [b"+ACK"]  # nothing went to the server for the nak
    await stopped(d, task)


async def test_keyed_dead_letters_after_max_deliver_and_the_key_moves_on():
    wire = Wire()
    d = delivery(wire)
    consumer = Consumer()
    handled: list[int] = []

    async def handler(m: Msg) -> None:
        if m.stream_sequence == 1:
            raise RuntimeError("poison")
        handled.append(m.stream_sequence)
        await m.ack()

    disp = keyed(d, handler, consumer, retry=RetryPolicy(max_deliver=3, backoff=0.001, dead_letter_subject="dlq"))
    task = await running(disp.run())
    await d.deliver(msg(d, disp, 1, "0.a"))
    await d.deliver(msg(d, disp, 2, "0.a"))
    await wait_for(lambda: handled == [2], 2, what="the key moves on")
    [(subject, data, headers)] = consumer.dead
    assert subject == "dlq" and data == b"1" and PIN_HEADER not in headers
    assert headers["Pcg-Deliveries"] == "3" and "poison" in headers["Pcg-Dead-Reason"]
    assert headers["Pcg-Stream-Seq"] == "1" and headers["Pcg-Subject"] == "a"
    assert wire.bodies(1)[0].startswith(b"+TERM RuntimeError")
    await stopped(d, task)


async def test_keyed_hands_out_nothing_during_a_take_over_then_each_key_in_stream_order():
    """Invariant 7 with the keyed dispatcher: what arrives under a new pin waits (the earlier holder's nak'd
    messages come after newer ones), then each key goes in stream order."""
    d = Delivery(Wire().publish, Wire().request, pin_margin=60.0)
    d.guarded = True
    d.pin_given(PIN, time.monotonic())
    seen: list[int] = []

    async def handler(m: Msg) -> None:
        seen.append(m.stream_sequence)
        await m.ack()

    disp = keyed(d, handler, concurrency=4)
    task = await running(disp.run())
    for seq, subject, deliveries in ((6, "0.a", 1), (7, "0.b", 1), (5, "0.a", 2), (4, "0.b", 2)):
        await d.deliver(msg(d, disp, seq, subject, deliveries=deliveries, cseq=10 + seq))
    await turns()
    assert seen == [] and not disp.busy
    d.taken_over(PIN)
    await wait_for(lambda: len(seen) == 4, 2, what="handed out after the take-over")
    assert [s for s in seen if s in (5, 6)] == [5, 6] and [s for s in seen if s in (4, 7)] == [4, 7]
    await stopped(d, task)


async def test_keyed_holds_and_the_waiting_messages_are_overdue_and_dropped():
    d = delivery(Wire())
    gate = asyncio.Event()

    async def handler(m: Msg) -> None:
        await gate.wait()
        await m.ack()

    disp = keyed(d, handler)
    task = await running(disp.run())
    for seq in (1, 2, 3):
        await d.deliver(msg(d, disp, seq, "0.a"))
    await wait_for(lambda: disp.running and disp.busy, 2, what="the first runs")
    d.hold()
    later = time.monotonic() + 10
    assert sorted(m.stream_sequence for m in disp.overdue(later, 5.0)) == [1, 2, 3]
    assert disp.overdue(time.monotonic(), 5.0) == []
    gate.set()
    await wait_for(lambda: not disp.running, 2, what="the running one ends")
    await turns()
    assert not disp.running  # held: the next one of the key does not start
    assert [m.stream_sequence for m in disp.drop_queued()] == [2, 3] and not disp.busy
    await stopped(d, task)


# --- Delivery: a RESET from outside starts a new epoch (invariant 6) ---------------------------


async def test_a_lower_consumer_sequence_starts_a_new_epoch_and_drops_the_old_buffer():
    wire = Wire()
    d = delivery(wire)
    for seq in (10, 11, 12):
        assert await d.deliver(msg(d, None, seq, cseq=seq - 9))
    first = await d.take()
    assert first is not None and first.stream_sequence == 10 and d.epoch == 0
    # `cg static reset ... --to-earliest` from outside: deliveries restart at consumer sequence 1
    assert await d.deliver(msg(d, None, 1, cseq=1))
    assert d.epoch == 1 and d.buffered == 1
    assert await d.deliver(msg(d, None, 2, cseq=2))
    taken = [await d.take(), await d.take()]
    assert [m.stream_sequence for m in taken if m] == [1, 2]
    assert wire.sent == []  # the dropped old messages got no nak: it would hit the new epoch's delivery


async def test_a_message_of_an_old_epoch_is_never_handed_out():
    d = delivery(Wire())
    old = msg(d, None, 5, cseq=5)
    assert await d.deliver(old)
    assert await d.deliver(msg(d, None, 3, cseq=1))  # RESET
    assert await d.skip_acked(old)  # e.g. queued inside the keyed dispatcher meanwhile
    assert old.superseded  # a retry in place (keyed dispatcher) stops
    fresh = await d.take()
    assert fresh is not None and fresh.stream_sequence == 3 and not await d.skip_acked(fresh)
    assert not fresh.superseded


async def test_acks_of_an_old_epoch_do_not_mark_the_new_epochs_redeliveries():
    wire = Wire()
    d = delivery(wire)
    running = msg(d, None, 7, cseq=7)
    assert await d.deliver(running)
    await msg(d, None, 6, cseq=6).ack()
    assert await d.deliver(msg(d, None, 6, cseq=1))  # RESET to 6: 6 comes again, a first delivery
    await running.ack()  # the old epoch's handler finishes after the RESET
    assert running.settled and d.last_acked() == 6
    # the new epoch's 6 and 7 are redelivered (AckWait ran out): handled, not taken for duplicates
    assert await d.deliver(msg(d, None, 6, cseq=1, deliveries=2))
    assert await d.deliver(msg(d, None, 7, cseq=2, deliveries=2))
    # the old 7's ack was not sent: it would have settled the new epoch's delivery of 7
    assert d.buffered == 3 and wire.bodies(6) == [b"+ACK"] and wire.bodies(7) == []


class SilentServer(Wire):
    """Records acks and answers no double ack, as the server does for a delivery a RESET dropped;
    ``supersede`` is the session's (AckReplies): the waiting double acks end with SupersededError."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: list[asyncio.Future[None]] = []

    async def request(self, subject: str, body: bytes, timeout: float) -> None:
        self.sent.append((subject, body))
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append(waiter)
        await asyncio.wait_for(waiter, timeout)

    def supersede(self) -> None:
        for waiter in self.waiting:
            if not waiter.done():
                waiter.set_exception(SupersededError("reset"))
        self.waiting.clear()


def silent_delivery() -> tuple[SilentServer, Delivery]:
    server = SilentServer()
    d = Delivery(server.publish, server.request, pin_margin=60.0, supersede=server.supersede)
    d.pin_given(PIN, time.monotonic())
    return server, d


async def test_a_double_ack_waiting_when_a_new_epoch_shows_stops_at_once_as_superseded():
    server, d = silent_delivery()
    old = msg(d, None, 9087, cseq=40)
    assert await d.deliver(old) and await d.take() is old
    acking = asyncio.create_task(old.ack_sync(timeout=30))
    await wait_for(lambda: server.waiting, 1, what="the double ack sent")
    assert not acking.done()
    assert await d.deliver(msg(d, None, 5, cseq=1))  # RESET back to 5 from outside
    with pytest.raises(SupersededError):
        await asyncio.wait_for(acking, 1)  # at once: not the 30 s timeout
    assert old.superseded and old.settled and d.last_acked() is None


async def test_acks_of_an_old_epoch_are_not_sent_after_it_ended():
    server, d = silent_delivery()
    a, b = msg(d, None, 20, cseq=20), msg(d, None, 21, cseq=21)
    assert await d.deliver(a) and await d.deliver(b)
    assert await d.deliver(msg(d, None, 5, cseq=1))  # RESET
    with pytest.raises(SupersededError):
        await asyncio.wait_for(a.ack_sync(timeout=30), 1)
    await b.ack()
    await b.in_progress()
    assert server.sent == [] and a.settled and b.settled and d.last_acked() is None


async def test_a_serial_handler_whose_double_ack_meets_a_reset_lets_the_replay_start():
    server, d = silent_delivery()
    outcome: list[tuple[int, str]] = []

    async def handler(m: Msg) -> None:
        try:
            await m.ack_sync(timeout=30)
        except SupersededError:
            outcome.append((m.stream_sequence, "superseded"))
            raise  # uncaught: still not a handler failure
        outcome.append((m.stream_sequence, "acked"))

    fatal: list[BaseException] = []
    disp = serial(d, handler, fatal)
    task = await running(disp.run())
    assert await d.deliver(msg(d, disp, 50, cseq=50))
    await wait_for(lambda: server.waiting, 1, what="50's double ack sent")
    assert await d.deliver(msg(d, disp, 5, cseq=1))  # RESET
    await wait_for(lambda: len(server.waiting) == 1 and server.bodies(5), 1, what="the replay's first handled")
    server.waiting[0].set_result(None)  # the server answers the new epoch's double ack
    await wait_for(lambda: len(outcome) == 2, 1, what="both handled")
    assert outcome == [(50, "superseded"), (5, "acked")] and fatal == [] and not task.done()
    await stopped(d, task)


async def test_redeliveries_and_rising_sequences_stay_in_one_epoch():
    d = delivery(Wire())
    assert await d.deliver(msg(d, None, 1, cseq=1))
    assert await d.deliver(msg(d, None, 2, cseq=2))
    assert await d.deliver(msg(d, None, 1, cseq=1, deliveries=2))  # a redelivery keeps its number
    assert await d.deliver(msg(d, None, 4, cseq=5))
    assert d.epoch == 0 and d.buffered == 4
