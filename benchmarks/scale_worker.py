"""Many instances in one process, for the scale measurements (benchmarks/scale.py).

usage: python -m benchmarks.scale_worker URL auto STREAM GROUP --count K [--lease-ttl S]
       python -m benchmarks.scale_worker URL static|elastic STREAM GROUP[,GROUP...] [--member M]

``auto``: K instances of GROUP in automatic membership (``elastic_consume(..., auto=True)``), each with a
connection of its own and a member of its own (``auto-<8 hex>``), all started at once.
``static``/``elastic``: one instance of member M (``m1``) for each GROUP, all on one connection (a service
consuming many groups).

Prints JSON lines on stdout:

- ``{"ev": "ready", "members": [...], "errors": [...], "t": ..}`` once every instance started (members: the
  instances' member names, auto, or their groups; errors: ``<name>: <error>`` of those that could not start);
- ``{"ev": "stats", "conflicts": N, "rebalances": N, "warnings": {template: N}, "warning_examples": {template:
  first message}, "t": ..}`` every second: the
  compare-and-set conflicts the instances met writing a config (pcgroups logs each at debug level), the
  membership changes they wrote (auto), and pcgroups' warnings by message template;
- ``{"ev": "event", "group": .., "kind": .., "partitions": [..], "t": ..}`` per instance event (``on_event``);
- ``{"ev": "done", ...}`` once SIGTERM stopped every instance (all at once), with the final stats.

Handlers ack without work. SIGTERM stops the instances, each as a user's Ctrl-C would.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import time
from collections import Counter

import nats


def emit(**fields) -> None:
    fields["t"] = time.time()
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class Counts(logging.Handler):
    """Counts what pcgroups logs: the compare-and-set conflicts (``store.update``, debug level) and the
    warnings, by their message template (``lease renewal failed: %s``, ...)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.conflicts = 0
        self.warnings: Counter[str] = Counter()
        self.examples: dict[str, str] = {}  # template -> its first message

    def emit(self, record: logging.LogRecord) -> None:
        if str(record.msg).startswith("compare-and-set conflict"):
            self.conflicts += 1
        elif record.levelno >= logging.WARNING:
            self.warnings[str(record.msg)] += 1
            self.examples.setdefault(str(record.msg), record.getMessage()[:300])


async def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale_worker")
    p.add_argument("url")
    p.add_argument("mode", choices=["auto", "static", "elastic"])
    p.add_argument("stream")
    p.add_argument("groups", help="the group (auto), or comma-separated groups (one instance each)")
    p.add_argument("--count", type=int, default=1, help="auto: instances in this process")
    p.add_argument("--lease-ttl", type=float, default=5.0)
    p.add_argument("--member", default="m1", help="static/elastic: the member every instance runs as")
    args = p.parse_args()

    counts = Counts()
    log = logging.getLogger("pcgroups")
    log.setLevel(logging.DEBUG)
    log.addHandler(counts)
    log.propagate = False

    from pcgroups import elastic_consume, static_consume

    async def handler(msg) -> None:
        await msg.ack()

    def on_event(group: str):
        def note(event) -> None:
            emit(ev="event", group=group, kind=event.kind, partitions=list(getattr(event, "partitions", []) or []))

        return note

    conns: list = []
    if args.mode == "auto":

        async def one():
            nc = await nats.connect(servers=args.url.split(","), max_reconnect_attempts=-1)
            conns.append(nc)
            return await elastic_consume(nc, args.stream, args.groups, "", handler, auto=True, lease_ttl=args.lease_ttl)

        started = await asyncio.gather(*(one() for _ in range(args.count)), return_exceptions=True)
        names = [getattr(i, "member_name", "") for i in started]
    else:
        nc = await nats.connect(servers=args.url.split(","), max_reconnect_attempts=-1)
        conns.append(nc)
        consume = static_consume if args.mode == "static" else elastic_consume
        names = args.groups.split(",")
        started = await asyncio.gather(
            *(consume(nc, args.stream, g, args.member, handler, on_event=on_event(g)) for g in names),
            return_exceptions=True,
        )
    insts = [i for i in started if not isinstance(i, BaseException)]
    members = [n for n, i in zip(names, started, strict=False) if not isinstance(i, BaseException)]
    errors = [f"{n}: {i}" for n, i in zip(names, started, strict=False) if isinstance(i, BaseException)]

    def stats() -> dict:
        return {
            "conflicts": counts.conflicts,
            "rebalances": sum(getattr(i, "rebalances", 0) for i in insts),
            "warnings": dict(counts.warnings),
            "warning_examples": counts.examples,
        }

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    emit(ev="ready", members=members, errors=errors)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            emit(ev="stats", **stats())
    t0 = time.time()
    await asyncio.gather(*(i.stop() for i in insts), return_exceptions=True)
    errors = [str(e) for e in await asyncio.gather(*(i.done() for i in insts), return_exceptions=True) if e]
    emit(ev="done", stop_seconds=round(time.time() - t0, 3), errors=errors[:5], **stats())
    await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(main())
