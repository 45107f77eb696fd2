"""The Spark data source's plain-Python parts (options, offsets, NATS reads and writes) against a real
nats-server: no JVM, no pyspark needed."""

from __future__ import annotations

import asyncio
import datetime as dt

import nats
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.js.api import RetentionPolicy

from pcgroups.errors import ConfigError, NotFoundError
from pcgroups.spark import _nats, _offsets
from pcgroups.spark._offsets import DataLossError, Layout, StreamState
from pcgroups.spark._options import ConnectionOptions, SinkOptions, SourceOptions

from .helpers.spark_support import (
    consumer_names,
    make_stream,
    partition_of,
    publish,
    put_kv_json,
    read_stream,
    run,
    stream_state,
)


def src(url, **kw):
    return SourceOptions.parse({"servers": url, **{k: str(v) for k, v in kw.items()}})


# --- options ---------------------------------------------------------------------------------


def test_source_options_parse_and_refuse_unknown():
    o = SourceOptions.parse(
        {
            "STREAM": "ORDERS",
            "partitioncount": "3",
            "startingOffsets": '{"ORDERS": {"0": 5, "1": -2}}',
            "maxOffsetsPerTrigger": "100",
            "failOnDataLoss": "false",
            "requestTimeout": "500ms",
            "assign": "2,0",
            "servers": "nats://a:1, nats://b:2",
            "checkpointLocation": "/x",
        }
    )
    assert o.stream == "ORDERS" and o.partition_count == 3 and o.assign == (0, 2)
    assert o.starting == {0: 5, 1: -2} and o.max_offsets_per_trigger == 100 and not o.fail_on_data_loss
    assert o.conn.timeout == 0.5 and o.conn.servers == ("nats://a:1", "nats://b:2")
    assert SourceOptions.parse({"stream": "S", "group": "g"}).starting is None
    with pytest.raises(ConfigError, match=r"unknown source option.*maxoffsetspertriger.*maxOffsetsPerTrigger"):
        SourceOptions.parse({"stream": "S", "partitionCount": "2", "maxOffsetsPerTriger": "5"})
    with pytest.raises(ConfigError, match="option stream is required"):
        SourceOptions.parse({"partitionCount": "2"})
    with pytest.raises(ConfigError, match=r"group .* or option partitionCount"):
        SourceOptions.parse({"stream": "S"})
    with pytest.raises(ConfigError, match="names stream 'OTHER'"):
        SourceOptions.parse({"stream": "S", "partitionCount": "2", "startingOffsets": '{"OTHER": {"0": 1}}'})
    with pytest.raises(ConfigError, match="earliest, latest or JSON"):
        SourceOptions.parse({"stream": "S", "partitionCount": "2", "startingOffsets": "first"})
    with pytest.raises(ConfigError, match="endingOffsets cannot be earliest"):
        SourceOptions.parse({"stream": "S", "partitionCount": "2", "endingOffsets": "earliest"})
    assert "secret" not in repr(SourceOptions.parse({"stream": "S", "partitionCount": "1", "password": "secret"}))


def test_sink_options():
    o = SinkOptions.parse({"servers": "nats://x:1", "maxPendingAcks": "64", "msgIdPrefix": "job7"})
    assert o.max_pending_acks == 64 and o.msg_id_prefix == "job7" and o.subject is None
    with pytest.raises(ConfigError, match=r"unknown sink option.*stream"):
        SinkOptions.parse({"stream": "S"})
    with pytest.raises(ConfigError, match="literal subject"):
        SinkOptions.parse({"subject": "a.*"})


# --- offsets ---------------------------------------------------------------------------------


def test_offsets_json_round_trip_and_restart_checks():
    lay = Layout("S", 3, (0, 1, 2))
    j = _offsets.to_json("S", {0: 5, 1: 7, 2: 9})
    assert j == {"S": {"0": 5, "1": 7, "2": 9}}
    assert _offsets.from_json(lay, j) == {0: 5, 1: 7, 2: 9}
    with pytest.raises(ConfigError, match="partition count"):
        _offsets.from_json(Layout("S", 4, (0, 1, 2, 3)), j)
    with pytest.raises(ConfigError, match="for stream 'S'"):
        _offsets.from_json(Layout("T", 3, (0, 1, 2)), j)


