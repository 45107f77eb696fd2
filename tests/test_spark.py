"""The ``pcgroups`` PySpark data source end to end: a real SparkSession (``local[2,2]``, shared by the
module) against the real test nats-server. Skipped when pyspark (or java) is missing."""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections import defaultdict

import pytest

pytest.importorskip("pyspark", reason="pyspark not installed (pip install -e '.[spark]')")
pytest.importorskip("pyarrow", reason="pyarrow not installed (pip install -e '.[spark]')")

from .helpers.spark_support import (
    consumer_names,
    make_plain_stream,
    make_stream,
    partition_of,
    publish,
    read_stream,
    run,
    stream_state,
)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(180)]

QUERY_TIMEOUT = 90  # seconds: every awaitTermination is bounded


@pytest.fixture(scope="module")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("java not found (Spark needs Java 17+)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers must see this venv
    from pyspark.sql import SparkSession

    from pcgroups.spark import register

    session = (
        SparkSession.builder.master("local[2,2]")  # 2 cores; a failed task gets one retry
        .appName("pcgroups-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


def reader(spark, url, stream, streaming=False, **options):
    r = (spark.readStream if streaming else spark.read).format("pcgroups")
    r = r.option("servers", url).option("stream", stream)
    for k, v in options.items():
        r = r.option(k, str(v))
    return r.load()


class Batches:
    """A foreachBatch sink that keeps, per micro-batch, the rows' (partition, sequence, spark partition)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.batches: dict[int, list] = {}

    def __call__(self, df, batch_id):
        from pyspark.sql.functions import spark_partition_id

        rows = df.select("partition", "sequence", spark_partition_id().alias("sp")).collect()
        with self.lock:
            self.batches[batch_id] = [(r.partition, r.sequence, r.sp) for r in rows]

    def sizes(self):
        return [len(self.batches[b]) for b in sorted(self.batches)]

    def seqs(self):
        return sorted(s for rows in self.batches.values() for _, s, _ in rows)


def run_available_now(df, sink, checkpoint):
    q = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert q.awaitTermination(QUERY_TIMEOUT), "streaming query did not finish in time"
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    return q


def orders(prefix, n, keys=37, start=0):
    return [(f"{prefix}.k{i % keys}", f"order-{i}".encode()) for i in range(start, start + n)]


def test_batch_read_one_spark_partition_per_group_partition_in_stream_order(spark, nats_server, uniq):
    url = nats_server.url
    run(make_stream(url, uniq, uniq, 3))
    items = orders(uniq, 3000)
    seqs = run(publish(url, items))
    df = reader(spark, url, uniq, partitionCount=3)
    assert df.rdd.getNumPartitions() == 3
    from pyspark.sql.functions import spark_partition_id

    rows = df.withColumn("sp", spark_partition_id()).collect()  # collect keeps each partition's order
    assert len(rows) == 3000
    by_sp = defaultdict(list)
    for r in rows:
        by_sp[r.sp].append(r)
    assert sorted(by_sp) == [0, 1, 2]
    for sp, part_rows in by_sp.items():
        assert {r.partition for r in part_rows} == {sp}  # one group partition per task
        got = [r.sequence for r in part_rows]
        want = [s for s, (subj, _) in zip(seqs, items, strict=False) if partition_of(subj.split(".")[1], 3) == sp]
        assert got == want  # all of them, in stream order
    r0 = rows[0]
    i = seqs.index(r0.sequence)
    assert (r0.subject, r0.data, r0.headers) == (items[i][0], items[i][1], {"i": str(i)})
    assert r0.timestamp is not None
    # assign a subset, endingOffsets (exclusive) per partition
    mid = seqs[1500]
    sub = reader(
        spark, url, uniq, partitionCount=3, assign="0,2", endingOffsets=f'{{"{uniq}": {{"0": {mid}, "2": -1}}}}'
    ).collect()
    want = sorted(
        s
        for s, (subj, _) in zip(seqs, items, strict=False)
        if (p := partition_of(subj.split(".")[1], 3)) == 2 or (p == 0 and s < mid)
    )
    assert sorted(r.sequence for r in sub) == want
    assert run(consumer_names(url, uniq)) == []  # no consumer was created


def test_bad_options_fail_with_clear_errors(spark, nats_server, uniq):
    url = nats_server.url
    run(make_stream(url, uniq, uniq, 2))
    with pytest.raises(Exception, match="unknown source option"):
        reader(spark, url, uniq, partitionCount=2, startingOffset="earliest").collect()
    with pytest.raises(Exception, match="static consumer group 'nope'"):
        reader(spark, url, uniq, group="nope").collect()


def test_rate_limit_bounds_batch_sizes_with_available_now(spark, nats_server, uniq, tmp_path):
    url = nats_server.url
    run(make_stream(url, uniq, uniq, 3))
    seqs = run(publish(url, orders(uniq, 2500)))
    sink = Batches()
    df = reader(
        spark, url, uniq, streaming=True, partitionCount=3, startingOffsets="earliest", maxOffsetsPerTrigger=600
    )
    run_available_now(df, sink, tmp_path / "ckpt")
    assert sink.sizes() == [600, 600, 600, 600, 100]
    assert sink.seqs() == seqs  # exactly once, nothing missing
    for rows in sink.batches.values():
        for p in range(3):  # stream order within each partition
            ps = [s for q, s, _ in rows if q == p]
            assert ps == sorted(ps)


def test_restart_from_checkpoint_reads_only_new_messages(spark, nats_server, uniq, tmp_path):
    url = nats_server.url
    run(make_stream(url, uniq, uniq, 2))
    first = run(publish(url, orders(uniq, 800)))
    ckpt = tmp_path / "ckpt"
    sink1 = Batches()
    run_available_now(
        reader(spark, url, uniq, streaming=True, partitionCount=2, startingOffsets="earliest"), sink1, ckpt
    )
    assert sink1.seqs() == first
    second = run(publish(url, orders(uniq, 300, start=800)))
    sink2 = Batches()
    # startingOffsets only applies to a new query: the restart resumes from the checkpoint
    run_available_now(
        reader(spark, url, uniq, streaming=True, partitionCount=2, startingOffsets="earliest"), sink2, ckpt
    )
    assert sink2.seqs() == second
    # the checkpoint holds per-partition stream sequences (the next one to read)
    offsets_dir = ckpt / "offsets"
    last = max((p for p in offsets_dir.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    assert f'"{uniq}":{{"0":{second[-1] + 1},"1":{second[-1] + 1}}}' in last.read_text().replace(" ", "")
    # a restart that sees another partition count is refused
    sink3 = Batches()
    df = reader(spark, url, uniq, streaming=True, partitionCount=3)
    q = df.writeStream.foreachBatch(sink3).option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start()
    try:
        with pytest.raises(Exception, match="partition count"):
            q.awaitTermination(QUERY_TIMEOUT)
    finally:
        q.stop()


def test_failed_task_is_retried_with_exact_counts(spark, nats_server, uniq, tmp_path):
    url = nats_server.url
    run(make_stream(url, uniq, uniq, 3))
    seqs = run(publish(url, orders(uniq, 3000)))
    marker = tmp_path / "failed-once"
    results: dict[int, list] = {}

    def fail_first_attempt(rows):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        out = []
        for i, r in enumerate(rows):
            if ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and i == 500:
                marker.write_text("x")
                raise RuntimeError("injected failure in the first attempt of partition 0")
            out.append((r.partition, r.sequence))
        return out

    def per_batch(df, batch_id):
        results[batch_id] = df.rdd.mapPartitions(fail_first_attempt).collect()

    df = reader(spark, url, uniq, streaming=True, partitionCount=3, startingOffsets="earliest")
    run_available_now(df, per_batch, tmp_path / "ckpt")
    assert marker.exists()  # the failure did happen
    got = [s for rows in results.values() for _, s in rows]
    assert sorted(got) == seqs and len(got) == len(set(got)) == 3000  # exact counts after the retry
    counts = defaultdict(int)
    for rows in results.values():
        for p, _ in rows:
            counts[p] += 1
    assert dict(counts) == {p: sum(1 for i in range(3000) if partition_of(f"k{i % 37}", 3) == p) for p in range(3)}


def test_sink_replayed_batch_writes_no_duplicates(spark, nats_server, uniq, tmp_path):
    url = nats_server.url
    run(make_stream(url, uniq, uniq, 2))
    run(make_plain_stream(url, uniq + "out", [f"{uniq}out.>"]))
    src = run(publish(url, orders(uniq, 1200)))
    ckpt = tmp_path / "ckpt"
    from pyspark.sql.functions import concat, lit

    def start():
        df = reader(
            spark, url, uniq, streaming=True, partitionCount=2, startingOffsets="earliest", maxOffsetsPerTrigger=500
        )
        out = df.select(concat(lit(f"{uniq}out."), df.subject).alias("subject"), "data", "headers")
        q = (
            out.writeStream.format("pcgroups")
            .option("servers", url)
            .option("maxPendingAcks", "50")
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert q.awaitTermination(QUERY_TIMEOUT)
            assert q.exception() is None, q.exception()
        finally:
            q.stop()

    start()
    assert run(stream_state(url, uniq + "out"))["messages"] == 1200
    # simulate a crash between the sink's write and the commit of the last batch: Spark replays it
    commits = ckpt / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    crc = commits / f".{last}.crc"
    if crc.exists():
        crc.unlink()
    start()
    assert (commits / str(last)).exists()  # the batch ran again
    stored = run(read_stream(url, uniq + "out"))
    assert len(stored) == 1200  # ... and wrote no duplicates
    source = run(read_stream(url, uniq))
    for p in range(2):  # per partition (one task each), the copy keeps the source's order
        want = [m[2] for m in source if m[1].startswith(f"{p}.")]
        got = [m[2] for m in stored if partition_of(m[1].split(".")[-1], 2) == p]
        assert got == want
    assert all(m[3].get("Nats-Msg-Id") for m in stored)
    assert len(src) == 1200


def test_batch_write_with_msg_id_prefix_is_idempotent(spark, nats_server, uniq):
    url = nats_server.url
    run(make_plain_stream(url, uniq, [f"{uniq}.>"]))
    df = spark.createDataFrame([(f"{uniq}.k{i % 4}", f"v{i}") for i in range(400)], "subject string, data string")
    for _ in range(2):
        df.repartition(2).sortWithinPartitions("data").write.format("pcgroups").mode("append").option(
            "servers", url
        ).option("msgIdPrefix", "job-1").save()
    assert run(stream_state(url, uniq))["messages"] == 400
    # a msg_id column wins over derived ids
    ids = spark.createDataFrame(
        [(f"{uniq}.x", "a", "same"), (f"{uniq}.x", "b", "same")], "subject string, data string, msg_id string"
    )
    ids.write.format("pcgroups").mode("append").option("servers", url).save()
    assert run(stream_state(url, uniq))["messages"] == 401
    with pytest.raises(Exception, match="only appends"):
        df.write.format("pcgroups").mode("overwrite").option("servers", url).save()
    with pytest.raises(Exception, match="column data"):
        df.select("subject").write.format("pcgroups").mode("append").option("servers", url).save()
