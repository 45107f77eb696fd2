"""The message a handler gets (:class:`Msg`), and what it asks of where it came from (:class:`MsgHost`).

A ``Msg`` wraps a JetStream delivery: the subject without its partition token, the partition, the data,
headers and metadata, and the acks (``ack``, ``ack_sync``, ``nak``, ``in_progress``, ``term``). Its host is
the session's :class:`~pcgroups.consume._delivery.Delivery` (a member instance), or a worker of a pool
(``pcgroups.pool._worker.WorkerHost``); what ``nak(delay)`` means is its dispatcher's (:class:`NakPolicy`).
``superseded`` says the message may be with another instance now: its handler should not ack it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from nats.aio.msg import Msg as NatsMsg

from ..errors import SupersededError

PIN_HEADER = "Nats-Pin-Id"

Publish = Callable[[str, bytes], Awaitable[Any]]
Request = Callable[[str, bytes, float], Awaitable[Any]]


def message_size(data: bytes, headers: dict[str, str] | None) -> int:
    """What a message with ``headers`` weighs against the server's max payload (nats-py checks the data only:
    a message over it with its headers makes the server close the connection)."""
    if not headers:
        return len(data)
    block = 12 + sum(len(k.encode()) + len(str(v).encode()) + 4 for k, v in headers.items())  # NATS/1.0 ... CRLFs
    return len(data) + block


def ack_numbers(reply: str) -> tuple[int, int, int]:
    """(deliveries, stream sequence, consumer sequence) of a JetStream ack subject (v1 and v2 forms),
    zeros when it is not one."""
    tokens: list[str] = reply.split(".") if reply else []
    try:
        if len(tokens) == 9:
            return int(tokens[4]), int(tokens[5]), int(tokens[6])
        return int(tokens[-6]), int(tokens[-5]), int(tokens[-4])
    except (ValueError, IndexError):
        return 0, 0, 0


class NakPolicy(Protocol):
    """What ``msg.nak(delay)`` means where the message is handled."""

    def nak(self, msg: Msg, delay: float | None) -> Coroutine[Any, Any, None]:
        """What ``msg.nak(delay)`` means (the coroutine sends it, if anything is sent)."""


class MsgHost(Protocol):
    """What a :class:`Msg` asks of where it came from: a :class:`Delivery` (a member instance), or a worker
    of a pool (:class:`pcgroups.pool._worker.WorkerHost`)."""

    @property
    def epoch(self) -> int:
        """The consumer epoch now (invariant 6)."""

    def supersedes(self, m: Msg) -> bool:
        """``m`` may now be handled by another instance (``Msg.superseded``, the epoch aside)."""

    def call(self, coro: Coroutine[Any, Any, None]) -> Any:
        """Awaitable in the loop's thread; blocking (until sent) from a sync handler's thread."""

    @property
    def publish(self) -> Publish:
        """Sends an ack body on the ack subject."""

    @property
    def request(self) -> Request:
        """Sends a double ack and waits for the server's answer."""

    def acked(self, seq: int, epoch: int | None = None) -> None:
        """``seq`` was acked."""


def call_in(loop: asyncio.AbstractEventLoop, loop_thread: int, coro: Coroutine[Any, Any, None]) -> Any:
    """``coro`` as it is in the loop's thread (to await); run there and waited for from any other thread."""
    if threading.get_ident() == loop_thread:
        return coro
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