def test_resolve_start_end_and_data_loss():
    state = StreamState("S", first_seq=11, last_seq=40)
    parts = (0, 1)
    assert _offsets.resolve_start(None, state, parts, default="earliest") == {0: 11, 1: 11}
    assert _offsets.resolve_start("latest", state, parts) == {0: 41, 1: 41}
    assert _offsets.resolve_start({0: -2, 1: 30}, state, parts) == {0: 11, 1: 30}
    with pytest.raises(ConfigError, match="missing \\[1\\]"):
        _offsets.resolve_start({0: 3}, state, parts)
    assert _offsets.resolve_end("latest", state, parts) == {0: 41, 1: 41}
    assert _offsets.resolve_end({0: 20, 1: -1}, state, parts) == {0: 20, 1: 41}
    with pytest.raises(DataLossError, match=r"partition 0: messages with sequences 5\.\.10"):
        _offsets.check_data_loss({0: 5, 1: 20}, state, fail=True)
    assert _offsets.check_data_loss({0: 5, 1: 20}, state, fail=False) == {0: 11, 1: 20}
    with pytest.raises(DataLossError, match="deleted and created again"):
        _offsets.check_data_loss({0: 50, 1: 20}, state, fail=True)
    empty = StreamState("S", first_seq=0, last_seq=0)
    assert _offsets.resolve_start(None, empty, parts) == {0: 1, 1: 1}
    assert _offsets.check_data_loss({0: 1, 1: 1}, empty, fail=True) == {0: 1, 1: 1}


@settings(max_examples=300, deadline=None)
@given(
    starts=st.lists(st.integers(1, 500), min_size=1, max_size=6),
    latest=st.integers(1, 800),
    max_rows=st.one_of(st.none(), st.integers(1, 200)),
    target=st.one_of(st.none(), st.integers(1, 800)),
)
def test_next_end_window(starts, latest, max_rows, target):
    start = dict(enumerate(starts))
    end = _offsets.next_end(start, latest, max_rows, target)
    top = latest if target is None else min(latest, target)
    lo = min(starts)
    assert set(end) == set(start)
    assert all(end[p] >= start[p] for p in start)  # never goes back
    moved = [p for p in start if end[p] > start[p]]
    assert all(end[p] <= top for p in moved)  # never past latest / the target
    if max_rows is not None and moved:
        assert max(end[p] for p in moved) - lo <= max_rows  # one window of <= max_rows sequences
    if top > lo and moved == [] and end != start:
        raise AssertionError("moved without reason")
    # the ranges are disjoint sub-ranges of [lo, E): a batch holds at most E - lo messages
    spans = _offsets.ranges(start, end)
    assert all(s < e for _, s, e in spans)


def test_timestamp_parse():
    assert (
        _nats.parse_ts_micros("2026-11-22T05:39:55.114802273Z")
        == int(dt.datetime(2026, 11, 22, 5, 39, 55, tzinfo=dt.UTC).timestamp()) * 1_000_000 + 114802
    )
    assert _nats.parse_ts_micros("2026-11-22T05:39:55.1Z") % 1_000_000 == 100000
    assert _nats.parse_ts_micros("2026-11-22T05:39:55Z") % 1_000_000 == 0


def test_subject_matching():
    assert _nats.subject_matches("orders.k1", ("orders.*",))
    assert not _nats.subject_matches("orders.k1.x", ("orders.*",))
    assert _nats.subject_matches("orders.k1.x", ("refunds.*", "orders.>"))
    assert not _nats.subject_matches("orders", ("orders.>",))


# --- reading from a real server ----------------------------------------------------------------


