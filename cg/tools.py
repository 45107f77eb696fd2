"""Demo helpers behind ``scripts/*.sh`` (the reference's scripts use the nats CLI; these don't).

Hidden ``cg tools`` commands; the usual connection options and ``NATS_*`` env vars apply.

- ``stream-setup``: the stream ``foo`` with subjects ``foo.*`` (or ``--subjects``); ``--static`` adds the subject
  transform ``foo.*`` → ``{{partition(10,1)}}.foo.{{wildcard(1)}}`` static groups need.
- ``traffic``: publishes synchronously (waiting for each ack) to ``foo.<n>``, ``n`` cycling below
  100, one message every 10ms, until Ctrl-C or ``--count`` messages (``nats bench js pub sync foo
  --multisubject --multisubjectmax 100 --sleep 10ms``).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .common import check_names, parse_sleep
from .errors import CLIError, expected
from .help import Command, Group as CommandGroup
from .runtime import runtime

tools_app = typer.Typer(help="demo helpers (stream set-up, traffic)", add_completion=False, cls=CommandGroup)


def static_transform(stream: str, partitions: int) -> tuple[str, str]:
    return f"{stream}.*", f"{{{{partition({partitions},1)}}}}.{stream}.{{{{wildcard(1)}}}}"


@tools_app.command("stream-setup", help="create the demo stream (subjects <stream>.*)", cls=Command)
def stream_setup(
    ctx: typer.Context,
    stream: Annotated[str, typer.Option("--stream", help="stream name; subjects are <stream>.*")] = "foo",
    subjects: Annotated[list[str], typer.Option("--subjects", help="the stream's subjects instead of <stream>.* "
                                                "(repeatable)", show_default=False)] = [],  # noqa: B006
    static: Annotated[bool, typer.Option("--static", help="add the partitioning subject transform "
                                                          "static groups need")] = False,
    partitions: Annotated[int, typer.Option("--partitions", help="partitions of the --static transform")] = 10,
    replicas: Annotated[int, typer.Option("--replicas", help="stream replicas")] = 1,
    memory: Annotated[bool, typer.Option("--memory", help="memory storage instead of file")] = False,
) -> None:
    from .output import out

    check_names(stream=stream)
    if partitions < 1:
        raise CLIError(f"invalid --partitions {partitions}: must be at least 1")
    if static and subjects:
        raise CLIError("--static makes the stream's subjects <stream>.*: give it without --subjects")
    subjects = subjects or [f"{stream}.*"]
    config: dict = {"name": stream, "subjects": subjects, "retention": "limits",
                    "storage": "memory" if memory else "file", "num_replicas": replicas, "discard": "old"}
    transform = static_transform(stream, partitions) if static else None
    if transform:
        config["subject_transform"] = {"src": transform[0], "dest": transform[1]}

    async def body(_nc: Any, api: Any) -> None:
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


@tools_app.command("traffic", help="publish synchronously to <subject>.<n>, n cycling below --max-subjects",
                   cls=Command)
def traffic(
    ctx: typer.Context,
    stream: Annotated[str, typer.Option("--stream", help="stream the publishes must land in")] = "foo",
    subject: Annotated[str, typer.Option("--subject", help="subject prefix (default: the stream name)",
                                         show_default=False)] = "",
    count: Annotated[int, typer.Option("--count", "-n", help="messages to publish (0: until Ctrl-C)")] = 0,
    sleep: Annotated[str, typer.Option("--sleep", help="pause between publishes", metavar="DURATION")] = "10ms",
    max_subjects: Annotated[int, typer.Option("--max-subjects", help="number of distinct subjects")] = 100,
    size: Annotated[int, typer.Option("--size", help="payload size in bytes")] = 128,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no summary line")] = False,
) -> None:
    from .output import go_duration, line_buffered_stdout, out

    check_names(stream=stream)
    prefix = subject or stream
    pause = parse_sleep(sleep)
    if max_subjects < 1:
        raise CLIError(f"invalid --max-subjects {max_subjects}: must be at least 1")
    if count < 0 or size < 0:
        raise CLIError("--count and --size must not be negative")
    rt = runtime(ctx)
    line_buffered_stdout()

    async def body() -> int:
        import asyncio
        import signal

        rc = rt.resolve()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        nc, _ = await rt.connect(reconnect=True)
        sent = 0
        try:
            js = nc.jetstream(**rc.jetstream_kwargs())
            payload = b"x" * size
            while not stop.is_set() and (count == 0 or sent < count):
                await js.publish(f"{prefix}.{sent % max_subjects}", payload, stream=stream,
                                 timeout=rc.timeout)
                sent += 1
                if pause > 0 and (count == 0 or sent < count):
                    try:
                        await asyncio.wait_for(stop.wait(), pause)
                    except asyncio.TimeoutError:
                        pass
        finally:
            await rt.close(nc)
        return sent

    try:
        sent = rt.run(body)
    except Exception as e:  # noqa: BLE001 - nats-py publish errors: one clear line
        if expected(e):
            raise
        raise CLIError(f"publish failed: {e or type(e).__name__}") from None
    if not quiet:
        out.line(f"published {sent} messages to {prefix}.<0..{max_subjects - 1}> "
                 f"(stream {stream}, one every {go_duration(pause)})")

