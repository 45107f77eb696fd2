"""``cg metrics``: serve the groups' state on ``/metrics`` for Prometheus (docs/OPERATIONS.md), and
the ``--metrics-listen`` of ``cg ... consume``; both serve the health probes ``/healthz`` and ``/readyz``
too (:mod:`pcgroups.ops._health`, docs/DEPLOYMENT.md).

- :func:`parse_listen` reads ``HOST:PORT`` (``:PORT`` for every interface, ``[::1]:PORT``) and
  :func:`serve` opens the HTTP server on it; both fail with one line naming what is wrong.
- :func:`run_exporter` connects (reconnecting forever), serves :class:`pcgroups.ops._exporter.GroupsExporter`
  and refreshes it every ``--interval`` until Ctrl-C/SIGTERM (exit 0). One line on stdout says where
  it listens, one on stderr what it reads (the server without its secret); a stream named that neither
  exists nor has a group is one warning at start; a refresh that fails, and the next that works
  again, are one line each on stderr. It is ready (``/readyz``) while its last refresh worked and is
  recent (:func:`exporter_readiness`).
- :func:`instance_metrics`: ``consume --metrics-listen``, the instance's own metrics
  (:mod:`pcgroups.ops._metrics`) and its probes (:class:`pcgroups.ops._health.InstanceReadiness`) served from its
  process.
- :func:`require_client`: without the ``metrics`` extra, one line saying how to install it.

Nothing printed names a secret: the server is shown with :func:`pcgroups.connect.redact`.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer

from .errors import CLIError, warn

if TYPE_CHECKING:
    from pcgroups.jetstream import JetStreamApi
    from pcgroups.ops import GroupStatus

    from .runtime import Runtime

DEFAULT_LISTEN = "127.0.0.1:9330"
REFRESH_GRACE = 10.0  # the exporter is ready while its last good refresh is at most 2 intervals + this old
INSTALL_HINT = "the Prometheus client is not installed: pip install 'pcgroups[metrics]'"


def require_client() -> None:
    """The ``metrics`` extra is installed, else a :class:`CLIError` saying how to install it."""
    try:
        import prometheus_client  # noqa: F401 - imported to learn whether it is installed
    except ImportError:
        raise CLIError(INSTALL_HINT) from None


def parse_listen(flag: str, text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); ``:PORT`` listens on every interface."""
    host, sep, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if (
        not sep
        or not port.isdigit()
        or not 1 <= int(port) <= 65535
        or (":" in host and not bracketed)
        or any(c.isspace() or c in "/[]" for c in host)
    ):
        raise CLIError(
            f"invalid {flag} {text!r}: give HOST:PORT with a port from 1 to 65535 "
            "(e.g. 127.0.0.1:9330, or :9330 for every interface)"
        )
    return host or "0.0.0.0", int(port)


def serve(flag: str, host: str, port: int, registry: Any, health: Any = None) -> Any:
    """Serve ``registry`` on http://host:port/metrics, and ``health``'s probes on /healthz and /readyz,
    from a daemon thread; the server (``shutdown()`` ends it). A port in use or an unknown host is one
    :class:`CLIError`."""
    from pcgroups.ops import serve_http

    try:
        server = serve_http(host, port, health=health, registry=registry)
    except OSError as e:
        reason = e.strerror or str(e)
        raise CLIError(f"{flag}: can not listen on {host}:{port}: {reason.lower()}") from None
    return server


def _say(text: str) -> None:
    """One note on stderr, wrapped at 80 columns (a long list of streams goes on indented lines)."""
    import textwrap

    try:
        print(
            textwrap.fill(text, 80, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False),
            file=sys.stderr,
            flush=True,
        )
    except (OSError, ValueError):
        pass


async def run_exporter(rt: Runtime, streams: list[str], host: str, port: int, interval: float) -> int:
    """Serve the exporter until a signal; 0 on a clean end."""
    from prometheus_client import CollectorRegistry

    from pcgroups.connect import redact
    from pcgroups.ops import GroupsExporter, Health

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass  # not the main thread (in-process tests)
    server = health = None
    nc = None
    try:
        nc, api = await rt.connect(reconnect=True)
        exporter = GroupsExporter(nc, api, streams=streams, interval=interval)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(exporter)
        await exporter.refresh()  # the first scrape finds a snapshot
        health = Health(exporter_readiness(exporter, interval))
        health.start()
        server = serve("--listen", host, port, registry, health)
        where = f"[{host}]" if ":" in host else host
        url = nc.connected_url.geturl() if nc.connected_url else ""
        print(f"serving metrics on http://{where}:{port}/metrics", flush=True)
        _say(f"reading {redact(url)} every {interval:g}s")
        _say(f"groups of {' '.join(streams) or 'every stream'}")
        for stream in await _unknown_streams(api, streams, exporter.statuses):
            warn(f"no stream {stream}, nor a group on it: nothing to show yet")
        refresher = asyncio.ensure_future(_refresh(exporter, stop))
        await stop.wait()
        await refresher
        return 0
    finally:
        if health is not None:
            health.stop()
        if server is not None:
            server.shutdown()
        if nc is not None:
            await rt.close(nc)
        for sig in installed:
            loop.remove_signal_handler(sig)


