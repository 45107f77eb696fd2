"""``cg static consume`` / ``cg elastic consume``: join a group as a member and print each message.

Per message (as the reference): ``[<member>] subject=<s>, seq=<n>, pinnedID=<pin>. Processing for
<sleep> ... `` is written and flushed *before* the simulated processing, then the message is
double-acked and the line ends with ``acked`` (or the reference's can-not-be-acknowledged message).
With ``--concurrency K`` > 1 several messages are handled at once, so each gets two whole lines:
``[<member>] subject=<s>, seq=<n>, pinnedID=<pin>. Processing for <sleep> ...`` before and the same
head with ``acked`` (or the message) after.
With ``--fail PATTERN`` a message whose subject matches ends its line (or its second line) with ``failed:
<reason>`` instead: the handler raised, and the library retries it in place; a message given up to the dead-letter
stream (``RetryPolicy.on_dead_letter``: after ``--max-deliver`` attempts, or following its parked key) is one line
``[<member>] subject=<s>, seq=<n> dead-lettered: <reason> (cg ... dead-letters ls STREAM GROUP)``, and the
instance's ``failed`` and ``dead-lettered`` events say nothing more.
Ends with status 0 when the group is deleted or on SIGINT/SIGTERM (after the handler in flight
finishes, which a first Ctrl-C says at once on stderr; a second signal exits at once), 1 with
``cg: error: ...`` when the instance fails.

What the instance is doing is one line per event (``pcgroups.events``), each naming the member:
``[m1] pinned: partitions 0-3``, ``[m1] standby: ...``, ``[m1] lost the pin``, ``[m1] not a member of
the group yet: ...``, ``[m1] added ...``, ``[m1] partitions now 2-3``, ``[m1] dropped ...``,
``[m1] disconnected from <url>``, ``[m1] reconnected to <url>``, ``[auto-1a2b3c4d] joined the group
(automatic membership, ...)``: on stdout in a terminal, on stderr in
a pipe (stdout keeps the reference's lines exactly). A dropped member's instance keeps running and
waits to be added again, as an instance started before its member was added does (an ``--auto``
instance's own leave when it stops is not a drop: nothing is said). A start that finds no server answering
(no connection yet, or JetStream not answering) is said once as ``cg: warning: ...`` at once, and tried again
until it works or Ctrl-C.

One :class:`Printer` owns the output: a status line never lands inside a message line (written in
two parts around the processing): it waits until the line is ended. In a terminal status lines wrap
at its width, before a command in parentheses rather than inside it (:func:`wrap_status`); ``pinned``
is said before the pin's first message line.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .common import ConsumeRequest
from .errors import CLIError, warn
from .output import go_duration, line_buffered_stdout, out, ranges

if TYPE_CHECKING:
    from nats.aio.client import Client

    from pcgroups.consume import ConsumeContext
    from pcgroups.jetstream import JetStreamApi

    from .runtime import Runtime

ACK_WAIT = 2.0  # the reference cg's consumer template: AckWait 2s, MaxAckPending 1, explicit
MAX_ACK_PENDING = 1
# asyncio wakes on the selector's whole milliseconds, late by up to one (5 ms asked: 5.2 ms slept), and
# time.sleep ~0.09 ms late (the kernel's timer slack): the last 1.5 ms of a --sleep is slept blocking
# but for its last 0.1 ms, which is a busy wait
SLEEP_TAIL = 0.0015
SLEEP_SPIN = 0.0001


def consumer_template(max_ack_pending: int = MAX_ACK_PENDING):
    from pcgroups.jetstream import ConsumerConfig

    return ConsumerConfig(max_ack_pending=max_ack_pending, ack_wait=ACK_WAIT, ack_policy="explicit")


class Printer:
    """The one writer of consume's output (see the module docstring); a closed stdout (``| head``)
    stops the instance quietly. ``status_on_stdout``: status lines go to stdout (a terminal), else to
    stderr; ``width``: a terminal's, at which they wrap. Status lines wait until :meth:`ready` (after
    ``consuming...``); any line waits while a message line is open, and lines keep their order.
    """

    def __init__(self, *, status_on_stdout: bool, width: int = 0) -> None:
        self.broken = False
        self.status_on_stdout = status_on_stdout
        self.width = width
        self._open = False  # a message line is started and not ended
        self._begun = ""  # its first part, written again if a line came in between
        self._cut = False  # an interruption ended it early (a terminal)
        self.in_flight = 0  # handlers running (make_handler counts them)
        self._ready = False
        self._header: list[str] = []  # consuming... and the like: before any message line
        self._early: list[tuple[bool, str]] = []  # status lines before ready()
        self._waiting: list[tuple[bool, str]] = []  # (on stdout, line) held while a message line is open

    def expect_header(self, lines: list[str]) -> None:
        """Lines (``consuming...``) said by :meth:`announce`, or before the first message line if that
        comes first: a message handled before the ready check finished never precedes them."""
        self._header = list(lines)

    def announce(self) -> None:
        header, self._header = self._header, []
        for text in header:
            self.line(text)

    def begin(self, text: str) -> bool:
        """The first part of a message line (flushed: the processing comes next)."""
        self._before_message()
        self._open, self._begun, self._cut = True, text, False
        return self._stdout(text)

    def end(self, text: str) -> bool:
        """The end of the open message line (all of it, when an interruption cut it); then the lines that
        waited."""
        written = self._stdout((self._begun if self._cut else "") + text + "\n")
        self._open = self._cut = False
        self._release()
        return written

    def interrupt(self, text: str) -> None:
        """Say ``text`` on stderr at once, even while a message line is open: on a terminal that line is ended
        first (after the ``^C`` the terminal shows) and written whole when its message is done."""
        if self._open and self.status_on_stdout and not self._cut:
            self._cut = self._stdout("\n")
        try:
            sys.stdout.flush()
            print(text, file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass

    def whole(self, text: str) -> bool:
        """A whole message line (handlers running at once write whole lines, never an open one)."""
        self._before_message()
        written = self._stdout(text + "\n")
        self._release()
        return written

    def close(self) -> None:
        """The instance ended: a message line its handler left open ends (an error then has a line of
        its own), and the lines that waited are written."""
        if self._open:
            if not self._cut:
                self._stdout("\n")
            self._open = self._cut = False
        self._release()

    def _before_message(self) -> None:
        """A message line comes: the header first, then the status lines said before it (``pinned``:
        the instance says it before its first handler starts), even before the ready check ended."""
        self.announce()
        self.ready()

    def line(self, text: str) -> None:
        """A whole line of the reference's on stdout (``consuming...``)."""
        self._waiting.append((True, text))
        self._release()

    def status(self, text: str) -> None:
        """A line about the instance (stdout in a terminal, else stderr)."""
        if self.status_on_stdout and self.width:
            text = wrap_status(text, self.width - 1)
        (self._waiting if self._ready else self._early).append((self.status_on_stdout, text))
        self._release()

    def ready(self) -> None:
        """Status lines may be written from now on (those that came before first)."""
        self._ready = True
        self._waiting.extend(self._early)
        self._early.clear()
        self._release()

    def _release(self) -> None:
        while self._waiting and not self._open:
            on_stdout, text = self._waiting.pop(0)
            if on_stdout:
                self._stdout(text + "\n")
                continue
            try:
                sys.stdout.flush()
                print(text, file=sys.stderr, flush=True)
            except (OSError, ValueError):
                pass

    def _stdout(self, text: str) -> bool:
        if self.broken:
            return False
        try:
            out.write(text)
            return True
        except (BrokenPipeError, ValueError, OSError):
            self.broken = True
            return False


