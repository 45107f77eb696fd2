"""Demo helpers behind ``scripts/*.sh`` (the reference's scripts use the nats CLI; these don't).

``cg tools`` commands; the usual connection options and ``NATS_*`` env vars apply.

- ``stream-setup``: the stream ``foo`` with subjects ``foo.*`` (or ``--subjects``); ``--static`` adds the subject
  transform ``foo.*`` → ``{{partition(10,1)}}.foo.{{wildcard(1)}}`` static groups need; ``stream-rm`` deletes
  streams (the README's clean-up).
- ``clean``: deletes pcgroups' own KV buckets (the groups' configs, the leases of automatic membership),
  each only when it holds nothing: a bucket with a group or a live lease is kept, and said so with the
  way out; and the dead-letter streams of deleted groups that hold no dead letter (``delete`` keeps them). Nothing
  else is looked at: run it when no group is being created (a group written between the look and the delete would
  go with its bucket).
- ``traffic``: publishes synchronously (waiting for each ack, then 10ms) to ``foo.<n>``, ``n`` cycling
  below 100, until Ctrl-C or ``--count`` messages (``nats bench js pub sync foo --multisubject
  --multisubjectmax 100 --sleep 10ms``); through a server restart it waits and publishes again
  (:class:`Publisher`), and its last line has the rate it reached.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from .common import check_names, given, parse_sleep
from .errors import CLIError, expected, warn
from .help import Command
from .help import Group as CommandGroup
from .runtime import runtime

if TYPE_CHECKING:
    import asyncio

    from nats.aio.client import Client
    from nats.js import JetStreamContext

    from pcgroups.jetstream import JetStreamApi

    from .runtime import Runtime

tools_app = typer.Typer(
    help="demo helpers (stream set-up and removal, traffic, clean-up)", add_completion=False, cls=CommandGroup
)


def static_transform(stream: str, partitions: int) -> tuple[str, str]:
    return f"{stream}.*", f"{{{{partition({partitions},1)}}}}.{stream}.{{{{wildcard(1)}}}}"


@tools_app.command("stream-setup", help="create the demo stream (subjects <stream>.*)", cls=Command)
def stream_setup(
    ctx: typer.Context,
    stream: Annotated[str, typer.Option("--stream", help="stream name; subjects are <stream>.*")] = "foo",
    subjects: Annotated[
        list[str],
        typer.Option("--subjects", help="the stream's subjects instead of <stream>.* (repeatable)", show_default=False),
    ] = [],
    static: Annotated[
        bool, typer.Option("--static", help="add the partitioning subject transform static groups need")
    ] = False,
    partitions: Annotated[int, typer.Option("--partitions", help="partitions of the --static transform")] = 10,
    replicas: Annotated[int, typer.Option("--replicas", help="stream replicas")] = 1,
    memory: Annotated[bool, typer.Option("--memory", help="memory storage instead of file")] = False,
) -> None:
    from .output import out

    check_names(stream=stream)
    if partitions < 1:
        raise CLIError(f"invalid --partitions {partitions}: must be at least 1")
    if given(ctx, "partitions") and not static:
        raise CLIError(
            "--partitions is the partition count of --static's subject transform: add --static, or "
            "leave --partitions out"
        )
    if static and subjects:
        raise CLIError("--static makes the stream's subjects <stream>.*: give it without --subjects")
    subjects = subjects or [f"{stream}.*"]
    config: dict = {
        "name": stream,
        "subjects": subjects,
        "retention": "limits",
        "storage": "memory" if memory else "file",
        "num_replicas": replicas,
        "discard": "old",
    }
    transform = static_transform(stream, partitions) if static else None
    if transform:
        config["subject_transform"] = {"src": transform[0], "dest": transform[1]}

    async def body(_nc: Client, api: JetStreamApi) -> None:
        from pcgroups.errors import JetStreamAPIError

        try:
            await api.request(f"STREAM.CREATE.{stream}", config)
        except JetStreamAPIError as e:
            raise CLIError(f"can't create stream {stream}: {e}") from None

    runtime(ctx).with_connection(body)
    text = f"stream {stream} ready: subjects [{' '.join(subjects)}]"
    if transform:
        text += f", subject transform {transform[0]} -> {transform[1]}"
    out.line(text)


@tools_app.command("stream-rm", help="delete streams (what nats str rm -f does)", cls=Command)
def stream_rm(
    ctx: typer.Context,
    streams: Annotated[list[str], typer.Argument(help="the streams to delete", metavar="STREAM", show_default=False)],
) -> None:
    from .output import out

    for stream in streams:
        check_names(stream=stream)

    async def body(_nc: Client, api: JetStreamApi) -> list[str]:
        missing = []
        for stream in streams:
            if await api.delete_stream(stream):
                out.line(f"stream {stream} deleted")
            else:
                missing.append(stream)
        return missing

    missing = runtime(ctx).with_connection(body)
    if missing:
        raise CLIError(
            f"no stream {' '.join(missing)} (the others were deleted)"
            if len(missing) < len(streams)
            else f"no stream {' '.join(missing)}"
        )


@tools_app.command("clean", help="delete pcgroups' KV buckets that hold no group and no lease", cls=Command)
def clean(ctx: typer.Context) -> None:
    from .output import out

    async def body(_nc: Client, api: JetStreamApi) -> tuple[list[str], list[str]]:
        from pcgroups.elastic import LEASE_BUCKET
        from pcgroups.errors import NotFoundError
        from pcgroups.jetstream import ELASTIC_BUCKET, STATIC_BUCKET, snapshot

        deleted, kept = [], []
        groups: set[tuple[str, str]] = set()
        for bucket, kind in ((STATIC_BUCKET, "static"), (ELASTIC_BUCKET, "elastic")):
            try:
                groups |= {(kind, entry.key) for entry in await snapshot(api, bucket)}
            except NotFoundError:
                pass
        deleted += await _empty_dead_letter_streams(api, groups)
        for bucket, kind in ((STATIC_BUCKET, "static"), (ELASTIC_BUCKET, "elastic"), (LEASE_BUCKET, "")):
            try:
                keys = [entry.key for entry in await snapshot(api, bucket)]
            except NotFoundError:
                continue
            if not keys:
                if await api.delete_stream(f"KV_{bucket}"):
                    deleted.append(f"KV bucket {bucket} deleted (stream KV_{bucket})")
                continue
            shown = ", ".join(keys[:3]) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
            if kind:
                way = f"delete them first: cg {kind} delete {' '.join(keys[0].split('.', 1))} ..."
                kept.append(f"KV bucket {bucket} kept: it holds {kind} groups ({shown}); {way}")
            else:
                kept.append(
                    f"KV bucket {bucket} kept: it holds the leases of running --auto instances ({shown}); "
                    "stop them first"
                )
        return deleted, kept

    deleted, kept = runtime(ctx).with_connection(body)
    for line in deleted:
        out.line(line)
    for line in kept:
        warn(line)
    if not deleted and not kept:
        out.line("no pcgroups KV bucket to delete")


async def _empty_dead_letter_streams(api: JetStreamApi, groups: set[tuple[str, str]]) -> list[str]:
    """Delete the dead-letter streams (``<stream>~<group>~<flavour>~dlq``) of groups not in ``groups`` ((flavour,
    ``<stream>.<group>``)) that hold no dead letter; what was deleted."""
    from pcgroups.deadletters import dead_letter_stream, held_dead_letters

    names: list[str] = []
    while True:
        page = await api.request("STREAM.NAMES", {"offset": len(names)})
        names += page.get("streams") or []
        if not page.get("streams") or len(names) >= page.get("total", 0):
            break
    deleted = []
    for name in names:
        parts = name.rsplit("~", 3)
        if len(parts) != 4 or parts[3] != "dlq" or parts[2] not in ("static", "elastic"):
            continue
        stream, group, kind = parts[:3]
        if dead_letter_stream(kind, stream, group) != name or (kind, f"{stream}.{group}") in groups:
            continue  # a long name (hashed), or its group is there
        if await held_dead_letters(api, kind, stream, group) == 0 and await api.delete_stream(name):
            deleted.append(f"dead-letter stream {name} deleted (its {kind} group {group} on {stream} is gone)")
    return deleted


@tools_app.command(
    "traffic", help="publish synchronously to <subject>.<n>, n cycling below --max-subjects", cls=Command
)
def traffic(
    ctx: typer.Context,
    stream: Annotated[str, typer.Option("--stream", help="stream the publishes must land in")] = "foo",
    subject: Annotated[
        str, typer.Option("--subject", help="subject prefix (default: the stream name)", show_default=False)
    ] = "",
    count: Annotated[int, typer.Option("--count", "-n", help="messages to publish (0: until Ctrl-C)")] = 0,
    sleep: Annotated[str, typer.Option("--sleep", help="pause between publishes", metavar="DURATION")] = "10ms",
    max_subjects: Annotated[int, typer.Option("--max-subjects", help="number of distinct subjects")] = 100,
    size: Annotated[int, typer.Option("--size", help="payload size in bytes")] = 128,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress and no summary line")] = False,
) -> None:
    from .output import line_buffered_stdout, out

    check_names(stream=stream)
    pause = parse_sleep(sleep)
    if max_subjects < 1:
        raise CLIError(f"invalid --max-subjects {max_subjects}: must be at least 1")
    if count < 0 or size < 0:
        raise CLIError("--count and --size must not be negative")
    rt = runtime(ctx)
    line_buffered_stdout()
    pub = Publisher(stream, subject or stream, count, pause, max_subjects, size, progress=not quiet)
    try:
        rt.run(pub.run, rt)
    except Exception as e:
        if expected(e):
            raise
        raise CLIError(f"publish failed: {e or type(e).__name__}") from None
    if not quiet:
        out.line(pub.summary())


class Publisher:
    """``cg tools traffic``: synchronous publishes (each waits for the stream's ack), a pause between two.

    A publish that fails (the server restarting, a leader election, a timeout) is sent again, with the
    same ``Nats-Msg-Id`` so the stream keeps one copy, after a back-off of 0.1 s doubling to 2 s; the
    outage and the recovery are said on stderr. With ``progress``, stderr also gets a progress line
    (redrawn in place on a terminal, every :attr:`EVERY` seconds otherwise); :meth:`summary` is the
    last line, with the rate measured."""

    EVERY = 10.0  # seconds between progress lines when stderr is not a terminal
    BACKOFF = (0.1, 2.0)  # first and longest wait before a failed publish is sent again

    def __init__(
        self, stream: str, prefix: str, count: int, pause: float, max_subjects: int, size: int, *, progress: bool
    ) -> None:
        self.stream, self.prefix, self.count, self.pause = stream, prefix, count, pause
        self.max_subjects, self.payload, self.progress = max_subjects, b"x" * size, progress
        self.sent = 0
        self.retries = 0
        self.seconds = 0.0
        self._run_id = ""
        self._last_progress = 0.0

    async def run(self, rt: Runtime) -> int:
        import asyncio
        import secrets
        import signal
        import time

        self._run_id = secrets.token_hex(6)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        rc = rt.resolve()
        nc, _ = await rt.connect(reconnect=True)
        started = self._last_progress = time.monotonic()
        watcher = asyncio.ensure_future(self._watch_connection(nc))
        try:
            js = nc.jetstream(**rc.jetstream_kwargs())
            while not stop.is_set() and (self.count == 0 or self.sent < self.count):
                if not await self._publish(js, rc.timeout, stop):
                    break
                self.sent += 1
                self.seconds = time.monotonic() - started
                self._show_progress()
                if self.pause > 0 and (self.count == 0 or self.sent < self.count):
                    await _wait(stop, self.pause)
        finally:
            watcher.cancel()
            self.seconds = time.monotonic() - started
            self._end_progress()
            await rt.close(nc)
        return self.sent

    async def _watch_connection(self, nc: Client) -> None:
        """Say when the connection is lost (publishing waits) and when it is back."""
        import asyncio
        import time

        lost_at, server = None, nc.connected_url.netloc if nc.connected_url else "the server"
        while True:
            await asyncio.sleep(0.2)
            if lost_at is None and not nc.is_connected:
                lost_at = time.monotonic()
                self._say(
                    f"lost the connection to {server}: reconnecting; publishing goes on once the stream "
                    "answers (Ctrl-C to stop)"
                )
            elif lost_at is not None and nc.is_connected:
                self._say(f"reconnected after {time.monotonic() - lost_at:.1f}s")
                lost_at = None

    async def _publish(self, js: JetStreamContext, timeout: float, stop: asyncio.Event) -> bool:
        """Publish message number :attr:`sent` until the stream acks it (False: stopped first)."""
        import time

        subject = f"{self.prefix}.{self.sent % self.max_subjects}"
        headers = {"Nats-Msg-Id": f"{self._run_id}-{self.sent}"}
        wait, failed_at = self.BACKOFF[0], None
        while True:
            try:
                await js.publish(subject, self.payload, stream=self.stream, timeout=timeout, headers=headers)
            except Exception as e:
                if not _retryable(e, answered=self.sent > 0):
                    raise _publish_error(e, subject, self.stream) from None
                if failed_at is None:
                    failed_at = time.monotonic()
                    self._say(
                        f"publish to {subject} failed ({_reason(e)}): retrying until the stream answers "
                        "(Ctrl-C to stop)"
                    )
                self.retries += 1
                if await _wait(stop, wait):
                    return False
                wait = min(wait * 2, self.BACKOFF[1])
                continue
            if failed_at is not None:
                self._say(f"publishing again after {time.monotonic() - failed_at:.1f}s")
            return True

    def rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        from .output import go_duration

        retried = f", {self.retries} publishes retried" if self.retries else ""
        last = min(self.sent, self.max_subjects) - 1  # the subjects it did publish to
        to = f" to {self.prefix}.0" if last == 0 else f" to {self.prefix}.<0..{last}>" if last > 0 else ""
        return (
            f"published {self.sent} messages{to} (stream {self.stream}) in {self.seconds:.1f}s, "
            f"{self.rate():.0f}/s (each publish waits for its ack, then a {go_duration(self.pause)} pause){retried}"
        )

    def _progress_text(self) -> str:
        return f"published {self.sent} messages ({self.rate():.0f}/s)"

    def _show_progress(self) -> None:
        import time

        if not self.progress:
            return
        now = time.monotonic()
        terminal = _stderr_is_terminal()
        if now - self._last_progress < (0.5 if terminal else self.EVERY):
            return
        self._last_progress = now
        self._write("\r\x1b[K" + self._progress_text() if terminal else self._progress_text() + "\n")

    def _end_progress(self) -> None:
        if self.progress and _stderr_is_terminal():
            self._write("\r\x1b[K")

    def _say(self, text: str) -> None:
        self._end_progress()
        self._write(text + "\n")

    @staticmethod
    def _write(text: str) -> None:
        import sys

        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


def _stderr_is_terminal() -> bool:
    import sys

    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError, OSError):
        return False


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` unless ``stop`` is set first; True when it was."""
    import asyncio

    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return False
    return True


def _retryable(e: BaseException, *, answered: bool) -> bool:
    """A publish error that a server coming back cures. No stream answering is one only once the stream
    has answered (JetStream starting again after a restart); before, the stream does not take the subject."""
    import nats.errors
    import nats.js.errors

    if isinstance(e, (nats.js.errors.NoStreamResponseError, nats.errors.NoRespondersError)):
        return answered
    if isinstance(e, nats.js.errors.APIError):
        from pcgroups.jetstream import ERR_NO_STREAM_MATCHES

        return e.code in (None, 503, 504) and e.err_code != ERR_NO_STREAM_MATCHES
    return isinstance(
        e,
        (
            nats.errors.TimeoutError,
            nats.errors.ConnectionClosedError,
            nats.errors.ConnectionReconnectingError,
            nats.errors.StaleConnectionError,
            nats.errors.OutboundBufferLimitError,
            TimeoutError,
        ),
    )


def _publish_error(e: BaseException, subject: str, stream: str) -> Exception:
    import nats.errors
    import nats.js.errors

    if isinstance(e, (nats.js.errors.NoStreamResponseError, nats.errors.NoRespondersError)):
        return CLIError(
            f"publish to {subject} failed: no stream takes that subject (does stream {stream} exist, "
            "with subjects that match it? --subject sets the prefix)"
        )
    return CLIError(f"publish to {subject} failed: {_reason(e)}")


def _reason(e: BaseException) -> str:
    return str(e).strip() or type(e).__name__