class Msg:
    """A message as a handler sees it: the partition token stripped from the subject.

    Acks pass straight to JetStream. In an ``async`` handler await them (``await msg.ack()``); in a
    sync handler (run in a worker thread) call them plainly: they block until sent.
    """

    __slots__ = (
        "_consumer_seq",
        "_deliveries",
        "_delivery",
        "_dispatcher",
        "_done",
        "_meta",
        "_msg",
        "_stream_seq",
        "epoch",
        "key",
        "last_progress",
        "naks",
        "partition",
        "pin_id",
        "received",
        "started",
        "subject",
    )

    def __init__(
        self, msg: NatsMsg, delivery: MsgHost, dispatcher: NakPolicy, pin_id: str | None, now: float | None = None
    ):
        self._msg = msg
        self._delivery = delivery
        self._dispatcher = dispatcher
        self.pin_id = pin_id
        # The ack subject is parsed once: the delivery count and the sequences serve dedup, resets and acks.
        self._deliveries, self._stream_seq, self._consumer_seq = ack_numbers(msg.reply)
        #: the consumer epoch it was delivered in (invariant 6; set again by Delivery.deliver)
        self.epoch = delivery.epoch
        token, dot, rest = msg.subject.partition(".")
        self.subject = rest if dot else msg.subject
        self.partition = int(token) if dot and token.isdigit() else -1
        self._done = False
        self._meta: NatsMsg.Metadata | None = None
        #: when it was received (monotonic)
        self.received = time.monotonic() if now is None else now
        #: when a dispatcher last handed it to the handler (monotonic; 0.0 before that)
        self.started = 0.0
        #: when the session last sent ``+WPI`` for it (monotonic; its receipt before the first)
        self.last_progress = self.received
        #: its key under key-level concurrency (set by the keyed dispatcher), else None
        self.key: str | None = None
        #: how many times ``nak()`` was called on it (retries in place included)
        self.naks = 0

    # --- what the handler reads ---------------------------------------------------------
    @property
    def nats_msg(self) -> NatsMsg:
        """The nats-py message as the server delivered it (``nats.aio.msg.Msg``): its ``subject`` still
        carries the partition token. For what this class does not carry over; acknowledge through this
        class (``ack()``, ``nak()``...), not through it: acks sent on the nats-py message bypass the
        instance's bookkeeping (the ordered release of partitions, resets, key-level retries)."""
        return self._msg

    @property
    def partitioned_subject(self) -> str:
        """The subject as stored in the stream the member consumes, partition token first."""
        return self._msg.subject

    @property
    def data(self) -> bytes:
        return self._msg.data

    @property
    def headers(self) -> dict[str, str] | None:
        return self._msg.headers

    @property
    def reply(self) -> str:
        return self._msg.reply

    @property
    def metadata(self) -> NatsMsg.Metadata:
        """JetStream metadata (stream and consumer sequences, deliveries, timestamp, pending)."""
        if self._meta is None:
            self._meta = self._msg.metadata
        return self._meta

    @property
    def deliveries(self) -> int:
        """How many times the server delivered it (1 the first time; 0 without an ack subject)."""
        return self._deliveries

    @property
    def stream_sequence(self) -> int:
        """Its stream sequence, from the ack subject (0 without one)."""
        return self._stream_seq

    @property
    def consumer_sequence(self) -> int:
        """Its consumer sequence, from the ack subject (0 without one; 1 is the first after a RESET)."""
        return self._consumer_seq

    @property
    def sequence(self) -> int:
        return self._stream_seq or self.metadata.sequence.stream

    @property
    def superseded(self) -> bool:
        """True once this instance lost the pin it received the message with, or may have lost it (it
        sent no pull carrying the pin for nearly PinnedTTL: the process was paused or its event loop
        blocked): another instance may now own the partition, so a long handler should stop and not ack.
        Also True once the consumer was RESET after it was delivered (invariant 6): it comes again if the
        new position is at or before it, so a retry or a long handler should stop."""
        return self._delivery.supersedes(self) or self.epoch != self._delivery.epoch

    @property
    def reset_since(self) -> bool:
        """True once the consumer was RESET after this message's delivery (invariant 6: its acks are not sent)."""
        return self.epoch != self._delivery.epoch

    # --- acks ---------------------------------------------------------------------------
    def ack(self) -> Any:
        return self._delivery.call(self.respond(b"+ACK", settle=True))

    def ack_sync(self, timeout: float = 5.0) -> Any:
        """Double ack: wait until the server confirmed the ack. Raises
        :class:`~pcgroups.errors.SupersededError` (not acked) when the consumer was RESET after the
        message's delivery, at once when the session sees it (invariant 6), not after ``timeout``."""
        return self._delivery.call(self._ack_sync(timeout))

    async def _ack_sync(self, timeout: float) -> None:
        self._check_epoch()
        try:
            await self._delivery.request(self._msg.reply, b"+ACK", timeout)
        except SupersededError:  # a new epoch showed while it waited: the server never answers
            self._settled(acked=False)
            raise
        self._settled(acked=True)

    def _check_epoch(self) -> None:
        """Raise SupersededError (settled, not acked) once the consumer was RESET after its delivery."""
        if self.epoch != self._delivery.epoch:
            self._settled(acked=False)
            raise SupersededError(
                f"message {self._stream_seq} was not acked: the consumer was reset after its delivery"
            )

    def nak(self, delay: float | None = None) -> Any:
        """Ask for redelivery. With key-level concurrency the retry happens in place (the key waits)."""
        self.naks += 1
        return self._delivery.call(self._dispatcher.nak(self, delay))

    def in_progress(self) -> Any:
        return self._delivery.call(self.respond(b"+WPI", settle=False))

    def term(self, reason: str | None = None) -> Any:
        return self._delivery.call(self.respond(b"+TERM" + (f" {reason}".encode() if reason else b""), settle=True))

    async def respond(self, body: bytes, *, settle: bool) -> None:
        """Send ``body`` (``+ACK``, ``-NAK``, ``+WPI``, ``+TERM ...``) on the ack subject; ``settle``: the
        message is done with (an ``+ACK`` is remembered, to re-ack a redelivery). Nothing is sent for a
        message of an epoch before a RESET (invariant 6)."""
        if self.epoch != self._delivery.epoch:
            if settle:
                self._settled(acked=False)
            return
        await self._delivery.publish(self._msg.reply, body)
        if settle:
            self._settled(acked=body == b"+ACK")

    def _settled(self, *, acked: bool) -> None:
        if not self._done:
            self._done = True
            if acked:
                self._delivery.acked(self._stream_seq, self.epoch)

    @property
    def settled(self) -> bool:
        return self._done

    def __repr__(self) -> str:
        return f"<Msg partition={self.partition} subject={self.subject!r}>"