def wrap_status(text: str, width: int) -> str:
    """``text`` wrapped at ``width`` with continuation lines indented; a parenthesised part (a command
    to run) moves to the next line whole, unless it alone is wider than a line."""
    import re
    import textwrap

    def wrap(t: str) -> list[str]:
        return textwrap.wrap(t, width, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False)

    lines = wrap(re.sub(r"\([^()]*\)", lambda m: m[0].replace(" ", "\0"), text))
    if any(len(line) > width for line in lines):
        lines = wrap(text)
    return "\n".join(lines).replace("\0", " ") or text


def dead_letter_line(member: str, msg: Any, reason: str, kind: str, stream: str, group: str) -> str:
    """The line of a message dead-lettered (``RetryPolicy.on_dead_letter``): never ``acked``."""
    why = f": {reason}" if reason else ""
    return (
        f"[{member}] subject={msg.subject}, seq={msg.sequence} dead-lettered{why} "
        f"(cg {kind} dead-letters ls {stream} {group})"
    )


#: Events ``consume`` prints no line for: each failed attempt and each dead letter has its message line already.
SAID_BY_MESSAGE_LINES = ("failed", "dead-lettered")


def status_line(ev: Any, stream: str, group: str, kind: str, auto: bool = False) -> str | None:
    """What ``cg ... consume`` says about an :class:`~pcgroups.events.InstanceEvent` (None: nothing, the message
    lines say it)."""
    if ev.kind in SAID_BY_MESSAGE_LINES:
        return None
    m = ev.member
    said = {
        "pinned": f"pinned: partitions {ranges(list(ev.partitions))}",
        "standby": f"standby: another instance of {m} holds the pin",
        "lost-pin": "lost the pin: another instance of it took over",
        "not-a-member": (
            "not a member of the group yet: joining (automatic membership)"
            if auto
            else f"not a member of the group yet: waiting to be added (cg {kind} add {stream} {group} {m})"
        ),
        "added": (
            f"added to the group: partitions {ranges(list(ev.partitions))}"
            if ev.partitions
            else "added to the group: no partition yet (more members than partitions)"
        ),
        "partitions": (
            f"partitions now {ranges(list(ev.partitions))}"
            if ev.partitions
            else "partitions now none (more members than partitions): waiting for one"
        ),
        "dropped": "dropped from the group: this instance keeps running, waiting to be added again (Ctrl-C to stop it)",
        "disconnected": f"disconnected from {ev.detail or 'the server'}",
        "reconnected": f"reconnected to {ev.detail or 'the server'}",
        "worker-joined": _worker_line("joined", ev.detail),
        "worker-left": _worker_line("left", ev.detail),
        "enrolled": f"enrolled: member {ev.detail} hands it messages",
        "no-dispatcher": (
            f"no dispatching member {_alone_for(ev.detail)}: waiting for one (cg {kind} consume "
            f"{stream} {group} MEMBER --dispatch)"
        ),
        "unavailable": f"not started: {ev.detail}; trying again until the server answers (Ctrl-C to stop)",
        "dead-letter-refused": f"dead letter refused: {ev.detail}; the message is held and tried again",
        "terminated": ev.detail,
        "parked": f"parked {ev.detail}",
        "unparked": f"unparked {ev.detail}",
    }
    return f"[{m}] {said.get(ev.kind) or ev.kind + (': ' + ev.detail if ev.detail else '')}"


