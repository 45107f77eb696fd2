"""An elastic group's intake stuck on one origin message, against a real nats-server (pcgroups.elastic._intake).

The origin stream stores a message whose header block is a few bytes under the server's 64 KiB limit; its
copy into the work queue gains a ``Nats-Stream-Source`` header, goes over, and the server retries it every
2 s for good: nothing after it reaches the group. It is detected, said by the status, the exporter, the
running instances and ``cg elastic info``, and stepped past by ``cg elastic skip-stuck``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal

import pytest
from nats.js.api import DiscardPolicy, StreamConfig

from pcgroups import (
    ConsumerConfig,
    JetStreamApi,
    PartitioningFilter,
    PCGroupsError,
    add_members,
    create_elastic,
    elastic_consume,
)
from pcgroups.elastic import _instance as elastic_instance
from pcgroups.elastic import _intake as intake
from pcgroups.ops._exporter import GroupsExporter, group_families
from pcgroups.ops._status import elastic_status
from tests.helpers.cli import assert_cli_error, procs, run_cg

from .helpers.support import wait_for

BIG = "x" * 65500  # a header block of 65,519 bytes: 87 more in the copy is over 65,535


@pytest.fixture
def quick(monkeypatch):
    """A source counts as stuck after 1 s here (5 s by default)."""
    monkeypatch.setattr(intake, "STUCK_AFTER", 1.0)
    monkeypatch.setattr(elastic_instance, "STUCK_AFTER", 1.0)


async def group_with_a_big_message(nc, js, stream: str, **kw) -> None:
    """Origin message 1 is copied, 2 is too big to copy, 3-5 wait behind it."""
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.*"]))
    await create_elastic(nc, stream, "g", 2, partitioning_filters=[PartitioningFilter(f"{stream}.*", [1])], **kw)
    await js.publish(f"{stream}.a", b"1")
    await js.publish(f"{stream}.b", b"2", headers={"Big": BIG})
    for i in range(3):
        await js.publish(f"{stream}.c{i}", b"x")


def sample(families, name: str, **labels) -> float:
    for f in families:
        if f.name == name:
            for s in f.samples:
                if all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
    raise AssertionError(f"no sample {name} {labels}")


async def test_a_source_stuck_on_a_message_is_said_everywhere_and_stepped_past(nc, js, uniq, quick, caplog):
    caplog.set_level(logging.WARNING)
    await group_with_a_big_message(nc, js, uniq)
    await add_members(nc, uniq, "g", ["m1"])
    got: list[str] = []

    async def handler(msg):
        got.append(msg.subject)
        await msg.ack()

    async with await elastic_consume(nc, uniq, "g", "m1", handler, config=ConsumerConfig(ack_wait=1)):
        stuck = await wait_for(lambda: intake.stuck_sources_of(nc, uniq, "g"), 10, what="the source seen stuck")
        assert [(s.stream, s.seq, s.subject, s.cause, s.header_bytes, s.copy_header_bytes) for s in stuck] == [
            (
                uniq,
                2,
                f"{uniq}.b",
                "too-big",
                65519,
                65519
                + len(
                    f"Nats-Stream-Source: {uniq} 2 {uniq}.* "
                    f"{{{{Partition(2,1)}}}}.{uniq}.{{{{Wildcard(1)}}}} "
                    f"{uniq}.b 12345678\r\n"
                ),
            )
        ]
        assert got == [f"{uniq}.a"]
        status = await elastic_status(nc, uniq, "g")
        assert [(s.stream, s.seq) for s in status.stuck_sources] == [(uniq, 2)]
        families = list(group_families([status], status.taken_at))
        assert sample(families, "pcgroups_elastic_source_stuck_sequence", source=uniq) == 2
        assert sample(families, "pcgroups_elastic_source_stuck_seconds", source=uniq) >= 1
        said = (
            f"the intake of elastic consumer group g on stream {uniq} stopped: sourcing from {uniq} is stuck at "
            f"its message 2 ({uniq}.b)"
        )
        await wait_for(lambda: any(said in r.getMessage() for r in caplog.records), 15, what="the instance's warning")

        plan = await intake.skip_stuck(nc, uniq, "g")
        assert plan.skipped is not None and plan.skipped.seq == 2 and not plan.executed
        assert [s.seq for s in await intake.stuck_sources_of(nc, uniq, "g")] == [2]  # the plan changed nothing

        done = await intake.skip_stuck(nc, uniq, "g", execute=True)
        assert done.executed and done.skipped is not None and done.skipped.seq == 2
        await wait_for(lambda: len(got) == 4, 10, what="the messages after it")
        assert got == [f"{uniq}.a", *(f"{uniq}.c{i}" for i in range(3))]
        assert await intake.stuck_sources_of(nc, uniq, "g") == []
        sources = (await JetStreamApi(nc).stream_info(f"{uniq}-g"))["config"]["sources"]
        assert len(sources) == 1 and "opt_start_seq" not in sources[0]  # as the reference's again
        await wait_for(
            lambda: any(
                f"sourcing from {uniq} moves again (past its message 2)" in r.getMessage() for r in caplog.records
            ),
            15,
            what="the instance saying it moves again",
        )
    assert sum(said in r.getMessage() for r in caplog.records) == 1  # said once


async def test_a_skip_waits_for_what_was_queued_before_the_message(nc, js, uniq, quick):
    """Nothing consumes: message 1 stays queued, so the skip (which would lose nothing else) does not happen."""
    await group_with_a_big_message(nc, js, uniq)
    await wait_for(lambda: intake.stuck_sources_of(nc, uniq, "g"), 10, what="the source seen stuck")
    with pytest.raises(PCGroupsError, match=f"still holds 1 message.s. from {uniq} after 0.3s"):
        await intake.skip_stuck(nc, uniq, "g", execute=True, timeout=0.3)
    assert [s.seq for s in await intake.stuck_sources_of(nc, uniq, "g")] == [2]


async def test_a_full_work_queue_is_not_a_message_to_step_past(nc, js, uniq, quick):
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.*"]))
    await create_elastic(
        nc, uniq, "g", 2, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])], max_buffered_msgs=2
    )
    for i in range(4):
        await js.publish(f"{uniq}.k{i}", b"x")
    stuck = await wait_for(lambda: intake.stuck_sources_of(nc, uniq, "g"), 10, what="the source seen stuck")
    assert [(s.seq, s.cause) for s in stuck] == [(3, "full")]
    result = await intake.skip_stuck(nc, uniq, "g", execute=True)
    assert result.skipped is None and not result.executed and "the work queue is full" in result.reason


async def test_cg_status_info_and_skip_stuck(nats_server, nc, js, uniq):
    """Through cg, with its 5 s: status and info say it, skip-stuck plans, then steps past and reports the dead
    letter; no consumer runs, so message 1 is purged first to let the skip go on."""
    url = nats_server.url
    await group_with_a_big_message(nc, js, uniq)
    await wait_for(lambda: _queued(js, uniq, 1), 5, what="message 1 queued")
    await js.purge_stream(f"{uniq}-g")
    line = f"intake stopped: sourcing from {uniq} is stuck at its message 2 ({uniq}.b) for "
    status = await wait_for(
        lambda: _said(run_cg("elastic", "status", uniq, "g", url=url), line), 15, interval=0.5, what="status saying it"
    )
    assert "(step past it: cg elastic skip-stuck" in status
    info = await run_cg("elastic", "info", uniq, "g", url=url)
    assert info.code == 0 and f"cg: warning: {line}" in info.err and line not in info.out
    doc = json.loads((await run_cg("elastic", "info", uniq, "g", "--json", url=url)).ok().out)
    assert [(s["stream"], s["seq"], s["cause"]) for s in doc["stuck_sources"]] == [(uniq, 2, "too-big")]
    plan = (await run_cg("elastic", "skip-stuck", uniq, "g", url=url)).ok()
    assert plan.lines[0].startswith(f"would step past message 2 of stream {uniq}: ")
    done = (await run_cg("elastic", "skip-stuck", uniq, "g", "--execute", url=url)).ok()
    assert done.lines == [
        f"stepped past message 2 of stream {uniq}: sourcing into {uniq}-g resumes at message 3",
        f"dead letter: {uniq} message 2 ({uniq}.b, header block 65519 bytes) was not copied into {uniq}-g; it "
        f"stays in {uniq} (nats stream get {uniq} 2)",
    ]
    await wait_for(lambda: _queued(js, uniq, 3), 10, what="messages 3-5 queued")
    again = (await run_cg("elastic", "skip-stuck", uniq, "g", url=url)).ok()
    assert again.lines == [
        f"no source of {uniq}-g is stuck (a source counts as stuck once its next message has waited 5s)"
    ]
    assert_cli_error(await run_cg("elastic", "skip-stuck", uniq, "nope", url=url), "nope")
    assert_cli_error(await run_cg("elastic", "skip-stuck", uniq, "g", "--wait", "0s", url=url), "--wait")


async def test_a_running_consume_says_it_once(nats_server, nc, js, uniq):
    url = nats_server.url
    await group_with_a_big_message(nc, js, uniq)
    (await run_cg("elastic", "add", uniq, "g", "m1", url=url)).ok()
    async with procs() as start:
        p = await start("elastic", "consume", uniq, "g", "m1", url=url)
        await p.wait_output(lambda o: " acked\n" in o, 10, "message 1 acked")
        err = b""
        while b"intake of elastic consumer group" not in err:
            err += await asyncio.wait_for(p.proc.stderr.readline(), 20)
        (await run_cg("elastic", "skip-stuck", uniq, "g", "--execute", url=url)).ok()
        await p.wait_output(lambda o: o.count(" acked\n") == 4, 15, "the messages after it")
        p.signal(signal.SIGTERM)
        r = await p.wait(10)
    said = [line for line in (err.decode() + r.err).splitlines() if "intake of elastic consumer group g" in line]
    assert said == [
        f"cg: warning: m1: the intake of elastic consumer group g on stream {uniq} stopped: sourcing "
        f"from {uniq} is stuck at its message 2 ({uniq}.b) for " + said[0].split(" for ", 1)[1]
    ], r.err


async def _said(result, line: str) -> str | None:
    r = await result
    return r.out if r.code == 0 and line in r.out else None


async def _queued(js, stream: str, n: int) -> bool:
    return (await js.stream_info(f"{stream}-g")).state.messages == n


# --- origin messages removed before their source copied them ------------------------------------------------


async def lossy_group(nc, js, stream: str) -> None:
    """An origin keeping its last 10 messages (discard old) and a group buffering 10: messages 1-10 are queued,
    then (:data:`MORE`) 100 more are published while nothing consumes: the origin keeps 101-110, and 11-100 are
    never copied."""
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.*"], max_msgs=10, discard=DiscardPolicy.OLD))
    await create_elastic(
        nc, stream, "g", 2, partitioning_filters=[PartitioningFilter(f"{stream}.*", [1])], max_buffered_msgs=10
    )
    await publish_n(js, stream, 10)
    await wait_for(lambda: _source_at(js, stream, 10), 10, what="messages 1-10 queued")


MORE = 100


async def publish_n(js, stream: str, n: int) -> None:
    futs = [await js.publish_async(f"{stream}.k{i % 7}", b"x") for i in range(n)]
    await asyncio.wait_for(asyncio.gather(*futs), 30)


async def _source_at(js, stream: str, seq: int) -> bool:
    info = await JetStreamApi(js._nc).stream_info(f"{stream}-g")
    return [s.get("seq") for s in info.get("sources") or []] == [seq]


async def test_messages_an_origin_removed_before_sourcing_are_said_everywhere(nc, js, uniq, quick, caplog):
    """status, the exporter and a running instance (once) say the 90 messages lost; afterwards (the source caught
    up, lag 0) one look sees nothing, and a watch that looked before and after counts them."""
    caplog.set_level(logging.WARNING)
    await lossy_group(nc, js, uniq)
    watch = intake.GapWatch()
    assert await watch.update(JetStreamApi(nc), await JetStreamApi(nc).stream_info(f"{uniq}-g")) == []
    exporter = GroupsExporter(nc, streams=[uniq])

    async def exported() -> float:
        await exporter.refresh()
        return sample(exporter.families, "pcgroups_elastic_source_lost_messages", source=uniq)

    assert await exported() == 0
    await publish_n(js, uniq, MORE)
    lost = intake.SourceGap(uniq, 11, 100, 90)
    assert await exported() == 90
    status = await elastic_status(nc, uniq, "g")
    assert status.source_gaps == [lost] and status.source_lost == {uniq: 90}
    assert (
        sample(list(group_families([status], status.taken_at)), "pcgroups_elastic_source_lost_messages", source=uniq)
        == 90
    )
    assert await intake.source_gaps_of(nc, uniq, "g") == [lost]
    await add_members(nc, uniq, "g", ["m1"])
    got: list[str] = []

    async def handler(msg):
        got.append(msg.subject)
        await msg.ack()

    async with await elastic_consume(nc, uniq, "g", "m1", handler, config=ConsumerConfig(ack_wait=1)):
        await wait_for(lambda: len(got) == 20, 30, what="the 10 queued and the 10 the origin kept")
        said = (
            f"m1: elastic consumer group g on stream {uniq} lost messages: 90 message(s) of {uniq} (sequences "
            "11-100) were removed from it"
        )
        await wait_for(lambda: any(said in r.getMessage() for r in caplog.records), 15, what="the instance's warning")
        await wait_for(lambda: _source_at(js, uniq, 110), 10, what="the source caught up")
        await asyncio.sleep(2.5)  # more checks of the instance: it said the loss once
        assert await exported() == 90
    assert sum(said in r.getMessage() for r in caplog.records) == 1
    assert (await elastic_status(nc, uniq, "g")).source_gaps == []  # one look sees nothing any more
    assert await exported() == 90  # the exporter's counter keeps them
    assert await watch.update(JetStreamApi(nc), await JetStreamApi(nc).stream_info(f"{uniq}-g")) == [lost]
    assert watch.lost == {uniq: 90}  # a watch that looked before and after: lost between its looks


async def test_cg_status_and_info_say_the_messages_lost_before_sourcing(nats_server, nc, js, uniq):
    url = nats_server.url
    await lossy_group(nc, js, uniq)
    await publish_n(js, uniq, MORE)
    line = (
        f"intake lost messages: 90 message(s) of {uniq} (sequences 11-100) were removed from it (its max "
        "messages, bytes or age, or a purge) before the group's source copied them: they never reach the group"
    )
    status = (await run_cg("elastic", "status", uniq, "g", url=url)).ok()
    assert line in status.out
    info = await run_cg("elastic", "info", uniq, "g", url=url)
    assert info.code == 0 and f"cg: warning: {line}" in info.err and line not in info.out
    doc = json.loads((await run_cg("elastic", "info", uniq, "g", "--json", url=url)).ok().out)
    assert doc["source_gaps"] == [{"stream": uniq, "first": 11, "last": 100, "count": 90}]
    assert doc["stuck_sources"] == [] or all(s["cause"] == "full" for s in doc["stuck_sources"])


async def test_a_source_taking_part_of_its_origin_is_not_said_to_lose_the_rest(nc, js, uniq):
    """The origin drops messages of subjects the group does not take: none of them was the group's."""
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.>"], max_msgs=50, discard=DiscardPolicy.OLD))
    await create_elastic(
        nc, uniq, "g", 2, partitioning_filters=[PartitioningFilter(f"{uniq}.a.*", [1])], max_buffered_msgs=5
    )
    for i in range(5):
        await js.publish(f"{uniq}.a.{i}", b"x")
    await wait_for(lambda: _source_at(js, uniq, 5), 10, what="messages 1-5 queued")
    futs = [await js.publish_async(f"{uniq}.b.{i}", b"x") for i in range(300)]
    await asyncio.wait_for(asyncio.gather(*futs), 30)
    await js.publish(f"{uniq}.a.9", b"x")  # the source is behind now (full), and the origin dropped 6-256
    assert (await js.stream_info(uniq)).state.first_seq == 257
    status = await elastic_status(nc, uniq, "g")
    assert status.source_gaps == [] and status.source_lost == {}


def test_a_source_takes_every_subject_of_its_origin_only_when_its_filters_cover_them():
    def source(*filters):
        return {"subject_transforms": [{"src": f, "dest": "x"} for f in filters]}

    takes = intake.takes_every_subject
    assert takes(source("o.*"), {"subjects": ["o.*"]})
    assert takes(source("o.*", "p.>"), {"subjects": ["o.*", "p.x.y"]})
    assert takes(source(">"), {})  # whole subjects: whatever it stores
    assert not takes(source("o.*"), {"subjects": ["o.>"]})
    assert not takes(source("o.a"), {"subjects": ["o.*"]})
    assert not takes(source("o.*"), {})  # stores what it sources: unknown subjects
    assert not takes(source("o.*"), {"subjects": ["o.*"], "subject_transform": {"src": "o.*", "dest": "p.*"}})
