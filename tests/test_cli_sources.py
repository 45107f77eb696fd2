"""``cg elastic`` over several streams, through the real ``cg``: aggregate groups (``--source``), partition
streams (``--partition-stream``), ``add-source``/``remove-source``, ``--start`` and joining by name
(``consume --auto --create``). Bad input: one ``cg: error:`` line, exit 1, nothing created or changed."""

from __future__ import annotations

import json
import signal

import pytest

from pcgroups import get_elastic_config, get_elastic_layout, work_queue_name
from pcgroups.deadletters import dead_letter_stream
from tests.helpers.cli import acg, assert_cli_error, kv_value, message_lines, procs, run_cg
from tests.helpers.support import wait_for

BUCKET = "elastic-consumer-groups"


@pytest.fixture
async def streams(js, uniq):
    """ORDERS-like and PAYMENTS-like streams and four partition streams, named after the test."""
    o, p = f"{uniq}O", f"{uniq}P"
    await js.add_stream(name=o, subjects=[f"{uniq}.orders.*"])
    await js.add_stream(name=p, subjects=[f"{uniq}.payments.*"])
    for i in range(4):
        await js.add_stream(name=f"{uniq}L{i}", subjects=[f"{uniq}.p{i}.>"])
    return o, p, [f"{uniq}L{i}" for i in range(4)]


async def test_create_an_aggregate_group_and_show_its_streams(nats_server, nc, js, uniq, streams):
    o, p, _ = streams
    url = nats_server.url
    (
        await run_cg(
            "elastic",
            "create",
            o,
            "billing",
            "8",
            "--filter",
            f"{uniq}.orders.*",
            "--wildcards",
            "1",
            "--source",
            p,
            "--filter",
            f"{uniq}.payments.*",
            "--wildcards",
            "1",
            url=url,
        )
    ).ok()
    # the stored value is the reference's fields only
    assert json.loads(await kv_value(js, BUCKET, f"{o}.billing")) == {
        "max_members": 8,
        "partitioning_filters": [
            {"filter": f"{uniq}.orders.*", "partitioning_wildcards": [1]},
            {"filter": f"{uniq}.payments.*", "partitioning_wildcards": [1]},
        ],
    }
    r = (await run_cg("elastic", "info", o, "billing", url=url)).ok()
    assert r.lines[-1] == (f"streams (aggregate): {o} ({uniq}.orders.* by 1), {p} ({uniq}.payments.* by 1)")
    doc = json.loads((await run_cg("elastic", "info", o, "billing", "--json", url=url)).ok().out)
    assert doc["layout"] == "aggregate" and [s["name"] for s in doc["streams"]] == [o, p]
    # a one-stream group's plain info is the reference's lines, nothing added
    (await run_cg("elastic", "create", o, "solo", "4", "--filter", f"{uniq}.orders.*", url=url)).ok()
    r = (await run_cg("elastic", "info", o, "solo", url=url)).ok()
    assert not any(line.startswith("streams") for line in r.lines)


async def test_create_partition_streams_repeated_or_comma_separated(nats_server, nc, js, uniq, streams):
    *_, parts = streams
    url = nats_server.url
    name = f"{uniq}LOGS"  # not a stream
    (
        await run_cg(
            "elastic",
            "create",
            name,
            "shipper",
            "4",
            "--partition-stream",
            f"{parts[0]},{parts[1]}",
            "--partition-stream",
            parts[2],
            "--partition-stream",
            parts[3],
            url=url,
        )
    ).ok()
    layout = await get_elastic_layout(nc, name, "shipper")
    assert [(s.name, s.partition) for s in layout.streams] == [(n, i) for i, n in enumerate(parts)]
    assert (await run_cg("elastic", "ls", name, url=url)).ok().out == "elastic consumer groups: [shipper]\n"
    r = (await run_cg("elastic", "info", name, "shipper", url=url)).ok()
    assert r.lines[-1].startswith(f"streams (partition-streams): {parts[0]} (partition 0), ")


async def test_bad_layouts_are_one_error_line_and_create_nothing(nats_server, nc, js, uniq, streams):
    o, p, parts = streams
    url = nats_server.url
    cases = [
        (
            [
                "elastic",
                "create",
                o,
                "g",
                "8",
                "--filter",
                f"{uniq}.refunds.*",
                "--source",
                p,
                "--filter",
                f"{uniq}.payments.*",
            ],
            f"partitioning filter {uniq}.refunds.* matches no subject of the group's streams",
        ),
        (
            [
                "elastic",
                "create",
                o,
                "g",
                "8",
                "--filter",
                f"{uniq}.orders.*",
                "--source",
                f"{uniq}NOPE",
                "--filter",
                f"{uniq}.payments.*",
            ],
            f"source stream does not exist: {uniq}NOPE",
        ),
        (
            ["elastic", "create", f"{uniq}LOGS", "g", "3", "--partition-stream", ",".join(parts)],
            "4 partition streams given for 3 partitions",
        ),
        (
            ["elastic", "create", f"{uniq}LOGS", "g", "4", "--partition-stream", ",".join(parts), "--filter", "x.*"],
            "--partition-stream takes no --filter or --source",
        ),
        (
            ["elastic", "create", o, "g", "8", "--filter", f"{uniq}.orders.*", "--start", "yesterday"],
            "--start yesterday: invalid start",
        ),
        (
            ["elastic", "create", o, "g", "8", "--filter", f"{uniq}.orders.*", "--start", f"{p}=new"],
            f"{p} is not one of the group's streams",
        ),
        (["elastic", "consume", o, "g", "m1", "--create", "4"], "--create needs --auto"),
        (["elastic", "consume", o, "g", "--auto", "--filter", "x.*"], "give them with --create PARTITIONS"),
    ]
    for argv, text in cases:
        r = await run_cg(*argv, url=url)
        assert_cli_error(r, text)
    for name in (o, f"{uniq}LOGS"):
        assert await kv_value(js, BUCKET, f"{name}.g") is None
    assert not [s for s in await js.streams_info() if s.config.name in (f"{o}-g", f"{uniq}LOGS-g")]