def _alone_for(detail: str) -> str:
    """``yet`` at a worker's start, ``answered for 2.5s`` once every dispatching member went quiet (the event's detail
    ends ``: none answered for 2.5s``)."""
    _, sep, since = detail.partition(": none answered for ")
    return f"answered for {since}" if sep else "yet"


def _worker_line(verb: str, detail: str) -> str:
    """``worker w1 joined: capacity 2`` from an event's ``w1: capacity 2``."""
    name, _, why = detail.partition(": ")
    return f"worker {name} {verb}" + (f": {why}" if why else "")


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
        time.sleep(left - SLEEP_SPIN)  # noqa: ASYNC251 - holds the loop on purpose, at most SLEEP_TAIL (above)
    while time.monotonic() < deadline:
        pass


class SimulatedFailure(Exception):
    """What the handler raises for a message that ``--fail PATTERN`` names (its subject matches the pattern)."""


def make_handler(
    member: str,
    sleep: float,
    printer: Printer,
    on_broken,
    whole_lines: bool = False,
    group_gone: Callable[[], Awaitable[bool]] | None = None,
    fail: tuple[str, ...] = (),
) -> Any:
    """``whole_lines`` (handlers running at once): the line is written whole before the processing and
    again, ending with ``acked``, after it, so lines of messages handled at once do not mix. ``group_gone``:
    whether the group was deleted, asked when an ack finds no consumer (then nothing is redelivered, and the
    reference's warning that it will be would be wrong). ``fail``: ``--fail`` patterns; a message whose subject
    matches one ends its line (or its second line) with ``failed: <reason>`` instead of ``acked`` and raises
    :class:`SimulatedFailure` (the library retries it, then dead-letters it)."""
    from nats.errors import NoRespondersError

    from pcgroups.errors import SupersededError

    from .common import fails

    sleep_text = go_duration(sleep)

    async def handler(msg) -> None:
        printer.in_flight += 1  # what a first Ctrl-C waits for (Run)
        try:
            seq = msg.sequence
            head = f"[{member}] subject={msg.subject}, seq={seq}, pinnedID={msg.pin_id or ''}. "
            first = f"{head}Processing for {sleep_text} ..."
            if not (printer.whole(first) if whole_lines else printer.begin(first + " ")):
                on_broken()
                return  # not acked: redelivered to whoever carries on
            if sleep > 0:
                await precise_sleep(sleep)
            if msg.superseded:  # another instance may be handling it now: the library's rule is not to ack
                text = (
                    "superseded by a reset (not acked)"
                    if msg.reset_since
                    else "superseded: another instance took over (not acked)"
                )
                if not (printer.whole(f"{head}{text}") if whole_lines else printer.end(text)):
                    on_broken()
                return
            pattern = fails(fail, msg.subject) if fail else None
            if pattern is not None:
                error = SimulatedFailure(f"subject {msg.subject} matches --fail {pattern}")
                text = f"failed: {type(error).__name__}: {error}"
                if not (printer.whole(f"{head}{text}") if whole_lines else printer.end(text)):
                    on_broken()
                    return
                raise error
            try:
                await msg.ack_sync()
            except SupersededError:  # a reset moved the consumer, or a worker's call was taken back: not an error
                text = (
                    "superseded by a reset (not acked)"
                    if msg.reset_since
                    else "superseded: another instance took over (not acked)"
                )
            except NoRespondersError as e:
                if group_gone is not None and await group_gone():
                    text = "not acked: the group was deleted"
                else:
                    text = (
                        f"message seq {seq} can not be acknowledged (most likely because of a membership or "
                        f"pinned id change) it will be or may already have been re-delivered: {e}"
                    )
            except Exception as e:
                text = f"message seq {seq} can not be acknowledged!: {e or type(e).__name__}"
            else:
                text = "acked"
            if not (printer.whole(f"{head}{text}") if whole_lines else printer.end(text)):
                on_broken()
        finally:
            printer.in_flight -= 1

    return handler


