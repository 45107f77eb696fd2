"""The replay lease of a member: which one of its instances runs lane R (docs/DESIGN.md, *Dead letters and parked
keys*).

Lane R runs in one instance of the member at a time: two would run an entry twice, and a key's entries out of
order. The pin can not say which: the server gives it only with a message, so a member that gets none has no
pinned instance. The lease is kept in the group's dead-letter stream instead, on the member's lane ``L`` subject
(``pcgroups.deadletters._names``, invariant 4), with JetStream's compare-and-set.

Invariants:

1. The lease is the last message on its subject; its data is the holder's id (one per :class:`ReplayLease`). It is
   taken and renewed by a publish with ``Nats-Expected-Last-Subject-Sequence``: the sequence of the message it
   replaces (0: there is none), which the stream refuses once another message came. So of the instances that
   saw one state of the lease, one takes it; the message it replaced is then deleted.
2. Its holder renews it every TTL/3 and counts it as held for ``HELD`` x TTL after it sent its last successful take
   or renewal (monotonic time: a pause, a cut-off or a slow server end it), and runs nothing of lane R otherwise.
3. Another instance takes it over only once its last message stayed the same for TTL as that instance saw it: by
   then its holder no longer counts it as held. It then waits ``grace`` (AckWait) before it runs anything (as a new
   pin holder does): a call of the earlier holder still running has ended by then, or is superseded.
4. A holder releases the lease (deletes its message, and older ones left behind) when it has nothing more to run,
   and when it stops: the next holder takes it without waiting.
"""

from __future__ import annotations

import logging
import secrets
import time

from ..deadletters import delete_entry, last_entry, next_entry
from ..errors import JetStreamAPIError
from ..jetstream._api import ERR_WRONG_LAST_SEQUENCE, JetStreamApi

log = logging.getLogger("pcgroups")

HELD = 0.9  # invariant 2: the part of the TTL a holder counts on after its last renewal
EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"


class ReplayLease:
    """One instance's side of its member's replay lease on ``subject`` of the dead-letter stream ``stream``."""

    def __init__(self, api: JetStreamApi, stream: str, subject: str):
        self.api, self.stream, self.subject = api, stream, subject
        self.id = secrets.token_hex(8)
        self.ttl = self.grace = 1.0  # set by times()
        self.seq = 0  # our message on the subject (0: the lease is not ours)
        self._renewed = 0.0  # when the last successful take or renewal was sent (invariant 2)
        self._from = 0.0  # when what we hold may run (invariant 3)
        self._seen = (0, 0.0)  # another holder's message, and since when we see it unchanged

    def times(self, ttl: float, grace: float) -> None:
        self.ttl, self.grace = ttl, grace

    def held(self) -> bool:
        """The lease is ours, for sure (invariant 2)."""
        return self.seq != 0 and time.monotonic() - self._renewed < HELD * self.ttl

    def ready(self) -> bool:
        """Held, and the earlier holder's calls are over (invariant 3)."""
        return self.held() and time.monotonic() >= self._from

    async def keep(self) -> bool:
        """Take the lease, or renew it when due: True while it is ours (invariants 1-3)."""
        now = time.monotonic()
        if self.seq and now - self._renewed < self.ttl / 3:
            return self.held()
        if self.seq and await self._put(self.seq, now, over=False):
            return True
        last = await last_entry(self.api, self.stream, self.subject)
        if last is None:
            return await self._put(0, now, over=False)
        if last.data == self.id.encode():  # ours: a renewal whose answer was lost
            return await self._put(last.seq, now, over=False)
        self.seq = 0
        if self._seen[0] != last.seq:
            self._seen = (last.seq, now)
            return False
        if now - self._seen[1] < self.ttl:
            return False
        log.info("%s: took over a replay lease its holder did not renew for %.1fs", self.subject, now - self._seen[1])
        return await self._put(last.seq, now, over=True)

    async def _put(self, expected: int, sent: float, *, over: bool) -> bool:
        """Publish the lease over message ``expected`` (invariant 1): False when another came first."""
        try:
            ack = await self.api.publish(self.subject, self.id.encode(), {EXPECTED_LAST: str(expected)})
        except JetStreamAPIError as e:
            if e.err_code != ERR_WRONG_LAST_SEQUENCE:
                raise  # no answer: the lease stays as it was (held while it counts as held)
            self.seq = 0
            return False
        if ack.get("stream") != self.stream:
            raise ValueError(f"stream {ack.get('stream')} took the replay lease, not {self.stream}: remove the overlap")
        if not self.seq:
            self._from = sent + (self.grace if over else 0.0)
        self.seq, self._renewed = int(ack["seq"]), sent
        if expected:
            try:
                await delete_entry(self.api, self.stream, expected)
            except Exception as e:  # left behind: a release deletes it
                log.debug("%s: the lease's message %d not deleted: %s", self.subject, expected, e)
        return True

    async def release(self) -> None:
        """Delete our message and those left behind before it (invariant 4)."""
        ours, self.seq = self.seq, 0
        if not ours:
            return
        await delete_entry(self.api, self.stream, ours)
        while (left := await next_entry(self.api, self.stream, self.subject)) is not None and left.seq < ours:
            await delete_entry(self.api, self.stream, left.seq)
