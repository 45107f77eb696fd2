"""The context object of every ``cg`` command: how it connects, runs its coroutine and asks the user.

The root callback (cg/app.py) stores a :class:`Runtime` in the Typer context (``ctx.obj``) and a
command gets it with :func:`runtime`; nothing a command uses is looked up in module state. The
interactive shell (cg/prompt.py) runs the same commands with a subclass of its own: their
coroutines run on the shell's event loop, on the shell's one connection (which a command's
:meth:`Runtime.close` only flushes), and their questions go through prompt-toolkit.

- :meth:`Runtime.run`: run a coroutine function to completion (a fresh event loop per command);
- :meth:`Runtime.connect` / :meth:`Runtime.close`, or :meth:`Runtime.connection` around a body, or
  :meth:`Runtime.with_connection` for a whole command: a connection and a JetStream API honouring
  the options' domain and timeout;
- :meth:`Runtime.ask` / :meth:`Runtime.ask_async` / :meth:`Runtime.stdin_is_terminal` /
  :meth:`Runtime.confirm_delete`: the user's answers.

Connection options are kept as given and turned into ``pcgroups.connect.ConnectionOptions`` only
when a command connects: neither nats-py nor the library is imported before that.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import Canceled

if TYPE_CHECKING:
    import typer
    from nats.aio.client import Client

    from pcgroups.connect import ConnectionOptions, ResolvedConnection
    from pcgroups.jetstream import JetStreamApi

T = TypeVar("T")

CLOSE_TIMEOUT = 2.0  # seconds to wait for a clean nats-py close

DELETE_WARNING = (
    "WARNING: this operation will cause all existing consumer members to terminate consuming are you sure? (y/n): "
)


class Runtime:
    """A command's surroundings: the connection options, an event loop to run on, the user.

    ``options`` is a ready ``ConnectionOptions``; ``settings`` are its fields as the command line
    gave them (the object is made on first use).
    """

    def __init__(self, options: ConnectionOptions | None = None, **settings: Any) -> None:
        self._options = options
        self._settings = settings

    @property
    def options(self) -> ConnectionOptions:
        if self._options is None:
            from pcgroups.connect import ConnectionOptions

            self._options = ConnectionOptions(**self._settings)
        return self._options

    def resolve(self) -> ResolvedConnection:
        """Options > env > context > default, without any network (context errors surface here)."""
        from pcgroups.connect import resolve

        return resolve(self.options)

    # -------------------------------------------------------- running

    def run(self, coro_fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """Run ``coro_fn(*args, **kwargs)`` to completion on a fresh event loop."""
        import asyncio

        return asyncio.run(coro_fn(*args, **kwargs))  # type: ignore[arg-type]

    def run_member(self, coro_fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """:meth:`run` for a member instance (``consume``): on uvloop when it is installed
        (:func:`member_loop_factory`)."""
        import asyncio

        with asyncio.Runner(loop_factory=member_loop_factory()) as runner:
            return runner.run(coro_fn(*args, **kwargs))  # type: ignore[arg-type]

    async def connect(self, *, reconnect: bool = False) -> tuple[Client, JetStreamApi]:
        """A new connection (``reconnect``: forever after losing the server) and its JetStream API."""
        from pcgroups.connect import connect
        from pcgroups.jetstream import JetStreamApi

        rc = self.resolve()
        nc = await connect(rc, reconnect=reconnect)
        return nc, JetStreamApi(nc, domain=rc.js_domain, api_prefix=rc.js_api_prefix, timeout=rc.timeout)

    async def close(self, nc: Client) -> None:
        """Done with a connection of :meth:`connect`: :func:`close_quietly`."""
        await close_quietly(nc)

    @asynccontextmanager
    async def connection(self, *, reconnect: bool = False) -> AsyncIterator[tuple[Client, JetStreamApi]]:
        """:meth:`connect` for the body of a ``with``, :meth:`close` after it."""
        nc, api = await self.connect(reconnect=reconnect)
        try:
            yield nc, api
        finally:
            await self.close(nc)

    def with_connection(self, body: Callable[[Client, JetStreamApi], Awaitable[T]]) -> T:
        """Connect, run ``body(nc, api)``, close: the whole network part of an admin command."""

        async def main() -> T:
            async with self.connection() as (nc, api):
                return await body(nc, api)

        return self.run(main)

    # -------------------------------------------------------- the user

    def stdin_is_terminal(self) -> bool:
        return stdin_is_terminal()

    def ask(self, prompt: str) -> str | None:
        """Write ``prompt`` (no newline) to stdout and read one line from stdin; None at end of input."""
        return read_answer(prompt)

    async def ask_async(self, prompt: str) -> str | None:
        """:meth:`ask` from a coroutine (see :func:`read_answer_async`)."""
        return await read_answer_async(prompt)

    async def confirm_delete(self, force: bool) -> None:
        """The reference's delete confirmation: only exactly ``y`` proceeds."""
        if force:
            return
        answer = await self.ask_async(DELETE_WARNING)
        if not self.stdin_is_terminal() and _stdout_is_terminal():  # no answer echoed ended the question's line
            _end_prompt_line()
        if answer is None:
            raise Canceled("no answer (stdin ended); -f deletes without asking")
        if answer.strip() != "y":
            raise Canceled()


