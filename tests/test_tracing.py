"""OpenTelemetry traces (pcgroups.tracing, ``consume --otel``): spans taken with the SDK's in-memory exporter
from real instances on a real nats-server, and over real OTLP/HTTP from a real ``cg`` process."""

from __future__ import annotations

import asyncio
import inspect
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from nats.js.api import StreamConfig
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pcgroups import (
    PartitioningFilter,
    RetryPolicy,
    add_members,
    create_elastic,
    create_static,
    elastic_consume,
    partition_of_subject,
    static_consume,
    static_member_step_down,
)
from pcgroups.errors import SupersededError
from pcgroups.jetstream._api import ConsumerConfig
from pcgroups.pool._worker import serve_worker
from pcgroups.tracing import NO_TRACING, Tracing
from tests.helpers.cli import ROOT, acg, assert_cli_error, cg_env, make_stream, partition_transform, procs
from tests.helpers.groups import one_partition_group
from tests.helpers.support import wait_for

pytestmark = pytest.mark.timeout(90)


def memory() -> tuple[Tracing, InMemorySpanExporter, trace.Tracer]:
    """A Tracing exporting to memory, and a tracer of the same provider for the producer's spans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider), exporter, provider.get_tracer("test-producer")


def named(exporter: InMemorySpanExporter, prefix: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name.startswith(prefix)]


async def publish(js, tracer, subject: str, data: bytes, header: str = "traceparent"):
    """Publish within a producer span whose context goes in the headers (``header``: the name it is
    written under, as a Go publisher's canonical ``Traceparent``); the producer span's context."""
    with tracer.start_as_current_span(f"send {subject}", kind=SpanKind.PRODUCER) as span:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
    await js.publish(subject, data, headers={header: carrier["traceparent"]})
    return span.get_span_context()


def test_importing_pcgroups_imports_no_opentelemetry():
    code = (
        "import sys, pcgroups, pcgroups.tracing, pcgroups.static, pcgroups.elastic._instance, cg.consume, cg.otel; "
        "print('opentelemetry' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert r.stdout.strip() == "False", r.stderr


@dataclass(eq=False)
class FakeMsg:
    """A message as the span code reads it (``Traced``), for the server-free checks of the wrapper."""

    subject: str = "orders.1"
    partition: int = 3
    key: str | None = None
    naks: int = 0
    headers: dict[str, str] | None = field(default_factory=dict)
    data: bytes = b"x"
    deliveries: int = 1
    stream_sequence: int = 7

    def nak(self) -> None:
        self.naks += 1


async def test_a_wrapped_handler_keeps_its_kind_and_runs_inside_its_span():
    tracing, exporter, _ = memory()
    spans = tracing.instance("static", "s", "g", "m1")
    seen: dict[str, object] = {}

    async def ok(msg):
        seen["async"] = trace.get_current_span().get_span_context()

    def in_thread(msg):
        seen["thread"] = (trace.get_current_span().get_span_context(), threading.current_thread())

    def naks(msg):
        msg.nak()

    async def superseded(msg):
        raise SupersededError("reset after its delivery")

    async def fails(msg):
        raise KeyError("boom")

    assert NO_TRACING.wrap(ok) is ok
    wrapped = {f.__name__: spans.wrap(f) for f in (ok, in_thread, naks, superseded, fails)}
    assert inspect.iscoroutinefunction(wrapped["ok"]) and not inspect.iscoroutinefunction(wrapped["in_thread"])
    await wrapped["ok"](FakeMsg())
    await asyncio.to_thread(wrapped["in_thread"], FakeMsg(stream_sequence=8))
    await asyncio.to_thread(wrapped["naks"], FakeMsg(stream_sequence=9))
    with pytest.raises(SupersededError):  # passed through unchanged, as any exception
        await wrapped["superseded"](FakeMsg(stream_sequence=10))
    with pytest.raises(KeyError):
        await wrapped["fails"](FakeMsg(stream_sequence=11))
    by_seq = {s.attributes["pcgroups.stream_sequence"]: s for s in exporter.get_finished_spans()}
    assert seen["async"] == by_seq[7].context
    assert seen["thread"][0] == by_seq[8].context and seen["thread"][1] is not threading.main_thread()
    assert trace.get_current_span() is trace.INVALID_SPAN  # nothing left attached
    assert by_seq[7].status.status_code is StatusCode.UNSET and by_seq[7].parent is None
    assert by_seq[9].status.status_code is StatusCode.ERROR and [e.name for e in by_seq[9].events] == ["nak"]
    assert by_seq[10].status.status_code is StatusCode.UNSET and by_seq[10].events[0].name == "superseded"
    failed = by_seq[11]
    assert failed.status.status_code is StatusCode.ERROR and failed.attributes["error.type"] == "KeyError"
    assert failed.events[0].name == "exception" and failed.events[0].attributes["exception.type"] == "KeyError"


def test_a_worker_traces_a_call_itself_and_a_dead_letter_without_its_calls_joins_the_producer():
    """``handling(msg, attributes)``, as a worker process running calls for several members would use it;
    a dead letter whose calls were traced elsewhere is a child of the producer's span."""
    tracing, exporter, tracer = memory()
    spans = tracing.instance("elastic", "s", "g", "")
    with tracer.start_as_current_span("send") as producer:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
    msg = FakeMsg(headers={"Traceparent": carrier["traceparent"]}, key="k1")
    with spans.handling(msg, {"pcgroups.member": "m2", "pcgroups.worker": "w1"}) as span:
        assert trace.get_current_span() is span
    spans.dead_letter(FakeMsg(headers=carrier, stream_sequence=99), "boom")
    [process] = named(exporter, "process")
    assert process.attributes["pcgroups.member"] == "m2" and process.attributes["pcgroups.worker"] == "w1"
    assert process.attributes["pcgroups.key"] == "k1"
    assert process.parent.span_id == producer.get_span_context().span_id
    [letter] = named(exporter, "dead-letter")
    assert letter.parent.span_id == producer.get_span_context().span_id
    assert letter.attributes["pcgroups.dead_letter.reason"] == "boom"


async def test_process_spans_continue_the_producers_trace_under_key_level_concurrency(js, nc, uniq):
    """A publisher with a trace context, a member with concurrency 3: each process span is the child of
    its producer span (a Go-style ``Traceparent`` header too) and links to it; a message without a
    context starts a trace of its own; the handler's own spans are children of its process span."""
    tracing, exporter, tracer = memory()
    await make_stream(js, uniq, transform=partition_transform(uniq, 4))
    await create_static(nc, uniq, "g", 4, members=["m1"])
    children: dict[str, object] = {}

    async def handler(msg):
        with tracer.start_as_current_span("inside") as span:
            children[msg.subject] = span.get_span_context()
        await msg.ack()

    inst = await static_consume(
        nc,
        uniq,
        "g",
        "m1",
        handler,
        config=ConsumerConfig(max_ack_pending=12, ack_wait=5),
        concurrency=3,
        tracing=tracing,
    )
    async with inst:
        await inst.wait_for_consuming(timeout=10)
        producers = {f"{uniq}.k{i}": await publish(js, tracer, f"{uniq}.k{i}", b"x" * i) for i in range(5)}
        producers[f"{uniq}.go"] = await publish(js, tracer, f"{uniq}.go", b"go", header="Traceparent")
        await js.publish(f"{uniq}.plain", b"no context")
        await wait_for(lambda: len(named(exporter, "process")) == 7, what="7 process spans")
    spans = {s.attributes["messaging.destination.name"]: s for s in named(exporter, "process")}
    for subject, producer in producers.items():
        span = spans[subject]
        assert span.name == f"process {uniq}" and span.kind is SpanKind.CONSUMER
        assert span.context.trace_id == producer.trace_id and span.parent.span_id == producer.span_id, subject
        assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
            (producer.trace_id, producer.span_id)
        ]
        assert children[subject].trace_id == producer.trace_id
        inside = next(s for s in exporter.get_finished_spans() if s.context == children[subject])
        assert inside.parent.span_id == span.context.span_id
        assert span.status.status_code is StatusCode.UNSET
        assert dict(span.attributes) == {
            "messaging.system": "nats",
            "messaging.operation.name": "process",
            "messaging.operation.type": "process",
            "messaging.destination.name": subject,
            "messaging.consumer.group.name": "g",
            "messaging.destination.partition.id": str(partition_of_subject(subject, 4, [1], f"{uniq}.*")),
            "messaging.message.body.size": len(b"go" if subject.endswith("go") else b"x" * int(subject[-1])),
            "pcgroups.flavour": "static",
            "pcgroups.stream": uniq,
            "pcgroups.member": "m1",
            "pcgroups.delivery_count": 1,
            "pcgroups.stream_sequence": span.attributes["pcgroups.stream_sequence"],
            "pcgroups.key": subject,
        }
    plain = spans[f"{uniq}.plain"]
    assert plain.parent is None and not plain.links
    assert len({s.context.trace_id for s in spans.values()}) == 7
    assert sorted(s.attributes["pcgroups.stream_sequence"] for s in spans.values()) == list(range(1, 8))


