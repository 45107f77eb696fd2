"""A member instance in a process of its own, for the benchmarks that kill instances or weigh them.

usage: python -m benchmarks.worker URL static|elastic|pool|plain|raw|rawpool|responder|bare STREAM GROUP MEMBER [--ack-wait S]
       [--work S] [--max-ack-pending N] [--concurrency K] [--dispatch] [--capacity C] [--fetch]
       [--report every|spans|count] [--loop asyncio|uvloop]

Prints JSON lines on stdout: {"ev":"ready","pid":..}; with ``--report every`` one
{"ev":"start","seq":..,"n":..,"t":..} per message (``n``: its delivery count; wall clock, so the parent can
compare with its own), with ``--report spans`` also {"ev":"end","seq":..,"t":..} when its handler returns;
with ``--report count`` {"ev":"count","n":..,"t":..} every 0.2 s; {"ev":"done","error":..} at the end.
``--max-ack-pending 0`` leaves the consumer template's max_ack_pending unset (the library's default).
``--dispatch`` (static, elastic): the instance runs no handler and hands its messages to the group's workers.
``pool`` is such a worker (``serve_worker``, MEMBER is its name, ``--capacity`` calls at once); with ``--fetch``
it reads each message's body by sequence (a direct get on STREAM) instead of taking the body offered: the
bench's prototype of the alternative to forwarding bodies, with a dispatcher whose consumer is headers-only.
``--loop uvloop`` runs on uvloop (as ``cg consume`` does when it is installed).
``bare`` only connects and waits: the footprint of a nats-py client with nothing of pcgroups running.
``plain`` is the baseline: a plain nats-py pull consumer (durable GROUP, filter subject MEMBER, ``fetch(1)``,
the same work and ack), for comparisons with as many processes as members.
``raw`` is the leanest pinned pull loop nats-py allows on an existing priority-group consumer (GROUP: the
consumer's name): the work (``--work``, slept as ``cg consume --sleep`` sleeps) and a double ack in the
subscription callback, nothing else; it reports nothing per message (the parent watches the acks). With
``--lines`` it also writes and flushes the two parts of ``cg consume``'s line for MEMBER, as the Go cg does.
``rawpool`` and ``responder`` are the floor of the worker pool without pcgroups: ``rawpool`` is a raw pinned pull
loop (its own pinned consumer GROUP, filtered ``0.>``, max_ack_pending 1000) that hands each message to one of
``--concurrency`` N ``responder`` processes (MEMBER ``w0`` .. ``wN-1``), one in flight at each, by a core NATS
request, and acks it when the answer comes; a ``responder`` answers each request at once.
SIGTERM stops the instance (in-flight work finishes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time

import nats


def emit(**fields) -> None:
    fields["t"] = time.time()
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("flavour", choices=["static", "elastic", "pool", "plain", "raw", "rawpool", "responder", "bare"])
    p.add_argument("stream")
    p.add_argument("group")
    p.add_argument("member")
    p.add_argument("--ack-wait", type=float, default=2.0)
    p.add_argument("--work", type=float, default=0.0)
    p.add_argument("--max-ack-pending", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--dispatch", action="store_true", help="static, elastic: hand the messages to the pool")
    p.add_argument("--headers-only", action="store_true", help="a dispatcher whose consumer delivers no bodies")
    p.add_argument("--capacity", type=int, default=1, help="pool: calls at once")
    p.add_argument("--pool-flavour", default="static", help="pool: the group's flavour")
    p.add_argument("--fetch", action="store_true", help="pool: read the body by sequence (direct get)")
    p.add_argument("--report", choices=["every", "spans", "count"], default="every")
    p.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    p.add_argument("--lines", action="store_true", help="raw: print cg consume's per-message lines")
    return p.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    nc = await nats.connect(args.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    loop = asyncio.get_running_loop()
    if args.flavour == "bare":
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        emit(ev="ready")
        await stop.wait()
        await nc.close()
        return
    if args.flavour == "plain":
        await plain(nc, args, loop)
        return
    if args.flavour == "raw":
        await raw(nc, args, loop)
        return
    if args.flavour in ("rawpool", "responder"):
        await (rawpool if args.flavour == "rawpool" else responder)(nc, args, loop)
        return
    await member_or_worker(nc, args, loop)


async def member_or_worker(nc, args: argparse.Namespace, loop: asyncio.AbstractEventLoop) -> None:
    """A member instance (static, elastic; ``--dispatch``: a dispatching one) or a worker of the pool."""
    from pcgroups import ConsumerConfig, elastic_consume, serve_worker, static_consume

    count = 0
    report = args.report
    fetch = DirectGet(nc, args.stream) if args.fetch else None

    async def handler(msg):
        nonlocal count
        if report != "count":
            emit(
                ev="start",
                seq=msg.sequence,
                n=msg.metadata.num_delivered,
                partition=msg.partition,
                subject=msg.subject,
                data=msg.data.decode(errors="replace") if len(msg.data) <= 32 else None,
            )
        if fetch is not None:  # the offer has no body (a headers-only consumer): its size is in a header
            body = await fetch.body(msg.sequence)
            if len(body) != int((msg.headers or {}).get("Nats-Msg-Size", -1)):
                raise RuntimeError(f"direct get of {msg.sequence}: {len(body)} bytes, not the message's")
        if args.work:
            await asyncio.sleep(args.work)
        await msg.ack()
        count += 1
        if report == "spans":
            emit(ev="end", seq=msg.sequence, subject=msg.subject)

    if args.flavour == "pool":
        inst = await serve_worker(
            nc,
            args.pool_flavour,
            args.stream,
            args.group,
            handler,
            name=args.member,
            capacity=args.capacity,
            ack_wait=args.ack_wait,
        )
        emit(ev="started")  # waiting for a dispatching member; "ready" once one answered
        await inst.wait_for_consuming(30)
    else:
        consume = static_consume if args.flavour == "static" else elastic_consume
        config = ConsumerConfig(
            max_ack_pending=args.max_ack_pending, ack_wait=args.ack_wait, headers_only=args.headers_only
        )
        if args.dispatch:
            inst = await consume(nc, args.stream, args.group, args.member, config=config, dispatch=True)
        else:
            inst = await consume(
                nc, args.stream, args.group, args.member, handler, config=config, concurrency=args.concurrency
            )
        await inst.wait_for_consuming(30)
    loop.add_signal_handler(signal.SIGTERM, inst.stop)
    emit(ev="ready", pid=os.getpid())

    async def counts():
        while True:
            await asyncio.sleep(0.2)
            emit(ev="count", n=count)

    reporter = asyncio.create_task(counts()) if report == "count" else None
    err = await inst.done()
    if reporter is not None:
        reporter.cancel()
    emit(ev="done", error=str(err) if err else None, n=count)
    await nc.close()


class DirectGet:
    """A message's body by its stream sequence: ``$JS.API.DIRECT.GET.<stream>`` (the stream allows direct gets),
    answered by any server holding the stream; the reply's body is the message's."""

    def __init__(self, nc, stream: str):
        self.nc = nc
        self.subject = f"$JS.API.DIRECT.GET.{stream}"

    async def body(self, seq: int) -> bytes:
        reply = await self.nc.request(self.subject, b'{"seq":%d}' % seq, timeout=5)
        status = reply.headers.get("Status") if reply.headers else None
        if status:
            raise RuntimeError(f"direct get of {seq}: {status} {reply.headers.get('Description', '')}")
        return reply.data


async def plain(nc, args, loop) -> None:
    from nats.js.api import AckPolicy
    from nats.js.api import ConsumerConfig as NatsConsumerConfig

    js = nc.jetstream()
    await js.add_consumer(
        args.stream,
        NatsConsumerConfig(
            durable_name=args.group,
            ack_policy=AckPolicy.EXPLICIT,
            max_ack_pending=args.max_ack_pending,
            ack_wait=args.ack_wait,
            filter_subject=None if args.member in ("", ">") else args.member,
        ),
    )
    sub = await js.pull_subscribe_bind(args.group, args.stream)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    emit(ev="ready")
    count = 0
    while not stop.is_set():
        try:
            msgs = await sub.fetch(1, timeout=1)
        except TimeoutError:
            continue
        for m in msgs:
            if args.report == "every":
                emit(ev="start", seq=m.metadata.sequence.stream, subject=m.subject)
            if args.work:
                await asyncio.sleep(args.work)
            await m.ack()
            count += 1
    emit(ev="done", error=None, n=count)
    await nc.close()


async def raw(nc, args, loop) -> None:
    """MSG.NEXT with ``group`` and the pin id, batch 500 topped up at half, expiry max(AckWait/2, 1 s) as the
    session's; per message the work and a double ack, as the reference cg does."""
    from cg.consume import precise_sleep

    subject = f"$JS.API.CONSUMER.MSG.NEXT.{args.stream}.{args.group}"
    inbox = nc.new_inbox()
    expires = int(max(args.ack_wait / 2, 1.0) * 1e9)
    state = {"pending": 0, "pin": None}
    wake = asyncio.Event()
    work = args.work
    lines = args.lines
    processing = f". Processing for {work * 1000:g}ms ... " if work else ". Processing for 0s ... "
    out = sys.stdout

    async def cb(msg) -> None:
        if not msg.reply:  # a status: 100 (heartbeat), 408 (the pull expired), 423 (the pin moved)
            status = msg.headers.get("Status") if msg.headers else None
            if status == "423":
                state["pin"] = None
            if status != "100":
                left = msg.headers.get("Nats-Pending-Messages") if msg.headers else None
                state["pending"] = max(state["pending"] - int(left), 0) if left else 0
                wake.set()
            return
        state["pin"] = msg.headers.get("Nats-Pin-Id") if msg.headers else None
        state["pending"] -= 1
        if state["pending"] <= 250:
            wake.set()
        if lines:
            seq = msg.reply.split(".")[-4]
            out.write(
                f"[{args.member}] subject={msg.subject.partition('.')[2]}, seq={seq}, "
                f"pinnedID={state['pin']}{processing}"
            )
            out.flush()
        if work:
            await precise_sleep(work)
        await nc.request(msg.reply, b"+ACK", timeout=5)
        if lines:
            out.write("acked\n")
            out.flush()

    await nc.subscribe(inbox, cb=cb)
    await pull_until_stopped(nc, loop, subject, inbox, state, wake, expires)


