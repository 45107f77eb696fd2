"""The burst traffic of P6 and P10: a burst on one key (``A``), then one message on each of many other keys,
and the other keys' latency: from just before their publish to their ``+ACK`` seen on the wire.

The consumer (a member instance, or a dispatcher and its workers) runs in processes of its own, so that the
benchmark's publishing does not share its event loop. Acks are watched per message (a subscription on
``$JS.ACK.<stream>.*.*.<stream seq>.>`` for each other key's message, made before it is published: the
sequences of a fresh stream written by one publisher are known), so the ``+WPI`` that every message waiting
behind ``A`` gets cost this process nothing."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from pcgroups.consume._msg import ack_numbers

from .common import publish_all, wait_until

BURST_KEY = "A"


@dataclass
class OtherKeys:
    """The other keys' messages: stream sequence -> publish time and first ``+ACK`` time (monotonic)."""

    published: dict[int, float] = field(default_factory=dict)
    acked: dict[int, float] = field(default_factory=dict)
    subs: list = field(default_factory=list)

    async def watch(self, nc, stream: str, seqs: range) -> None:
        async def cb(msg) -> None:
            if msg.data.startswith(b"+ACK"):
                self.acked.setdefault(ack_numbers(msg.subject)[1], time.monotonic())

        for seq in seqs:
            self.subs.append(await nc.subscribe(f"$JS.ACK.{stream}.*.*.{seq}.>", cb=cb))
        await nc.flush()

    async def close(self) -> None:
        for sub in self.subs:
            await sub.unsubscribe()

    def latencies(self) -> list[float]:
        return sorted(self.acked[s] - t for s, t in self.published.items() if s in self.acked)


async def publish_burst(nc, stream: str, burst: int) -> None:
    await publish_all(nc, [f"{stream}.{BURST_KEY}"] * burst)


async def burst_then_others(
    nc, stream: str, burst: int, others: int, timeout: float, *, paced: float = 0.0, stored: bool = False
) -> OtherKeys:
    """On a fresh ``stream`` (subjects ``<stream>.<key>``): ``burst`` messages on key A (``stored``: they were
    published already), then one message on each of ``others`` keys, all at once (``paced`` 0) or one every
    ``paced`` seconds; waits (``timeout``) until every other key's message was acked and returns their stamps."""
    js = nc.jetstream()
    keys = OtherKeys()
    first = burst + 1
    await keys.watch(nc, stream, range(first, first + others))
    try:
        if not stored:
            await publish_burst(nc, stream, burst)
        if paced:
            next_at = time.monotonic()
            for i in range(others):
                keys.published[first + i] = time.monotonic()
                ack = await js.publish(f"{stream}.o{i}", b"x")
                _check_seq(ack.seq, first + i)
                next_at += paced
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        else:
            t = time.monotonic()
            futs = [await js.publish_async(f"{stream}.o{i}", b"x") for i in range(others)]
            for i, fut in enumerate(futs):
                keys.published[first + i] = t
                _check_seq((await fut).seq, first + i)
        await wait_until(lambda: len(keys.acked) >= others, timeout, f"{others} other keys' messages acked")
    finally:
        await keys.close()
    return keys


def _check_seq(got: int, expected: int) -> None:
    if got != expected:
        raise RuntimeError(f"published at stream sequence {got}, expected {expected} (the stream was not fresh)")
