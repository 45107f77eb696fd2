"""An elastic instance in automatic membership, in its own process (for SIGKILL tests).

usage: python -m tests.auto_proc URL STREAM GROUP [--member M] [--lease-ttl S] [--ack-wait S] [--work S]
Prints JSON lines: {"ev":"ready","member":..,"instance":..}, the checker's start/end event lines
(pcgroups.testing._checker.event_line, instance = "<member>/<instance id>"), {"ev":"done","error":..}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time

import nats

from pcgroups import ConsumerConfig, elastic_consume
from pcgroups.testing._checker import event_line, origin_of


def emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main() -> None:
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(message)s")
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("stream")
    p.add_argument("group")
    p.add_argument("--member", default=None)
    p.add_argument("--lease-ttl", type=float, default=2.0)
    p.add_argument("--ack-wait", type=float, default=1.0)
    p.add_argument("--work", type=float, default=0.0)
    args = p.parse_args()
    nc = await nats.connect(args.url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    label: dict[str, str] = {}
    labelled = asyncio.Event()

    async def handler(msg):
        await labelled.wait()
        subject, origin = origin_of(msg)
        common = dict(
            member=label["member"],
            instance=label["instance"],
            partition=msg.partition,
            key=origin,
            seq=origin,
            subject=subject,
        )
        emit(event_line("start", **common))
        if args.work:
            await asyncio.sleep(args.work)
        # the end is printed once the ack is handed to the client, before the server can see it (a
        # SIGKILL in between leaves the call "killed" and the message is redelivered, never unrecorded)
        await msg.ack()
        emit(event_line("end", **common, outcome="ack"))

    inst = await elastic_consume(
        nc,
        args.stream,
        args.group,
        args.member or "",
        handler,
        auto=True,
        lease_ttl=args.lease_ttl,
        config=ConsumerConfig(max_ack_pending=1, ack_wait=args.ack_wait),
    )
    label.update(member=inst.member_name, instance=f"{inst.member_name}/{inst.instance_id}")
    labelled.set()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, inst.stop)
    emit(json.dumps({"ev": "ready", "member": inst.member_name, "instance": label["instance"], "t": time.time()}))
    err = await inst.done()
    emit(json.dumps({"ev": "done", "error": str(err) if err else None, "t": time.time()}))
    await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