async def test_failures_naks_and_dead_letters_set_the_status_and_an_event(js, nc, uniq):
    tracing, exporter, tracer = memory()
    await make_stream(js, uniq, transform=partition_transform(uniq, 1))
    await create_static(nc, uniq, "g", 1, members=["m1"])
    dead: list[str] = []
    calls: dict[bytes, int] = {}

    async def handler(msg):
        calls[msg.data] = calls.get(msg.data, 0) + 1
        if msg.data == b"poison":
            raise ValueError("poison")
        if msg.data == b"nak-once" and calls[msg.data] == 1:
            await msg.nak()
            return
        await msg.ack()

    retry = RetryPolicy(max_deliver=3, backoff=0.01, on_dead_letter=lambda msg, reason: dead.append(reason))
    inst = await static_consume(
        nc,
        uniq,
        "g",
        "m1",
        handler,
        config=ConsumerConfig(max_ack_pending=10, ack_wait=5),
        concurrency=2,
        retry=retry,
        tracing=tracing,
    )
    async with inst:
        await inst.wait_for_consuming(timeout=10)
        poison = await publish(js, tracer, f"{uniq}.a", b"poison")
        await publish(js, tracer, f"{uniq}.b", b"nak-once")
        await wait_for(
            lambda: named(exporter, "dead-letter") and len(named(exporter, "process")) == 5,
            what="the dead letter and 5 process spans",
        )
    assert len(dead) == 1  # the user's own callback is still told
    attempts = sorted(
        (s for s in named(exporter, "process") if s.attributes["messaging.destination.name"] == f"{uniq}.a"),
        key=lambda s: s.start_time,
    )
    assert [s.attributes["pcgroups.delivery_count"] for s in attempts] == [1, 2, 3]
    for s in attempts:
        assert s.status.status_code is StatusCode.ERROR and s.attributes["error.type"] == "ValueError"
        assert [e.name for e in s.events] == ["exception"] and s.parent.span_id == poison.span_id
    [letter] = named(exporter, "dead-letter")
    assert letter.parent.span_id == attempts[-1].context.span_id and letter.context.trace_id == poison.trace_id
    assert letter.status.status_code is StatusCode.ERROR and letter.events[0].name == "dead-letter"
    assert "poison" in letter.events[0].attributes["reason"]
    naked, retried = sorted(
        (s for s in named(exporter, "process") if s.attributes["messaging.destination.name"] == f"{uniq}.b"),
        key=lambda s: s.start_time,
    )
    assert naked.status.status_code is StatusCode.ERROR and [e.name for e in naked.events] == ["nak"]
    assert retried.status.status_code is StatusCode.UNSET and retried.attributes["pcgroups.delivery_count"] == 2


