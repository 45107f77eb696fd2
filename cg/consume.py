"""``cg static consume`` / ``cg elastic consume``: join a group as a member and print each message.

Per message (as the reference): ``[<member>] subject=<s>, seq=<n>, pinnedID=<pin>. Processing for
<sleep> ... `` is written and flushed *before* the simulated processing, then the message is
double-acked and the line ends with ``acked`` (or the reference's can-not-be-acknowledged message).
With ``--concurrency K`` > 1 several messages are handled at once, so each gets two whole lines:
``[<member>] subject=<s>, seq=<n>, pinnedID=<pin>. Processing for <sleep> ...`` before and the same
head with ``acked`` (or the message) after.
Ends with status 0 when the group is deleted or on SIGINT/SIGTERM (after the handler in flight
finishes; a second signal exits at once), 1 with ``cg: error: ...`` when the instance fails.

An elastic member's changes of membership are said on stderr (stdout keeps the reference's lines):
not a member yet (waiting to be added), added (its partitions), its partitions changed, dropped. A
dropped member's instance keeps running and waits to be added again, as an instance started before its
member was added does (:class:`_MembershipNotes`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from .common import ConsumeConcurrency
from .errors import CLIError
from .output import go_duration, line_buffered_stdout, out

if TYPE_CHECKING:
    from .runtime import Runtime

ACK_WAIT = 2.0          # the reference cg's consumer template: AckWait 2s, MaxAckPending 1, explicit
MAX_ACK_PENDING = 1
# asyncio wakes on the selector's whole milliseconds, late by up to one (5 ms asked: 5.2 ms slept), and
# time.sleep ~0.09 ms late (the kernel's timer slack): the last 1.5 ms of a --sleep is slept blocking
# but for its last 0.1 ms, which is a busy wait
SLEEP_TAIL = 0.0015
SLEEP_SPIN = 0.0001


def consumer_template(max_ack_pending: int = MAX_ACK_PENDING):
    from pcgroups.jsapi import ConsumerConfig

    return ConsumerConfig(max_ack_pending=max_ack_pending, ack_wait=ACK_WAIT, ack_policy="explicit")


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


def make_handler(member: str, sleep: float, printer: _Printer, on_broken, whole_lines: bool = False) -> Any:
    """``whole_lines`` (handlers running at once): the line is written whole before the processing and
    again, ending with ``acked``, after it, so lines of messages handled at once do not mix."""
    from nats.errors import NoRespondersError

    sleep_text = go_duration(sleep)

    async def handler(msg) -> None:
        seq = msg.sequence
        head = f"[{member}] subject={msg.subject}, seq={seq}, pinnedID={msg.pin_id or ''}. "
        if not printer.write(f"{head}Processing for {sleep_text} ..." + ("\n" if whole_lines else " ")):
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
        if not printer.write(f"{head}{text}\n" if whole_lines else text + "\n"):
            on_broken()

    return handler


async def consume(rt: Runtime, kind: str, stream: str, group: str, member: str,
                  sleep: float, *, auto: bool = False, lease_ttl: float = 5.0, create: Any = None,
                  concurrency: ConsumeConcurrency | None = None, metrics_listen: str | None = None) -> int:
    """Run one member instance until the group is deleted, a signal, or an error (raised).

    ``auto`` (elastic): automatic membership with instance leases of ``lease_ttl`` seconds; ``create``
    (an ``ElasticSpec``) creates the group first if it does not exist; ``concurrency``: the handlers at
    once, their key and max_ack_pending (default: one at a time, max_ack_pending 1); ``metrics_listen``:
    serve the instance's metrics there (cg/metrics.py). The connection is the runtime's
    (:meth:`Runtime.connect` with reconnection, :meth:`Runtime.close`).
    """
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

    keyed = concurrency or ConsumeConcurrency()
    handler = make_handler(member, sleep, printer, on_broken, whole_lines=keyed.handlers > 1)
    metrics_server, metrics_kwargs = None, {}
    nc = None
    try:
        if metrics_listen:
            from .metrics import instance_metrics

            metrics, metrics_server, metrics_kwargs = instance_metrics(kind, stream, group, member, metrics_listen,
                                                                       start)
            handler = metrics.wrap(handler)

        async def setup():
            nonlocal nc
            nc, api = await rt.connect(reconnect=True)
            extra = {"auto": True, "lease_ttl": lease_ttl, "create": create} if auto else {}
            extra.update(metrics_kwargs)
            return await start(nc, stream, group, member, handler, config=consumer_template(keyed.max_ack_pending),
                               concurrency=keyed.handlers, key=keyed.key(), api=api, **extra)

        inst = await _unless_stopped(setup(), stop_requested)
        if inst is None:
            return 0  # interrupted while setting up
        if stop_requested.is_set():
            inst.stop()
        done = asyncio.ensure_future(inst.done())
        await _wait_ready(inst, done, stop_requested)
        notes = None
        if not done.done() and not stop_requested.is_set():
            if auto:
                printer.write(f"joined as member {member} (automatic membership, lease TTL {go_duration(lease_ttl)})\n")
            printer.write("consuming...\n")
            if kind == "elastic" and not auto:
                notes = _MembershipNotes(inst.api, stream, group, member)
                notes.start()
        try:
            result = await done
        finally:
            if notes is not None:
                notes.stop()
        if result is not None:
            raise CLIError(str(result) or type(result).__name__) from None
        if not stop_requested.is_set():
            print(f"{kind} consumer group {group} on stream {stream} was deleted", file=sys.stderr)
        return 0
    finally:
        if inst is not None:
            await inst.stop()  # idempotent: returns at once when it has ended
        if nc is not None:
            await rt.close(nc)
        if metrics_server is not None:
            metrics_server.shutdown()
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


class _MembershipNotes:
    """Says on stderr when an elastic instance's member is not (yet) a member, is added, sees its partitions
    change or is dropped: from a watch of the group's config (every change, however short)."""

    def __init__(self, api: Any, stream: str, group: str, member: str) -> None:
        self.api, self.stream, self.group, self.member = api, stream, group, member
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def note(self, before: tuple[bool, list[int]] | None, now: tuple[bool, list[int]], members: int,
             partitions: int) -> str | None:
        """The line for a change of (in the membership, partitions), None when there is nothing to say."""
        from .output import ranges

        was_in, had = before if before is not None else (None, None)
        is_in, has = now
        where = f"elastic consumer group {self.group} on stream {self.stream}"
        if not is_in:
            if was_in is None:
                return (f"member {self.member} is not a member of {where} yet: waiting to be added "
                        f"(cg elastic add {self.stream} {self.group} {self.member})")
            if was_in:
                return (f"member {self.member} was dropped from {where}: this instance keeps running, waiting to "
                        "be added again (Ctrl-C to stop it)")
            return None
        if not has:
            if had or was_in is not True:
                return (f"member {self.member} of {where} owns no partition ({members} members for {partitions} "
                        "partitions): waiting for one")
            return None
        if was_in is not True:
            if was_in is None:
                return None  # a member from the start: consuming... says it
            return f"member {self.member} was added to {where}: partitions {ranges(has)}"
        if had != has:
            return f"member {self.member} of {where}: partitions {ranges(had or [])} -> {ranges(has)}"
        return None

    async def _run(self) -> None:
        from pcgroups.elastic import stored_config
        from pcgroups.partitions import member_partitions
        from pcgroups.store import ELASTIC_BUCKET, group_key, open_bucket

        kv = await open_bucket(self.api, ELASTIC_BUCKET, kind="elastic")
        watcher = await kv.watch(group_key(self.stream, self.group))
        before: tuple[bool, list[int]] | None = None
        shape: int | None = None   # the partition count: a change of it ends the instance, which says so
        try:
            async for entry in watcher:
                if entry is None or entry.operation in ("DEL", "PURGE") or not entry.value:
                    continue  # the end of the initial values, or the group deleted (the instance says so)
                try:
                    cfg = stored_config(self.stream, self.group, entry.value)
                except Exception:  # noqa: BLE001 - an invalid config ends the instance, which reports it
                    continue
                if shape is not None and cfg.max_members != shape:
                    continue
                shape = cfg.max_members
                now = (cfg.is_in_membership(self.member), member_partitions(
                    max_members=cfg.max_members, members=cfg.members, member_mappings=cfg.member_mappings,
                    member=self.member))
                if now != before:
                    text = self.note(before, now, len(cfg.members) + len(cfg.member_mappings), cfg.max_members)
                    if text:
                        _say(text)
                    before = now
        finally:
            await watcher.stop()


def _say(text: str) -> None:
    try:
        sys.stdout.flush()
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _silence_stdout() -> None:
    """After a broken pipe, point fd 1 at /dev/null so the final flush can't fail noisily."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
