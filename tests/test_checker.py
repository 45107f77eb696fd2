"""The invariant checker on synthetic records: a clean run passes, and each violation is found."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

from pcgroups.testing._checker import Recorder, Report, event_line


def clean_run() -> Recorder:
    """Two partitions, two instances of one member with a failover at t=10, and a second member."""
    rec = Recorder()
    t = 0.0
    for key in range(10):  # partition 0, instance a, then b after a failover
        inst = "a" if key < 5 else "b"
        rec.record("m1", inst, 0, key, t, t + 0.5)
        t += 1.0
    for key in range(10, 20):  # partition 1, member m2, interleaved in time with p0
        rec.record("m2", "c", 1, key, (key - 10) * 1.0, (key - 10) * 1.0 + 0.9)
    return rec


def test_a_clean_run_passes():
    report = clean_run().check(range(20), redelivery_bound=0)
    assert isinstance(report, Report)
    assert report.ok and report.failures == [] and report.examples == []
    assert (
        report.calls,
        report.processed,
        report.lost,
        report.redelivered,
        report.overlaps,
        report.order_violations,
        report.partitions,
    ) == (20, 20, 0, 0, 0, 0, 2)
    assert report.by_instance == {"a": 5, "b": 5, "c": 10}


def test_loss_is_detected():
    report = clean_run().check(range(23))
    assert not report.ok and report.lost == 3 and report.lost_examples == [20, 21, 22]
    assert report.examples[0].kind == "lost" and "3 of 23" in report.failures[0]


def test_a_nak_or_error_is_not_a_success():
    rec = Recorder()
    rec.record("m", "a", 0, 1, 0, 1, outcome="nak")
    rec.record("m", "a", 0, 2, 1, 2, outcome="error")
    report = rec.check([1, 2])
    assert report.lost == 2 and report.processed == 0


def test_overlap_across_instances_is_detected():
    rec = clean_run()
    rec.record("m1", "x", 0, 99, 3.2, 3.4)  # inside a's call of key 3 (3.0..3.5)
    report = rec.check()
    assert report.overlaps == 1 and not report.ok
    [v] = [v for v in report.examples if v.kind == "overlap"]
    assert "partition 0" in v.message and {c.instance for c in v.calls} == {"a", "x"}


def test_a_long_call_overlaps_every_later_start_until_it_ends():
    rec = Recorder()
    rec.record("m1", "a", 0, 1, 0.0, 10.0)
    rec.record("m1", "b", 0, 2, 1.0, 2.0)
    rec.record("m1", "b", 0, 3, 3.0, 4.0)
    rec.record("m1", "b", 0, 4, 11.0, 12.0)
    assert rec.check().overlaps == 2


def test_an_open_call_runs_until_now_unless_its_instance_was_killed():
    rec = Recorder()
    rec.start("m1", "a", 0, 1, t=0.0)
    rec.record("m1", "b", 0, 1, 5.0, 5.5)
    assert rec.check(now=6.0).overlaps == 1
    assert rec.check(now=6.0).open_calls == 1
    assert rec.close_instance("a", t=2.0) == 1
    report = rec.check([1], now=6.0, redelivery_bound=1)
    assert report.overlaps == 0 and report.open_calls == 0 and report.redelivered == 1 and report.ok
    assert rec.calls[0].outcome == "killed"


def test_adjacent_calls_do_not_overlap():
    rec = Recorder()
    rec.record("m1", "a", 0, 1, 0.0, 1.0)
    rec.record("m1", "b", 0, 2, 1.0, 2.0)
    assert rec.check().overlaps == 0


def test_order_violation_is_detected():
    rec = Recorder()
    for key, (s, e) in zip([1, 3, 2, 4], [(0, 1), (1, 2), (2, 3), (3, 4)], strict=False):
        rec.record("m", "a", 0, key, s, e)
    report = rec.check([1, 2, 3, 4])
    assert report.order_violations == 1 and report.lost == 0 and not report.ok
    [v] = [v for v in report.examples if v.kind == "order"]
    assert "#2" in v.message and "#3" in v.message


def test_order_is_per_partition_and_a_redelivery_before_later_messages_is_fine():
    rec = Recorder()
    rec.record("m", "a", 0, 1, 0, 1, outcome="nak")  # failed, redelivered before 2
    rec.record("m", "a", 0, 1, 1, 2)
    rec.record("m", "a", 0, 2, 2, 3)
    rec.record("m", "a", 1, 0, 2.5, 2.6)  # a lower key on another partition
    report = rec.check([0, 1, 2], redelivery_bound=1)
    assert report.ok and report.redelivered == 1 and report.duplicates == 0


def test_a_success_after_a_later_message_on_redelivery_is_an_order_violation():
    rec = Recorder()
    rec.record("m", "a", 0, 1, 0, 1, outcome="nak")
    rec.record("m", "a", 0, 2, 1, 2)  # 2 succeeded while 1 was still unacked
    rec.record("m", "a", 0, 1, 2, 3)
    assert rec.check([1, 2]).order_violations == 1


def test_redeliveries_over_the_bound_fail_and_duplicates_are_counted():
    rec = clean_run()
    rec.record("m1", "b", 0, 9, 20.0, 20.5)  # 9 processed twice
    rec.record("m1", "b", 0, 9, 21.0, 21.5)  # and three times
    within = rec.check(range(20), redelivery_bound=2)
    assert within.ok and within.redelivered == 2 and within.duplicates == 1
    over = rec.check(range(20), redelivery_bound=1)
    assert not over.ok and not over.redeliveries_ok
    [v] = [v for v in over.examples if v.kind == "redelivery"]
    assert "#9 handled 3 times" in v.message
    assert any("bound of 1" in f for f in over.failures)
    assert rec.check(range(20)).ok  # no bound: report only


def test_examples_are_capped():
    rec = Recorder()
    for key in range(50, 0, -1):  # every success after a higher one
        rec.record("m", "a", 0, key, 50 - key, 50 - key + 0.5)
    report = rec.check(examples=3)
    assert report.order_violations == 49 and len(report.examples) == 3


def test_feed_pairs_start_and_end_lines_from_other_processes():
    rec = Recorder()
    lines = [
        event_line("start", member="m1", instance="p1", partition=0, key="k1", order=1, seq=11, t=1.0),
        event_line("start", member="m2", instance="p2", partition=1, key="k2", order=2, seq=12, t=1.1),
        "consuming...",  # not an event: ignored
        json.dumps({"ev": "ready"}),
        event_line("end", member="m2", instance="p2", partition=1, key="k2", order=2, seq=12, t=1.3),
        event_line("end", member="m1", instance="p1", partition=0, key="k1", order=1, seq=11, outcome="ack", t=1.5),
        event_line("start", member="m1", instance="p1", partition=0, key="k3", order=3, seq=13, t=2.0),
    ]
    for line in lines:
        rec.feed(line)
    assert [(c.key, c.start, c.end, c.outcome) for c in rec.calls] == [
        ("k1", 1.0, 1.5, "ack"),
        ("k2", 1.1, 1.3, "ack"),
        ("k3", 2.0, None, None),
    ]
    assert rec.calls[0].order == 1 and rec.calls[0].seq == 11
    rec.close_instance("p1", t=2.5)
    report = rec.check(["k1", "k2", "k3"])
    assert report.lost == 1 and report.lost_examples == ["k3"] and report.overlaps == 0


def test_handler_records_and_acks_from_async_and_threads():
    class FakeMsg:
        def __init__(self, seq):
            self.subject = f"orders.k{seq}"
            self.partition = seq  # one partition each: the keys mix two sequence spaces
            self.headers = {"Nats-Stream-Source": f"orders {seq} x y z"} if seq % 3 == 0 else None
            self.metadata = SimpleNamespace(sequence=SimpleNamespace(stream=1000 + seq), num_delivered=1)
            self.acks = 0

        async def ack(self):
            self.acks += 1

    rec = Recorder()
    handler = rec.handler("m1", "a")
    msgs = [FakeMsg(s) for s in (3, 4, 6)]

    async def run():
        for m in msgs:
            await handler(m)

    asyncio.run(run())
    assert all(m.acks == 1 for m in msgs)
    # sourced (elastic) messages are keyed by their origin sequence, static ones by their own
    assert [c.key for c in rec.calls] == [3, 1004, 6]
    assert rec.check([3, 1004, 6]).ok

    # recording from threads (sync handlers run in worker threads)
    rec2 = Recorder()

    def worker(n):
        for i in range(200):
            c = rec2.start("m", f"t{n}", n, n * 1000 + i)
            rec2.end(c)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert rec2.check([n * 1000 + i for n in range(4) for i in range(200)]).ok


def test_failing_work_is_recorded_as_an_error_and_raised():
    class M:
        subject, partition, headers = "s", 0, None
        metadata = SimpleNamespace(sequence=SimpleNamespace(stream=7), num_delivered=2)

        async def ack(self):
            raise AssertionError("must not ack")

    def boom(msg):
        raise RuntimeError("boom")

    rec = Recorder()
    try:
        asyncio.run(rec.handler("m", "a", boom)(M()))
    except RuntimeError:
        pass
    [call] = rec.calls
    assert call.outcome == "error" and call.deliveries == 2 and rec.check([7]).lost == 1


def test_report_to_dict_is_json():
    rec = clean_run()
    rec.record("m1", "x", 0, 99, 3.2, 3.4)
    d = rec.check(range(21)).to_dict()
    json.dumps(d)
    assert d["ok"] is False and d["lost"] == 1 and d["overlaps"] == 1 and d["examples"]


def test_assert_ok_names_the_failures_and_views_for_tests():
    rec = Recorder()
    rec.record("m1", "a", 0, 1, 0.0, 1.0)
    rec.record("m2", "b", 0, 2, 3.0, 4.0)
    rec.record("m1", "a", 1, 3, 0.5, 0.6)
    assert rec.check([1, 2, 3]).assert_ok().ok
    assert rec.owners(0) == ["m1", "m2"] and rec.owners(0, since=2.0) == ["m2"]
    assert rec.longest_pause(partitions=[0]) == 3.0 and rec.longest_pause() == 2.5
    assert [c.key for c in rec.acked_calls()] == [1, 2, 3]
    rec.record("m3", "c", 0, 4, 3.5, 3.6)
    try:
        rec.check([1, 2, 3, 4, 5]).assert_ok()
    except AssertionError as e:
        assert "1 of 5 messages never acked" in str(e) and "overlap" in str(e)
    else:
        raise AssertionError("assert_ok passed a failing report")
