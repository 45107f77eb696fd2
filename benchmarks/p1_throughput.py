"""P1: one static member, explicit acks, a handler that only acks, vs a plain nats-py pull consumer
(``pull_subscribe`` + ``fetch(500)`` + ``ack``) on the same stream, and vs the leanest raw pinned pull loop on a
consumer filtered like the member's (``0.>``: nats-server's cost per message grows with the subjects a filter
visits) and, for information, on an unfiltered one. Rounds alternate so every side sees the same machine; the
best round of each is compared. Rates and CPU are counted from the tenth of the backlog acked to the last (start-up
left out: P8 measures it)."""

from __future__ import annotations

import asyncio
import json
import time

from nats.js.api import AckPolicy
from nats.js.api import ConsumerConfig as NatsConsumerConfig

from pcgroups import ConsumerConfig, create_static, static_consume

from .common import Result, Row, Size, connect, publish_all, ratio, server_and_connection, static_stream

STREAM = "P1"
MAX_ACK_PENDING = 1000


class Steady:
    """The rate and the client CPU per message over the acks from a tenth of ``n`` to the last: each side's start-up
    (a consumer's creation; the member's group, KV and pin) left out."""

    def __init__(self, n: int):
        self.n, self.warm, self.count = n, n // 10, 0
        self.t0 = self.c0 = self.t1 = self.c1 = 0.0

    def tick(self) -> None:
        self.count += 1
        if self.count == self.warm:
            self.t0, self.c0 = time.perf_counter(), time.process_time()
        elif self.count == self.n:
            self.t1, self.c1 = time.perf_counter(), time.process_time()

    @property
    def rate(self) -> float:
        return (self.n - self.warm) / (self.t1 - self.t0)

    @property
    def cpu_us(self) -> float:
        return (self.c1 - self.c0) / (self.n - self.warm) * 1e6


async def plain_round(nc, durable: str, n: int, meter: Steady | None = None) -> float:
    js = nc.jetstream()
    t0 = time.perf_counter()
    sub = await js.pull_subscribe(
        "0.>",
        durable=durable,
        stream=STREAM,
        config=NatsConsumerConfig(ack_policy=AckPolicy.EXPLICIT, max_ack_pending=MAX_ACK_PENDING),
    )
    count = 0
    while count < n:
        try:
            msgs = await sub.fetch(500, timeout=5)
        except TimeoutError:
            continue
        for m in msgs:
            await m.ack()
            count += 1
            if meter is not None:
                meter.tick()
    elapsed = time.perf_counter() - t0
    await sub.unsubscribe()
    return elapsed