class Run:
    """One long-running instance of cg (``consume``, ``worker``): the signals (the first stops the instance
    after its calls in flight, the same one again exits at once), a closed stdout, the wait until it is ready
    (``consuming...``) and its end."""

    def __init__(self, printer: Printer) -> None:
        self.printer = printer
        self.stop_requested = asyncio.Event()
        self.inst: ConsumeContext | None = None
        self.nc: Client | None = None  # the connection setup() made (closed at the end)
        self.on_stop: list[Callable[[], None]] = []  # told when a stop is asked (the health probes)
        self._received: set[int] = set()

    def stop(self) -> None:
        self.stop_requested.set()
        for told in self.on_stop:
            told()
        if self.inst is not None:
            self.inst.stop()

    def _on_signal(self, sig: int) -> None:
        # The same signal again (a second Ctrl-C): don't wait for anything. Another one is no hurry: run as a
        # nats plugin, Ctrl-C ends nats too, and cg then gets SIGTERM for its parent's end (cg/main.py).
        if sig in self._received:
            try:
                sys.stdout.flush()
            except Exception:
                pass
            os._exit(130)
        self._received.add(sig)
        if sig == signal.SIGINT and self.printer.in_flight:  # said at once: the stop waits for them
            n = self.printer.in_flight
            what = "the message" if n == 1 else f"the {n} messages"
            self.printer.interrupt(
                f"cg: stopping after {what} in flight (at most {go_duration(ACK_WAIT)}; Ctrl-C again: now)"
            )
        self.stop()

    async def __call__(
        self,
        rt: Runtime,
        setup: Callable[[], Any],
        *,
        deleted: str | None = None,
        cleanup: Callable[[], None] = lambda: None,
        ready_within: float | None = ACK_WAIT,
    ) -> int:
        """Run ``setup()`` (connects and starts the instance, returns it) until the instance ends; ``deleted``:
        what to say when it ends by itself (the group was deleted); ``consuming...`` once it is ready, or after
        ``ready_within`` anyway (None: only once ready)."""
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass  # not the main thread (in-process tests): Ctrl-C handling is the caller's
        try:
            self.inst = inst = await _unless_stopped(setup(), self.stop_requested)
            if inst is None:
                return 0  # interrupted while setting up
            if self.stop_requested.is_set():
                inst.stop()
            done = asyncio.ensure_future(inst.done())
            if ready_within is None:
                self.printer.ready()  # what it waits for is said before consuming...
            await _wait_ready(inst, done, self.stop_requested, ready_within)
            if not done.done() and not self.stop_requested.is_set():
                self.printer.announce()
            self.printer.ready()
            result = await done
            await inst.stop()  # the handler in flight ends its line first (bounded by AckWait)
            self.printer.close()  # a line it could not end ends here: what follows has a line of its own
            if result is not None:
                raise CLIError(str(result) or type(result).__name__) from None
            if not self.stop_requested.is_set() and deleted:
                print(deleted, file=sys.stderr)
            return 0
        finally:
            if self.inst is not None:
                await self.inst.stop()  # idempotent: returns at once when it has ended
            if self.nc is not None:
                await rt.close(self.nc)
            cleanup()
            for sig in installed:
                loop.remove_signal_handler(sig)
            if self.printer.broken:
                _silence_stdout()


