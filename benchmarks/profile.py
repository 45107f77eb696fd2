"""Run one side of a benchmark alone, for a profiler:

    py-spy record -r 500 -f raw -o p1.txt -- python -m benchmarks.profile p1 100000
    python -m benchmarks.profile p1 100000 --pyinstrument

Cases: ``p1`` (static member, ack only), ``p1-raw`` (the leanest raw pull loop), ``p6`` (K=8, many keys,
10 ms of work), ``p6-k1``, ``p6-burst`` (K=8, N stored messages on one key then one on each of 40 others:
the time until the others have all started, i.e. taking in the burst). The server is started before the
measured part; what is printed is the rate.

``p7`` / ``p7-raw``: one ``cg static consume`` member (asyncio's loop; ``p7-uvloop``: uvloop's) or one raw
pinned loop, in a child process, on a stored backlog of N messages without work (``p7-otel``: ``--otel``
with no exporter, spans made and dropped; ``p7-otlp``: exported over OTLP/HTTP to a sink process;
``p7-elastic``: one ``cg elastic consume`` member of the same shape); profile the child:

    py-spy record --subprocesses -r 1000 -f raw -o p7.txt -- python -m benchmarks.profile p7 30000
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time

from .common import publish_all, server_and_connection, static_stream


async def publish_only(url: str, n: int) -> None:
    from . import p1_throughput as p1
    from .common import connect

    nc = await connect(url)
    try:
        await publish_all(nc, [f"{p1.STREAM}.k{i % 100}" for i in range(n)])
    finally:
        await nc.close()


async def p7_member(case: str, n: int) -> None:
    from pcgroups.jetstream._api import JetStreamApi

    from . import p7_consume as p7

    async with server_and_connection() as (server, nc):
        sink = None
        if case == "p7-otlp":
            endpoint, sink = p7.otlp_sink()
            otel = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}
        else:
            otel = {"OTEL_TRACES_EXPORTER": "none"}
        side = {
            "p7": p7.Side("cg", env=p7.ASYNCIO),
            "p7-uvloop": p7.Side("cg"),
            "p7-raw": p7.Side("raw"),
            "p7-elastic": p7.Side("elastic", env=p7.ASYNCIO),
            "p7-otel": p7.Side("cg", env={**p7.ASYNCIO, **otel}, args=("--otel",)),
            "p7-otlp": p7.Side("cg", env={**p7.ASYNCIO, **otel}, args=("--otel",)),
        }[case]
        await p7.backlog(nc, "PROF", side.flavour, n)
        pid = server.proc.pid if server.proc else None
        try:
            ms, cpu, server_cpu, _ = await p7.one_round(
                server.url, nc, JetStreamApi(nc), side, "PROF", "prof", 0.0, n, ["m1"], server_pid=pid
            )
        finally:
            if sink is not None:
                sink.kill()
                sink.wait()
        print(f"{case}: {ms:.3f} ms and {cpu:.0f} us of CPU per message (the server's: {server_cpu or 0:.0f} us)")


async def p6_burst(nc, js, n: int) -> float:
    """Seconds from a K=8 member's start over ``n`` stored messages on key A and 40 on other keys until the 40
    have all started (10 ms of work each)."""
    from pcgroups import ConsumerConfig, create_static, static_consume

    from .common import wait_until

    await static_stream(js, "BURST", 1)
    await create_static(nc, "BURST", "g", 1, members=["m"])
    await publish_all(nc, ["BURST.A"] * n + [f"BURST.o{i}" for i in range(40)])
    others: set[str] = set()

    async def handler(msg) -> None:
        if msg.subject != "A":
            others.add(msg.subject)
        await asyncio.sleep(0.01)
        await msg.ack()

    t0 = time.perf_counter()
    inst = await static_consume(nc, "BURST", "g", "m", handler, concurrency=8, config=ConsumerConfig(ack_wait=5))
    try:
        await wait_until(lambda: len(others) == 40, 60, "the other keys")
        return time.perf_counter() - t0
    finally:
        await inst.stop()


async def main(case: str, n: int) -> None:
    from . import p1_throughput as p1
    from . import p6_keys as p6

    if case.startswith("p7"):
        await p7_member(case, n)
        return
    async with server_and_connection() as (server, nc):
        js = nc.jetstream()
        if case.startswith("p1"):
            await static_stream(js, p1.STREAM, 1)
            # published by a child process, so the profile shows only consuming
            subprocess.run(
                [sys.executable, "-m", "benchmarks.profile", "publish", str(n), "--url", server.url], check=True
            )
            t0 = time.perf_counter()
            if case == "p1":
                await p1.pcg_round(nc, "g", n)
            else:
                await p1.raw_round(nc, "raw", n)
            print(f"{case}: {n / (time.perf_counter() - t0):,.0f} msg/s")
        elif case == "p6-burst":
            print(f"{case}: the 40 other keys all started {await p6_burst(nc, js, n):.3f} s after the start")
        else:
            k = 1 if case == "p6-k1" else 8
            rate = await p6.throughput_round(nc, js, k, window=max(n / 1000, 2.0), group_suffix="prof")
            print(f"{case}: {rate:,.0f} msg/s")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "case",
        choices=[
            "p1",
            "p1-raw",
            "p6",
            "p6-k1",
            "p6-burst",
            "p7",
            "p7-raw",
            "p7-uvloop",
            "p7-elastic",
            "p7-otel",
            "p7-otlp",
            "publish",
        ],
    )
    ap.add_argument("n", type=int, nargs="?", default=100_000)
    ap.add_argument("--pyinstrument", action="store_true")
    ap.add_argument("--url", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.case == "publish":
        asyncio.run(publish_only(a.url, a.n))
        sys.exit(0)
    if a.pyinstrument:
        from pyinstrument import Profiler

        prof = Profiler(async_mode="disabled", interval=0.0005)
        prof.start()
        asyncio.run(main(a.case, a.n))
        prof.stop()
        print(prof.output_text(unicode=False, color=False, show_all=False))
    else:
        asyncio.run(main(a.case, a.n))
