"""One member instance of ``cg demo`` in its own process, reporting on stdout in JSON lines.

usage: python -m cg.demo.worker URL[,URL...] static|elastic STREAM GROUP MEMBER INSTANCE [--ack-wait S] [--work S]

Lines: ``{"ev":"ready"}``; ``{"ev":"pin","pin":..}`` when its pin changes (null: not pinned);
``start``/``end`` of each handler call as :func:`pcgroups.testing._checker.event_line` writes them (the
message id is the payload, an integer in publish order); ``{"ev":"done","error":..}`` at the end.
It stops (letting the handler in flight finish) on SIGTERM, SIGINT or when its stdin closes (the
demo went away), so no instance outlives the demo.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time

PIN_POLL = 0.05


def emit(obj: dict | str) -> None:
    sys.stdout.write((obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))) + "\n")
    sys.stdout.flush()


async def main() -> int:
    p = argparse.ArgumentParser(prog="cg.demo.worker")
    p.add_argument("url")
    p.add_argument("flavour", choices=["static", "elastic"])
    p.add_argument("stream")
    p.add_argument("group")
    p.add_argument("member")
    p.add_argument("instance")
    p.add_argument("--ack-wait", type=float, default=2.0)
    p.add_argument("--work", type=float, default=0.005)
    args = p.parse_args()

    import nats

    from pcgroups import ConsumerConfig, ConsumerInstance, elastic_consume, static_consume
    from pcgroups.testing import event_line

    nc = await nats.connect(
        servers=args.url.split(","), max_reconnect_attempts=-1, reconnect_time_wait=0.2, name=args.instance
    )
    member, instance = args.member, args.instance

    async def handler(msg) -> None:
        try:
            key = int(msg.data)
        except ValueError:
            key = msg.data.decode(errors="replace")
        seq = msg.sequence
        deliveries = msg.metadata.num_delivered or 1
        emit(
            event_line(
                "start",
                member=member,
                instance=instance,
                partition=msg.partition,
                key=key,
                seq=seq,
                subject=msg.subject,
                deliveries=deliveries,
            )
        )
        if args.work:
            await asyncio.sleep(args.work)
        if msg.superseded:  # our pin moved while we worked: the new pinned instance redoes it
            emit(
                event_line(
                    "end", member=member, instance=instance, partition=msg.partition, key=key, seq=seq, outcome="nak"
                )
            )
            await msg.nak()
            return
        await msg.ack()
        # recorded after the ack is handed to the client and before it is flushed: before the server sees it
        emit(
            event_line(
                "end",
                member=member,
                instance=instance,
                partition=msg.partition,
                key=key,
                seq=seq,
                outcome="ack",
                t=time.time(),
            )
        )

    consume = static_consume if args.flavour == "static" else elastic_consume
    inst = await consume(
        nc, args.stream, args.group, member, handler, config=ConsumerConfig(max_ack_pending=1, ack_wait=args.ack_wait)
    )
    assert isinstance(inst, ConsumerInstance)  # a named member (not automatic membership): it has a session
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, inst.stop)

    async def watch_stdin() -> None:
        reader = asyncio.StreamReader()
        try:
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        except (OSError, ValueError):
            return
        while await reader.read(1024):
            pass
        inst.stop()

    async def watch_pin() -> None:
        pin = None
        while True:
            session = inst.session
            now = session.pin_id if session is not None and not session.closed else None
            if now != pin:
                pin = now
                emit({"ev": "pin", "member": member, "instance": instance, "pin": pin, "t": time.time()})
            await asyncio.sleep(PIN_POLL)

    emit({"ev": "ready", "member": member, "instance": instance, "t": time.time()})
    helpers = [asyncio.ensure_future(watch_stdin()), asyncio.ensure_future(watch_pin())]
    err = await inst.done()
    for h in helpers:
        h.cancel()
    emit({"ev": "done", "member": member, "instance": instance, "error": str(err) if err else None, "t": time.time()})
    try:
        await asyncio.wait_for(nc.close(), 2)
    except Exception:
        pass
    return 1 if err else 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except KeyboardInterrupt:
        sys.exit(0)
