"""The control loop every consume context runs, and the protocol they share.

A consume context is what the consume entry points give: a :class:`~pcgroups.consume._instance.ConsumerInstance`
(a static or elastic member instance) or an :class:`~pcgroups.elastic._membership.AutoInstance` (an elastic
instance in automatic membership). Both satisfy :class:`ConsumeContext`, the typed protocol users
program against, and both are driven by a :class:`ControlLoop`.

The loop's contract:

- Events are small frozen dataclasses, one queue of them per context. Anything running in the
  context's event loop (callbacks, watch pumps, timers) posts them with ``_post``; only the loop's
  task takes them (``_next_event``, which a subclass overrides for timed events) and handles them
  one at a time, in arrival order (``_handle``, a ``match`` over the event classes).
- ``_handle`` returns :data:`CONTINUE` to go on, or the context's result: None for a normal end, the
  error otherwise. A cancelled loop ends with None; an exception ends it with what ``_failed`` makes
  of it (logged: a bug or an unexpected server answer ends the context, never leaves it a zombie).
- ``_close(result)`` then releases what the context holds and may change the result; that result is
  ``error`` and what ``done()`` gives.
- ``stop()`` is idempotent and safe from a handler: the first call runs ``_halt`` and posts
  :class:`Stop`; every call returns the end to await.
- ``done()`` returns the result; ``wait()`` returns on None and raises the error, so an instance's
  failure is not lost by a caller who forgets to look at the result.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any, Final, Generic, Protocol, Self, TypeVar, runtime_checkable

from ..errors import PCGroupsError
from ._msg import Msg

log = logging.getLogger("pcgroups")

__all__ = ["CONTINUE", "ConsumeContext", "ControlLoop", "Outcome", "Stop"]


@runtime_checkable
class ConsumeContext(Protocol):
    """What every consume entry point gives (``static_consume``, ``elastic_consume`` with or without
    ``auto``): one running instance of a member."""

    @property
    def member_name(self) -> str:
        """The member this instance consumes as."""
        ...

    @property
    def pinned(self) -> bool:
        """True while this instance holds the member's pin (gets the member's messages)."""
        ...

    @property
    def consuming(self) -> bool:
        """True while this instance is attached to its member's consumer (pinned or standby)."""
        ...

    @property
    def partitions(self) -> list[int]:
        """The partitions the member owns under the current config."""
        ...

    @property
    def recovered_errors(self) -> int:
        """How many faults the instance absorbed without ending: its member's consumer went away under
        it and it created the consumer again (elastic groups; static instances end instead)."""
        ...

    def stop(self) -> asyncio.Future[BaseException | None]:
        """Ask the instance to end (idempotent, safe from a handler); await the result for the end."""
        ...

    async def done(self) -> BaseException | None:
        """Wait for the end: None for a normal end (stop, group deleted), the error otherwise."""
        ...

    async def wait(self) -> None:
        """Wait for the end: return on a normal end (stop, group deleted), raise the error that ended
        the instance otherwise (``done()`` returns it instead)."""
        ...

    async def wait_for_consuming(self, timeout: float | None = None) -> None:
        """Wait until the instance is attached to its consumer; raises if it ended first."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...

    def __aiter__(self) -> AsyncIterator[Msg]:
        """The messages, for an instance started with ``handler=None``."""
        ...


@dataclass(frozen=True)
class Stop:
    """``stop()`` was called: end after in-flight work finishes."""


class _Continue:
    def __repr__(self) -> str:
        return "CONTINUE"


CONTINUE: Final = _Continue()
"""What ``_handle`` returns to keep the loop going."""

Outcome = BaseException | None | _Continue
"""What handling one event gives: :data:`CONTINUE`, or the context's result."""

E = TypeVar("E")


class ControlLoop(Generic[E]):
    """The event queue, the task that runs the loop, the end; ``stop()``, ``done()``, ``wait()``,
    ``wait_for_consuming()`` and ``async with`` on them (see the module docs)."""

    member_name: str

    def __init__(self) -> None:
        self._events: asyncio.Queue[E | Stop] = asyncio.Queue()
        self._done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None
        self._stop_requested = False
        self.error: BaseException | None = None

    # --- public surface -------------------------------------------------------------------
    def stop(self) -> asyncio.Future[BaseException | None]:
        """Ask the instance to end (idempotent, safe from a handler). Await the result to wait for it."""
        if not self._done.done() and not self._stop_requested:
            self._stop_requested = True
            self._halt()
            self._post(Stop())
        return asyncio.shield(self._done)

    async def done(self) -> BaseException | None:
        """Wait for the end: None for a normal end (stop, group deleted), the error otherwise."""
        return await asyncio.shield(self._done)

    async def wait(self) -> None:
        """Wait for the end: return on a normal end, raise the error that ended the instance otherwise."""
        error = await self.done()
        if error is not None:
            raise error

    async def wait_for_consuming(self, timeout: float | None = None) -> None:
        """Wait until the instance is attached to its consumer; raises if it ended first."""
        try:
            await self._race(asyncio.wait_for(self._attached(), timeout), "the instance ended before consuming")
        except TimeoutError:
            raise TimeoutError(f"{self.member_name} did not start consuming within {timeout}s") from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- for subclasses -------------------------------------------------------------------
    def _post(self, event: E | Stop) -> None:
        self._events.put_nowait(event)

    def _launch(self, name: str) -> None:
        """Start the loop's task."""
        self._task = asyncio.create_task(self._run(), name=name)

    async def _race(self, aw: Awaitable[Any], ended: str = "the instance ended") -> None:
        """Await ``aw``, but raise at once if the instance ends first (its error, else ``ended``)."""
        task = asyncio.ensure_future(aw)
        try:
            await asyncio.wait({task, self._done}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
        if task.done() and not task.cancelled():
            task.result()
            return
        raise self._done.result() or PCGroupsError(ended)

    async def _run(self) -> None:
        result: BaseException | None = None
        try:
            while True:
                outcome = await self._handle(await self._next_event())
                if not isinstance(outcome, _Continue):
                    result = outcome
                    break
        except asyncio.CancelledError:
            result = None
        except Exception as e:
            result = self._failed(e)
        try:
            result = await self._close(result)
        finally:
            self.error = result
            if not self._done.done():
                self._done.set_result(result)

    async def _next_event(self) -> E | Stop:
        return await self._events.get()

    async def _handle(self, event: E | Stop) -> Outcome:
        """Handle one event: :data:`CONTINUE`, or the instance's result (None or an error)."""
        raise NotImplementedError

    def _failed(self, error: Exception) -> BaseException | None:
        """The result of a loop that raised ``error`` (called in the ``except`` block)."""
        log.exception("%s: control loop failed", self._label())
        return error

    async def _close(self, result: BaseException | None) -> BaseException | None:
        """Release what the instance holds; the final result."""
        return result

    def _halt(self) -> None:
        """The first ``stop()``: what must stop at once, before the loop sees :class:`Stop`."""

    def _interrupt(self) -> None:
        """From :meth:`_halt`: cancel the event being handled (a request that can only time out, the
        server being gone); the loop goes straight to :meth:`_close`, with the result None."""
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def _attached(self) -> Coroutine[Any, Any, Any]:
        """Returns once the instance is attached to its consumer (``wait_for_consuming``)."""
        raise NotImplementedError

    def _label(self) -> str:
        return self.member_name
