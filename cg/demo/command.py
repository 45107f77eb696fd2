"""``cg demo`` itself: its options, running :func:`demo` (a :class:`~cg.demo.run.Demo`, its view and its
summary) and ending it cleanly on Ctrl-C (status 130, every process it started stopped)."""

from __future__ import annotations

import asyncio
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from .script import CLUSTER_DURATION, DEFAULT_DURATION, DEFAULT_RATE, MAX_RATE, MIN_DURATION, MIN_RATE, DemoResult

if TYPE_CHECKING:
    from rich.console import Console


async def demo(
    *,
    duration: float = DEFAULT_DURATION,
    console: Console | None = None,
    rate: float = DEFAULT_RATE,
    ack_wait: float | None = None,
    work: float = 0.005,
    live: bool | None = None,
    cluster: bool = False,
) -> DemoResult:
    """Run the demo; returns what it found. ``live``: the live view (default: the console is a terminal);
    ``cluster``: on a 3-node cluster, with a node kill."""
    from rich.console import Console

    from .run import Demo
    from .summary import print_summary
    from .view import View

    console = console or Console()
    d = Demo(duration=duration, console=console, rate=rate, ack_wait=ack_wait, work=work, live=live, cluster=cluster)
    view = View(d)
    live_ctx = None
    refresher: asyncio.Task | None = None
    try:
        if d.live_view:
            from rich.live import Live

            live_ctx = Live(
                view.render(),
                console=console,
                auto_refresh=False,
                transient=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            live_ctx.start()
        refresher = asyncio.create_task(view.refresh_loop(live_ctx))
        await d.setup()
        await d.run()
        await d.stop_workers()  # every call ends and is recorded before the checks
        result = d.check()
        refresher.cancel()
        if live_ctx is not None:
            live_ctx.update(view.render(), refresh=True)
            live_ctx.stop()
            live_ctx = None
        print_summary(console, result, d.plan.ack_wait if d.plan else None)
        return result
    finally:
        if refresher is not None:
            refresher.cancel()
        if live_ctx is not None:
            live_ctx.stop()
        await d.cleanup()


async def run_demo(
    *,
    duration: float = DEFAULT_DURATION,
    console: Console | None = None,
    rate: float = DEFAULT_RATE,
    ack_wait: float | None = None,
    live: bool | None = None,
    cluster: bool = False,
) -> int:
    """Run the demo and return its exit code: 0 when every check passed, 1 otherwise."""
    from rich.console import Console
    from rich.text import Text

    console = console or Console()
    try:
        result = await demo(
            duration=duration, console=console, rate=rate, ack_wait=ack_wait, live=live, cluster=cluster
        )
    except (asyncio.CancelledError, KeyboardInterrupt):
        raise
    except Exception as e:  # setup failed (no nats-server binary, a port, ...): one clear line
        console.print(Text(f"cg demo: error: {e}", style="bold red"), soft_wrap=True)
        return 1
    return result.exit_code


def demo_command(
    duration: Annotated[
        str | None,
        typer.Option(
            "--duration",
            metavar="DURATION",
            help="the longest the demo runs: it ends once the groups caught up "
            "after the traffic (a Go duration like 40s; "
            "every phase scales with it; at least 8s; default "
            f"{DEFAULT_DURATION:g}s, {CLUSTER_DURATION:g}s with "
            "--cluster)",
        ),
    ] = None,
    rate: Annotated[
        float,
        typer.Option(
            "--rate",
            metavar="PER-SECOND",
            help=f"messages per second to publish, both streams together ({MIN_RATE:g} to {MAX_RATE:g})",
        ),
    ] = DEFAULT_RATE,
    cluster: Annotated[
        bool,
        typer.Option(
            "--cluster", help="run on a 3-node JetStream cluster (R3 streams) and also SIGKILL the stream leader's node"
        ),
    ] = False,
) -> None:
    """Run partitioned consumer groups on an embedded nats-server: a live view, a SIGKILL failover, elastic
    membership changes, and a summary that checks order, exclusivity and no loss."""
    from rich.console import Console

    from ..common import parse_duration_option
    from ..errors import CLIError

    if duration is None:
        duration = f"{CLUSTER_DURATION if cluster else DEFAULT_DURATION:g}s"
    seconds = parse_duration_option("--duration", duration, minimum=MIN_DURATION)
    if not MIN_RATE <= rate <= MAX_RATE:
        raise CLIError(f"invalid --rate {rate:g}: must be between {MIN_RATE:g} and {MAX_RATE:g} messages per second")
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=80)  # a log or a pipe: the 80 columns the summary is made for
    try:
        code = asyncio.run(run_demo(duration=seconds, console=console, rate=rate, cluster=cluster))
    except KeyboardInterrupt:
        sys.stderr.write("cg demo: interrupted (every process it started was stopped)\n")
        raise typer.Exit(130) from None
    raise typer.Exit(code)


def register(app: typer.Typer, name: str = "demo") -> None:
    """Add ``cg demo`` to the root app."""
    from ..help import Command

    app.command(name, help=DEMO_HELP, cls=Command)(demo_command)


DEMO_HELP = (
    "run partitioned consumer groups on an embedded nats-server: live view, failover, membership "
    "changes and a checked summary"
)

__all__ = ["DEMO_HELP", "demo", "demo_command", "register", "run_demo"]
