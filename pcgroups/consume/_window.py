"""How many messages a keyed instance (or a dispatcher of the worker pool) holds at once: the adaptive
:class:`Window`, bounded by count and, through :class:`MessageSize`, by bytes (docs/DESIGN.md, *Fair by default*)."""

from __future__ import annotations

#: A keyed instance's default consumer window (``max_ack_pending``) and the most it holds at once: a burst
#: on one key of up to about this many messages does not hold back other keys (:class:`Window`).
FAIR_WINDOW = 16384
#: Per handler slot, what a keyed instance asks for while no key is starved (the window's base).
WINDOW_PER_SLOT = 4
WINDOW_SHRINK_AFTER = 1.0  # seconds the window must have been under a quarter full before it halves
#: The most message bytes a keyed instance holds at once, whatever its window: a burst of large messages
#: is held as far as this reaches (256 messages of 256 KB), not up to :data:`FAIR_WINDOW` of them.
WINDOW_BYTES = 64 * 1024 * 1024
#: The most bytes one pull asks for (a quarter of the 64 MiB a server lets wait for one client, its
#: ``max_pending``, past which it closes the connection as a slow consumer).
PULL_BYTES = 16 * 1024 * 1024


class MessageSize:
    """A running average of the size of the messages received (each new one weighs 1/16), to bound
    pulls and the window by bytes: :meth:`fit` caps a number of messages to a byte budget."""

    def __init__(self) -> None:
        self.average = 0.0

    def saw(self, size: int) -> None:
        self.average = size if self.average == 0 else self.average + (size - self.average) / 16

    def fit(self, n: int, budget: int) -> int:
        """``n`` at most, as many as ``budget`` bytes hold at the average size (one at least)."""
        return n if self.average <= 0 else min(n, max(1, int(budget // self.average)))


class Window:
    """How many messages a keyed instance holds (buffered, waiting for their key, running), between ``base``
    and ``cap`` (the consumer's max_ack_pending; the server never delivers more).

    It doubles while it is (three quarters) full and starved (a handler slot is free but every message held
    waits behind a busy key: a burst on one key), so other keys further in the stream are reached; it halves back toward
    ``base`` once it has been under a quarter full for :data:`WINDOW_SHRINK_AFTER`. It also doubles, up to
    ``reach`` (a pull's ``batch``), while hungry: the last pull was used up and the handlers ran out of work
    before the next one (the window, not the handlers, bounds the rate); it halves back toward ``base`` once no
    pull decision was hungry for :data:`WINDOW_SHRINK_AFTER` (the handlers are the bottleneck again). What is
    held costs memory and a ``+WPI`` per AckWait/3, and is redelivered when the instance dies: at most ``cap``
    messages, and never more than :data:`WINDOW_BYTES` of them at the average message size (``sizes``).
    """

    def __init__(self, base: int, cap: int, sizes: MessageSize | None = None, reach: int = 0):
        self.cap = max(cap, 1)
        self.base = max(1, min(base, self.cap))
        self._reach = reach
        self.size = self.base
        self.sizes = sizes or MessageSize()
        self._low_since: float | None = None
        self._hungry_at: float | None = None  # the last hungry decision, while hunger holds the window above base

    @property
    def reach(self) -> int:
        """The most hunger grows it to: a pull's batch, at least ``base``, at most ``cap``."""
        return min(max(self._reach, self.base), self.cap)

    def room(self, outstanding: int) -> int:
        """How many more messages may be asked for, with ``outstanding`` held or requested."""
        return max(self.sizes.fit(self.size, WINDOW_BYTES) - outstanding, 0)

    def update(self, outstanding: int, starved: bool, now: float, hungry: bool = False) -> None:
        """``outstanding``: held or requested. Full is within a quarter of the size (less is not worth a pull).
        ``hungry``: the last pull was used up, and nothing is buffered or queued while a handler slot is free."""
        if hungry:  # used up, not too large: no time under a quarter full counts
            self._hungry_at = now
            self._low_since = None
            self.size = max(self.size, min(self.size * 2, self.reach))
        elif starved and outstanding >= self.size - self.size // 4 and self.size < self.cap:
            self.size = min(self.size * 2, self.cap)
            self._low_since = None
        elif outstanding < self.size // 4 and self.size > self.base:
            if self._low_since is None:
                self._low_since = now
            elif now - self._low_since >= WINDOW_SHRINK_AFTER:
                self.size = max(self.size // 2, self.base)
                self._low_since = now
        else:
            self._low_since = None
            fed = self._hungry_at is not None and not starved and now - self._hungry_at >= WINDOW_SHRINK_AFTER
            if fed and self.size <= self.reach:
                self.size = max(self.size // 2, self.base)
                self._hungry_at = now if self.size > self.base else None

    def rebase(self, base: int) -> None:
        """A new base (a worker pool's slots changed); the size follows it up, and shrinks to it over time."""
        self.base = max(1, min(base, self.cap))
        self.size = max(self.size, self.base)

    def at_least(self, n: int) -> None:
        """Make room for ``n`` messages (a take-over waiting for an earlier holder's), within the cap."""
        self.size = max(self.size, min(n, self.cap))
        self._hungry_at = None  # held for the take-over: it shrinks when under a quarter full
