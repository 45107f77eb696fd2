"""Copy a partitioned stream into other subjects with Spark, exactly once: the job of docs/SPARK.md, *On a cluster*.

    spark-submit --master spark://HOST:7077 --py-files pcgroups.zip examples/spark_copy.py \\
        --servers nats://HOST:4222 --stream ORDERS --group cg --to copy --checkpoint /shared/ckpt/orders-copy

1. Says where the executors import pcgroups from (the zip shipped with ``--py-files``, or an installed
   copy) and from which processes.
2. Reads the stream once as a batch: messages, first and last sequence of each partition.
3. Copies it with Structured Streaming: ``readStream.format("pcgroups")`` into ``writeStream.format("pcgroups")``
   as ``<to>.<subject>`` (the partition token stripped, as group members see it), the offsets in the
   checkpoint. The sink's message ids are ``<query id>:<batch>:<task>:<row>``, so a micro-batch that Spark
   runs again after a crash is dropped by the target stream as duplicates (within its duplicate window).
   With ``--available-now`` the query stops once it has copied what the stream held when it started;
   without, it runs until it is stopped.

``--copy-only`` skips steps 1 and 2 (a restart of the copy).
The target stream must exist and store ``<to>.>``. Prints one JSON line per step on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
from typing import Any


def where_pcgroups_is(_: object) -> tuple[str, str, int]:
    """On an executor: where its Python imports pcgroups from, and which process it is."""
    import pcgroups

    return str(pcgroups.__file__), socket.gethostname(), os.getpid()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", required=True, help="NATS URL(s), comma-separated")
    p.add_argument("--stream", required=True, help="the partitioned stream to copy")
    p.add_argument("--group", default="", help="a static group of the stream: the partition count comes from it")
    p.add_argument("--partitions", type=int, default=0, help="the partition count, without --group")
    p.add_argument("--to", required=True, help="the subject prefix of the copies")
    p.add_argument("--checkpoint", required=True, help="the query's checkpoint directory (storage the driver keeps)")
    p.add_argument("--max-per-trigger", type=int, default=1000, help="at most this many messages per micro-batch")
    p.add_argument("--available-now", action="store_true", help="copy what is there now, then stop")
    p.add_argument("--copy-only", action="store_true", help="skip steps 1 and 2 (a restart of the copy)")
    args = p.parse_args()
    if bool(args.group) == bool(args.partitions):
        p.error("give one of --group and --partitions")

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from pcgroups.spark import register

    spark = SparkSession.builder.appName(f"pcgroups copy {args.stream}").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)

    def say(**fields: object) -> None:
        print(json.dumps(fields), flush=True)

    def source(read: Any) -> Any:  # spark.read or spark.readStream
        r = read.format("pcgroups").option("servers", args.servers).option("stream", args.stream)
        r = r.option("group", args.group) if args.group else r.option("partitionCount", args.partitions)
        return r

    if not args.copy_only:
        n = spark.sparkContext.defaultParallelism
        places = spark.sparkContext.parallelize(range(n), n).map(where_pcgroups_is).collect()
        say(
            step="executors",
            pcgroups=sorted({f for f, _, _ in places}),
            processes=sorted({(h, pid) for _, h, pid in places}),
            driver_pid=os.getpid(),
        )
        batch = source(spark.read).load()
        per_partition = (
            batch.groupBy("partition")
            .agg(F.count("*").alias("messages"), F.min("sequence").alias("first"), F.max("sequence").alias("last"))
            .collect()
        )
        say(step="batch-read", partitions={r.partition: [r.messages, r.first, r.last] for r in sorted(per_partition)})

    rows = (
        source(spark.readStream)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.max_per_trigger)
        .load()
    )
    copies = rows.select(F.concat(F.lit(args.to + "."), rows.subject).alias("subject"), "data", "headers")
    writer = (
        copies.writeStream.format("pcgroups")
        .option("servers", args.servers)
        .option("checkpointLocation", args.checkpoint)
    )
    query = (writer.trigger(availableNow=True) if args.available_now else writer).start()
    say(step="streaming", id=str(query.id))
    query.awaitTermination()
    say(step="stopped", batches=(query.lastProgress or {}).get("batchId"))
    spark.stop()


if __name__ == "__main__":
    main()