async def test_one_at_a_time_a_nak_is_retried_in_place_and_a_failure_is_dead_lettered(js, nc, uniq):
    """One handler at a time: a nak is retried in place (the same delivery, handled again), a handler that keeps
    failing is dead-lettered (a dead-letter span) and the instance goes on."""
    tracing, exporter, tracer = memory()
    await make_stream(js, uniq, transform=partition_transform(uniq, 1))
    await create_static(nc, uniq, "g", 1, members=["m1"])
    calls = 0

    async def handler(msg):
        nonlocal calls
        calls += 1
        if calls == 1:
            await msg.nak()
        elif calls == 2:
            await msg.ack()
        else:
            raise RuntimeError("broken")

    inst = await static_consume(
        nc,
        uniq,
        "g",
        "m1",
        handler,
        config=ConsumerConfig(ack_wait=5, max_ack_pending=1),
        tracing=tracing,
        retry=RetryPolicy(max_deliver=2, backoff=0.01),
    )
    async with inst:
        await inst.wait_for_consuming(timeout=10)
        await publish(js, tracer, f"{uniq}.a", b"1")
        await publish(js, tracer, f"{uniq}.a", b"2")
        await wait_for(lambda: named(exporter, "dead-letter"), what="the dead letter")
        assert not inst._done.done()
    nak, retried, *broken = sorted(named(exporter, "process"), key=lambda s: s.start_time)
    assert [e.name for e in nak.events] == ["nak"] and nak.attributes["pcgroups.delivery_count"] == 1
    assert retried.attributes["pcgroups.delivery_count"] == 2 and retried.status.status_code is StatusCode.UNSET
    assert "pcgroups.key" not in retried.attributes  # one at a time: no key
    assert [s.attributes["pcgroups.delivery_count"] for s in broken] == [1, 2]
    assert all(
        s.status.status_code is StatusCode.ERROR and s.attributes["error.type"] == "RuntimeError" for s in broken
    )


