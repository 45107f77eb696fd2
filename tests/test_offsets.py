"""Replay and skip (pcgroups/offsets.py) against a real nats-server, with member instances running."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from nats.js.api import StreamConfig, SubjectTransform

from pcgroups import (
    ConfigError,
    ConsumerConfig,
    JetStreamApi,
    PartitioningFilter,
    add_members,
    create_elastic,
    create_static,
    elastic_consume,
    static_consume,
)
from pcgroups.ops._offsets import Target, execute_reset, plan_elastic_reset, plan_static_reset

from .helpers.support import wait_for

FAST = ConsumerConfig(max_ack_pending=1, ack_wait=2)


async def static_stream(js, stream: str, n: int, partitions: int = 2) -> None:
    await js.add_stream(
        StreamConfig(
            name=stream,
            subjects=[f"{stream}.*"],
            subject_transform=SubjectTransform(
                src=f"{stream}.*", dest=f"{{{{partition({partitions},1)}}}}.{stream}.{{{{wildcard(1)}}}}"
            ),
        )
    )
    await publish(js, stream, 0, n)


async def publish(js, stream: str, start: int, end: int) -> None:
    for i in range(start, end):
        await js.publish(f"{stream}.{i}", str(i).encode())


def recorder(seen: list):
    async def handler(msg):
        seen.append((msg.partition, int(msg.data), msg.sequence))
        await msg.ack()

    return handler


def per_partition(seen: list) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for p, value, _ in seen:
        out.setdefault(p, []).append(value)
    return out


def consumer_state(info: dict) -> tuple:
    return (
        info["delivered"]["stream_seq"],
        info["ack_floor"]["stream_seq"],
        info["num_pending"],
        info["num_ack_pending"],
    )


async def test_static_plan_changes_nothing_and_earliest_replays_everything_once_more_in_order(nc, js, uniq):
    stream = uniq
    await static_stream(js, stream, 20)
    await create_static(nc, stream, "g", 2, members=["m1", "m2"])
    seen: list = []
    inst = await static_consume(nc, stream, "g", "m1", recorder(seen), config=FAST)
    try:
        first = await wait_for(lambda: len(seen) >= 1 and seen, 10, what="m1 running")
        mine = {first[0][0]}
        await wait_for(lambda: len(seen) == 10, 10, what="m1's ten messages")
        api = JetStreamApi(nc)
        before = consumer_state(await api.consumer_info(stream, "g-m1"))
        plan = await plan_static_reset(nc, stream, "g", Target.of(earliest=True))
        assert consumer_state(await api.consumer_info(stream, "g-m1")) == before  # planning changes nothing
        m1, m2 = plan.members
        assert (m1.member, m1.after, m1.replay, m1.skip) == ("m1", 1, 10, 0) and m1.now > 10 and m1.after_time
        assert not m2.exists and "no consumer yet" in m2.note
        done_before = list(seen)
        await execute_reset(nc, plan)
        await wait_for(lambda: len(seen) == 20, 10, what="ten replayed")
        await wait_for(lambda: _settled(api, stream, "g-m1"), 10, what="m1's consumer settled")
        assert len(seen) == 20  # nothing more came
        replayed = seen[10:]
        assert [v for _, v, _ in replayed] == [v for _, v, _ in done_before]  # same messages, same order
        assert {p for p, _, _ in seen} == mine
    finally:
        await inst.stop()


async def test_static_to_time_lands_on_the_first_message_at_or_after_it_and_latest_skips(nc, js, uniq):
    stream = uniq
    await static_stream(js, stream, 6, partitions=1)
    await asyncio.sleep(0.05)
    cut = datetime.now(UTC)
    await asyncio.sleep(0.05)
    await publish(js, stream, 6, 10)
    await create_static(nc, stream, "g", 1, members=["m1"])
    seen: list = []
    inst = await static_consume(nc, stream, "g", "m1", recorder(seen), config=FAST)
    try:
        await wait_for(lambda: len(seen) == 10, 10, what="all ten")
        plan = await execute_reset(nc, await plan_static_reset(nc, stream, "g", Target.of(time=cut.isoformat())))
        assert plan.members[0].after == 7 and plan.members[0].replay == 4
        await wait_for(lambda: len(seen) == 14, 10, what="the four from the time on")
        assert [v for _, v, _ in seen[10:]] == [6, 7, 8, 9]
        # latest: stop the instance, publish more, skip them all
        await inst.stop()
        await publish(js, stream, 10, 15)
        plan = await plan_static_reset(nc, stream, "g", Target.of(latest=True))
        assert (plan.members[0].now, plan.members[0].after, plan.members[0].skip) == (11, 16, 5)
        await execute_reset(nc, plan)
        info = await JetStreamApi(nc).consumer_info(stream, "g-m1")
        assert info["num_pending"] == 0 and info["ack_floor"]["stream_seq"] == 15
        inst = await static_consume(nc, stream, "g", "m1", recorder(seen), config=FAST)
        await publish(js, stream, 15, 16)
        await wait_for(lambda: len(seen) == 15, 10, what="the one published after the skip")
        assert seen[-1][1] == 15
    finally:
        await inst.stop()


async def test_static_reset_under_key_level_concurrency_keeps_each_keys_order(nc, js, uniq):
    """A RESET to the first message while four handlers run and more wait: the new epoch handles every
    message once, in order per key; nothing of the old epoch starts after it."""
    stream = uniq
    await js.add_stream(
        StreamConfig(
            name=stream,
            subjects=[f"{stream}.*"],
            subject_transform=SubjectTransform(src=f"{stream}.*", dest=f"0.{stream}.{{{{wildcard(1)}}}}"),
        )
    )
    for i in range(40):
        await js.publish(f"{stream}.k{i % 4}", str(i).encode())
    await create_static(nc, stream, "g", 1, members=["m1"])
    starts: list[tuple[int, int, str]] = []

    async def handler(msg):
        starts.append((msg.sequence, msg.epoch, msg.subject))
        await asyncio.sleep(0.02)
        await msg.ack()

    inst = await static_consume(
        nc, stream, "g", "m1", handler, concurrency=4, config=ConsumerConfig(max_ack_pending=16, ack_wait=5)
    )
    try:
        await wait_for(lambda: len(starts) >= 15, 10, what="some handled")
        await execute_reset(nc, await plan_static_reset(nc, stream, "g", Target.of(earliest=True)))
        await wait_for(lambda: sum(s[1] == 1 for s in starts) >= 40, 15, what="the new epoch's forty")
        await wait_for(lambda: _settled(JetStreamApi(nc), stream, "g-m1"), 10, what="settled")
    finally:
        await inst.stop()
    first_new = next(i for i, s in enumerate(starts) if s[1] == 1)
    before, after = starts[:first_new], starts[first_new:]
    assert {s[1] for s in before} == {0} and {s[1] for s in after} == {1}  # no old message starts after the RESET
    assert sorted(s[0] for s in after) == list(range(1, 41))  # each once in the new epoch
    assert len({s[0] for s in before}) == len(before)  # none twice in the old one
    for key in ("k0", "k1", "k2", "k3"):
        seqs = [s[0] for s in after if s[2].endswith(key)]
        assert seqs == sorted(seqs)


async def elastic_group(nc, js, stream: str, n: int) -> None:
    await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.*"]))
    await publish(js, stream, 0, n)
    await create_elastic(nc, stream, "g", 4, partitioning_filters=[PartitioningFilter(f"{stream}.*", [1])])


async def test_elastic_replay_from_earliest_with_a_member_running(nc, js, uniq):
    stream = uniq
    await elastic_group(nc, js, stream, 12)
    await add_members(nc, stream, "g", ["m1"])
    seen: list = []
    inst = await elastic_consume(nc, stream, "g", "m1", recorder(seen), config=FAST)
    try:
        await wait_for(lambda: len(seen) == 12, 15, what="twelve")
        plan = await plan_elastic_reset(nc, stream, "g", Target.of(earliest=True))
        assert [(s.stream, s.start, s.messages) for s in plan.sources] == [(stream, 1, 12)] and plan.queued == 0
        await execute_reset(nc, plan)
        await wait_for(lambda: len(seen) == 24, 15, what="twelve again")
        first, again = per_partition(seen[:12]), per_partition(seen[12:])
        assert first == again  # every message once more, in order per partition
        cfg = (await JetStreamApi(nc).stream_info(f"{stream}-g"))["config"]
        assert "opt_start_seq" not in cfg["sources"][0]  # the start is history once sourcing runs
        await publish(js, stream, 12, 13)
        await wait_for(lambda: len(seen) == 25, 15, what="a new message after the replay")
    finally:
        await inst.stop()


async def test_elastic_replay_of_a_group_over_two_streams_by_time(nc, js, uniq):
    """--to-time on an aggregate group: each stream sourced again from its first message at or after it."""
    orders, payments = uniq + "o", uniq + "p"
    await js.add_stream(StreamConfig(name=orders, subjects=[f"{orders}.*"]))
    await js.add_stream(StreamConfig(name=payments, subjects=[f"{payments}.*"]))
    await publish(js, orders, 0, 3)
    await publish(js, payments, 0, 3)
    await asyncio.sleep(0.05)
    cut = datetime.now(UTC)
    await asyncio.sleep(0.05)
    await publish(js, orders, 3, 5)
    await publish(js, payments, 3, 6)
    await create_elastic(
        nc,
        orders,
        "g",
        2,
        sources=[payments],
        partitioning_filters=[PartitioningFilter(f"{orders}.*", [1]), PartitioningFilter(f"{payments}.*", [1])],
    )
    await add_members(nc, orders, "g", ["m1"])
    seen: list = []
    inst = await elastic_consume(nc, orders, "g", "m1", recorder(seen), config=FAST)
    try:
        await wait_for(lambda: len(seen) == 11, 15, what="all eleven")
        with pytest.raises(ConfigError, match="--to-seq needs a group over one stream"):
            await plan_elastic_reset(nc, orders, "g", Target.of(seq=1))
        plan = await plan_elastic_reset(nc, orders, "g", Target.of(time=cut.isoformat()))
        assert sorted((s.stream, s.start, s.messages) for s in plan.sources) == [(orders, 4, 2), (payments, 4, 3)]
        await execute_reset(nc, plan)
        await wait_for(lambda: len(seen) == 16, 15, what="the five after the time again")
        assert sorted(v for _, v, _ in seen[11:]) == [3, 3, 4, 4, 5]
        cfg = (await JetStreamApi(nc).stream_info(f"{orders}-g"))["config"]
        assert all("opt_start_seq" not in src for src in cfg["sources"])
    finally:
        await inst.stop()


async def test_elastic_skip_purges_only_the_named_members_queue(nc, js, uniq):
    stream = uniq
    await elastic_group(nc, js, stream, 40)
    await add_members(nc, stream, "g", ["m1", "m2"])
    api = JetStreamApi(nc)
    await wait_for(lambda: _messages(api, f"{stream}-g", 40), 10, what="sourced")
    plan = await plan_elastic_reset(nc, stream, "g", Target.of(latest=True), ["m1"])
    (m1,) = plan.members
    assert plan.purge_partitions == m1.partitions == [0, 1] and plan.queued == m1.skip > 0
    await execute_reset(nc, plan)
    assert (await api.stream_info(f"{stream}-g"))["state"]["messages"] == 40 - m1.skip
    seen1: list = []
    seen2: list = []
    i1 = await elastic_consume(nc, stream, "g", "m1", recorder(seen1), config=FAST)
    i2 = await elastic_consume(nc, stream, "g", "m2", recorder(seen2), config=FAST)
    try:
        await wait_for(lambda: len(seen2) == 40 - m1.skip, 15, what="m2's untouched queue")
        await publish(js, stream, 40, 48)
        await wait_for(lambda: len(seen1) + len(seen2) == 48 - m1.skip, 15, what="new messages to both")
        assert all(v >= 40 for _, v, _ in seen1)
    finally:
        await i1.stop()
        await i2.stop()


async def _settled(api, stream: str, consumer: str) -> bool:
    info = await api.consumer_info(stream, consumer)
    return info["num_pending"] == 0 and info["num_ack_pending"] == 0


async def _messages(api, wq: str, n: int) -> bool:
    return (await api.stream_info(wq))["state"]["messages"] == n


async def test_bad_targets_and_members(nc, js, uniq):
    with pytest.raises(ConfigError, match="give exactly one"):
        Target.of()
    with pytest.raises(ConfigError, match="--to-earliest and --to-latest given together"):
        Target.of(earliest=True, latest=True)
    with pytest.raises(ConfigError, match="invalid --to-time"):
        Target.of(time="yesterday")
    with pytest.raises(ConfigError, match="invalid --by-duration"):
        Target.of(duration="-1h")
    stream = uniq
    await static_stream(js, stream, 3)
    await create_static(nc, stream, "g", 2, members=["m1", "m2"])
    with pytest.raises(ConfigError, match="m9 is not a member"):
        await plan_static_reset(nc, stream, "g", Target.of(earliest=True), ["m9"])
    with pytest.raises(ConfigError, match="past the end"):
        await plan_static_reset(nc, stream, "g", Target.of(seq=99))
    await elastic_group(nc, js, stream + "e", 3)
    await add_members(nc, stream + "e", "g", ["m1"])
    with pytest.raises(ConfigError, match="whole group"):
        await plan_elastic_reset(nc, stream + "e", "g", Target.of(earliest=True), ["m1"])
