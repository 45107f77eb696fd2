"""How a failed message is retried in place (its key, or its partition on the strict path, waits), and what
ends it: the group's dead-letter stream by default (pcgroups.deadletters), a subject of the user's, or a drop.

Invariants:

1. One policy drives every path (one handler at a time, key-level concurrency, the worker pool): a handler that
   raises, or calls ``nak()``, has its message retried in place after ``backoff`` (doubling, at most
   ``max_backoff``; a ``nak(delay)`` says its own), up to ``max_deliver`` attempts, the server's deliveries
   before this holder's included; then it is given up. A failing handler never ends the instance.
2. Given up, a message goes to the group's dead-letter stream (no ``dead_letter_subject``, no ``drop``), or to
   ``dead_letter_subject`` (a stream must take it), and is terminated only once a stream acknowledged it; with
   ``drop`` it is terminated (``+TERM``): gone, a log line and an event aside. Nothing is dropped unless asked.
3. ``park_keys`` (the group's dead-letter stream only): a key whose message was dead-lettered is parked, its later
   messages follow it into the stream without running, until a replay (or a purge) frees it.
4. A policy that exists is consistent (:meth:`RetryPolicy.__post_init__`), else a ``ConfigError``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError
from ._msg import Msg


@dataclass
class RetryPolicy:
    """How a failed message is retried before it is dead-lettered, on every path (strict, key-level, workers)."""

    max_deliver: int = 5  # attempts (server deliveries included) before dead-lettering; 0 = never
    backoff: float = 0.1  # first retry delay, doubled each time
    max_backoff: float = 5.0
    dead_letter_subject: str | None = None  # None: the group's dead-letter stream; else this subject (a stream's)
    on_dead_letter: Callable[[Msg, str], None] | None = None  # told of each message dead-lettered, and why
    drop: bool = False  # terminate (+TERM) after max_deliver instead of dead-lettering: only when asked
    park_keys: bool = False  # a key whose message was dead-lettered is parked: its later messages follow it

    def __post_init__(self) -> None:
        if self.max_deliver < 0:
            raise ConfigError(f"max_deliver must be >= 0 (0: retry for ever), got {self.max_deliver}")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ConfigError(f"backoff and max_backoff must be >= 0, got {self.backoff} and {self.max_backoff}")
        if self.drop and self.dead_letter_subject:
            raise ConfigError("drop=True terminates a message that keeps failing: give no dead_letter_subject with it")
        if self.park_keys and (self.drop or self.dead_letter_subject):
            raise ConfigError(
                "park_keys needs the group's dead-letter stream (it is the record of the parked keys): "
                "give neither drop nor dead_letter_subject with it"
            )

    @property
    def to_group_stream(self) -> bool:
        """Given-up messages go to the group's dead-letter stream (invariant 2)."""
        return not self.drop and not self.dead_letter_subject


class RetryLater(Exception):
    """Raised by a handle that ran the call elsewhere (a worker) when it failed or nak'd: the keyed dispatcher
    retries in place as for a local ``nak(delay)`` (``delay`` 0: its backoff), ``reason`` naming why."""

    def __init__(self, reason: str = "", delay: float = 0.0):
        super().__init__(reason or "nak")
        self.reason = reason
        self.delay = delay
