"""A pull session's dead letters: where its dispatcher's given-up messages go, the parked keys of the partitions it
hands out, and lane R, the replays it runs (docs/DESIGN.md, *Dead letters and parked keys*).

One :class:`DeadLetters` per :class:`~pcgroups.consume._session.PullSession`; the dispatchers (both, and the pool's)
reach it as their consumer's ``dead_letters``. The stored format is :mod:`pcgroups.deadletters`.

Invariants:

1. A dead letter is stored with a PubAck of the group's dead-letter stream (:meth:`DeadLetters.store`), under a
   ``Nats-Msg-Id`` that names the message (``<origin stream>:<sequence>``; a replayed one ``<dead-letter
   stream>:<its sequence>``): published again after a lost acknowledgement, or by the next pin holder after a
   crash, it is stored once. A stream that does not exist is created on first need (when the user may).
2. A key is parked while the stream holds an entry on its subjects. The session keeps the names of the parked keys
   it knows (:meth:`DeadLetters.parked_lane`), loaded from the stream once per pin and consumer epoch (a partition
   gained comes with a RESET, hence a new epoch), plus those it parks itself; before a message follows its key
   into the stream, the stream confirms the key is still parked (a purge or a finished replay frees it). A key
   that is not in the set is not asked about: a message of a key that is not parked costs nothing.
3. A parked key's message follows into lane ``D``, or into lane ``R`` while the key has entries there and none in
   ``D`` (a replay in progress: it runs after them).
4. Lane R (:meth:`DeadLetters.run`) runs in one instance of the member at a time: the one holding the member's
   replay lease (:mod:`pcgroups.consume._lease`), and only while it may run lane R. The pinned instance may once it
   held the pin for AckWait (the earlier holder's calls are superseded by then), takes no pin over and may start
   handlers; an instance without the pin only while consumer info shows no pinned instance of the member (the server
   gives the pin only with a message, so an idle member has none), asked before each entry it hands out. It hands
   the lane-R entries of its partitions to its dispatcher, one at a time in stream order, through its ``Delivery``,
   as messages of their key (:class:`ReplayHost`: an ack or term deletes the entry, ``nak()`` retries in place)
   received with its pin, None without one (a pin it gets meanwhile drops the message: it runs again). With
   ``park_keys`` an entry whose key has an older message (by origin sequence) in lane ``D`` follows it there without
   running. A replayed message given up goes back to lane ``D``. A key with no entry left is free.
5. A replayed message has an ack subject of the member's own consumer that no delivery has: a stream sequence
   above ``REPLAY_SEQ_BASE`` and consumer sequence 0. The server ignores what is sent to it (``-NAK``, ``+WPI``:
   nothing of that sequence is pending); its acks go to the :class:`ReplayHost`.
6. The lease is released when the holder finds nothing of lane R to run, when a pinned instance shows up beside it
   (once its message in flight is done: the pinned instance takes the lease at once) and when the session ends. Its
   TTL is max(AckWait, 3 x REPLAY_POLL), its grace AckWait: a holder keeps it at each look (at least every
   REPLAY_POLL, a third of the TTL), and one that died is taken over after TTL + AckWait.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg as NatsMsg

from ..deadletters import (
    HEADER_REPLAYED,
    LANE_DEAD,
    LANE_REPLAY,
    Entry,
    dead_letter_stream,
    delete_entry,
    ensure_stream,
    key_token,
    last_entry,
    letter_headers,
    next_entry,
    publish,
    restored_headers,
    split_subject,
    subject_counts,
)
from ..deadletters._names import DLQ_ROOT, lease_subject
from ..errors import JetStreamAPIError, NotFoundError, PermissionDeniedError
from ..jetstream._api import JetStreamApi, parse_timestamp, pinned_client_id
from ._delivery import Delivery
from ._lease import ReplayLease
from ._msg import Msg, NakPolicy, Publish, Request, message_size

log = logging.getLogger("pcgroups")

REPLAY_SEQ_BASE = 1 << 62  # invariant 5
REPLAY_POLL = 1.0  # how often an instance looks for lane-R entries
REPLAY_CHECK = 0.05  # how often it looks at the replayed message it handed out
ABSENT_POLL = 10.0  # ... while the group has no dead-letter stream
Emit = Callable[[str, Iterable[int], str], None]


class DeadLetters:
    """One session's dead letters (see the module docstring). ``owned()`` gives the partitions the session hands
    out; ``emit(kind, partitions, detail)`` tells the instance's owner (``pcgroups.events``)."""

    def __init__(
        self,
        api: JetStreamApi,
        *,
        flavour: str,
        stream: str,
        group: str,
        member: str,
        origin: str,
        consumer: str,
        park_keys: bool,
        label: str,
        owned: Callable[[], set[int]],
        emit: Emit,
    ):
        self.api = api
        self.flavour, self.group_stream, self.group, self.member = flavour, stream, group, member
        self.origin = origin  # the stream the member's consumer is on (the work queue of an elastic group)
        self.consumer = consumer
        self.parking = park_keys
        self.label = label
        self.owned = owned
        self.emit = emit
        self.stream = dead_letter_stream(flavour, stream, group)
        self.delivery: Delivery | None = None  # the session's (attach)
        #: replayed messages handed to the dispatcher, and their entries (invariant 4)
        self.replays: dict[Msg, Entry] = {}
        #: messages being retried (or held for a dead letter refused), and when they first failed
        self.failing: dict[Msg, float] = {}
        self._parked: set[tuple[int, str]] = set()  # (partition, key token), invariant 2
        self._parked_for: tuple[str | None, int] | None = None  # (pin, epoch) the set was loaded for
        self._loading = asyncio.Lock()  # one load at a time (every key's first message asks)
        self._noted: set[tuple[int, str]] | None = None  # keys parked here while a load is under way
        self._inflight: Msg | None = None
        self._over = False  # the dispatcher is done with the message in flight
        self._deleted: set[int] = set()  # lane-R entries deleted (handled, or moved to lane D)
        self._cursor = 1
        self._scope: tuple[str | None, frozenset[int]] | None = None  # (pin, owned) the cursor is for
        self._pinned: tuple[str | None, float] = (None, 0.0)  # the pin and since when it is held
        self.lease = ReplayLease(api, self.stream, lease_subject(flavour, stream, group, member))  # invariant 4

    def attach(self, delivery: Delivery) -> None:
        self.delivery = delivery

    def _subject(self, lane: str, partition: int | str, token: str) -> str:
        return f"{DLQ_ROOT}.{self.flavour}.{self.group_stream}.{self.group}.{lane}.{partition}.{token}"

    def describe(self, m: Msg) -> str:
        entry = self.replays.get(m)
        if entry is not None:
            return f"replayed dead letter {entry.seq} ({m.subject})"
        return f"message {m.sequence} ({m.subject})"

    # --- storing (invariant 1) ----------------------------------------------------------------
    async def store(self, m: Msg, key: str, reason: str, deliveries: int, *, lane: str, parked: bool) -> None:
        """Store ``m`` in ``lane`` of its key; returns once the stream acknowledged it, raises why not."""
        entry = self.replays.get(m)
        if entry is not None:  # back to the stream: where it was, under the key it was parked as
            partition, token, msg_id = entry.partition, entry.token, f"{self.stream}:{entry.seq}"
            origin_stream, origin_seq = entry.origin_stream, entry.origin_seq
            headers = {k: v for k, v in (m.headers or {}).items() if k != HEADER_REPLAYED}
        else:
            partition, token, msg_id = m.partition, key_token(key), f"{self.origin}:{m.sequence}"
            origin_stream, origin_seq, headers = self.origin, m.sequence, dict(m.headers or {})
        subject = self._subject(lane, partition, token)
        letter = letter_headers(
            headers,
            origin_stream=origin_stream,
            origin_seq=origin_seq,
            subject=m.subject,
            partitioned_subject=m.partitioned_subject,
            member=self.member,
            key=key,
            deliveries=deliveries,
            reason=reason,
            parked=parked,
        )
        size = message_size(m.data, {**letter, "Nats-Msg-Id": msg_id})
        if size > self.api.nc.max_payload:  # the server would close the connection
            raise ValueError(
                f"{size} bytes with the dead letter's headers, over the max payload ({self.api.nc.max_payload})"
            )
        try:
            ack = await publish(self.api, subject, m.data, letter, msg_id=msg_id)
        except JetStreamAPIError as e:
            if e.code != 503:  # a stream refused it, or did not answer: not a missing stream
                raise
            await self._ensure(e)
            ack = await publish(self.api, subject, m.data, letter, msg_id=msg_id)
        if ack.get("stream") != self.stream:  # another stream takes the subjects (one of '>')
            raise ValueError(f"stream {ack.get('stream')} took it, not {self.stream}: remove the overlap")
        if self.parking:
            self.note_parked(partition, token, key)

    async def _ensure(self, cause: JetStreamAPIError) -> None:
        """No stream takes the dead-letter subjects: create the group's (its replicas as the member's stream's)."""
        try:
            replicas = int((await self.api.stream_info(self.origin))["config"].get("num_replicas", 1))
            if await ensure_stream(self.api, self.flavour, self.group_stream, self.group, replicas):
                log.warning("%s: created the group's dead-letter stream %s", self.label, self.stream)
        except PermissionDeniedError as e:
            raise JetStreamAPIError(
                f"the group has no dead-letter stream {self.stream} and this user may not create it ({e}): "
                f"create it with the group's create (cg {self.flavour} create ...)",
                code=cause.code,
            ) from None

    # --- parked keys (invariants 2, 3) --------------------------------------------------------------
    def note_parked(self, partition: int, token: str, key: str) -> None:
        if self._noted is not None:  # an answer asked before this dead letter must not forget it
            self._noted.add((partition, token))
        if (partition, token) not in self._parked:
            self._parked.add((partition, token))
            self.emit("parked", (partition,), f"key {key!r}: its later messages follow it into {self.stream}")

    def _unpark(self, partition: int, token: str, key: str, why: str) -> None:
        if (partition, token) in self._parked:
            self._parked.discard((partition, token))
            self.emit("unparked", (partition,), f"key {key!r}: {why}")

    async def parked_lane(self, m: Msg, key: str) -> str | None:
        """The lane ``m`` of ``key`` follows its parked key into, or None when the key is not parked (invariants
        2, 3); raises when the stream can not say (the message waits: it must not run ahead of its key)."""
        d = self.delivery
        assert d is not None
        loaded_for = (d.pin_id, d.epoch)
        if self._parked_for != loaded_for:
            async with self._loading:
                if self._parked_for != loaded_for:
                    await self._load()
                    self._parked_for = loaded_for
        token = key_token(key)
        if (m.partition, token) not in self._parked:
            return None
        lane = await self._lane(m.partition, token)
        if lane is None:
            self._unpark(m.partition, token, key, "no dead letter of it is left (purged or replayed)")
        return lane

    async def _load(self) -> None:
        self._noted = set()
        try:
            subjects = f"{DLQ_ROOT}.{self.flavour}.{self.group_stream}.{self.group}.>"
            counts = await subject_counts(self.api, self.stream, subjects)
            self._parked = {(s[1], s[2]) for s in map(split_subject, counts) if s is not None} | self._noted
        finally:
            self._noted = None

    async def _lane(self, partition: int, token: str) -> str | None:
        """Where a parked key's next message goes: ``D`` while it has entries there, else ``R`` while it has
        entries there, else None (free)."""
        for lane in (LANE_DEAD, LANE_REPLAY):
            try:
                if await last_entry(self.api, self.stream, self._subject(lane, partition, token)) is not None:
                    return lane
            except NotFoundError:
                return None  # no stream, no dead letters
        return None

    async def blocked(self, entry: Entry) -> bool:
        """With ``park_keys``: a lane-R entry whose key has an older message (by origin sequence) in lane D follows it
        there instead of running (invariant 4)."""
        first = await next_entry(self.api, self.stream, self._subject(LANE_DEAD, entry.partition, entry.token))
        return first is not None and first.origin_stream == entry.origin_stream and first.origin_seq < entry.origin_seq

    # --- lane R (invariant 4) ---------------------------------------------------------------------
    async def replay_settled(self, entry: Entry, body: bytes, *, strict: bool) -> None:
        """A replayed message was acked or terminated (by its handler, or after it was stored in lane D again): its
        entry leaves lane R. ``strict`` (a double ack): a delete that fails raises."""
        if not (body.startswith(b"+ACK") or body.startswith(b"+TERM")):
            return  # +WPI, -NAK: nothing to do for an entry
        for delay in (0.1, 0.25, 0.5, None):
            try:
                await delete_entry(self.api, self.stream, entry.seq)
                break
            except Exception as e:
                if delay is None:
                    if strict:
                        raise
                    log.warning(
                        "%s: dead letter %d not deleted after its replay: %s; it runs again", self.label, entry.seq, e
                    )
                    return
                await asyncio.sleep(delay)
        self._deleted.add(entry.seq)
        if self.parking:
            try:
                left = await last_entry(self.api, self.stream, self._subject("*", entry.partition, entry.token))
            except Exception as e:  # the next message of the key asks again
                log.debug("%s: dead letters left of a key: %s", self.label, e)
                return
            if left is None:
                self._unpark(entry.partition, entry.token, entry.key or entry.token, "replayed: it flows again")

    def done_with(self, m: Msg) -> None:
        """The dispatcher is done with ``m`` (handled, given up, or not ours any more)."""
        self.failing.pop(m, None)
        if m is self._inflight:
            self._over = True

    async def run(self, dispatcher: NakPolicy, busy: Callable[[], bool], nc: Client, grace: float) -> None:
        """The lane-R task of the session (invariant 4): until the session's Delivery closes."""
        d = self.delivery
        assert d is not None
        self.lease.times(max(grace, 3 * REPLAY_POLL), grace)  # invariant 6
        try:
            while not d.closed:
                await asyncio.sleep(REPLAY_CHECK if self._inflight is not None else REPLAY_POLL)
                try:
                    if self._inflight is not None and self.lease.held():
                        await self.lease.keep()  # renewed while its message runs
                    if self._watch(busy()):
                        continue
                    await self._feed(dispatcher, nc, grace)
                except NotFoundError:
                    await asyncio.sleep(ABSENT_POLL)  # no dead-letter stream (yet)
                except PermissionDeniedError as e:  # a member's permissions do not change while it runs
                    log.warning("%s: replays of dead letters will not run here: %s", self.label, e)
                    return
                except Exception as e:  # disconnected, no leader: look again shortly
                    log.debug("%s: lane R: %s", self.label, e)
        finally:
            await self._release()

    async def _release(self) -> None:
        """Give the lease up, best effort (invariant 6): a message left behind is taken over after its TTL."""
        if self.lease.seq:
            try:
                await self.lease.release()
            except Exception as e:
                log.debug("%s: replay lease not released: %s", self.label, e)

    def _watch(self, busy: bool) -> bool:
        """True while the replayed message in flight is held (waiting, or being handled)."""
        m, d = self._inflight, self.delivery
        if m is None or d is None:
            return False
        entry = self.replays[m]
        dropped = (
            m.pin_id != d.pin_id
            or m.epoch != d.epoch
            or d.closed
            or (d.partitions is not None and m.partition not in d.partitions)
            or (not self._over and not busy and not d.buffered)
        )
        if not self._over and not dropped:
            return True
        del self.replays[m]
        self._inflight = None
        if entry.seq in self._deleted:
            self._deleted.discard(entry.seq)
            self._cursor = max(self._cursor, entry.seq + 1)
        else:
            self._cursor = min(self._cursor, entry.seq)  # not done: again, after a poll
            return True
        return False

    async def _feed(self, dispatcher: NakPolicy, nc: Client, grace: float) -> bool:
        """Hand the next lane-R entry of the partitions handed out to the dispatcher; False when there is none."""
        d = self.delivery
        assert d is not None
        now = time.monotonic()
        if self._pinned[0] != d.pin_id:
            self._pinned = (d.pin_id, now)
        owned = frozenset(self.owned())
        if self._scope != (d.pin_id, owned):
            self._scope, self._cursor = (d.pin_id, owned), 1
        if not self._may_run(d, now, grace):
            return False
        entry = await self._next(owned)
        if entry is None or not await self._alone(d):
            await self._release()  # nothing to run, or the member's pinned instance runs it (invariant 6)
            return False
        if not await self.lease.keep() or not self.lease.ready():
            return False
        m = self._message(entry, d, dispatcher, nc)
        if m is None:
            self._cursor = entry.seq + 1
            return True
        self.replays[m] = entry
        self._inflight, self._over = m, False
        await d.deliver(m)
        return True

    def _may_run(self, d: Delivery, now: float, grace: float) -> bool:
        """Handlers may start; with a pin, held for ``grace`` and not being taken over (invariant 4)."""
        if d.pin_id is None:
            return d.may_start()
        return not d.taking_over and d.may_start() and now - self._pinned[1] >= grace

    async def _next(self, owned: frozenset[int]) -> Entry | None:
        """The first lane-R entry of ``owned`` from the cursor on."""
        lane = self._subject(LANE_REPLAY, "*", "*")
        seq = self._cursor
        while (entry := await next_entry(self.api, self.stream, lane, seq)) is not None:
            if entry.partition in owned:
                return entry
            seq = entry.seq + 1
        return None

    async def _alone(self, d: Delivery) -> bool:
        """Pinned, or the member has no pinned instance (invariant 4)."""
        if d.pin_id is not None:
            return True
        return pinned_client_id(await self.api.consumer_info(self.origin, self.consumer)) is None

    def _message(self, entry: Entry, d: Delivery, dispatcher: NakPolicy, nc: Client) -> Msg | None:
        """``entry`` as a message of the member's consumer (invariant 5), or None when it can not be one."""
        subject = entry.partitioned_subject
        if not subject or subject.split(".", 1)[0] != str(entry.partition):
            log.warning(
                "%s: dead letter %d (%s) has no partitioned subject of its partition: not replayed",
                self.label,
                entry.seq,
                entry.subject,
            )
            return None
        stamp = parse_timestamp(entry.time)
        ns = int(stamp.timestamp() * 1e9) if stamp is not None else time.time_ns()
        reply = f"$JS.ACK.{self.origin}.{self.consumer}.1.{REPLAY_SEQ_BASE + entry.seq}.0.{ns}.0"
        headers = restored_headers(entry.headers)
        headers[HEADER_REPLAYED] = str(entry.seq)
        raw = NatsMsg(_client=nc, subject=subject, reply=reply, data=entry.data, headers=headers)
        return ReplayedMsg(raw, ReplayHost(self, d, entry), dispatcher, d.pin_id, entry.origin_seq)

    # --- what the metrics read ----------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """The parked keys known and the age of the oldest message failing now (0 without one)."""
        oldest = min(self.failing.values(), default=None)
        return {"parked_keys": len(self._parked), "oldest_failing": time.monotonic() - oldest if oldest else 0.0}


