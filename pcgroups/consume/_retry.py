"""How a failed message is retried in place (its key, or its partition on the strict path, waits), and what
ends it: the group's dead-letter stream by default (pcgroups.deadletters), a subject of the user's, or a drop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


class RetryLater(Exception):
    """Raised by a handle that ran the call elsewhere (a worker) when it failed or nak'd: the keyed dispatcher
    retries in place as for a local ``nak(delay)`` (``delay`` 0: its backoff), ``reason`` naming why."""

    def __init__(self, reason: str = "", delay: float = 0.0):
        super().__init__(reason or "nak")
        self.reason = reason
        self.delay = delay
