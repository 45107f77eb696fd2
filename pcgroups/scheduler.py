"""Key-level concurrency inside one member instance: per-key queues served round-robin.

With partition order a burst on one key delays every other key of its partition. Here each key keeps
its own stream order and at most one message per key runs at a time, up to ``concurrency`` handlers
at once; keys with work are served in turn, so a key with 1,000 queued messages gets one turn per
round. A failed handler (exception or ``nak()``) blocks only its key: the message is retried in place
with backoff (later messages of the key wait), and after ``max_deliver`` attempts it goes to a
dead-letter subject and the key moves on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .session import Msg, PullSession

log = logging.getLogger("pcgroups")

KeyFunc = Callable[["Msg"], str]


def key_by_subject(msg: "Msg") -> str:
    """The default key: the subject with the partition token stripped."""
    return msg.subject


def key_by_tokens(indexes: list[int]) -> KeyFunc:
    """Key by subject tokens (1-based, of the stripped subject), joined with '.'."""
    def key(msg: "Msg") -> str:
        tokens = msg.subject.split(".")
        return ".".join(tokens[i - 1] for i in indexes if 0 < i <= len(tokens))
    return key


def key_by_header(name: str) -> KeyFunc:
    """Key by a header's value (messages without it share the empty key)."""
    def key(msg: "Msg") -> str:
        return (msg.headers or {}).get(name, "")
    return key


def key_by_partitioning(filters: list[tuple[str, list[int] | None]]) -> KeyFunc:
    """Key by the tokens an elastic group partitions on: the first matching filter's wildcard
    tokens (the whole subject when it has no indexes, or no filter matches)."""
    parsed = [(f.split("."), [i for i, t in enumerate(f.split(".")) if t == "*"], idx) for f, idx in filters]

    def key(msg: "Msg") -> str:
        tokens = msg.subject.split(".")
        for ftoks, stars, idx in parsed:
            if _matches(ftoks, tokens):
                return ".".join(tokens[stars[k - 1]] for k in idx) if idx else msg.subject
        return msg.subject
    return key


def _matches(filter_tokens: list[str], tokens: list[str]) -> bool:
    for i, f in enumerate(filter_tokens):
        if f == ">":
            return len(tokens) > i
        if i >= len(tokens) or (f != "*" and f != tokens[i]):
            return False
    return len(tokens) == len(filter_tokens)


@dataclass
class RetryPolicy:
    """How a failed message of a key is retried before it is dead-lettered."""

    max_deliver: int = 5            # attempts (server deliveries included) before dead-lettering; 0 = never
    backoff: float = 0.1            # first retry delay, doubled each time
    max_backoff: float = 5.0
    dead_letter_subject: str | None = None   # None: the message is terminated (+TERM) after max_deliver