async def test_control_spans_take_over_rebalance_and_reset(js, nc, uniq):
    """An elastic member gets the pin (take-over), then loses half its partitions to a new member: its
    rebalance span runs from the config change to the new filters, with the consumer RESET as its child."""
    tracing, exporter, tracer = memory()
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.*"]))
    await create_elastic(nc, uniq, "g", 4, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])
    await add_members(nc, uniq, "g", ["m1"])

    async def handler(msg):
        await msg.ack()

    inst = await elastic_consume(nc, uniq, "g", "m1", handler, config=ConsumerConfig(ack_wait=2), tracing=tracing)
    async with inst:
        await inst.wait_for_consuming(timeout=10)
        await publish(js, tracer, f"{uniq}.a", b"1")
        await wait_for(lambda: named(exporter, "take-over"), what="the take-over span")
        await add_members(nc, uniq, "g", ["m2"])
        await wait_for(lambda: named(exporter, "rebalance"), what="the rebalance span")
    [take_over] = named(exporter, "take-over")
    assert take_over.name == "take-over g" and take_over.parent is None
    assert take_over.attributes["pcgroups.partitions"] == (0, 1, 2, 3)
    assert take_over.attributes["pcgroups.previous_state"] == "none" and take_over.attributes["pcgroups.pin_id"]
    [rebalance] = named(exporter, "rebalance")
    assert rebalance.attributes["pcgroups.partitions.before"] == (0, 1, 2, 3)
    assert rebalance.attributes["pcgroups.partitions.after"] == (0, 1)
    assert [e.name for e in rebalance.events] == ["applied"]
    [reset] = named(exporter, "reset")
    assert reset.parent.span_id == rebalance.context.span_id and reset.attributes["pcgroups.consumer"] == "m1"
    assert rebalance.start_time < reset.start_time <= reset.end_time < rebalance.end_time


async def test_a_take_over_from_a_standby_after_a_step_down(js, nc, uniq):
    tracing, exporter, tracer = memory()
    await make_stream(js, uniq, transform=partition_transform(uniq, 2))
    await create_static(nc, uniq, "g", 2, members=["m1"])

    async def handler(msg):
        await msg.ack()

    config = ConsumerConfig(ack_wait=1)
    standby = asyncio.Event()
    first = await static_consume(nc, uniq, "g", "m1", handler, config=config)
    second = await static_consume(
        nc,
        uniq,
        "g",
        "m1",
        handler,
        config=config,
        tracing=tracing,
        on_event=lambda ev: ev.kind == "standby" and standby.set(),
    )
    async with first, second:
        await publish(js, tracer, f"{uniq}.a", b"1")
        await wait_for(lambda: first.pinned, what="the first instance pinned")
        await asyncio.wait_for(standby.wait(), 10)
        await static_member_step_down(nc, uniq, "g", "m1")

        async def published_then_pinned() -> bool:  # until the second one gets a message, and with it the pin
            await publish(js, tracer, f"{uniq}.b", b"b")
            return second.pinned

        await wait_for(published_then_pinned, 4, interval=0.2, what="the second instance pinned")
        await wait_for(lambda: named(exporter, "take-over"), what="the take-over span")
    [take_over] = named(exporter, "take-over")
    assert take_over.attributes["pcgroups.previous_state"] == "standby"
    assert take_over.attributes["pcgroups.partitions"] == (0, 1)


