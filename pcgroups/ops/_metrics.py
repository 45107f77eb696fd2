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
  rebalances (``added``, ``partitions``, ``dropped``), the partitions it handles, and dead letters
  refused (``dead-letter-refused``);
- :meth:`InstanceMetrics.on_dead_letter` is a ``RetryPolicy(on_dead_letter=...)``: messages
  dead-lettered after their retries (and those that followed a parked key);
- :meth:`InstanceMetrics.watch_dead_letters` reads the instance's ``dead_letter_status`` at each scrape: the keys
  parked in its partitions and the age of its oldest failing message.

:meth:`InstanceMetrics.serve` serves the registry on ``/metrics`` from a daemon thread, and the health
probes ``/healthz`` and ``/readyz`` of a :class:`pcgroups.ops._health.Health` when given one.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from functools import wraps
from typing import Any

from ..errors import extra_missing
from ..events import InstanceEvent
from ._health import serve

__all__ = ["INSTANCE_METRICS", "POOL_METRICS", "InstanceMetrics", "MetricFamilies", "pool_families"]

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
    "pcgroups_instance_dead_letters_refused": "Dead letters no stream acknowledged (refused, no stream, no answer): "
    "the message is held and its dead letter tried again",
    "pcgroups_instance_parked_keys": "Keys parked in the partitions this instance handles (park_keys: their messages "
    "follow their first dead letter into the dead-letter stream); 0 on a standby",
    "pcgroups_instance_oldest_failing_seconds": "Seconds since the oldest message that is failing now (retried, or "
    "held while its dead letter is refused) first failed; 0 when none is",
}

#: name (counters without ``_total``) -> help of a dispatching instance's pool (``dispatch=True``): served by
#: its own ``--metrics-listen`` and, for every dispatching instance, by ``cg metrics`` (the pinned one's view).
POOL_METRICS: dict[str, str] = {
    "pcgroups_pool_workers": "Workers enrolled with the member's dispatching instance, by state (busy: a message "
    "of this member in flight there; idle: none)",
    "pcgroups_pool_slots": "Messages the member's dispatcher may have at its workers at once (their capacities, "
    "capped by max_in_flight)",
    "pcgroups_pool_in_flight_messages": "Messages at the workers now",
    "pcgroups_pool_waiting_messages": "Messages the dispatching instance holds that wait for a worker (or for their "
    "key's turn)",
    "pcgroups_pool_worker_busy_messages": "Messages of this member in flight at the worker",
    "pcgroups_pool_worker_handled_messages": "Messages the worker settled for this dispatching instance since it "
    "started",
    "pcgroups_pool_retried_messages": "Worker calls that failed or nak'd and were retried in place",
}

LABELS = ("flavour", "stream", "group", "member")
REBALANCES = ("added", "partitions", "dropped")
# handler durations: 1 ms to 1 min
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class MetricFamilies:
    """The metric objects in one registry, shared by the :class:`InstanceMetrics` of a process."""

    def __init__(self, registry: Any = None) -> None:
        try:
            from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
        except ModuleNotFoundError as e:
            raise extra_missing(e, "pcgroups.ops.InstanceMetrics", "metrics") from None

        self.registry = registry if registry is not None else CollectorRegistry()
        m, r = INSTANCE_METRICS, self.registry

        def counter(name: str, extra: tuple[str, ...] = ()) -> Any:
            return Counter(name, m[name], [*LABELS, *extra], registry=r)

        def gauge(name: str) -> Any:
            return Gauge(name, m[name], LABELS, registry=r)

        self.handled = counter("pcgroups_instance_messages_handled")
        self.errors = counter("pcgroups_instance_handler_errors")
        self.duration = Histogram(
            "pcgroups_instance_handler_seconds",
            m["pcgroups_instance_handler_seconds"],
            LABELS,
            registry=r,
            buckets=BUCKETS,
        )
        self.pinned = gauge("pcgroups_instance_pinned")
        self.pins_gained = counter("pcgroups_instance_pins_gained")
        self.pins_lost = counter("pcgroups_instance_pins_lost")
        self.rebalances = counter("pcgroups_instance_rebalances", ("kind",))
        self.partitions = gauge("pcgroups_instance_partitions")
        self.dead_lettered = counter("pcgroups_instance_dead_lettered")
        self.dead_letters_refused = counter("pcgroups_instance_dead_letters_refused")
        self.parked_keys = gauge("pcgroups_instance_parked_keys")
        self.oldest_failing = gauge("pcgroups_instance_oldest_failing_seconds")