async def consume(rt: Runtime, request: ConsumeRequest) -> int:
    """Run one member instance until the group is deleted, a signal, or an error (raised).

    ``request`` says what to run (:class:`~cg.common.ConsumeRequest`): its concurrency (default: one
    message at a time, max_ack_pending 1), ``dispatch`` (the group's workers run the handler;
    ``keyed.handlers`` caps the messages at the workers, 0: their capacities), ``auto`` (elastic: automatic
    membership with leases of ``lease_ttl`` seconds; ``create``, an ``ElasticSpec``, creates the group first
    if it does not exist), ``metrics_listen`` (the instance's metrics and health probes there:
    cg/metrics.py), ``otel`` (its spans, exported as the ``OTEL_*`` variables say: cg/otel.py). The library
    gets it as one :class:`~pcgroups.consume.ConsumeOptions`. The connection is the runtime's
    (:meth:`Runtime.connect` with reconnection, :meth:`Runtime.close`).
    """
    from pcgroups.consume import ConsumeOptions

    kind, stream, group, member, keyed = request.kind, request.stream, request.group, request.member, request.keyed
    start: Callable[..., Any]
    if kind == "static":
        from pcgroups.static import static_consume as start
    else:
        from pcgroups.elastic import elastic_consume as start

    line_buffered_stdout()
    printer = Printer(status_on_stdout=out.pretty, width=_terminal_width() if out.pretty else 0)
    printer.expect_header(["consuming..."])
    if request.auto:
        printer.status(
            f"[{member}] joined the group (automatic membership, lease TTL {go_duration(request.lease_ttl)})"
        )
    run = Run(printer)
    handler = (
        None
        if request.dispatch
        else make_handler(
            member,
            request.sleep,
            printer,
            run.stop,
            whole_lines=keyed.handlers > 1,
            group_gone=lambda: _group_deleted(run.nc, kind, stream, group),
            fail=request.failures.patterns,
        )
    )
    from .otel import traced_by_env

    tracing, finish = traced_by_env(request.otel)
    served = None  # --metrics-listen: the metrics, the probes and their server
    told = None  # the metrics' own event callback
    retry = None
    if request.metrics_listen is not None:  # "" is a bad address, not no address
        from .metrics import instance_metrics

        served = instance_metrics(kind, stream, group, member, request.metrics_listen)
        told, retry = served.on_event, served.retry
        run.on_stop.append(served.health.stopping)
        if handler is not None:
            handler = served.metrics.wrap(handler)

    def on_event(ev: Any) -> None:
        said = status_line(ev, stream, group, kind, request.auto)
        if said is None:
            pass
        elif ev.kind == "unavailable":  # said at once: status lines wait for "consuming..."
            warn(said)
        else:
            printer.status(said)
        if told is not None:
            told(ev)

    def on_dead_letter(msg: Any, reason: str) -> None:
        printer.line(dead_letter_line(member, msg, reason, kind, stream, group))

    retry = request.failures.policy(retry, on_dead_letter)

    options = ConsumeOptions(
        handler=handler,
        config=consumer_template(keyed.max_ack_pending),
        concurrency=1 if request.dispatch else keyed.handlers,
        key=keyed.key(),
        retry=retry,
        on_event=on_event,
        tracing=tracing,
        dispatch=request.dispatch,
        max_in_flight=keyed.handlers if request.dispatch else 0,
    )
    auto = {"auto": True, "lease_ttl": request.lease_ttl, "create": request.create} if request.auto else {}

    async def setup():
        nc, api = await _connect_patiently(rt)
        run.nc = nc
        await _check_key_tokens(nc, api, kind, stream, group, keyed.key_tokens)
        inst = await start(nc, stream, group, member, api=api, options=options, **auto)
        if served is not None:
            served.readiness.attach(nc, inst)
            served.health.check()
            served.metrics.watch_dead_letters(inst.dead_letter_status)
            if request.dispatch:
                served.metrics.watch_pool(asyncio.get_running_loop(), inst.pool_status)
        return inst

    def cleanup() -> None:
        if served is not None:
            served.health.stop()
            served.server.shutdown()
        finish()

    return await run(
        rt, setup, deleted=f"{kind} consumer group {group} on stream {stream} was deleted", cleanup=cleanup
    )


