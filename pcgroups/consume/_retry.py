"""How a failed message is retried in place under key-level concurrency (its key waits), and what ends it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ._msg import Msg


@dataclass
class RetryPolicy:
    """How a failed message of a key is retried before it is dead-lettered."""

    max_deliver: int = 5  # attempts (server deliveries included) before dead-lettering; 0 = never
    backoff: float = 0.1  # first retry delay, doubled each time
    max_backoff: float = 5.0
    dead_letter_subject: str | None = None  # None: the message is terminated (+TERM) after max_deliver
    on_dead_letter: Callable[[Msg, str], None] | None = None  # told of each message dead-lettered, and why


class RetryLater(Exception):
    """Raised by a handle that ran the call elsewhere (a worker) when it failed or nak'd: the keyed dispatcher
    retries in place as for a local ``nak(delay)`` (``delay`` 0: its backoff), ``reason`` naming why."""

    def __init__(self, reason: str = "", delay: float = 0.0):
        super().__init__(reason or "nak")
        self.reason = reason
        self.delay = delay