async def _read_all(nc, url, plan: _nats.ReadPlan, p, start, end, *, mode=None, batch=7, include_headers=True):
    conn = ConnectionOptions(servers=(url,))
    cls = _nats.DirectRangeReader if (mode or plan.mode) == "direct" else _nats.ConsumerRangeReader
    r = cls(
        nc,
        conn,
        plan.layout.stream,
        p,
        start,
        end,
        plan.layout.filter_subjects(p),
        batch=batch,
        include_headers=include_headers,
    )
    await r.open()
    rows = []
    try:
        while (cols := await r.next_batch()) is not None:
            rows += list(zip(cols.subject, cols.data, cols.headers, cols.sequence, cols.timestamp, strict=False))
    finally:
        await r.close()
    return rows


@pytest.mark.parametrize("mode", ["direct", "consumer"])
async def test_range_reader_reads_one_partition_in_stream_order(nats_server, uniq, mode):
    url = nats_server.url
    await make_stream(url, uniq, uniq, 3)
    keys = [f"k{i % 13}" for i in range(300)]
    seqs = await publish(url, [(f"{uniq}.{k}", str(i).encode()) for i, k in enumerate(keys)])
    nc = await nats.connect(url)
    try:
        plan = await _nats.resolve(nc, src(url, stream=uniq, partitionCount=3, readMode=mode))
        assert plan.mode == mode and plan.layout.partitions == (0, 1, 2)
        total = 0
        for p in range(3):
            want = [(s, i) for i, (s, k) in enumerate(zip(seqs, keys, strict=False)) if partition_of(k, 3) == p]
            rows = await _read_all(nc, url, plan, p, 1, 301)
            assert [r[3] for r in rows] == [s for s, _ in want]  # every message, in stream order
            assert [r[1] for r in rows] == [str(i).encode() for _, i in want]
            assert all(r[0] == f"{uniq}.{keys[i]}" for r, (_, i) in zip(rows, want, strict=False))  # token stripped
            assert all(dict(r[2]) == {"i": str(i)} for r, (_, i) in zip(rows, want, strict=False))  # user headers only
            total += len(rows)
            # a middle range [a, b) of the sequences
            a, b = want[5][0], want[-5][0]
            mid = await _read_all(nc, url, plan, p, a, b)
            assert [r[3] for r in mid] == [s for s, _ in want if a <= s < b]
        assert total == 300
        now = dt.datetime.now(dt.UTC).timestamp() * 1e6
        assert abs(rows[0][4] - now) < 120e6
        no_headers = await _read_all(nc, url, plan, 0, 1, 301, include_headers=False)
        assert all(r[2] is None for r in no_headers)
    finally:
        await nc.close()
    # the reader leaves nothing behind: no consumer on the stream
    assert await consumer_names(url, uniq) == []