class InstanceMetrics:
    """One instance's metrics (see the module doc); ``families``: share another's registry."""

    def __init__(
        self, flavour: str, stream: str, group: str, member: str, *, families: MetricFamilies | None = None
    ) -> None:
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
        self._refused = f.dead_letters_refused.labels(*labels)
        self._parked_keys = f.parked_keys.labels(*labels)
        self._oldest_failing = f.oldest_failing.labels(*labels)

    @property
    def registry(self) -> Any:
        return self.families.registry

    # ------------------------------------------------------------ the handler

    def _done(self, started: float, failed: bool) -> None:
        self._duration.observe(time.perf_counter() - started)
        (self._errors if failed else self._handled).inc()

    def wrap(self, handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``handler`` counted and timed; async stays async, plain stays plain."""
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(type(handler).__call__):

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
            else:  # a standby's member owns its partitions as much as the pinned instance's does
                self._partitions.set(len(event.partitions))
            self._pinned.set(0)
        elif kind in REBALANCES:
            self._rebalances[kind].inc()
            self._partitions.set(0 if kind == "dropped" else len(event.partitions))
        elif kind == "not-a-member":
            self._partitions.set(0)
        elif kind == "dead-letter-refused":
            self._refused.inc()

    def on_dead_letter(self, msg: Any, reason: str) -> None:
        """A ``RetryPolicy(on_dead_letter=...)`` callback: one message dead-lettered."""
        self._dead.inc()

    def watch_dead_letters(self, status_of: Callable[[], dict[str, Any]]) -> None:
        """Serve the parked keys and the oldest failing message's age of an instance: each scrape calls ``status_of``
        (``ConsumerInstance.dead_letter_status``: it only reads, from any thread)."""

        def read(name: str) -> float:
            try:
                return float(status_of().get(name) or 0)
            except Exception:  # changed while read: the next scrape has it
                return 0.0

        self._parked_keys.set_function(lambda: read("parked_keys"))
        self._oldest_failing.set_function(lambda: read("oldest_failing"))

    # ------------------------------------------------------------ a dispatching instance's pool

    def watch_pool(self, loop: Any, status_of: Callable[[], dict[str, Any] | None]) -> None:
        """Serve the pool metrics (:data:`POOL_METRICS`) of a dispatching instance: each scrape asks
        ``status_of`` (``ConsumerInstance.pool_status``) in the instance's event ``loop``."""
        self.registry.register(_PoolCollector(loop, status_of))

    # ------------------------------------------------------------ serving

    def serve(self, host: str, port: int, health: Any = None) -> Any:
        """Serve the registry on http://host:port/metrics, and ``health``'s probes (a
        :class:`pcgroups.ops._health.Health`) on /healthz and /readyz, from a daemon thread; the server
        (``shutdown()`` stops it). ``OSError`` when the address can not be used."""

        return serve(host, port, health=health, registry=self.registry)


class _PoolCollector:
    """The pool metrics of one dispatching instance, read in its event loop at each scrape."""

    def __init__(self, loop: Any, status_of: Callable[[], dict[str, Any] | None]) -> None:
        self._loop = loop
        self._status_of = status_of

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        import asyncio

        async def read() -> dict[str, Any] | None:
            return self._status_of()

        try:
            status = asyncio.run_coroutine_threadsafe(read(), self._loop).result(timeout=2)
        except Exception:
            status = None
        yield from pool_families([status] if status else [])


def pool_families(statuses: list[dict[str, Any]]) -> Any:
    """The pool metrics (:data:`POOL_METRICS`) of dispatching instances' status answers (``Roster.status``)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    m = POOL_METRICS
    labels = list(LABELS)
    workers = GaugeMetricFamily("pcgroups_pool_workers", m["pcgroups_pool_workers"], labels=[*labels, "state"])
    slots = GaugeMetricFamily("pcgroups_pool_slots", m["pcgroups_pool_slots"], labels=labels)
    in_flight = GaugeMetricFamily(
        "pcgroups_pool_in_flight_messages", m["pcgroups_pool_in_flight_messages"], labels=labels
    )
    waiting = GaugeMetricFamily("pcgroups_pool_waiting_messages", m["pcgroups_pool_waiting_messages"], labels=labels)
    busy = GaugeMetricFamily(
        "pcgroups_pool_worker_busy_messages", m["pcgroups_pool_worker_busy_messages"], labels=[*labels, "worker"]
    )
    handled = CounterMetricFamily(
        "pcgroups_pool_worker_handled_messages", m["pcgroups_pool_worker_handled_messages"], labels=[*labels, "worker"]
    )
    retried = CounterMetricFamily("pcgroups_pool_retried_messages", m["pcgroups_pool_retried_messages"], labels=labels)
    for s in statuses:
        key = [str(s.get(k, "")) for k in LABELS]
        pool = s.get("workers") or []
        n_busy = sum(1 for w in pool if w.get("busy"))
        workers.add_metric([*key, "busy"], n_busy)
        workers.add_metric([*key, "idle"], len(pool) - n_busy)
        slots.add_metric(key, s.get("slots", 0))
        in_flight.add_metric(key, s.get("in_flight", 0))
        waiting.add_metric(key, s.get("waiting", 0))
        retried.add_metric(key, s.get("retried", 0))
        for w in pool:
            busy.add_metric([*key, str(w.get("name"))], w.get("busy", 0))
            handled.add_metric([*key, str(w.get("name"))], w.get("handled", 0))
    yield from (workers, slots, in_flight, waiting, busy, handled, retried)