async def test_automatic_membership_traces_the_assignment_it_writes(js, nc, uniq):
    tracing, exporter, _ = memory()
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.*"]))
    await create_elastic(nc, uniq, "g", 4, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])

    async def handler(msg):
        await msg.ack()

    inst = await elastic_consume(nc, uniq, "g", "", handler, auto=True, lease_ttl=2, tracing=tracing)
    async with inst:
        await wait_for(lambda: named(exporter, "assign"), what="the assign span")
    join, leave = sorted(named(exporter, "assign"), key=lambda s: s.start_time)  # and its leave at the stop
    assert join.attributes["pcgroups.members.before"] == () and leave.attributes["pcgroups.members.after"] == ()
    assert (
        join.attributes["pcgroups.members.after"] == leave.attributes["pcgroups.members.before"] == (inst.member_name,)
    )
    assert join.attributes["pcgroups.partitions.moved"] == 4 and join.start_time <= join.end_time


async def test_a_pool_worker_traces_the_calls_it_runs(js, nc, uniq, connections):
    """With ``dispatch=True`` the workers run the calls: each worker call is a process span of the worker's,
    child of the producer's span, naming the dispatching member and the worker; the dispatching member's
    dead letter joins the producer's trace."""
    tracing, exporter, tracer = memory()
    await one_partition_group(js, nc, uniq)

    async def handler(msg):
        if msg.data == b"poison":
            raise ValueError("poison")
        await msg.ack()

    d = await static_consume(
        await connections(),
        uniq,
        "g",
        "m",
        dispatch=True,
        tracing=tracing,
        retry=RetryPolicy(max_deliver=2, backoff=0.01),
    )
    w = await serve_worker(await connections(), "static", uniq, "g", handler, name="w1", capacity=2, tracing=tracing)
    try:
        await w.wait_for_consuming(10)
        fine = await publish(js, tracer, f"{uniq}.a", b"fine")
        poison = await publish(js, tracer, f"{uniq}.b", b"poison")
        await wait_for(
            lambda: named(exporter, "dead-letter") and len(named(exporter, "process")) == 3,
            what="3 worker calls and the dead letter",
        )
    finally:
        await w.stop()
        await d.stop()
    calls = named(exporter, "process")
    assert {(s.attributes["pcgroups.member"], s.attributes["pcgroups.worker"]) for s in calls} == {("m", "w1")}
    assert sorted(s.parent.span_id for s in calls) == sorted([fine.span_id, poison.span_id, poison.span_id])
    assert [s.status.status_code for s in calls if s.parent.span_id == poison.span_id] == [StatusCode.ERROR] * 2
    [letter] = named(exporter, "dead-letter")
    assert letter.parent.span_id == poison.span_id and letter.status.status_code is StatusCode.ERROR


# ------------------------------------------------------------ cg ... consume --otel, over real OTLP/HTTP


