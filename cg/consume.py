"""``cg static consume`` / ``cg elastic consume``: join a group as a member and print each message.

Per message (as the reference): ``[<member>] subject=<s>, seq=<n>, pinnedID=<pin>. Processing for
<sleep> ... `` is written and flushed *before* the simulated processing, then the message is
double-acked and the line ends with ``acked`` (or the reference's can-not-be-acknowledged message).
Ends with status 0 when the group is deleted or on SIGINT/SIGTERM (after the handler in flight
finishes; a second signal exits at once), 1 with ``cg: error: ...`` when the instance fails.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any

from pcgroups.connect import ConnectionOptions

from .common import CLIError, close_quietly, resolve_connection
from .output import go_duration, line_buffered_stdout, out

ACK_WAIT = 2.0          # the reference cg's consumer template: AckWait 2s, MaxAckPending 1, explicit
MAX_ACK_PENDING = 1
# asyncio wakes on the selector's whole milliseconds, late by up to one (5 ms asked: 5.2 ms slept), and
# time.sleep ~0.09 ms late (the kernel's timer slack): the last 1.5 ms of a --sleep is slept blocking
# but for its last 0.1 ms, which is a busy wait
SLEEP_TAIL = 0.0015
SLEEP_SPIN = 0.0001


def consumer_template():
    from pcgroups.jsapi import ConsumerConfig

    return ConsumerConfig(max_ack_pending=MAX_ACK_PENDING, ack_wait=ACK_WAIT, ack_policy="explicit")


class _Printer:
    """Writes the per-message lines; a closed stdout (``| head``) stops the instance quietly."""

    def __init__(self) -> None:
        self.broken = False

    def write(self, text: str) -> bool:
        if self.broken:
            return False
        try:
            out.write(text)
            return True
        except (BrokenPipeError, ValueError, OSError):
            self.broken = True
            return False


async def precise_sleep(seconds: float) -> None:
    """Sleep ``seconds`` as the reference's Go ``time.Sleep`` does (it simulates work: a comparison of
    tools expects the same work). The event loop runs for all but the last ``SLEEP_TAIL`` (1.5 ms),
    which holds the loop: never longer than that (pin keep-alives come every PinnedTTL/3, 0.67 s with
    cg's AckWait)."""
    deadline = time.monotonic() + seconds
    if seconds > SLEEP_TAIL:
        await asyncio.sleep(seconds - SLEEP_TAIL)
    left = deadline - time.monotonic()
    if left > SLEEP_SPIN:
        time.sleep(left - SLEEP_SPIN)
    while time.monotonic() < deadline:
        pass


def make_handler(member: str, sleep: float, printer: _Printer, on_broken) -> Any:
    from nats.errors import NoRespondersError

    sleep_text = go_duration(sleep)

    async def handler(msg) -> None:
        seq = msg.sequence
        if not printer.write(f"[{member}] subject={msg.subject}, seq={seq}, pinnedID={msg.pin_id or ''}. "
                             f"Processing for {sleep_text} ... "):
            on_broken()
            return  # not acked: redelivered to whoever carries on
        if sleep > 0:
            await precise_sleep(sleep)
        try:
            await msg.ack_sync()
        except NoRespondersError as e:
            text = (f"message seq {seq} can not be acknowledged (most likely because of a membership or "
                    f"pinned id change) it will be or may already have been re-delivered: {e}")
        except Exception as e:  # noqa: BLE001 - reported as the reference does, then carry on
            text = f"message seq {seq} can not be acknowledged!: {e or type(e).__name__}"
        else:
            text = "acked"
        if not printer.write(text + "\n"):
            on_broken()

    return handler


def run_consume(opts: ConnectionOptions, kind: str, stream: str, group: str, member: str, sleep: float,
                **kw: Any) -> int:
    """Run :func:`consume` on an event loop of its own: uvloop's when it is installed (the ``uvloop``
    extra: about a fifth less CPU per message, BENCHMARKS.md P7) unless ``CG_EVENT_LOOP=asyncio``."""
    factory = None
    if os.environ.get("CG_EVENT_LOOP", "").lower() != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(consume(opts, kind, stream, group, member, sleep, **kw))


async def consume(opts: ConnectionOptions, kind: str, stream: str, group: str, member: str,
                  sleep: float, *, auto: bool = False, lease_ttl: float = 5.0) -> int:
    """Run one member instance until the group is deleted, a signal, or an error (raised).

    ``auto`` (elastic): automatic membership with instance leases of ``lease_ttl`` seconds.
    """
    from pcgroups.connect import connect
    from pcgroups.jsapi import JetStreamApi

    if kind == "static":
        from pcgroups.static import static_consume as start
    else:
        from pcgroups.elastic import elastic_consume as start

    line_buffered_stdout()
    loop = asyncio.get_running_loop()
    stop_requested = asyncio.Event()
    signals = 0
    inst = None

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals > 1:  # a second Ctrl-C: don't wait for anything
            try:
                sys.stdout.flush()
            except Exception:  # noqa: BLE001
                pass
            os._exit(130)
        stop_requested.set()
        if inst is not None:
            inst.stop()

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (in-process tests): Ctrl-C handling is the caller's

    printer = _Printer()

    def on_broken() -> None:
        stop_requested.set()
        if inst is not None:
            inst.stop()

    handler = make_handler(member, sleep, printer, on_broken)
    nc = None
    try:
        rc = resolve_connection(opts)

        async def setup():
            nonlocal nc
            nc = await connect(rc, reconnect=True)
            api = JetStreamApi(nc, domain=rc.js_domain, timeout=rc.timeout)
            extra = {"auto": True, "lease_ttl": lease_ttl} if auto else {}
            return await start(nc, stream, group, member, handler, config=consumer_template(), api=api, **extra)

        inst = await _unless_stopped(setup(), stop_requested)
        if inst is None:
            return 0  # interrupted while setting up
        if stop_requested.is_set():
            inst.stop()
        done = asyncio.ensure_future(inst.done())
        await _wait_ready(inst, done, stop_requested)
        if not done.done() and not stop_requested.is_set():
            if auto:
                printer.write(f"joined as member {member} (automatic membership, lease TTL {go_duration(lease_ttl)})\n")
            printer.write("consuming...\n")
        result = await done
        if result is not None:
            raise CLIError(str(result) or type(result).__name__) from None
        if not stop_requested.is_set():
            print(f"{kind} consumer group {group} on stream {stream} was deleted", file=sys.stderr)
        return 0
    finally:
        if inst is not None:
            await inst.stop()  # idempotent: returns at once when it has ended
        if nc is not None:
            await close_quietly(nc)
        for sig in installed:
            loop.remove_signal_handler(sig)
        if printer.broken:
            _silence_stdout()


async def _unless_stopped(coro, stop: asyncio.Event):
    """The coroutine's result, or None if ``stop`` is set first (the coroutine is canceled)."""
    task = asyncio.ensure_future(coro)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        return task.result()
    task.cancel()
    try:
        inst = await task
    except (asyncio.CancelledError, Exception):  # noqa: BLE001 - we are stopping anyway
        return None
    if inst is not None:
        await inst.stop()
    return None


async def _wait_ready(inst, done: asyncio.Future, stop: asyncio.Event) -> None:
    """Until the instance is attached to its consumer (a member owning no partition yet never is:
    give up after AckWait), it ended, or a stop was asked."""
    waiters = [asyncio.ensure_future(inst.wait_for_consuming(ACK_WAIT)), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait([*waiters, done], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        for w in waiters:
            try:
                await w
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - only the wait matters here
                pass


def _silence_stdout() -> None:
    """After a broken pipe, point fd 1 at /dev/null so the final flush can't fail noisily."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