async def test_group_config_from_kv_gives_partitions_and_filters(nats_server, uniq):
    url = nats_server.url
    await make_stream(url, uniq, uniq, 4, tokens=2)  # <p>.<uniq>.<kind>.<key>
    items = [
        (f"{uniq}.{kind}.k{i % 9}", str(i).encode())
        for i in range(200)
        for kind in (("orders",) if i % 3 else ("refunds",))
    ]
    seqs = await publish(url, items)
    await put_kv_json(
        url,
        "static-consumer-groups",
        f"{uniq}.g1",
        {"max_members": 4, "filters": [f"{uniq}.orders.*"], "members": ["m1", "m2"]},
    )
    await put_kv_json(
        url,
        "static-consumer-groups",
        f"{uniq}.g2",
        {"max_members": 4, "filters": [f"{uniq}.orders.*", f"{uniq}.refunds.*"], "members": ["m1"]},
    )
    await put_kv_json(
        url,
        "static-consumer-groups",
        f"{uniq}.g3",
        {
            "max_members": 4,
            "filters": [f"{uniq}.orders.*"],
            "member_mappings": [{"member": "m1", "partitions": [0, 1, 2, 3]}],
        },
    )
    nc = await nats.connect(url)
    try:
        for group, kinds in (("g1", {"orders"}), ("g2", {"orders", "refunds"}), ("g3", {"orders", "refunds"})):
            plan = await _nats.resolve(nc, src(url, stream=uniq, group=group))
            assert plan.layout.partition_count == 4
            got = []
            for p in range(4):
                rows = await _read_all(nc, url, plan, p, 1, len(items) + 1)
                assert [r[3] for r in rows] == sorted(r[3] for r in rows)
                assert all(partition_of(r[0].split(".")[-1], 4) == p for r in rows)
                got += [r[3] for r in rows]
            want = sorted(s for s, (subj, _) in zip(seqs, items, strict=False) if subj.split(".")[1] in kinds)
            assert sorted(got) == want, group
        with pytest.raises(NotFoundError, match="static consumer group 'nope'"):
            await _nats.resolve(nc, src(url, stream=uniq, group="nope"))
        with pytest.raises(ConfigError, match="disagrees"):
            await _nats.resolve(nc, src(url, stream=uniq, group="g1", partitionCount=3))
        with pytest.raises(ConfigError, match="assign names partitions \\[7\\]"):
            await _nats.resolve(nc, src(url, stream=uniq, group="g1", assign="1,7"))
        with pytest.raises(NotFoundError, match="stream 'missing' not found"):
            await _nats.resolve(nc, src(url, stream="missing", partitionCount=2))
    finally:
        await nc.close()


async def test_stream_kinds_and_read_modes(nats_server, uniq):
    url = nats_server.url
    await make_stream(url, uniq, uniq, 2, allow_direct=False)
    await make_stream(url, uniq + "wq", uniq + "wq", 2, retention=RetentionPolicy.WORK_QUEUE)
    nc = await nats.connect(url)
    try:
        assert (await _nats.resolve(nc, src(url, stream=uniq, partitionCount=2))).mode == "consumer"
        with pytest.raises(ConfigError, match="readMode=direct needs allow_direct"):
            await _nats.resolve(nc, src(url, stream=uniq, partitionCount=2, readMode="direct"))
        with pytest.raises(ConfigError, match=r"workqueue retention.*failOnDataLoss=false"):
            await _nats.resolve(nc, src(url, stream=uniq + "wq", partitionCount=2))
        plan = await _nats.resolve(nc, src(url, stream=uniq + "wq", partitionCount=2, failOnDataLoss="false"))
        assert plan.mode == "direct"
        with pytest.raises(ConfigError, match="work-queue"):
            await _nats.resolve(
                nc, src(url, stream=uniq + "wq", partitionCount=2, failOnDataLoss="false", readMode="consumer")
            )
    finally:
        await nc.close()


async def test_elastic_group_reads_its_work_queue_stream(nats_server, uniq):
    """An elastic group's `<stream>-<group>` work-queue stream: readable with failOnDataLoss=false."""
    url = nats_server.url
    await make_stream(url, f"{uniq}-eg", uniq, 3, retention=RetentionPolicy.WORK_QUEUE)
    await put_kv_json(
        url,
        "elastic-consumer-groups",
        f"{uniq}.eg",
        {
            "max_members": 3,
            "partitioning_filters": [{"filter": f"{uniq}.*", "partitioning_wildcards": [1]}],
            "members": ["m1"],
        },
    )
    seqs = await publish(url, [(f"{uniq}.k{i}", b"x") for i in range(40)])
    nc = await nats.connect(url)
    try:
        plan = await _nats.resolve(nc, src(url, stream=uniq, group="eg", groupType="elastic", failOnDataLoss="false"))
        assert plan.layout.stream == f"{uniq}-eg" and plan.layout.partition_count == 3
        got = []
        for p in range(3):
            got += [r[3] for r in await _read_all(nc, url, plan, p, 1, 41)]
        assert sorted(got) == seqs
    finally:
        await nc.close()
    assert (await stream_state(url, f"{uniq}-eg"))["messages"] == 40  # reading took nothing away