class Collector:
    """An OTLP/HTTP trace receiver (``POST /v1/traces``, protobuf) on 127.0.0.1: the spans it got."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        self.spans: list[tuple[dict, object]] = []  # (resource attributes, span)
        received = self.spans

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = ExportTraceServiceRequest()
                request.ParseFromString(self.rfile.read(int(self.headers["Content-Length"])))
                for rs in request.resource_spans:
                    resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                    received.extend((resource, s) for ss in rs.scope_spans for s in ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def named(self, prefix: str) -> list:
        return [s for _, s in self.spans if s.name.startswith(prefix)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_cg_consume_otel_exports_over_otlp_http(js, nc, server_url, uniq):
    """``cg static consume --otel --concurrency 3``: the spans reach an OTLP/HTTP collector as children of
    the producer's spans, as service ``cg``; with ``console`` as a second exporter they go to stderr and
    stdout keeps consume's own lines; Ctrl-C exports what is left and exits 0."""
    _, _, tracer = memory()
    await make_stream(js, uniq, transform=partition_transform(uniq, 2))
    await create_static(nc, uniq, "g", 2, members=["m1"])
    collector = Collector()
    env = cg_env(
        server_url,
        OTEL_TRACES_EXPORTER="otlp,console",
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    try:
        async with procs() as start:
            p = await start(
                "static", "consume", uniq, "g", "m1", "--sleep", "0", "--concurrency", "3", "--otel", env=env
            )
            await p.wait_text("consuming...")
            producers = [await publish(js, tracer, f"{uniq}.k{i}", b"x") for i in range(5)]
            await p.wait_output(lambda o: o.count("acked\n") == 5, what="5 acked")
            await wait_for(lambda: len(collector.named("process")) == 5, what="5 spans at the collector")
            p.signal(signal.SIGINT)
            r = await p.wait(20)
    finally:
        collector.close()
    assert r.code == 0, r.err
    spans = collector.named("process")
    assert sorted(s.parent_span_id for s in spans) == sorted(c.span_id.to_bytes(8, "big") for c in producers)
    assert {s.trace_id for s in spans} == {c.trace_id.to_bytes(16, "big") for c in producers}
    assert {s.name for s in spans} == {f"process {uniq}"}
    assert {res["service.name"] for res, _ in collector.spans} == {"cg"}
    assert collector.named("take-over")
    assert all(line == "consuming..." or line.startswith("[m1] subject=") for line in r.out.splitlines()), r.out
    assert '"name": "process' in r.err and "Traceback" not in r.err


async def test_cg_consume_otel_without_a_collector_says_so_once(js, nc, server_url, uniq):
    """``--otel`` with nothing listening at the endpoint: one warning naming it, and nothing more from the
    exporter while consume goes on (it retried every batch with a long line each), nor when it ends."""
    from pcgroups.testing import free_ports

    await make_stream(js, uniq, transform=partition_transform(uniq, 2))
    await create_static(nc, uniq, "g", 2, members=["m1"])
    endpoint = f"http://127.0.0.1:{free_ports(1)[0]}"
    env = cg_env(server_url, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY="100")
    said = f"cg: warning: traces: can't export spans to {endpoint}/v1/traces (connection refused); they are dropped"
    async with procs() as start:
        p = await start("static", "consume", uniq, "g", "m1", "--sleep", "0", "--otel", env=env)
        await p.wait_text("consuming...")
        err = ""
        for i in range(4):  # batches of their own, each failing
            await js.publish(f"{uniq}.k{i}", b"x")
            await p.wait_output(lambda o, i=i: o.count("acked\n") == i + 1, what=f"{i + 1} acked")
            while i == 0 and said not in err:
                err += (await asyncio.wait_for(p.proc.stderr.readline(), 15)).decode()
        p.signal(signal.SIGINT)
        r = await p.wait(20)
    assert r.code == 0, err + r.err
    told = [line for line in (err + r.err).splitlines() if "export" in line.lower() or "trace" in line.lower()]
    assert len(told) == 1 and told[0].startswith(said), told


async def test_bad_otel_settings_are_one_line(server_url, tmp_path):
    args = ("static", "consume", "s", "g", "m1", "--otel")
    r = await acg(*args, env=cg_env(server_url, OTEL_TRACES_EXPORTER="nosuch"))
    assert_cli_error(r, "the span exporter 'nosuch', which is not installed (installed: console")
    r = await acg(*args, env=cg_env(server_url, OTEL_EXPORTER_OTLP_PROTOCOL="http/json"))
    assert_cli_error(
        r, "OTEL_EXPORTER_OTLP_PROTOCOL 'http/json' is not a protocol cg can export with: give http/protobuf or grpc"
    )
    r = await acg(*args, env=cg_env(server_url, OTEL_EXPORTER_OTLP_PROTOCOL="grpc"))
    assert_cli_error(r, "pip install opentelemetry-exporter-otlp-proto-grpc")
    blocker = tmp_path / "opentelemetry"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('not installed (test)')\n")
    import os

    r = await acg(*args, env=cg_env(server_url, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)])))
    assert_cli_error(r, "pip install 'pcgroups[otel]'")
