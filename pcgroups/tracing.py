"""OpenTelemetry traces of a running member instance (the ``otel`` extra; docs/OPERATIONS.md, *Traces*).

Off by default. Importing this module costs nothing: ``opentelemetry`` is imported when a
:class:`Tracing` is made, and an instance given none (``tracing=None``, the default) runs
:data:`NO_TRACING`, whose methods do nothing and whose :meth:`~InstanceTracing.wrap` returns the
handler itself.

A :class:`Tracing` names the tracer provider and the propagator (default: the global ones). Given to a
consume entry point (``static_consume(..., tracing=Tracing())``), the instance binds it to its labels
(:meth:`Tracing.instance`: an :class:`InstanceTracing`) and makes:

- a ``process <stream>`` span (kind CONSUMER) per handler call, following the messaging semantic
  conventions: ``messaging.system`` ``nats``, ``messaging.operation.name`` and ``.type`` ``process``,
  ``messaging.destination.name`` (the subject, partition token stripped), ``messaging.consumer.group.name``,
  ``messaging.destination.partition.id``, ``messaging.message.body.size``, ``messaging.message.id`` (the
  ``Nats-Msg-Id`` header, when there is one), and ``pcgroups.flavour``, ``pcgroups.stream``,
  ``pcgroups.member``, ``pcgroups.delivery_count``, ``pcgroups.stream_sequence`` (of the stream consumed:
  the group's own for static, the work queue for elastic) and, with key-level concurrency, ``pcgroups.key``.
  A retry in place is a handler call, so a span, of its own;
- a ``dead-letter <stream>`` span when the retry policy gives a message up;
- control spans (kind INTERNAL): ``take-over <group>`` when the instance gets the member's pin (the
  hooks run and the ``pinned`` event), ``rebalance <group>`` from the moment an elastic instance sees its
  member's partitions change until its consumer has the new filters, ``assign <group>`` for a membership
  written by automatic membership, and ``reset <group>`` for each consumer RESET the instance sends (a
  RESET while a rebalance is open is its child).

Invariants (tests/test_tracing.py checks each):

1. Without a :class:`Tracing` nothing of this module runs per message and ``opentelemetry`` is not
   imported: the instance's handler is the user's own.
2. A process span's parent is the producer's context, read with the propagator from the message's headers
   (W3C ``traceparent`` and ``tracestate`` by default; header names matched case-insensitively, as a Go
   publisher may write ``Traceparent``), and the span also links to it; without one the span is a root.
   The handler runs with the span as the current one (a sync handler in its worker thread too), so the
   spans it starts are its children. Parents are always explicit: a span never inherits whatever context
   was current where the instance's tasks were started.
3. A handler that raises: the span's status is ERROR, the exception is recorded as an event and
   ``error.type`` is its class; the exception passes through unchanged. A ``nak()`` in the handler: status
   ERROR, a ``nak`` event, ``error.type`` ``nak``. A dead letter: a ``dead-letter`` span, child of the
   message's last process span (of the producer's context when that span is not known here), status
   ERROR, with a ``dead-letter`` event naming the reason. A handler cancelled (the instance stops) or
   superseded by a RESET is no error: an event says so.
4. A wrapped handler keeps its kind: an async one stays async, a plain one plain (run in a thread).
5. A rebalance span is open from :meth:`~InstanceTracing.rebalance_started` until
   :meth:`~InstanceTracing.rebalance_done` (an ``applied`` event), a newer change (``superseded``) or
   :meth:`~InstanceTracing.close` (``instance stopped``).

**Another process.** The span code reads the message through :class:`Traced` only (``pcgroups.Msg`` is
one) and needs nothing of the instance but its labels. A worker process that runs the handler builds
its own ``Tracing`` (its own tracer provider and exporter) and ``spans = tracing.instance(flavour,
stream, group, member)``, then runs each call as ``with spans.handling(msg, {"pcgroups.member": m}):
handler(msg)`` (or calls ``spans.wrap(handler)``), where ``msg`` has the attributes of :class:`Traced`
(the headers carry the producer's context across; ``key`` is the one the dispatcher gave the message,
``naks`` counts its ``nak()`` calls): the span is the worker's, with the same attributes and parent.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager, nullcontext
from functools import wraps
from typing import Any, Protocol

from ._version import __version__
from .errors import SupersededError, extra_missing

__all__ = ["NO_TRACING", "InstanceTracing", "Traced", "Tracing"]

SYSTEM = "nats"
MSG_ID_HEADER = "Nats-Msg-Id"
FAILED_KEPT = 1024  # messages whose last handling failed: their attempts, and the span to parent a dead letter


class Traced(Protocol):
    """What a process span reads of a message (``pcgroups.Msg`` is one)."""

    subject: str  # the partition token stripped
    partition: int
    key: str | None  # its key under key-level concurrency, else None
    naks: int  # times nak() was called on it

    @property
    def headers(self) -> Mapping[str, str] | None: ...

    @property
    def data(self) -> bytes: ...

    @property
    def deliveries(self) -> int: ...

    @property
    def stream_sequence(self) -> int: ...


class InstanceTracing:
    """An instance's spans (see the module docstring); this class itself makes none (:data:`NO_TRACING`)."""

    enabled = False

    def wrap(self, handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``handler`` with a process span around each call (here: the handler itself)."""
        return handler

    def handling(self, msg: Traced, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[Any]:
        """One handler call of ``msg`` runs inside this: its process span (here: nothing), with
        ``attributes`` besides its own (they win). What :meth:`wrap` uses; a worker that runs the handler
        for several members can use it directly (``{"pcgroups.member": ...}``)."""
        return nullcontext()

    def dead_letter(self, msg: Any, reason: str) -> None:
        """A ``RetryPolicy.on_dead_letter``: ``msg`` was given up for ``reason``."""

    def take_over(
        self, partitions: Iterable[int], pin: str | None, previous: str | None
    ) -> AbstractContextManager[Any]:
        """The instance got the member's pin (``previous``: its pin state before, None at start)."""
        return nullcontext()

    def rebalance_started(self, before: Iterable[int], after: Iterable[int]) -> None:
        """The member's partitions change from ``before`` to ``after`` (the instance saw the new config)."""

    def rebalance_done(self) -> None:
        """The member's consumer has the new filters: the open rebalance, if any, ends."""

    def assigned(self, started_ns: int, before: Iterable[str], after: Iterable[str], moved: int) -> None:
        """Automatic membership wrote an assignment of the members ``after`` (were ``before``) that moves
        ``moved`` partitions; it started at ``started_ns`` (``time.time_ns()``)."""

    def reset(self, consumer: str, seq: int | None) -> AbstractContextManager[Any]:
        """A consumer RESET to ``seq`` (None: its ack floor) is sent inside this."""
        return nullcontext()

    def close(self) -> None:
        """The instance ended: an open rebalance ends too."""


NO_TRACING = InstanceTracing()


class Tracing:
    """Where spans go: ``tracer_provider`` (default: the global one) and ``propagator`` (default: the
    global one, W3C trace context and baggage unless ``OTEL_PROPAGATORS`` says otherwise)."""

    def __init__(self, tracer_provider: Any = None, *, propagator: Any = None) -> None:
        try:
            from opentelemetry import propagate, trace
        except ModuleNotFoundError as e:
            raise extra_missing(e, "pcgroups.tracing.Tracing", "otel") from None

        self.tracer = trace.get_tracer("pcgroups", __version__, tracer_provider=tracer_provider)
        self.propagator = propagator if propagator is not None else propagate.get_global_textmap()

    def instance(self, flavour: str, stream: str, group: str, member: str) -> InstanceTracing:
        """The spans of one instance of ``member``."""
        return _Spans(self, flavour, stream, group, member)


def _header_getter() -> Any:
    """The propagator's view of NATS headers: names matched case-insensitively."""
    from opentelemetry.propagators.textmap import Getter

    class HeaderGetter(Getter[Mapping[str, str]]):
        def get(self, carrier: Mapping[str, str], key: str) -> list[str] | None:
            value = carrier.get(key)
            if value is None:
                lower = key.lower()
                value = next((v for k, v in carrier.items() if k.lower() == lower), None)
            return None if value is None else [value]

        def keys(self, carrier: Mapping[str, str]) -> list[str]:
            return list(carrier)

    return HeaderGetter()


class _Spans(InstanceTracing):
    """The spans of one instance (made by :meth:`Tracing.instance`)."""

    enabled = True

    def __init__(self, tracing: Tracing, flavour: str, stream: str, group: str, member: str) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import Link, SpanKind, Status, StatusCode

        self._tracer = tracing.tracer
        self._propagator = tracing.propagator
        self._getter = _header_getter()
        self._context, self._trace = context, trace
        self._Link, self._CONSUMER, self._INTERNAL = Link, SpanKind.CONSUMER, SpanKind.INTERNAL
        self._error: Callable[[str], Any] = lambda description: Status(StatusCode.ERROR, description)
        self.group = group
        self._labels: dict[str, Any] = {
            "messaging.system": SYSTEM,
            "messaging.consumer.group.name": group,
            "pcgroups.flavour": flavour,
            "pcgroups.stream": stream,
            "pcgroups.member": member,
        }
        self._process = {**self._labels, "messaging.operation.name": "process", "messaging.operation.type": "process"}
        self._process_name = f"process {stream}"
        # (stream sequence, server deliveries) of a message whose last handler call failed -> that call's span
        # context and delivery count: a retry in place counts on, a dead letter is that span's child
        self._failed: OrderedDict[tuple[int, int], tuple[Any, int]] = OrderedDict()
        self._failed_lock = threading.Lock()
        self._rebalance: Any = None
        self._root = context.Context()  # no parent: a span never inherits the context its caller runs in

    # --- process spans -------------------------------------------------------------------
    def _start(self, msg: Traced, extra: Mapping[str, Any] | None = None) -> tuple[Any, int]:
        """The process span of a handler call of ``msg`` (started, ``extra`` among its attributes), and its
        delivery count."""
        headers = msg.headers
        count = msg.deliveries
        if self._failed:
            failed = self._failed.get((msg.stream_sequence, count))
            if failed is not None:
                count = failed[1] + 1  # retried in place: the server's count stays
        attributes = {
            **self._process,
            "messaging.destination.name": msg.subject,
            "messaging.destination.partition.id": str(msg.partition),
            "messaging.message.body.size": len(msg.data),
            "pcgroups.delivery_count": count,
            "pcgroups.stream_sequence": msg.stream_sequence,
        }
        if msg.key is not None:
            attributes["pcgroups.key"] = msg.key
        if extra:
            attributes.update(extra)
        parent, links = self._root, None
        if headers:
            msg_id = headers.get(MSG_ID_HEADER)
            if msg_id:
                attributes["messaging.message.id"] = msg_id
            parent, producer = self._producer(headers)
            if producer is not None:
                links = [self._Link(producer)]
        return self._tracer.start_span(
            self._process_name, context=parent, kind=self._CONSUMER, attributes=attributes, links=links
        ), count

    def _producer(self, headers: Mapping[str, str]) -> tuple[Any, Any]:
        """The producer's context in ``headers`` and its span context; (the root, None) without one."""
        context = self._propagator.extract(headers, getter=self._getter)
        producer = self._trace.get_current_span(context).get_span_context()
        return (context, producer) if producer.is_valid else (self._root, None)

    def _ended(self, span: Any, msg: Traced, naks: int, count: int, error: BaseException | None) -> None:
        """Status and events of a handler call that returned (``error`` None) or raised; then end it."""
        failed = True
        if error is None:
            failed = msg.naks > naks
            if failed:
                span.set_status(self._error("nak"))
                span.set_attribute("error.type", "nak")
                span.add_event("nak")
        elif isinstance(error, SupersededError):
            failed = False
            span.add_event("superseded", {"reason": str(error)})
        elif not isinstance(error, Exception):  # cancelled: the instance stops
            failed = False
            span.add_event("cancelled")
        else:
            span.set_status(self._error(f"{type(error).__name__}: {error}"))
            span.set_attribute("error.type", type(error).__qualname__)
            span.record_exception(error)
        key = (msg.stream_sequence, msg.deliveries)
        if failed:
            with self._failed_lock:
                self._failed[key] = (span.get_span_context(), count)
                self._failed.move_to_end(key)
                if len(self._failed) > FAILED_KEPT:
                    self._failed.popitem(last=False)
        elif self._failed:
            with self._failed_lock:
                self._failed.pop(key, None)
        span.end()

    def handling(self, msg: Traced, attributes: Mapping[str, Any] | None = None) -> AbstractContextManager[Any]:
        return _Call(self, msg, attributes)

    def wrap(self, handler: Callable[[Any], Any]) -> Callable[[Any], Any]:
        call = self.handling
        if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(type(handler).__call__):

            @wraps(handler)
            async def traced_async(msg: Any) -> Any:
                with call(msg):
                    return await handler(msg)

            return traced_async

        @wraps(handler)
        def traced(msg: Any) -> Any:
            with call(msg):
                return handler(msg)

        return traced

    def dead_letter(self, msg: Any, reason: str) -> None:
        with self._failed_lock:
            last = self._failed.pop((msg.stream_sequence, msg.deliveries), None)
        if last is not None:
            parent = self._trace.set_span_in_context(self._trace.NonRecordingSpan(last[0]))
        else:  # its handler calls were traced elsewhere (a worker process), or not kept: the producer's trace
            parent = self._producer(msg.headers)[0] if msg.headers else self._root
        attributes = {
            **self._labels,
            "messaging.destination.name": msg.subject,
            "messaging.destination.partition.id": str(msg.partition),
            "pcgroups.stream_sequence": msg.stream_sequence,
            "pcgroups.dead_letter.reason": reason,
        }
        span = self._tracer.start_span(
            f"dead-letter {self._labels['pcgroups.stream']}", context=parent, kind=self._INTERNAL, attributes=attributes
        )
        span.add_event("dead-letter", {"reason": reason})
        span.set_status(self._error(reason))
        span.end()

    # --- control spans -------------------------------------------------------------------
    def _control(self, operation: str, attributes: Mapping[str, Any]) -> AbstractContextManager[Any]:
        """A control span, child of the open rebalance if any (else a root), current inside."""
        parent = self._root if self._rebalance is None else self._trace.set_span_in_context(self._rebalance)
        return self._tracer.start_as_current_span(
            f"{operation} {self.group}", context=parent, kind=self._INTERNAL, attributes={**self._labels, **attributes}
        )

    def take_over(
        self, partitions: Iterable[int], pin: str | None, previous: str | None
    ) -> AbstractContextManager[Any]:
        return self._control(
            "take-over",
            {
                "pcgroups.partitions": sorted(partitions),
                "pcgroups.pin_id": pin or "",
                "pcgroups.previous_state": previous or "none",
            },
        )

    def rebalance_started(self, before: Iterable[int], after: Iterable[int]) -> None:
        self._end_rebalance("superseded")
        self._rebalance = self._tracer.start_span(
            f"rebalance {self.group}",
            context=self._root,
            kind=self._INTERNAL,
            attributes={
                **self._labels,
                "pcgroups.partitions.before": sorted(before),
                "pcgroups.partitions.after": sorted(after),
            },
        )

    def rebalance_done(self) -> None:
        self._end_rebalance("applied")

    def _end_rebalance(self, event: str) -> None:
        span, self._rebalance = self._rebalance, None
        if span is not None:
            span.add_event(event)
            span.end()

    def assigned(self, started_ns: int, before: Iterable[str], after: Iterable[str], moved: int) -> None:
        span = self._tracer.start_span(
            f"assign {self.group}",
            context=self._root,
            kind=self._INTERNAL,
            start_time=started_ns,
            attributes={
                **self._labels,
                "pcgroups.members.before": sorted(before),
                "pcgroups.members.after": sorted(after),
                "pcgroups.partitions.moved": moved,
            },
        )
        span.end(end_time=time.time_ns())

    def reset(self, consumer: str, seq: int | None) -> AbstractContextManager[Any]:
        return self._control(
            "reset",
            {"pcgroups.consumer": consumer, "pcgroups.reset.to": "ack floor" if seq is None else f"sequence {seq}"},
        )

    def close(self) -> None:
        self._end_rebalance("instance stopped")


class _Call:
    """One handler call inside its process span (:meth:`InstanceTracing.handling`): the span is current
    inside, and ends with the call's outcome."""

    __slots__ = ("_count", "_msg", "_naks", "_span", "_spans", "_token")

    def __init__(self, spans: _Spans, msg: Traced, attributes: Mapping[str, Any] | None) -> None:
        self._spans, self._msg = spans, msg
        self._span, self._count = spans._start(msg, attributes)
        self._naks = msg.naks

    def __enter__(self) -> Any:
        spans = self._spans
        self._token = spans._context.attach(spans._trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        self._spans._context.detach(self._token)
        self._spans._ended(self._span, self._msg, self._naks, self._count, error)