async def pull_until_stopped(
    nc, loop, subject: str, inbox: str, state: dict, wake: asyncio.Event, expires: int
) -> None:
    """The raw loops' pulls: keep 500 messages asked for (topped up at half, with the pin once known) until SIGTERM."""
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    emit(ev="ready")
    while not stop.is_set():
        if state["pending"] <= 250:
            want = 500 - state["pending"]
            req = {"expires": expires, "batch": want, "group": "PCG"}
            if state["pin"]:
                req["id"] = state["pin"]
            await nc.publish(subject, json.dumps(req).encode(), reply=inbox)
            state["pending"] += want
        wake.clear()
        try:
            await asyncio.wait_for(wake.wait(), 0.5)
        except TimeoutError:
            pass
    emit(ev="done", error=None)
    await nc.close()


def responder_subject(stream: str, name: str) -> str:
    return f"_RAWPOOL.{stream}.{name}"


async def responder(nc, args, loop) -> None:
    async def cb(msg) -> None:
        await nc.publish(msg.reply, b"ok")

    await nc.subscribe(responder_subject(args.stream, args.member), cb=cb)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    emit(ev="ready")
    await stop.wait()
    await nc.close()


async def rawpool(nc, args, loop) -> None:
    """See the module docstring: each JetStream message goes to a free responder (or waits for one), its ack is
    sent in the callback that reads the responder's answer, which hands that responder the next waiting message."""
    from collections import deque

    name = args.group
    cfg = {
        "durable_name": name,
        "ack_policy": "explicit",
        "max_ack_pending": 1000,
        "ack_wait": 30_000_000_000,
        "filter_subjects": ["0.>"],
        "priority_groups": ["PCG"],
        "priority_policy": "pinned_client",
        "priority_timeout": 30_000_000_000,
    }
    body = json.dumps({"stream_name": args.stream, "config": cfg, "action": "create"}).encode()
    await nc.request(f"$JS.API.CONSUMER.CREATE.{args.stream}.{name}", body, timeout=5)
    subject = f"$JS.API.CONSUMER.MSG.NEXT.{args.stream}.{name}"
    inbox, replies = nc.new_inbox(), nc.new_inbox() + "."
    free = deque(responder_subject(args.stream, f"w{i}") for i in range(args.concurrency))
    waiting: deque = deque()
    inflight: dict[str, tuple] = {}
    state = {"pending": 0, "pin": None, "n": 0}
    wake = asyncio.Event()

    async def offer(msg, to: str) -> None:
        state["n"] += 1
        token = str(state["n"])
        inflight[token] = (msg, to)
        await nc.publish(to, msg.data, reply=replies + token)

    async def on_answer(answer) -> None:
        msg, to = inflight.pop(answer.subject[len(replies) :])
        await nc.publish(msg.reply, b"+ACK")  # (nats-py's ack() sends an empty body: the same to the server)
        if waiting:
            await offer(waiting.popleft(), to)
        else:
            free.append(to)

    async def on_msg(msg) -> None:
        if not msg.reply:  # a status: the pull ended (or a heartbeat)
            if msg.headers and msg.headers.get("Status") == "423":
                state["pin"] = None
            state["pending"] = 0
            wake.set()
            return
        state["pin"] = msg.headers.get("Nats-Pin-Id") if msg.headers else None
        state["pending"] -= 1
        if state["pending"] <= 250:
            wake.set()
        if free:
            await offer(msg, free.popleft())
        else:
            waiting.append(msg)

    await nc.subscribe(replies + "*", cb=on_answer)
    await nc.subscribe(inbox, cb=on_msg)
    await pull_until_stopped(nc, loop, subject, inbox, state, wake, 1_000_000_000)


if __name__ == "__main__":
    _args = parse_args()
    if _args.loop == "uvloop":
        import uvloop

        uvloop.run(main(_args))
    else:
        asyncio.run(main(_args))