def runtime(ctx: typer.Context) -> Runtime:
    """The runtime the root callback stored (a plain one when a command runs without the root)."""
    obj = ctx.find_root().obj
    return obj if isinstance(obj, Runtime) else Runtime()


def stdin_is_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):
        return False


async def close_quietly(nc: Client) -> None:
    """Close (flushing pending acks) without letting a slow or failed close hide the result."""
    import asyncio

    try:
        await asyncio.wait_for(nc.close(), CLOSE_TIMEOUT)
    except Exception:
        pass


def read_answer(prompt: str) -> str | None:
    """Write ``prompt`` (no newline) to stdout and read one line from stdin; None at end of input. Ctrl-C
    ends the prompt's line first (the shell's next prompt starts on a line of its own)."""
    sys.stdout.write(prompt)
    sys.stdout.flush()
    try:
        line = sys.stdin.readline() if sys.stdin is not None else ""
    except (OSError, ValueError):
        return None
    except KeyboardInterrupt:
        _end_prompt_line()
        raise
    if line == "":
        return None
    return line.rstrip("\r\n")


def _stdout_is_terminal() -> bool:
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def _end_prompt_line() -> None:
    """A question was left unanswered (Ctrl-C): end its line."""
    try:
        sys.stdout.write("\n")
        sys.stdout.flush()
    except Exception:
        pass


async def read_answer_async(prompt: str) -> str | None:
    """:func:`read_answer` from a coroutine: stdin is read by a daemon thread, so the connection keeps
    answering server pings while the user thinks, and Ctrl-C is not held up by a pending read."""
    import asyncio
    import threading

    loop = asyncio.get_running_loop()
    answer: asyncio.Future[str | None] = loop.create_future()

    def settle(value: str | None = None, error: BaseException | None = None) -> None:
        if answer.done():
            return
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(value)

    def read() -> None:
        try:
            value = read_answer(prompt)
        except BaseException as e:
            loop.call_soon_threadsafe(settle, None, e)
        else:
            loop.call_soon_threadsafe(settle, value)

    threading.Thread(target=read, name="cg-stdin", daemon=True).start()
    try:
        return await answer
    except (asyncio.CancelledError, KeyboardInterrupt):  # Ctrl-C while the question waits
        _end_prompt_line()
        raise


def member_loop_factory() -> Any:
    """The event loop a member instance (``consume``) runs on: uvloop's when it is installed (in the
    ``cli`` extra where it has wheels: about a fifth less CPU per message, BENCHMARKS.md P7) unless
    ``CG_EVENT_LOOP=asyncio``; else asyncio's (None)."""
    import os

    if os.environ.get("CG_EVENT_LOOP", "").lower() == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


__all__ = [
    "DELETE_WARNING",
    "Runtime",
    "close_quietly",
    "member_loop_factory",
    "read_answer",
    "read_answer_async",
    "runtime",
    "stdin_is_terminal",
]
