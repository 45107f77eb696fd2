"""What every ``cg`` command shares: connection options, running a coroutine, errors, argument checks.

Heavy imports (nats-py, the pcgroups library) happen inside functions, so ``cg --help`` and
``cg --fisk-introspect`` stay fast and never touch the network.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from pcgroups.config import ElasticConfig, MemberMapping, PartitioningFilter, StaticConfig
from pcgroups.connect import ConnectionOptions, parse_duration
from pcgroups.errors import ConfigError, PCGroupsError

if TYPE_CHECKING:
    from nats.aio.client import Client

    from pcgroups.connect import ResolvedConnection
    from pcgroups.jsapi import JetStreamApi

T = TypeVar("T")

VERSION = "0.1.0"
APP_HELP = "Partitioned Consumer Group CLI tool"
CLOSE_TIMEOUT = 2.0  # seconds to wait for a clean nats-py close


class CLIError(PCGroupsError):
    """An error the CLI reports as ``cg: error: <message>`` (exit status 1)."""


class Canceled(CLIError):
    """The user answered anything but ``y`` to a confirmation."""

    def __init__(self) -> None:
        super().__init__("operation canceled")


# ---------------------------------------------------------------- connection options


def options(ctx: typer.Context) -> ConnectionOptions:
    """The connection options the root callback stored (defaults when run without it)."""
    root = ctx.find_root()
    opts = root.obj
    return opts if isinstance(opts, ConnectionOptions) else ConnectionOptions()


def resolve_connection(opts: ConnectionOptions) -> "ResolvedConnection":
    """Options > env > context > default, without any network (context errors surface here)."""
    from pcgroups.connect import resolve

    return resolve(opts)


@asynccontextmanager
async def connected(opts: ConnectionOptions, *, reconnect: bool = False
                    ) -> AsyncIterator[tuple["Client", "JetStreamApi"]]:
    """A connection and a JetStream API (honouring the JS domain) for the body of a command."""
    from pcgroups.connect import connect
    from pcgroups.jsapi import JetStreamApi

    rc = resolve_connection(opts)
    nc = await connect(rc, reconnect=reconnect)
    try:
        yield nc, JetStreamApi(nc, domain=rc.js_domain, timeout=rc.timeout)
    finally:
        await close_quietly(nc)


async def close_quietly(nc: Any) -> None:
    """Close (flushing pending acks) without letting a slow or failed close hide the result."""
    try:
        await asyncio.wait_for(nc.close(), CLOSE_TIMEOUT)
    except Exception:  # noqa: BLE001 - the command's own outcome matters, not the close
        pass


def run(coro_fn: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """Run an async command body to completion on a fresh event loop."""
    return asyncio.run(coro_fn(*args, **kwargs))


def with_connection(ctx: typer.Context, body: Callable[["Client", "JetStreamApi"], Awaitable[T]]) -> T:
    """Connect with the command line's options, run ``body(nc, api)``, close."""
    opts = options(ctx)

    async def main() -> T:
        async with connected(opts) as (nc, api):
            return await body(nc, api)

    return run(main)


# ---------------------------------------------------------------- argument checks (no network)


def check_names(*, stream: str | None = None, group: str | None = None,
                members: Iterable[str] = ()) -> None:
    """Validate names before connecting (the library's rules and messages)."""
    from pcgroups.config import validate_name

    if stream is not None:
        validate_name("stream", stream)
    if group is not None:
        validate_name("group", group)
    for m in members:
        validate_name("member", m)


def parse_mappings(texts: Iterable[str]) -> list[MemberMapping]:
    """``member:p1,p2,...`` arguments; the first bad one is an error naming it."""
    from pcgroups.config import parse_mapping

    mappings = [parse_mapping(t) for t in texts]
    if not mappings:
        raise CLIError("no valid member mappings provided")
    return mappings


def parse_duration_option(flag: str, text: str, *, minimum: float = 0.0) -> float:
    """A duration option's value: a Go duration (``20ms``, ``1.5s``), at least ``minimum`` seconds."""
    try:
        seconds = parse_duration(text)
    except PCGroupsError as e:
        raise CLIError(f"invalid {flag}: {e}") from None
    if seconds < minimum:
        allowed = "must not be negative" if minimum == 0 else f"must be at least {minimum:g}s"
        raise CLIError(f"invalid {flag} {text!r}: {allowed}")
    return seconds


def parse_sleep(text: str) -> float:
    """A ``--sleep`` value: a Go duration, not negative."""
    return parse_duration_option("--sleep", text)


def check_static_config(cfg: StaticConfig) -> None:
    from pcgroups.config import validate_partition_count

    try:
        validate_partition_count(cfg.max_members)
        cfg.validate()
    except ConfigError as e:
        raise ConfigError(f"invalid static consumer group config: {e}") from None


