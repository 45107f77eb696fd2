"""Rows per second through the ``pcgroups`` Spark data source vs plain nats-py, on this machine.

    .venv/bin/python examples/spark_throughput.py [--messages 200000] [--partitions 4] [--payload 100]

Starts an embedded nats-server, fills a partitioned stream, and measures:

- plain nats-py reading the whole stream in one process: an ephemeral pull consumer (ack none,
  ``fetch(500)``); and, for reference, the data source's own range readers (batched direct get, and
  ephemeral consumer) run in one process without Spark;
- Spark ``local[2]`` batch reads (``spark.read.format("pcgroups")`` into the ``noop`` sink, which
  materialises every row and column), with ``readMode`` direct and consumer;
- plain nats-py publishing (``js.publish`` awaiting each ack, and ``publish_async`` windows);
- Spark writes (``df.write.format("pcgroups")``) of generated rows, ``maxPendingAcks`` 1 and 256.

Spark numbers are wall time of the action (planning, task launch and Python workers included); the
session start (several seconds) is not counted, and each action runs once to warm up first.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import nats
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig, SubjectTransform

from pcgroups.spark import _nats
from pcgroups.spark._options import ConnectionOptions
from pcgroups.testing._server import EmbeddedServer

T = TypeVar("T")


async def fill(url: str, n: int, partitions: int, payload: int) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=20000)
    await js.add_stream(
        StreamConfig(
            name="BENCH",
            subjects=["bench.*"],
            allow_direct=True,
            subject_transform=SubjectTransform(
                src="bench.*", dest=f"{{{{partition({partitions},1)}}}}.bench.{{{{wildcard(1)}}}}"
            ),
        )
    )
    await js.add_stream(StreamConfig(name="OUT", subjects=["out.>"]))
    body = b"x" * payload
    for i in range(n):
        await js.publish_async(f"bench.k{i % 1000}", body, headers={"n": str(i)})
    await asyncio.wait_for(js.publish_async_completed(), 120)
    await nc.close()


async def plain_pull(url: str) -> int:
    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(
        ">", stream="BENCH", config=ConsumerConfig(ack_policy=AckPolicy.NONE, mem_storage=True, inactive_threshold=10)
    )
    n = 0
    while True:
        try:
            msgs = await sub.fetch(500, timeout=2)
        except nats.errors.TimeoutError:
            break
        n += len(msgs)
        if msgs[-1].metadata.num_pending == 0:
            break
    await sub.unsubscribe()
    await nc.close()
    return n


async def source_reader(
    url: str, partitions: int, last: int, cls: type[_nats.DirectRangeReader] | type[_nats.ConsumerRangeReader]
) -> int:
    """The data source's own range reader (what each Spark task runs), partition after partition."""
    conn = ConnectionOptions(servers=(url,))
    nc = await _nats.connect(conn)
    n = 0
    for p in range(partitions):
        r = cls(nc, conn, "BENCH", p, 1, last + 1, (f"{p}.>",), batch=500, include_headers=True)
        await r.open()
        while (cols := await r.next_batch()) is not None:
            n += len(cols)
        await r.close()
    await nc.close()
    return n


async def plain_publish(url: str, n: int, window: int, payload: int) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=max(window, 1))
    body = b"y" * payload
    await _nats.publish_all(
        js,
        ((f"out.p{i % 1000}", body, {"Nats-Msg-Id": f"plain{window}:{i}"}) for i in range(n)),
        window=window,
        timeout=30,
        expected_stream=None,
    )
    await nc.close()


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--payload", type=int, default=100)
    ap.add_argument("--sync-writes", type=int, default=20_000, help="rows for the maxPendingAcks=1 runs")
    args = ap.parse_args()
    n, parts = args.messages, args.partitions
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    results: list[tuple[str, int, float]] = []

    def report(what: str, rows: int, secs: float) -> None:
        results.append((what, rows, secs))
        print(f"  {what:<58} {rows:>8} rows {secs:>7.2f} s {rows / secs:>10,.0f} rows/s", flush=True)

    with EmbeddedServer() as server:
        url = server.url
        secs, _ = timed(lambda: asyncio.run(fill(url, n, parts, args.payload)))
        print(
            f"filled BENCH: {n} messages of {args.payload} bytes + 1 header, {parts} partitions "
            f"({n / secs:,.0f} msg/s publish_async)"
        )
        print("plain nats-py / no Spark, one process:")
        secs, got = timed(lambda: asyncio.run(plain_pull(url)))
        assert got == n, got
        report("read: pull consumer, ack none, fetch(500)", got, secs)
        for label, cls in (("direct", _nats.DirectRangeReader), ("consumer", _nats.ConsumerRangeReader)):
            secs, got = timed(functools.partial(asyncio.run, source_reader(url, parts, n, cls)))
            assert got == n, got
            report(f"read: the source's {label} reader, one process, no Spark", got, secs)
        w = args.sync_writes
        secs, _ = timed(lambda: asyncio.run(plain_publish(url, w, 1, args.payload)))
        report("write: js.publish, await each ack", w, secs)
        secs, _ = timed(lambda: asyncio.run(plain_publish(url, n, 256, args.payload)))
        report("write: publish_async, window 256", n, secs)

        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        from pcgroups.spark import register

        t = time.perf_counter()
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("pcgroups-throughput")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        print(f"Spark local[2] (session start {time.perf_counter() - t:.1f} s, not counted):")
        try:
            for mode in ("direct", "consumer"):
                df = (
                    spark.read.format("pcgroups")
                    .option("servers", url)
                    .option("stream", "BENCH")
                    .option("partitionCount", parts)
                    .option("readMode", mode)
                    .load()
                )

                def read_all(df: Any = df) -> None:
                    df.write.format("noop").mode("overwrite").save()

                read_all()  # warm-up
                secs, _ = timed(read_all)
                report(f"read: spark.read pcgroups -> noop, readMode={mode}", n, secs)

            def gen(rows: int) -> Any:
                return spark.range(rows, numPartitions=2).select(
                    F.concat(F.lit("out.s"), (F.col("id") % 1000).cast("string")).alias("subject"),
                    F.expr(f"repeat('z', {args.payload})").alias("data"),
                )

            for acks, rows in ((1, w), (256, n)):

                def write(prefix: str, rows: int = rows, acks: int = acks) -> None:
                    (
                        gen(rows)
                        .write.format("pcgroups")
                        .mode("append")
                        .option("servers", url)
                        .option("maxPendingAcks", acks)
                        .option("msgIdPrefix", prefix)
                        .save()
                    )

                write(f"warm{acks}", rows=2000)
                secs, _ = timed(functools.partial(write, f"run{acks}"))
                report(f"write: df.write pcgroups, maxPendingAcks={acks}", rows, secs)
        finally:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