async def test_add_and_remove_a_stream_with_a_member_running(nats_server, nc, js, uniq, streams):
    o, p, _ = streams
    url = nats_server.url
    (await run_cg("elastic", "create", o, "g", "2", "--filter", f"{uniq}.orders.*", url=url)).ok()
    (await run_cg("elastic", "add", o, "g", "m1", url=url)).ok()
    for i in range(3):
        await js.publish(f"{uniq}.payments.c{i}", b"p")  # a backlog in the stream to add
    async with procs() as start:
        member = await start("elastic", "consume", o, "g", "m1", "--sleep", "0", url=url)
        await member.wait_text("consuming...")
        r = (await run_cg("elastic", "add-source", o, "g", p, "--filter", f"{uniq}.payments.*", url=url)).ok()
        assert r.lines == [
            f"added stream {p} to elastic consumer group g",
            f"streams now: {o} ({uniq}.orders.* by 1), {p} ({uniq}.payments.* by 1)",
        ]
        for i in range(3):
            await js.publish(f"{uniq}.orders.c{i}", b"o")
        await member.wait_output(lambda out: len(message_lines(out)) >= 6, what="3 payments and 3 orders")
        r = (await run_cg("elastic", "remove-source", o, "g", p, url=url)).ok()
        assert r.lines[-1] == f"streams now: {o} ({uniq}.orders.* by 1)"
        await js.publish(f"{uniq}.payments.late", b"p")
        await js.publish(f"{uniq}.orders.late", b"o")
        await member.wait_output(lambda out: f"{uniq}.orders.late" in out, what="an order after the removal")
        member.signal(signal.SIGTERM)
        result = await member.wait()
    assert result.code == 0
    subjects = [m["subject"] for m in message_lines(result.out)]
    assert sorted(subjects) == sorted(
        [f"{uniq}.payments.c{i}" for i in range(3)]
        + [f"{uniq}.orders.c{i}" for i in range(3)]
        + [f"{uniq}.orders.late"]
    )
    assert (await get_elastic_config(nc, o, "g")).partitioning_filters[0].filter == f"{uniq}.orders.*"
    assert_cli_error(await run_cg("elastic", "remove-source", o, "g", o, url=url), "is the only stream")
    assert_cli_error(await run_cg("elastic", "add-source", o, "g", p, url=url), "partitions by filters")


async def test_instances_started_together_with_create_join_one_group(fresh_server):
    """``cg elastic consume STREAM GROUP --auto --create N ...`` three times at once on an empty server: one
    group, one work queue, every instance joined, the partitions spread over them."""
    import nats

    url = fresh_server.url
    async with await nats.connect(url) as nc:
        js = nc.jetstream()
        await js.add_stream(name="ORDERS", subjects=["orders.*"])
        argv = [
            "elastic",
            "consume",
            "ORDERS",
            "billing",
            "--auto",
            "--lease-ttl",
            "2s",
            "--sleep",
            "0",
            "--create",
            "3",
            "--filter",
            "orders.*",
            "--wildcards",
            "1",
        ]
        async with procs() as start:
            members = [await start(*argv, url=url) for _ in range(3)]
            for m in members:
                await m.wait_text("consuming...", timeout=30)

            async def spread():
                cfg = await get_elastic_config(nc, "ORDERS", "billing")
                return sorted(len(mm.partitions) for mm in cfg.member_mappings) == [1, 1, 1]

            await wait_for(spread, timeout=20, what="three members of one partition each")
            for i in range(9):
                await js.publish(f"orders.c{i}", b"o")
            await wait_for(
                lambda: sum(len(message_lines(m.out)) for m in members) == 9, timeout=20, what="every order handled"
            )
            for m in members:
                m.signal(signal.SIGTERM)
            codes = [(await m.wait(timeout=20)).code for m in members]
        assert codes == [0, 0, 0]
        assert await (await js.key_value(BUCKET)).keys() == ["ORDERS.billing"]
        assert sorted(s.config.name for s in await js.streams_info()) == [
            "KV_elastic-consumer-groups",
            "KV_pcgroups-leases",
            "ORDERS",
            work_queue_name("ORDERS", "billing"),
            dead_letter_stream("elastic", "ORDERS", "billing"),  # made with the group
        ]
        assert all(len(message_lines(m.out)) >= 1 for m in members)
        r = await acg(
            "elastic", "consume", "ORDERS", "billing", "--auto", "--create", "5", "--filter", "orders.*", url=url
        )
        assert_cli_error(r, "partitions: 3 now, 5 asked")