def exporter_readiness(exporter: Any, interval: float) -> Any:
    """The exporter's ``/readyz``: its last refresh worked and ended at most 2 intervals + REFRESH_GRACE ago."""
    limit = 2 * interval + REFRESH_GRACE

    def ready() -> tuple[bool, dict[str, Any]]:
        ago = time.time() - exporter.last_time
        body: dict[str, Any] = {"refreshed_s_ago": round(ago, 3), "groups": len(exporter.statuses)}
        if exporter.last_error:
            body["errors"] = exporter.last_error
        if not exporter.up:
            return False, {"reason": f"the last refresh failed: {exporter.last_error}", **body}
        if ago > limit:
            return False, {"reason": f"no refresh for {ago:.1f}s (every {interval:g}s)", **body}
        return True, body

    return ready


async def _unknown_streams(api: JetStreamApi, streams: list[str], statuses: list[GroupStatus]) -> list[str]:
    """The streams named that neither exist nor have a group (a group's name need not be a stream: an
    elastic group over partition streams)."""
    from pcgroups.errors import NotFoundError

    with_groups = {s.stream for s in statuses}
    unknown = []
    for stream in streams:
        if stream in with_groups:
            continue
        try:
            await api.stream_info(stream)
        except NotFoundError:
            unknown.append(stream)
        except Exception:
            continue
    return unknown


async def _refresh(exporter: Any, stop: asyncio.Event) -> None:
    """:meth:`GroupsExporter.run`, saying on stderr when refreshes start or stop failing."""
    said: list[str | None] = [exporter.last_error]
    if exporter.last_error:
        warn(f"metrics refresh: {exporter.last_error}")

    def note() -> None:
        if exporter.last_error != said[0]:
            if exporter.last_error:
                warn(f"metrics refresh: {exporter.last_error}")
            elif said[0]:
                _say("metrics refresh works again")
            said[0] = exporter.last_error

    await exporter.run(stop, note)


def register(app: typer.Typer, name: str = "metrics") -> None:
    """Add ``cg metrics`` to the root app."""
    from .help import Command

    app.command(name, help=METRICS_HELP, cls=Command)(metrics_command)


METRICS_HELP = "serve the consumer groups' lag, instances and pins on /metrics for Prometheus (docs/OPERATIONS.md)"


def metrics_command(
    ctx: typer.Context,
    streams: Annotated[
        list[str] | None,
        typer.Argument(
            help="only the groups of these streams (default: every group)", metavar="STREAM", show_default=False
        ),
    ] = None,
    listen: Annotated[
        str, typer.Option("--listen", help="address to serve /metrics on", metavar="HOST:PORT")
    ] = DEFAULT_LISTEN,
    interval: Annotated[
        str,
        typer.Option(
            "--interval", help="refresh the groups' state this often, whatever the scrape rate", metavar="DURATION"
        ),
    ] = "5s",
) -> None:
    from .common import check_names, parse_duration_option
    from .runtime import runtime

    host, port = parse_listen("--listen", listen)
    seconds = parse_duration_option("--interval", interval, minimum=0.1)
    for stream in streams or []:
        check_names(stream=stream)
    require_client()
    rt = runtime(ctx)
    raise typer.Exit(rt.run(run_exporter, rt, list(streams or []), host, port, seconds))


class Served(NamedTuple):
    """What ``consume --metrics-listen`` serves: the metrics, the probes, the server, and the consume
    options that feed them (the instance's events, and the retry policy telling of dead letters)."""

    metrics: Any
    health: Any
    readiness: Any
    server: Any
    on_event: Callable[[Any], None]
    retry: Any


def instance_metrics(kind: str, stream: str, group: str, member: str, listen: str) -> Served:
    """``consume --metrics-listen``: the instance's :class:`pcgroups.ops.InstanceMetrics` and its probes
    (:class:`pcgroups.ops.Health` of an :class:`~pcgroups.ops.InstanceReadiness`, started on the running event
    loop) served on ``listen``, and what feeds them (the instance's events; the default retry policy telling
    of dead letters). Bad input is one :class:`CLIError`, before anything connects."""
    host, port = parse_listen("--metrics-listen", listen)
    require_client()
    from pcgroups.consume import RetryPolicy
    from pcgroups.ops import Health, InstanceMetrics, InstanceReadiness

    metrics = InstanceMetrics(kind, stream, group, member)
    readiness = InstanceReadiness(member)
    health = Health(readiness)
    server = serve("--metrics-listen", host, port, metrics.registry, health)
    health.start()

    def on_event(event: Any) -> None:
        metrics.on_event(event)
        readiness.on_event(event)
        health.check()

    return Served(metrics, health, readiness, server, on_event, RetryPolicy(on_dead_letter=metrics.on_dead_letter))


__all__ = [
    "DEFAULT_LISTEN",
    "INSTALL_HINT",
    "Served",
    "exporter_readiness",
    "instance_metrics",
    "metrics_command",
    "parse_listen",
    "register",
    "require_client",
    "run_exporter",
    "serve",
]