class KeyedDispatcher:
    """Runs a session's handler with up to ``concurrency`` keys at once, one message per key."""

    def __init__(self, session: "PullSession", *, concurrency: int, key: KeyFunc, retry: RetryPolicy):
        self.s = session
        self.concurrency = concurrency
        self.key = key
        self.retry = retry
        self.keys: OrderedDict[str, deque[Msg]] = OrderedDict()   # keys with queued messages
        self.ready: deque[str] = deque()                          # keys with work and no handler running
        self.running: dict[str, Msg] = {}
        self.started: dict[int, float] = {}
        self.tasks: set[asyncio.Task] = set()
        # The dispatcher waits on one event: set when messages arrive, when dispatching resumes and when a
        # handler task ends (a slot is free).
        self.slot = session._queued
        self.checked_pin: str | None = None
        self.checking = False   # _restore_order is asking: no task takes a message meanwhile (a reset drops them)

    @property
    def busy(self) -> bool:
        return bool(self.running) or bool(self.keys)

    def queued(self):
        for q in self.keys.values():
            yield from q

    def drop_queued(self) -> list["Msg"]:
        dropped = [m for q in self.keys.values() for m in q]
        self.keys.clear()
        self.ready.clear()
        return dropped

    def _admit(self, m: "Msg") -> None:
        k = self.key(m)
        q = self.keys.get(k)
        if q is None:
            q = self.keys[k] = deque()
            if k not in self.running:
                self.ready.append(k)
        q.append(m)

    async def run(self) -> None:
        s = self.s
        while not s.closed:
            while s._queue:
                m = s._queue.popleft()
                if m.pin_id is not None and m.pin_id != self.checked_pin and m.pin_id == s.pin_id:
                    self.checked_pin = m.pin_id
                    self.checking = True
                    try:
                        reset = await self._restore_order(m)
                    finally:
                        self.checking = False
                    if reset:
                        break
                if m.pin_id != s.pin_id:
                    await s._nak_quietly(m)
                elif s.partitions is None or m.partition in s.partitions:
                    self._admit(m)
            while (taken := self._take()) is not None:
                task = asyncio.create_task(self._run_one(*taken))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            if not self.busy and not s._queue:
                s._idle.set()
            s._queued.clear()
            if s._queue:
                continue
            await s._queued.wait()

    def _take(self) -> "tuple[str, Msg] | None":
        """The next ready key (round-robin) and its next message, marked running; None when
        ``concurrency`` handlers run, no key is ready, or dispatching is paused."""
        s = self.s
        while (self.ready and len(self.running) < self.concurrency and not s._paused and not s.closed
               and not self.checking):
            k = self.ready.popleft()
            q = self.keys.get(k)
            if not q:
                self.keys.pop(k, None)
                continue
            m = q.popleft()
            if not q:
                del self.keys[k]
            self.running[k] = m
            return k, m
        return None

    async def _restore_order(self, first: "Msg") -> bool:
        """On taking the pin with an earlier owner's messages unacked (redelivered after AckWait out of
        order, or still pending), RESET the consumer to its ack floor: everything comes again in stream
        order at once. A fresh pin (first delivery, nothing unacked below it) needs no reset. Returns
        True when it reset (what was buffered is dropped)."""
        s = self.s
        try:
            info = await s.api.consumer_info(s.stream, s.consumer)
        except Exception as e:
            log.debug("%s: consumer info failed: %s", s.label, e)
            return False
        if info.get("num_ack_pending", 0) == 0:
            return False
        # What is pending may be only what was just delivered to us (the first message included): then
        # a first delivery with the ack floor right below it means no earlier owner's message is
        # outstanding, and no reset is needed. A redelivery, or a gap between the floor and our first
        # consumer sequence, still resets (a take-over with messages in flight).
        if first._deliveries == 1:
            floor = (info.get("ack_floor") or {}).get("consumer_seq", 0)
            if floor >= first._consumer_seq - 1:
                return False
        # From here on what arrives is dropped until the first delivery after the reset (consumer
        # sequence 1): the reset may redeliver before its own reply reaches us.
        s._await_reset = True
        s._queue.clear()
        self.drop_queued()
        try:
            await s.api.reset(s.stream, s.consumer)
        except Exception as e:
            log.warning("%s: reset failed: %s", s.label, e)
            s._await_reset = False
            return True  # what was dropped is redelivered after AckWait
        log.info("%s: pinned with %d unacked messages: reset to the ack floor (%d) to keep stream order",
                 s.label, info.get("num_ack_pending", 0), info.get("ack_floor", {}).get("stream_seq", 0))
        return True

    async def _run_one(self, k: str, m: "Msg") -> None:
        """Handle ``m`` of key ``k``, then chain: while a slot is free this task takes the next ready
        key itself (same round-robin, same ``running`` bookkeeping), without a round trip through the
        dispatcher. The dispatcher is woken only when the task ends, i.e. when a slot really frees."""
        try:
            while True:
                try:
                    await self._attempts(k, m)
                finally:
                    self.started.pop(id(m), None)
                    del self.running[k]
                    if k in self.keys:
                        self.ready.append(k)
                taken = self._take()
                if taken is None:
                    return
                k, m = taken
        finally:
            self.slot.set()

    async def _attempts(self, k: str, m: "Msg") -> None:
        s = self.s
        if m._deliveries > 1 and m._stream_seq in s._recent_acks:
            # Redelivered while it waited here (AckWait ran out), and acked meanwhile: not handled again.
            # Acked once more, in case the first ack was lost (else it would come back after every AckWait).
            await s._reack(m)
            return
        attempt = 0
        while not s.closed:
            attempt += 1
            self.started[id(m)] = time.monotonic()
            m._retry = None
            error: BaseException | None = None
            try:
                if s._is_async:
                    await s.handler(m)
                else:
                    await asyncio.to_thread(s.handler, m)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                error = e
            if error is None and m._retry is None:
                return  # acked, termed, or left to the handler (no ack: redelivered after AckWait)
            reason = repr(error) if error is not None else "nak"
            deliveries = attempt + max(m.metadata.num_delivered - 1, 0)
            if self.retry.max_deliver and deliveries >= self.retry.max_deliver:
                await self._dead_letter(m, reason, deliveries)
                return
            delay = m._retry if m._retry else min(self.retry.backoff * 2 ** (attempt - 1), self.retry.max_backoff)
            log.info("%s: key %r message %d failed (%s), retry %d in %.2fs", s.label, k, m.sequence,
                     reason, attempt, delay)
            await asyncio.sleep(delay)
            if m.superseded:
                return  # the pin moved: the new owner has it

    async def _dead_letter(self, m: "Msg", reason: str, deliveries: int) -> None:
        s = self.s
        if self.retry.dead_letter_subject:
            headers = dict(m.headers or {})
            headers.update({"Pcg-Dead-Reason": reason[:512], "Pcg-Subject": m.subject,
                            "Pcg-Stream": s.stream, "Pcg-Consumer": s.consumer,
                            "Pcg-Stream-Seq": str(m.sequence), "Pcg-Deliveries": str(deliveries)})
            headers.pop("Nats-Pin-Id", None)
            await s.nc.publish(self.retry.dead_letter_subject, m.data, headers=headers)
            await s.nc.flush()
        log.warning("%s: message %d (%s) dead-lettered after %d deliveries: %s", s.label, m.sequence,
                    m.subject, deliveries, reason)
        await m._publish(b"+TERM " + reason[:200].encode(), True)

    def long_running(self, older_than: float):
        now = time.monotonic()
        for m in self.running.values():
            if not m.settled and now - self.started.get(id(m), now) >= older_than:
                yield m

    async def cancel(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        for t in list(self.tasks):
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
