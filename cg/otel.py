"""``cg ... consume --otel``: the instance's OpenTelemetry spans (:mod:`pcgroups.tracing`), exported as the
standard ``OTEL_*`` environment variables say (docs/OPERATIONS.md, *Traces*).

- ``OTEL_TRACES_EXPORTER``: exporters by name, comma-separated (default ``otlp``; ``none`` exports
  nothing). ``otlp`` is OTLP over the protocol ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` or
  ``OTEL_EXPORTER_OTLP_PROTOCOL`` gives: ``http/protobuf`` (the default, as the specification says; the
  ``otel`` extra installs it) or ``grpc`` (needs ``opentelemetry-exporter-otlp-proto-grpc``). Any other
  name is an installed exporter's entry point (``console`` writes to stderr: stdout keeps consume's lines).
- What the SDK and the exporters read themselves: the endpoint, headers, timeout and compression
  (``OTEL_EXPORTER_OTLP_*``), the sampler (``OTEL_TRACES_SAMPLER``, ``OTEL_TRACES_SAMPLER_ARG``), the
  batching (``OTEL_BSP_*``), the propagators (``OTEL_PROPAGATORS``), the resource (``OTEL_SERVICE_NAME``,
  ``OTEL_RESOURCE_ATTRIBUTES``; ``service.name`` is ``cg`` unless they name one) and
  ``OTEL_SDK_DISABLED``.

:func:`tracing_from_env` checks all of that before anything connects: an exporter that is not installed
or a protocol that does not exist is one ``cg: error:`` line. A collector that does not answer is one
``cg: warning:`` line naming where the spans went, the first time an export fails; the exporters' own
complaints (a long line per retry) are not shown (:class:`ExportFailures`). :func:`finish` exports what is
left when the instance has ended, waiting at most :data:`FLUSH_LIMIT`; :func:`traced_by_env` gives both,
for a command's ``--otel``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from .errors import CLIError, debugging, warn

INSTALL_HINT = "OpenTelemetry is not installed: pip install 'pcgroups[otel]'"
PROTOCOLS = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
PACKAGES = {
    "otlp_proto_http": "opentelemetry-exporter-otlp-proto-http",
    "otlp_proto_grpc": "opentelemetry-exporter-otlp-proto-grpc",
}
FLUSH_LIMIT = 5.0  # seconds the last spans may take to export when the instance ends
GROUP = "opentelemetry_traces_exporter"


def exporter_names(env: Mapping[str, str]) -> list[str]:
    """The entry-point names ``OTEL_TRACES_EXPORTER`` asks for (``otlp`` resolved to its protocol's)."""
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    if names == ["none"]:
        return []
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    ).strip()
    resolved = []
    for name in names:
        if name == "otlp":
            if protocol not in PROTOCOLS:
                raise CLIError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r} is not a protocol cg can export "
                    f"with: give {' or '.join(PROTOCOLS)}"
                )
            name = PROTOCOLS[protocol]
        resolved.append(name)
    return resolved


def _exporter(name: str) -> Any:
    """A new exporter of the installed entry point ``name``."""
    from importlib.metadata import entry_points

    found = list(entry_points(group=GROUP, name=name))
    if not found:
        installed = sorted({e.name for e in entry_points(group=GROUP)})
        hint = f": pip install {PACKAGES[name]}" if name in PACKAGES else ""
        raise CLIError(
            f"OTEL_TRACES_EXPORTER asks for the span exporter {name!r}, which is not installed{hint} "
            f"(installed: {', '.join(installed) or 'none'}; 'otlp' picks OTLP by its protocol, "
            "'none' exports nothing)"
        )
    cls = found[0].load()
    if name == "console":
        return cls(out=sys.stderr)
    return cls()


class ExportFailures(logging.Filter):
    """On cg's log handlers while spans are exported: what OpenTelemetry's exporters and span processors
    log about a failed export is said once, as one warning naming ``endpoints``, and then dropped."""

    LOGGERS = ("opentelemetry.exporter", "opentelemetry.sdk")

    def __init__(self, endpoints: list[str]) -> None:
        super().__init__()
        self.endpoints = endpoints
        self.said = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not record.name.startswith(self.LOGGERS):
            return True
        if not self.said:
            self.said = True
            errno = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", record.getMessage())
            why = f" ({errno[1].strip().lower()})" if errno else ""
            where = ", ".join(self.endpoints) or "the collector"
            warn(
                f"traces: can't export spans to {where}{why}; they are dropped until it answers "
                "(OTEL_EXPORTER_OTLP_ENDPOINT says where)"
            )
        return False

    def install(self) -> None:
        """On cg's handlers of the root logger; not with ``CG_DEBUG`` (everything is shown then)."""
        if debugging():
            return
        for handler in logging.getLogger().handlers:
            if getattr(handler, "_cg", False):
                handler.addFilter(self)


def tracing_from_env(env: Mapping[str, str] = os.environ) -> tuple[Any, Any, ExportFailures]:
    """The :class:`pcgroups.tracing.Tracing` and the tracer provider ``--otel`` uses (see the module doc), and
    the filter that says a failed export once (installed on cg's log handlers)."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise CLIError(INSTALL_HINT) from None
    from pcgroups.tracing import Tracing

    exporters = []
    for name in exporter_names(env):
        try:
            exporters.append(_exporter(name))
        except CLIError:
            raise
        except Exception as e:
            raise CLIError(f"the span exporter {name!r} can not start: {e}") from None
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "cg"}))
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    failures = ExportFailures([e._endpoint for e in exporters if isinstance(getattr(e, "_endpoint", None), str)])
    failures.install()
    return Tracing(provider), provider, failures


def finish(provider: Any, failures: ExportFailures | None = None) -> None:
    """Export the spans left (the instance has ended), waiting at most :data:`FLUSH_LIMIT`: an exporter
    that can not reach its collector does not hold the exit up (nor says so again after ``failures`` did)."""
    done = threading.Thread(target=provider.shutdown, name="cg-otel-shutdown", daemon=True)
    done.start()
    done.join(FLUSH_LIMIT)
    if done.is_alive() and not (failures is not None and failures.said):
        warn(f"traces: the exporter did not finish within {FLUSH_LIMIT:g}s; the last spans may be lost")


def traced_by_env(otel: bool) -> tuple[Any, Callable[[], None]]:
    """``--otel``: the :class:`pcgroups.tracing.Tracing` (None without ``--otel``) and what to call when
    the instance has ended (:func:`finish`; nothing without)."""
    if not otel:
        return None, lambda: None
    tracing, provider, failures = tracing_from_env()
    return tracing, lambda: finish(provider, failures)


__all__ = ["INSTALL_HINT", "ExportFailures", "exporter_names", "finish", "traced_by_env", "tracing_from_env"]