async def test_aggregate_and_partition_stream_groups_read_through_their_work_queue(nats_server, uniq):
    """Groups over several streams read like any elastic group: one Spark partition per group partition,
    every message of every stream once; the ``Nats-Stream-Source`` header names each row's stream."""
    from pcgroups import PartitioningFilter, create_elastic

    url = nats_server.url
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=f"{uniq}O", subjects=[f"{uniq}.orders.*"])
        await js.add_stream(name=f"{uniq}P", subjects=[f"{uniq}.payments.*"])
        for i in range(3):
            await js.add_stream(name=f"{uniq}L{i}", subjects=[f"{uniq}.p{i}.>"])
        sent = {}
        for i in range(30):
            for stream, subject in (
                (f"{uniq}O", f"{uniq}.orders.c{i % 6}"),
                (f"{uniq}P", f"{uniq}.payments.c{i % 6}"),
                (f"{uniq}L{i % 3}", f"{uniq}.p{i % 3}.host.{i}"),
            ):
                sent.setdefault(stream, []).append((await js.publish(subject, b"x")).seq)
        await create_elastic(
            nc,
            f"{uniq}O",
            "agg",
            3,
            sources=[f"{uniq}P"],
            partitioning_filters=[
                PartitioningFilter(f"{uniq}.orders.*", [1]),
                PartitioningFilter(f"{uniq}.payments.*", [1]),
            ],
        )
        await create_elastic(nc, f"{uniq}LOGS", "ps", 3, partition_streams=[f"{uniq}L{i}" for i in range(3)])
        for name, group, streams in (
            (f"{uniq}O", "agg", [f"{uniq}O", f"{uniq}P"]),
            (f"{uniq}LOGS", "ps", [f"{uniq}L{i}" for i in range(3)]),
        ):
            want = sum(len(sent[s]) for s in streams)
            while (await stream_state(url, f"{name}-{group}"))["messages"] < want:
                await asyncio.sleep(0.02)
            plan = await _nats.resolve(
                nc, src(url, stream=name, group=group, groupType="elastic", failOnDataLoss="false")
            )
            got: dict[str, list[int]] = {}
            for p in range(3):
                for _subject, _, headers, _, _ in await _read_all(nc, url, plan, p, 1, want + 1):
                    origin, seq = dict(headers)["Nats-Stream-Source"].split(" ")[:2]
                    got.setdefault(origin, []).append(int(seq))
                    if group == "ps":
                        assert origin == f"{uniq}L{p}"  # stream i is partition i
            assert {s: sorted(v) for s, v in got.items()} == {s: sent[s] for s in streams}
    finally:
        await nc.close()


async def test_seq_at_time(nats_server, uniq):
    url = nats_server.url
    await make_stream(url, uniq, uniq, 2)
    await publish(url, [(f"{uniq}.a", b"1")])
    cut = int(dt.datetime.now(dt.UTC).timestamp() * 1000) + 5
    import asyncio

    await asyncio.sleep(0.02)
    seqs = await publish(url, [(f"{uniq}.b", b"2"), (f"{uniq}.c", b"3")])
    nc = await nats.connect(url)
    try:
        conn = ConnectionOptions(servers=(url,))
        assert await _nats.seq_at_time(nc, conn, uniq, cut, True) == seqs[0]
        assert await _nats.seq_at_time(nc, conn, uniq, cut + 3_600_000, True) == seqs[-1] + 1
    finally:
        await nc.close()