async def raw_round(nc, durable: str, n: int, meter: Steady | None = None, *, filtered: bool = False) -> float:
    """The loop a priority-group client needs anyway, at its leanest: a pinned-client consumer, MSG.NEXT
    with an own inbox, ``group`` and the pin id, batch 500, the next pull at half-drain, the pin taken
    from ``Nats-Pin-Id``, ack in the subscription callback. ``filtered``: the consumer filters ``0.>`` as a
    member's does (its partition)."""
    t0 = time.perf_counter()
    cfg = {
        "durable_name": durable,
        "ack_policy": "explicit",
        "max_ack_pending": MAX_ACK_PENDING,
        "ack_wait": 30_000_000_000,
        "priority_groups": ["PCG"],
        "priority_policy": "pinned_client",
        "priority_timeout": 30_000_000_000,
    }
    if filtered:
        cfg["filter_subjects"] = ["0.>"]
    reply = await nc.request(
        f"$JS.API.CONSUMER.CREATE.{STREAM}.{durable}",
        json.dumps({"stream_name": STREAM, "config": cfg, "action": "create"}).encode(),
        timeout=5,
    )
    if b'"error"' in reply.data:
        raise RuntimeError(reply.data.decode())
    done = asyncio.Event()
    wake = asyncio.Event()
    state = {"count": 0, "pending": 0, "pin": None}
    subject = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{durable}"
    inbox = nc.new_inbox()

    async def cb(msg):
        if not msg.reply:  # a status (408 at expiry, 423 pin lost): the pull ended
            if msg.headers and msg.headers.get("Status") == "423":
                state["pin"] = None
            state["pending"] = 0
            wake.set()
            return
        state["pin"] = msg.headers.get("Nats-Pin-Id") if msg.headers else None
        state["pending"] -= 1
        if state["pending"] <= 250:
            wake.set()
        await msg.ack()
        state["count"] += 1
        if meter is not None:
            meter.tick()
        if state["count"] == n:
            done.set()

    sub = await nc.subscribe(inbox, cb=cb)
    finished = asyncio.ensure_future(done.wait())
    while not done.is_set():
        if state["pending"] <= 250:
            want = 500 - state["pending"]
            req = {"batch": want, "expires": 1_000_000_000, "group": "PCG"}
            if state["pin"]:
                req["id"] = state["pin"]
            await nc.publish(subject, json.dumps(req).encode(), reply=inbox)
            state["pending"] += want
        wake.clear()
        waiter = asyncio.ensure_future(wake.wait())
        await asyncio.wait({waiter, finished}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
    elapsed = time.perf_counter() - t0
    await sub.unsubscribe()
    return elapsed


async def pcg_round(nc, group: str, n: int, meter: Steady | None = None) -> float:
    await create_static(nc, STREAM, group, 1, members=["m"])
    done = asyncio.Event()
    count = 0

    async def handler(msg):
        nonlocal count
        await msg.ack()
        count += 1
        if meter is not None:
            meter.tick()
        if count == n:
            done.set()

    t0 = time.perf_counter()
    inst = await static_consume(
        nc, STREAM, group, "m", handler, config=ConsumerConfig(max_ack_pending=MAX_ACK_PENDING, ack_wait=30)
    )
    try:
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.perf_counter() - t0
    finally:
        await inst.stop()
    return elapsed


async def run(size: Size) -> Result:
    res = Result("P1", "static member (ack only) vs plain pull consumer, msg/s")
    n = size.p1_messages
    async with server_and_connection() as (server, nc):
        js = nc.jetstream()
        await static_stream(js, STREAM, 1)
        pub_s = await publish_all(nc, [f"{STREAM}.k{i % 100}" for i in range(n)])
        plain, pcg, raw, raw_f = [], [], [], []
        cpu: dict[str, list[float]] = {"pcgroups": [], "plain": [], "raw": [], "raw_filtered": []}

        async def measured(kind: str, round_fn, name: str) -> float:
            # each side on its own connection, as an application would have
            c = await connect(server.url)
            meter = Steady(n)
            try:
                await round_fn(c, name, n, meter)
                cpu[kind].append(meter.cpu_us)
                return meter.rate
            finally:
                await c.close()

        async def raw_filtered(c, name: str, count: int, meter: Steady) -> float:
            return await raw_round(c, name, count, meter, filtered=True)

        for r in range(size.p1_rounds):
            raw.append(await measured("raw", raw_round, f"raw{r}"))
            raw_f.append(await measured("raw_filtered", raw_filtered, f"rawf{r}"))
            plain.append(await measured("plain", plain_round, f"plain{r}"))
            pcg.append(await measured("pcgroups", pcg_round, f"g{r}"))
    best_plain, best_pcg = max(plain), max(pcg)
    r = ratio(best_pcg, best_plain)
    res.rows.append(
        Row(
            "throughput, 1 member, max_ack_pending 1000",
            best_pcg,
            "msg/s",
            best_plain,
            "pull_subscribe+fetch(500)",
            r,
            ">= 0.9",
            r is not None and r >= 0.9,
        )
    )
    r2 = ratio(best_pcg, max(raw_f))
    res.rows.append(
        Row(
            "same, vs the leanest raw priority-group pull loop on a consumer filtered like the member's",
            best_pcg,
            "msg/s",
            max(raw_f),
            "raw pinned MSG.NEXT loop, filter 0.>",
            r2,
            ">= 0.9",
            r2 is not None and r2 >= 0.9,
        )
    )
    cpu_pcg, cpu_raw_f = min(cpu["pcgroups"]), min(cpu["raw_filtered"])
    r3 = ratio(cpu_pcg, cpu_raw_f)
    res.rows.append(
        Row(
            "client CPU per message (lower is better)",
            cpu_pcg,
            "us",
            cpu_raw_f,
            "raw pinned MSG.NEXT loop, filter 0.>",
            r3,
            "<= 1.2",
            r3 is not None and r3 <= 1.2,
        )
    )
    res.rows.append(
        Row(
            "throughput vs the raw loop on an unfiltered consumer (no member's consumer is)",
            best_pcg,
            "msg/s",
            max(raw),
            "raw pinned MSG.NEXT loop, no filter",
            ratio(best_pcg, max(raw)),
        )
    )
    res.rows.append(
        Row(
            "client CPU per message vs that unfiltered loop",
            cpu_pcg,
            "us",
            min(cpu["raw"]),
            "raw pinned MSG.NEXT loop, no filter",
            ratio(cpu_pcg, min(cpu["raw"])),
        )
    )
    res.details = {
        "messages": n,
        "publish_msgs_per_s": n / pub_s,
        "rounds_pcgroups": pcg,
        "rounds_plain": plain,
        "rounds_raw": raw,
        "rounds_raw_filtered": raw_f,
        "client_cpu_us_per_msg": cpu,
        "ratio_of_medians": ratio(sorted(pcg)[len(pcg) // 2], sorted(plain)[len(plain) // 2]),
    }
    return res
