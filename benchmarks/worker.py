"""A member instance in a process of its own, for the benchmarks that kill instances or weigh them.

usage: python -m benchmarks.worker URL static|elastic|plain|bare STREAM GROUP MEMBER [--ack-wait S] [--work S]
       [--max-ack-pending N] [--concurrency K] [--report every|count]

Prints JSON lines on stdout: {"ev":"ready","pid":..}; with ``--report every`` one
{"ev":"start","seq":..,"t":..} per message (wall clock, so the parent can compare with its own);
with ``--report count`` {"ev":"count","n":..,"t":..} every 0.2 s; {"ev":"done","error":..} at the end.
``bare`` only connects and waits: the footprint of a nats-py client with nothing of pcgroups running.
``plain`` is the baseline: a plain nats-py pull consumer (durable GROUP, filter subject MEMBER, ``fetch(1)``,
the same work and ack), for comparisons with as many processes as members.
SIGTERM stops the instance (in-flight work finishes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time

import nats


def emit(**fields) -> None:
    fields["t"] = time.time()
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("flavour", choices=["static", "elastic", "plain", "bare"])
    p.add_argument("stream")
    p.add_argument("group")
    p.add_argument("member")
    p.add_argument("--ack-wait", type=float, default=2.0)
    p.add_argument("--work", type=float, default=0.0)
    p.add_argument("--max-ack-pending", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--report", choices=["every", "count"], default="every")
    args = p.parse_args()
    nc = await nats.connect(args.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    loop = asyncio.get_running_loop()
    if args.flavour == "bare":
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        emit(ev="ready")
        await stop.wait()
        await nc.close()
        return

    count = 0
    every = args.report == "every"
    if args.flavour == "plain":
        await plain(nc, args, loop)
        return

    from pcgroups import ConsumerConfig, elastic_consume, static_consume

    async def handler(msg):
        nonlocal count
        if every:
            emit(ev="start", seq=msg.sequence, partition=msg.partition, subject=msg.subject,
                 data=msg.data.decode(errors="replace") if len(msg.data) <= 32 else None)
        if args.work:
            await asyncio.sleep(args.work)
        await msg.ack()
        count += 1

    consume = static_consume if args.flavour == "static" else elastic_consume
    inst = await consume(nc, args.stream, args.group, args.member, handler,
                         config=ConsumerConfig(max_ack_pending=args.max_ack_pending, ack_wait=args.ack_wait),
                         concurrency=args.concurrency)
    loop.add_signal_handler(signal.SIGTERM, inst.stop)
    emit(ev="ready")

    async def counts():
        while True:
            await asyncio.sleep(0.2)
            emit(ev="count", n=count)

    reporter = None if every else asyncio.create_task(counts())
    err = await inst.done()
    if reporter is not None:
        reporter.cancel()
    emit(ev="done", error=str(err) if err else None, n=count)
    await nc.close()


async def plain(nc, args, loop) -> None:
    from nats.js.api import AckPolicy
    from nats.js.api import ConsumerConfig as NatsConsumerConfig
    js = nc.jetstream()
    await js.add_consumer(args.stream, NatsConsumerConfig(
        durable_name=args.group, ack_policy=AckPolicy.EXPLICIT, max_ack_pending=args.max_ack_pending,
        ack_wait=args.ack_wait, filter_subject=None if args.member in ("", ">") else args.member))
    sub = await js.pull_subscribe_bind(args.group, args.stream)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    emit(ev="ready")
    count = 0
    while not stop.is_set():
        try:
            msgs = await sub.fetch(1, timeout=1)
        except asyncio.TimeoutError:
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


if __name__ == "__main__":
    asyncio.run(main())
