"""How an instance tells its owner what it does (the contract is :mod:`pcgroups.events`).

:class:`Reporter` (one per instance) keeps the partitions the owner was told it owns
(:attr:`Reporter.assigned`), runs ``on_revoked`` / ``on_assigned`` for the difference when the
instance's control loop says what it owns now (:meth:`Reporter.settle`), and emits each
:class:`~pcgroups.events.InstanceEvent` once per change: an event equal to the last one of its kind
of state (the pin, the membership, the connection) is not repeated. The control loop calls
:meth:`~Reporter.settle` only at points where the hooks' promises hold: in-flight handlers of
partitions it gives up have finished, and no handler of a partition it gains has started.

A hook (``on_assigned``, ``on_revoked``, and ``on_event`` too) that raises is logged; the instance
ends with that error. :meth:`Reporter.settle` raises :class:`HookError` around it (the control loop
unwraps it); an ``on_event`` error, raised in a callback of its own, is passed to ``on_failure``.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterable

from ..events import EventCallback, InstanceEvent, PartitionsHook

log = logging.getLogger("pcgroups")

_STATE_OF = {
    "pinned": "pin",
    "standby": "pin",
    "lost-pin": "pin",
    "not-a-member": "membership",
    "added": "membership",
    "partitions": "membership",
    "dropped": "membership",
    "disconnected": "connection",
    "reconnected": "connection",
    "unavailable": "connection",
    "worker-joined": "workers",
    "worker-left": "workers",
    "enrolled": "dispatchers",
    "no-dispatcher": "dispatchers",
    "dead-letter-refused": "",
    "failed": "",
    "dead-lettered": "",
    "terminated": "",
    "parked": "",
    "unparked": "",
}


class HookError(Exception):
    """A rebalance hook raised ``error`` (logged already): the instance ends with ``error``."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


class Reporter:
    """The hooks and events of one instance of ``member`` (see the module docstring)."""

    def __init__(
        self,
        member: str,
        *,
        on_assigned: PartitionsHook | None = None,
        on_revoked: PartitionsHook | None = None,
        on_event: EventCallback | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ):
        self.member = member
        self.assigned: set[int] = set()
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked
        self._on_event = on_event
        self._on_failure = on_failure
        self._last: dict[str, InstanceEvent] = {}

    @property
    def gates(self) -> bool:
        """Handlers of a new pin must wait until the control loop admits it: an ``on_assigned`` hook runs
        first, and the ``pinned`` event is said before the first handler starts (a cost at pin time only)."""
        return self._on_assigned is not None or self._on_event is not None

    async def settle(self, owned: Iterable[int]) -> None:
        """The instance hands out ``owned`` from now on: ``on_revoked`` for what it no longer owns,
        then ``on_assigned`` for what it gains (each only when not empty)."""
        owned = set(owned)
        gone = self.assigned - owned
        if gone:
            self.assigned -= gone
            await self._call("on_revoked", self._on_revoked, gone)
        new = owned - self.assigned
        if new:
            await self._call("on_assigned", self._on_assigned, new)
            self.assigned |= new

    async def _call(self, name: str, hook: PartitionsHook | None, partitions: set[int]) -> None:
        if hook is None:
            return
        try:
            result = hook(set(partitions))
            if inspect.isawaitable(result):
                await result
        except Exception as e:
            log.error(
                "%s: the %s hook failed for partitions %s: %r", self.member, name, sorted(partitions), e, exc_info=True
            )
            raise HookError(e) from e

    def emit(self, kind: str, partitions: Iterable[int] = (), detail: str = "") -> None:
        """Tell ``on_event``, unless the last event of this kind of state was the same."""
        event = InstanceEvent(kind, self.member, tuple(sorted(partitions)), detail)
        state = _STATE_OF[kind]
        if state:  # a kind of state: said once per change ("": each time)
            if self._last.get(state) == event:
                return
            self._last[state] = event
        if self._on_event is None:
            return
        try:
            self._on_event(event)
        except Exception as e:
            log.error("%s: the on_event callback failed on %s: %r", self.member, kind, e, exc_info=True)
            if self._on_failure is not None:
                self._on_failure(e)

    def forget(self, state: str) -> None:
        """The next event of ``state`` ("pin", "membership") is said even if equal to the last one."""
        self._last.pop(state, None)