async def work(
    rt: Runtime,
    kind: str,
    stream: str,
    group: str,
    name: str,
    sleep: float,
    capacity: int,
    *,
    otel: bool = False,
    fail: tuple[str, ...] = (),
) -> int:
    """``cg static|elastic worker``: a worker of the group's pool (pcgroups.pool._worker) until a signal (it finishes
    the calls it holds first) or an error; it prints the messages as ``consume`` does; ``otel``: a span per
    call, exported as the ``OTEL_*`` variables say (cg/otel.py); ``fail``: ``--fail`` patterns (its dispatching
    member retries such a message, then dead-letters it)."""
    from pcgroups.pool import serve_worker

    from .otel import traced_by_env

    line_buffered_stdout()
    printer = Printer(status_on_stdout=out.pretty, width=_terminal_width() if out.pretty else 0)
    printer.expect_header(["consuming..."])
    run = Run(printer)
    handler = make_handler(name, sleep, printer, run.stop, whole_lines=capacity > 1, fail=fail)
    tracing, finish = traced_by_env(otel)

    async def setup():
        nc, api = await _connect_patiently(rt)
        run.nc = nc
        await _group_there(nc, api, kind, stream, group)
        return await serve_worker(
            nc,
            kind,
            stream,
            group,
            handler,
            name=name,
            capacity=capacity,
            ack_wait=ACK_WAIT,
            on_event=lambda ev: _say(printer, status_line(ev, stream, group, kind)),
            tracing=tracing,
        )

    return await run(
        rt,
        setup,
        deleted=f"{kind} consumer group {group} on stream {stream} was deleted",
        cleanup=finish,
        ready_within=None,
    )


def _say(printer: Printer, line: str | None) -> None:
    if line is not None:
        printer.status(line)


async def _connect_patiently(rt: Runtime) -> tuple[Any, Any]:
    """The runtime's connection (reconnecting for good once made); while no server answers, tried again every
    RECONNECT_TIME_WAIT (2 s), said once: a consume started while its server restarts waits for it."""
    from pcgroups.connect import RECONNECT_TIME_WAIT, ServerUnreachableError

    told = False
    while True:
        try:
            return await rt.connect(reconnect=True)
        except ServerUnreachableError as e:
            if not told:
                told = True
                warn(f"{e}; trying again every {RECONNECT_TIME_WAIT:g}s until it answers (Ctrl-C to stop)")
        await asyncio.sleep(RECONNECT_TIME_WAIT)