async def test_publish_all_dedupes_replays(nats_server, uniq):
    url = nats_server.url
    from .helpers.spark_support import make_plain_stream

    await make_plain_stream(url, uniq, [f"{uniq}.>"])
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(publish_async_max_pending=64)
        rows = [(f"{uniq}.k{i % 5}", str(i).encode(), {"Nats-Msg-Id": f"id{i}", "x": "1"}) for i in range(300)]
        assert await _nats.publish_all(js, iter(rows), window=1, timeout=5, expected_stream=uniq) == (300, 0)
        assert await _nats.publish_all(js, iter(rows), window=64, timeout=5, expected_stream=None) == (300, 300)
        more = [(f"{uniq}.k", b"m", {"Nats-Msg-Id": f"more{i}"}) for i in range(200)]
        assert await _nats.publish_all(js, iter(more), window=64, timeout=5, expected_stream=None) == (200, 0)
    finally:
        await nc.close()
    stored = await read_stream(url, uniq)
    assert len(stored) == 500
    assert [m[2] for m in stored[:300]] == [str(i).encode() for i in range(300)]  # published in order
    assert stored[0][3]["x"] == "1"


def test_fast_header_parser_matches_nats_py():
    from nats.aio.client import Client as NATS

    samples = [
        b"a: 1\r\nNats-Sequence: 12\r\n\r\n",
        b"X:y\r\nbad name: z\r\nK:\tv \r\nnocolon\r\n\r\n",
        b"h: caf\xc3\xa9\r\nh: second\r\n\xff: x\r\n\r\n",
        b"",
    ]
    for raw in samples:
        assert _nats.Client._parse_header_lines(raw) == NATS._parse_header_lines(raw)


def test_readers_and_writers_pickle_without_connections(nats_server, uniq):
    pytest.importorskip("pyspark")
    import pickle

    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    from pcgroups.spark.source import PcgroupsBatchReader, PcgroupsStreamReader

    schema = StructType(
        [
            StructField("partition", IntegerType()),
            StructField("subject", StringType()),
            StructField("data", BinaryType()),
            StructField("headers", MapType(StringType(), StringType())),
            StructField("sequence", LongType()),
            StructField("timestamp", TimestampType()),
        ]
    )
    url = nats_server.url
    run(make_stream(url, uniq, uniq, 2))
    seqs = run(publish(url, [(f"{uniq}.a", b"1"), (f"{uniq}.b", b"2"), (f"{uniq}.c", b"3")]))
    r = PcgroupsStreamReader(
        src(url, stream=uniq, partitionCount=2, startingOffsets="earliest", maxOffsetsPerTrigger=2), schema
    )
    try:
        start = r.initialOffset()  # opens the driver-side connection
        assert start == {uniq: {"0": 1, "1": 1}}
        end = r.latestOffset(start, r.getDefaultReadLimit())
        assert end == {uniq: {"0": 3, "1": 3}}
        assert r.reportLatestOffset() == {uniq: {"0": seqs[-1] + 1, "1": seqs[-1] + 1}}
        parts = r.partitions(start, end)
        assert [(p.partition, p.start, p.end) for p in parts] == [(0, 1, 3), (1, 1, 3)]
        copy = pickle.loads(pickle.dumps(r))  # what Spark ships to executors: options only
        assert copy.opts == r.opts and copy._driver is None
        assert pickle.loads(pickle.dumps(parts[0])) == parts[0]
        r.prepareForTriggerAvailableNow()
        run(publish(url, [(f"{uniq}.d", b"4")]))
        assert r.latestOffset(end, r.getDefaultReadLimit()) == {uniq: {"0": 4, "1": 4}}  # not past the target
        last = {uniq: {"0": 4, "1": 4}}
        assert r.latestOffset(last, r.getDefaultReadLimit()) == last
    finally:
        r.stop()
    b = PcgroupsBatchReader(src(url, stream=uniq, partitionCount=2), schema)
    assert pickle.loads(pickle.dumps(b)).opts == b.opts
    with pytest.raises(ConfigError, match="batch reads only"):
        PcgroupsStreamReader(src(url, stream=uniq, partitionCount=2, endingOffsets="latest"), schema)
    with pytest.raises(ConfigError, match="not valid for a batch read"):
        PcgroupsBatchReader(src(url, stream=uniq, partitionCount=2, startingOffsets="latest"), schema)
