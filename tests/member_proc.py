"""A member instance in its own process, for failover tests: prints one JSON line per event.

usage: python -m tests.member_proc URL static|elastic STREAM GROUP MEMBER [--ack-wait S] [--work S]
       [--concurrency K] [--max-ack-pending N]
Lines: {"ev":"ready"}, {"ev":"start"|"end","seq":..,"subject":..,"partition":..,"pin":..,"t":..}, {"ev":"done","error":..}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time

import nats

from pcgroups import ConsumerConfig, elastic_consume, static_consume


def emit(**fields) -> None:
    fields["t"] = time.time()
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def main() -> None:
    import logging
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("flavour", choices=["static", "elastic"])
    p.add_argument("stream")
    p.add_argument("group")
    p.add_argument("member")
    p.add_argument("--ack-wait", type=float, default=1.0)
    p.add_argument("--work", type=float, default=0.0)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--max-ack-pending", type=int, default=1)
    args = p.parse_args()
    nc = await nats.connect(args.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)

    async def handler(msg):
        meta = msg.metadata
        emit(ev="start", seq=meta.sequence.stream, subject=msg.subject, partition=msg.partition, pin=msg.pin_id)
        if args.work:
            await asyncio.sleep(args.work)
        await msg.ack_sync()
        emit(ev="end", seq=meta.sequence.stream, subject=msg.subject, partition=msg.partition, pin=msg.pin_id)

    consume = static_consume if args.flavour == "static" else elastic_consume
    inst = await consume(nc, args.stream, args.group, args.member, handler,
                         config=ConsumerConfig(max_ack_pending=args.max_ack_pending, ack_wait=args.ack_wait),
                         concurrency=args.concurrency)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, inst.stop)
    emit(ev="ready")
    err = await inst.done()
    emit(ev="done", error=str(err) if err else None)
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
