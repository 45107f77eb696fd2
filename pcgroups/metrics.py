"""Per-instance Prometheus metrics of a running member instance (docs/OPERATIONS.md).

Importing this module costs nothing: ``prometheus_client`` (the ``metrics`` extra) is imported
when an :class:`InstanceMetrics` is made, and an instance without one has no metrics code at all.

An :class:`InstanceMetrics` holds the metrics of one instance, labelled ``flavour``, ``stream``,
``group``, ``member``, in a registry of its own (or the ``families`` of another one: several
instances of one process then share a registry, one label set each). It plugs in at three places:

- :meth:`InstanceMetrics.wrap` wraps the handler given to ``static_consume`` / ``elastic_consume``:
  messages handled, handler errors, handler duration (an async handler stays async, a plain one
  plain, so the instance runs it as before);
- :meth:`InstanceMetrics.on_event` takes the instance's :class:`pcgroups.events.InstanceEvent`
  (``on_event=``): pins gained (``pinned``) and lost (``lost-pin``), whether it is pinned now,
  rebalances (``added``, ``partitions``, ``dropped``) and the partitions it handles;
- :meth:`InstanceMetrics.on_dead_letter` is a ``RetryPolicy(on_dead_letter=...)``: messages
  dead-lettered after their retries.

:meth:`InstanceMetrics.serve` serves the registry on ``/metrics`` from a daemon thread.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from functools import wraps
from typing import Any

from .events import InstanceEvent

__all__ = ["INSTANCE_METRICS", "InstanceMetrics", "MetricFamilies"]

#: name (counters without ``_total``, the histogram without its suffixes) -> help.
INSTANCE_METRICS: dict[str, str] = {
    "pcgroups_instance_messages_handled": "Messages the handler returned from without raising",
    "pcgroups_instance_handler_errors": "Messages the handler raised on",
    "pcgroups_instance_handler_seconds": "How long the handler took per message",
    "pcgroups_instance_pinned": "1 while this instance holds its member's pin (handles its messages), else 0",
    "pcgroups_instance_pins_gained": "Times this instance got its member's pin",
    "pcgroups_instance_pins_lost": "Times this instance lost its member's pin to another instance",
    "pcgroups_instance_rebalances": "Changes of the member's partitions seen by this instance, by kind "
                                    "(added, partitions, dropped)",
    "pcgroups_instance_partitions": "Partitions this instance's member owns, as of the last event",
    "pcgroups_instance_dead_lettered": "Messages dead-lettered after their retries",
}

LABELS = ("flavour", "stream", "group", "member")
REBALANCES = ("added", "partitions", "dropped")
# handler durations: 1 ms to 1 min
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class MetricFamilies:
    """The metric objects in one registry, shared by the :class:`InstanceMetrics` of a process."""

    def __init__(self, registry: Any = None) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry if registry is not None else CollectorRegistry()
        m, r = INSTANCE_METRICS, self.registry

        def counter(name: str, extra: tuple[str, ...] = ()) -> Any:
            return Counter(name, m[name], [*LABELS, *extra], registry=r)

        def gauge(name: str) -> Any:
            return Gauge(name, m[name], LABELS, registry=r)

        self.handled = counter("pcgroups_instance_messages_handled")
        self.errors = counter("pcgroups_instance_handler_errors")
        self.duration = Histogram("pcgroups_instance_handler_seconds", m["pcgroups_instance_handler_seconds"],
                                  LABELS, registry=r, buckets=BUCKETS)
        self.pinned = gauge("pcgroups_instance_pinned")
        self.pins_gained = counter("pcgroups_instance_pins_gained")
        self.pins_lost = counter("pcgroups_instance_pins_lost")
        self.rebalances = counter("pcgroups_instance_rebalances", ("kind",))
        self.partitions = gauge("pcgroups_instance_partitions")
        self.dead_lettered = counter("pcgroups_instance_dead_lettered")


class InstanceMetrics:
    """One instance's metrics (see the module doc); ``families``: share another's registry."""

    def __init__(self, flavour: str, stream: str, group: str, member: str, *,
                 families: MetricFamilies | None = None) -> None:
        self.families = families if families is not None else MetricFamilies()
        self.labels = (flavour, stream, group, member)
        f, labels = self.families, self.labels
        self._handled = f.handled.labels(*labels)
        self._errors = f.errors.labels(*labels)
        self._duration = f.duration.labels(*labels)
        self._pinned = f.pinned.labels(*labels)
        self._gained = f.pins_gained.labels(*labels)
        self._lost = f.pins_lost.labels(*labels)
        self._rebalances = {kind: f.rebalances.labels(*labels, kind) for kind in REBALANCES}
        self._partitions = f.partitions.labels(*labels)
        self._dead = f.dead_lettered.labels(*labels)

    @property
    def registry(self) -> Any:
        return self.families.registry

    # ------------------------------------------------------------ the handler

    def _done(self, started: float, failed: bool) -> None:
        self._duration.observe(time.perf_counter() - started)
        (self._errors if failed else self._handled).inc()

    def wrap(self, handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``handler`` counted and timed; async stays async, plain stays plain."""
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(getattr(handler, "__call__", None)):
            @wraps(handler)
            async def counted_async(msg: Any) -> Any:
                started = time.perf_counter()
                try:
                    result = await handler(msg)
                except BaseException:
                    self._done(started, True)
                    raise
                self._done(started, False)
                return result

            return counted_async

        @wraps(handler)
        def counted(msg: Any) -> Any:
            started = time.perf_counter()
            try:
                result = handler(msg)
            except BaseException:
                self._done(started, True)
                raise
            self._done(started, False)
            return result

        return counted

    # ------------------------------------------------------------ events

    def on_event(self, event: InstanceEvent) -> None:
        """An ``on_event`` callback: pins and rebalances (never blocks, never raises on a kind it
        does not count)."""
        kind = event.kind
        if kind == "pinned":
            self._gained.inc()
            self._pinned.set(1)
            self._partitions.set(len(event.partitions))
        elif kind in ("lost-pin", "standby"):
            if kind == "lost-pin":
                self._lost.inc()
            else:   # a standby's member owns its partitions as much as the pinned instance's does
                self._partitions.set(len(event.partitions))
            self._pinned.set(0)
        elif kind in REBALANCES:
            self._rebalances[kind].inc()
            self._partitions.set(0 if kind == "dropped" else len(event.partitions))
        elif kind == "not-a-member":
            self._partitions.set(0)

    def on_dead_letter(self, msg: Any, reason: str) -> None:
        """A ``RetryPolicy(on_dead_letter=...)`` callback: one message dead-lettered."""
        self._dead.inc()

    # ------------------------------------------------------------ serving

    def serve(self, host: str, port: int) -> Any:
        """Serve the registry on http://host:port/metrics from a daemon thread; the server
        (``shutdown()`` stops it). ``OSError`` when the address can not be used."""
        from prometheus_client import start_http_server

        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server