def check_elastic_config(cfg: ElasticConfig) -> None:
    from pcgroups.config import validate_partition_count

    try:
        validate_partition_count(cfg.max_members)
        cfg.validate()
    except ConfigError as e:
        raise ConfigError(f"invalid elastic consumer group config: {e}") from None


_WILDCARD_SPLIT = re.compile(r"[,\s]+")


def star_count(filter: str) -> int:
    return sum(1 for token in filter.split(".") if token == "*")


def parse_wildcards(text: str | None, filter: str) -> list[int]:
    """Partitioning wildcard indexes for ``filter`` (``"1,2"`` or ``"1 2"``).

    None (no ``--wildcards`` for this filter) means every ``*`` token of the filter, in order.
    An empty string is an explicit empty list: the whole subject is hashed.
    """
    if text is None:
        return list(range(1, star_count(filter) + 1))
    parts = [p for p in _WILDCARD_SPLIT.split(text.strip()) if p]
    out: list[int] = []
    for p in parts:
        if not re.fullmatch(r"[+-]?\d+", p):
            raise CLIError(f"can't parse partition {p}: wildcard indexes are integers "
                           f"(for example 1,2) (filter {filter})")
        out.append(int(p))
    return out


def partitioning_filters(filters: list[str], wildcards: list[str]) -> list[PartitioningFilter]:
    """``--filter`` values paired in order with ``--wildcards`` values."""
    if len(wildcards) > len(filters):
        raise CLIError(f"{len(wildcards)} --wildcards given for {len(filters)} --filter: "
                       "each --wildcards pairs with one --filter, in order")
    out = []
    for i, f in enumerate(filters):
        if not f:
            raise CLIError("a --filter can't be empty")
        out.append(PartitioningFilter(f, parse_wildcards(wildcards[i] if i < len(wildcards) else None, f)))
    return out


# ---------------------------------------------------------------- stdin


def stdin_is_terminal() -> bool:
    try:
        return sys.stdin is not None and sys.stdin.isatty()
    except (ValueError, OSError):
        return False


def ask(prompt: str) -> str | None:
    """Write ``prompt`` (no newline) to stdout and read one line from stdin; None at end of input."""
    from cg.output import out

    out.write(prompt)
    try:
        line = sys.stdin.readline() if sys.stdin is not None else ""
    except (OSError, ValueError):
        return None
    if line == "":
        return None
    return line.rstrip("\r\n")


async def ask_async(prompt: str) -> str | None:
    """:func:`ask` from a coroutine: stdin is read by a daemon thread, so the connection keeps
    answering server pings while the user thinks, and Ctrl-C is not held up by a pending read."""
    import threading

    loop = asyncio.get_running_loop()
    answer: asyncio.Future = loop.create_future()

    def read() -> None:
        try:
            value = ask(prompt)
        except BaseException as e:  # noqa: BLE001 - handed to the waiting coroutine
            loop.call_soon_threadsafe(lambda: answer.done() or answer.set_exception(e))
        else:
            loop.call_soon_threadsafe(lambda: answer.done() or answer.set_result(value))

    threading.Thread(target=read, name="cg-stdin", daemon=True).start()
    return await answer


DELETE_WARNING = ("WARNING: this operation will cause all existing consumer members to terminate "
                  "consuming are you sure? (y/n): ")


async def confirm_delete(force: bool) -> None:
    """The reference's delete confirmation: only exactly ``y`` proceeds."""
    if force:
        return
    answer = await ask_async(DELETE_WARNING)
    if answer is None or answer.strip() != "y":
        raise Canceled()


# ---------------------------------------------------------------- logging


class _GoLogFormatter(logging.Formatter):
    """``2006/01/02 15:04:05 message`` as Go's log package writes; tracebacks only when debugging."""

    def __init__(self, debug: bool):
        super().__init__("%(asctime)s %(message)s", datefmt="%Y/%m/%d %H:%M:%S")
        self.debug = debug

    def format(self, record: logging.LogRecord) -> str:
        if not self.debug and record.exc_info:
            exc = record.exc_info[1]
            record = logging.makeLogRecord(record.__dict__)
            record.msg = f"{record.getMessage()}: {exc}" if exc else record.getMessage()
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return super().format(record)


def setup_logging() -> None:
    """Library warnings on stderr with a Go-like timestamp; ``CG_DEBUG=1`` shows debug and tracebacks."""
    debug = os.environ.get("CG_DEBUG", "") not in ("", "0", "false")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_GoLogFormatter(debug))
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, "_cg", False):
            root.removeHandler(h)
    handler._cg = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if debug else logging.WARNING)