async def _group_there(nc: Client, api: JetStreamApi, kind: str, stream: str, group: str) -> None:
    """A worker of a group that does not exist would wait for a dispatcher for ever: one error line instead. A
    worker's role may not read configs (docs/SECURITY.md): then it is not checked."""
    from pcgroups.elastic import get_elastic_config
    from pcgroups.errors import NotFoundError, PermissionDeniedError
    from pcgroups.static import get_static_config

    try:
        await (get_static_config if kind == "static" else get_elastic_config)(nc, stream, group, api=api)
    except NotFoundError as e:
        hint = "" if "(" in str(e) else f" (cg {kind} ls {stream} lists the groups)"
        raise CLIError(f"{e}{hint}") from None
    except PermissionDeniedError:
        pass


async def _group_deleted(nc: Client | None, kind: str, stream: str, group: str) -> bool:
    """Whether the group is gone (when it can't be told, or not connected yet: no)."""
    from pcgroups.elastic import get_elastic_config
    from pcgroups.errors import NotFoundError
    from pcgroups.static import get_static_config

    if nc is None:
        return False
    try:
        await (get_static_config if kind == "static" else get_elastic_config)(nc, stream, group)
    except NotFoundError:
        return True
    except Exception:
        return False
    return False


async def _check_key_tokens(
    nc: Client, api: JetStreamApi, kind: str, stream: str, group: str, positions: tuple[int, ...]
) -> None:
    """Warn once (``cg: warning:``) when ``--key-tokens`` names a token past the subjects the handler sees: the
    group's filters, or without filters its streams' subjects (static: as the stream's transform writes them,
    the partition token stripped); a group not readable yet (created by ``--create``, a broken config) is
    the instance's to report."""
    if not positions:
        return
    from .common import key_tokens_beyond

    try:
        subjects = await _handler_subjects(nc, api, kind, stream, group)
    except Exception:
        return
    message = key_tokens_beyond(positions, subjects)
    if message:
        warn(message)


async def _handler_subjects(nc: Client, api: JetStreamApi, kind: str, stream: str, group: str) -> list[str]:
    """Patterns of the subjects a member's handler gets (the partition token stripped)."""
    if kind == "static":
        from pcgroups.static import get_static_config

        filters = list((await get_static_config(nc, stream, group, api=api)).filters or [])
        if filters:
            return filters
        config = (await api.stream_info(stream))["config"]
        dests = [
            t["dest"]
            for t in [config.get("subject_transform") or {}]
            + [t for src in config.get("sources") or [] for t in src.get("subject_transforms") or []]
            if t.get("dest")
        ]
        stored = dests or list(config.get("subjects") or [])  # the subjects as stored, partition first
        return [
            ".".join("*" if t.startswith("{{") else t for t in subject.split(".")[1:])
            for subject in stored
            if "." in subject
        ]
    from pcgroups.elastic import get_elastic_config, get_elastic_layout

    cfg = await get_elastic_config(nc, stream, group, api=api)
    if cfg.partitioning_filters:
        return [pf.filter for pf in cfg.partitioning_filters]
    subjects: list[str] = []
    for source in (await get_elastic_layout(nc, stream, group, api=api)).streams:
        subjects += (await api.stream_info(source.name))["config"].get("subjects") or [">"]
    return subjects


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
    except (asyncio.CancelledError, Exception):
        return None
    if inst is not None:
        await inst.stop()
    return None


async def _wait_ready(inst, done: asyncio.Future, stop: asyncio.Event, timeout: float | None) -> None:
    """Until the instance is attached to its consumer (a member owning no partition yet never is:
    give up after ``timeout``), it ended, or a stop was asked."""
    waiters = [asyncio.ensure_future(inst.wait_for_consuming(timeout)), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait([*waiters, done], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
        for w in waiters:
            try:
                await w
            except (asyncio.CancelledError, Exception):
                pass


def _terminal_width() -> int:
    import shutil

    return shutil.get_terminal_size((80, 24)).columns


def _silence_stdout() -> None:
    """After a broken pipe, point fd 1 at /dev/null so the final flush can't fail noisily."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
