"""A member instance in its own process, for failover tests: prints one JSON line per event.

usage: python -m tests.member_proc URL[,URL...] static|elastic STREAM GROUP MEMBER [--ack-wait S] [--work S]
       [--concurrency K] [--max-ack-pending N] [--instance NAME] [--context FILE] [--ack sync|plain] [--key origin|stream]
Lines: {"ev":"ready"}, {"ev":"start"|"end","seq":..,"subject":..,"partition":..,"pin":..,"t":..}, {"ev":"done","error":..},
{"ev":"connected","server":NAME} (on connect and each reconnect), {"ev":"disconnected"}.
start/end lines also carry member, instance, key and order (the origin stream sequence), so that
:meth:`pcgroups.testing._checker.Recorder.feed` takes them as they are. Several comma-separated URLs are a
cluster's servers; ``--context FILE`` connects through :func:`pcgroups.connect.connect` with that
NATS context file instead (URL is then ignored).
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

from pcgroups import ConsumerConfig, elastic_consume, static_consume
from pcgroups.connect import ConnectionOptions, connect
from pcgroups.testing._checker import origin_of


def emit(**fields) -> None:
    fields["t"] = time.time()
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def main() -> None:
    import logging

    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(created).3f %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("pcgroups").setLevel(logging.DEBUG)
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
    p.add_argument("--instance", default="")
    p.add_argument("--context", default=None)
    p.add_argument(
        "--key",
        choices=["origin", "stream"],
        default="origin",
        help="origin: key and order are the origin stream sequence; stream: the key is STREAM:SEQ of the "
        "origin and the order the work-queue sequence (arrival order, for groups over several streams)",
    )
    p.add_argument(
        "--ack",
        choices=["sync", "plain"],
        default="sync",
        help="sync: wait for the server's confirmation (then print end); plain: print end once the "
        "ack is handed to the client, as the checker wants when instances take over from each other",
    )
    args = p.parse_args()
    instance = args.instance or f"{args.member}-{os.getpid()}"

    def server_name() -> str:
        info = getattr(nc, "_server_info", None) or {}
        return str(info.get("server_name") or "")

    async def on_reconnect() -> None:
        logging.getLogger("member").info("reconnected to %s", server_name())
        emit(ev="connected", server=server_name())

    async def on_disconnect() -> None:
        logging.getLogger("member").info("disconnected")
        emit(ev="disconnected")

    if args.context:
        nc = await connect(
            ConnectionOptions(context=args.context), reconnected_cb=on_reconnect, disconnected_cb=on_disconnect
        )
    else:
        nc = await nats.connect(
            servers=args.url.split(","),
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
            reconnected_cb=on_reconnect,
            disconnected_cb=on_disconnect,
        )
    emit(ev="connected", server=server_name())

    async def handler(msg):
        meta = msg.metadata
        _, origin = origin_of(msg)
        ids = dict(member=args.member, instance=instance, key=origin, order=origin)
        if args.key == "stream":
            source = ((msg.headers or {}).get("Nats-Stream-Source") or "?").split(" ")[0]
            ids.update(key=f"{source}:{origin}", order=meta.sequence.stream)
        deliveries = meta.num_delivered or 1
        emit(
            ev="start",
            seq=meta.sequence.stream,
            subject=msg.subject,
            partition=msg.partition,
            pin=msg.pin_id,
            deliveries=deliveries,
            **ids,
        )
        if args.work:
            await asyncio.sleep(args.work)
        if args.ack == "sync":
            await msg.ack_sync()
        else:
            await msg.ack()
        emit(ev="end", seq=meta.sequence.stream, subject=msg.subject, partition=msg.partition, pin=msg.pin_id, **ids)

    consume = static_consume if args.flavour == "static" else elastic_consume
    inst = await consume(
        nc,
        args.stream,
        args.group,
        args.member,
        handler,
        config=ConsumerConfig(max_ack_pending=args.max_ack_pending, ack_wait=args.ack_wait),
        concurrency=args.concurrency,
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, inst.stop)
    emit(ev="ready")
    err = await inst.done()
    emit(ev="done", error=str(err) if err else None)
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