class ReplayedMsg(Msg):
    """A replayed dead letter as its handler gets it: its ``sequence`` is the one its message had when it failed
    (the origin's, as ``consume`` printed it then); the internal one of invariant 5 stays ``stream_sequence``."""

    __slots__ = ("origin_seq",)

    def __init__(self, msg: NatsMsg, host: ReplayHost, dispatcher: NakPolicy, pin_id: str | None, origin_seq: int):
        super().__init__(msg, host, dispatcher, pin_id)
        self.origin_seq = origin_seq

    @property
    def sequence(self) -> int:
        return self.origin_seq or self.stream_sequence


class ReplayHost:
    """Where a replayed message's acks go (invariants 4, 5): an ack or term deletes its entry from lane R; the rest is
    the session's Delivery's (its pin, epoch, thread for sync handlers)."""

    def __init__(self, dead: DeadLetters, delivery: Delivery, entry: Entry):
        self._dead = dead
        self._d = delivery
        self._entry = entry

    @property
    def epoch(self) -> int:
        return self._d.epoch

    def supersedes(self, m: Msg) -> bool:
        return self._d.supersedes(m) or not self._dead.lease.held()

    def call(self, coro: Coroutine[Any, Any, None]) -> Any:
        return self._d.call(coro)

    @property
    def publish(self) -> Publish:
        return self._publish

    @property
    def request(self) -> Request:
        return self._request

    async def _publish(self, subject: str, body: bytes) -> None:
        await self._dead.replay_settled(self._entry, body, strict=False)

    async def _request(self, subject: str, body: bytes, timeout: float) -> None:
        await self._dead.replay_settled(self._entry, body, strict=True)

    def acked(self, seq: int, epoch: int | None = None) -> None:
        pass  # a replayed message is not a delivery: it is never redelivered
