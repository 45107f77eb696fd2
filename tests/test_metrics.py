"""Metrics: ``cg metrics`` (the groups' exporter) and ``consume --metrics-listen`` / pcgroups.ops._metrics (an
instance's own), scraped over real HTTP from real processes on a real nats-server; the dashboard and the
alert rules name only metrics that exist."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
import time

import pytest

from pcgroups import PartitioningFilter, add_members, create_elastic, create_static
from pcgroups.events import InstanceEvent
from pcgroups.ops._exporter import EXPORTER_METRICS, GROUP_METRICS
from pcgroups.ops._metrics import INSTANCE_METRICS, POOL_METRICS, InstanceMetrics
from pcgroups.testing._server import free_port
from tests.helpers.cli import (
    ROOT,
    acg,
    assert_cli_error,
    cg_env,
    make_stream,
    partition_transform,
    procs,
    run_cg,
)
from tests.helpers.http import scrape
from tests.helpers.support import wait_for

pytestmark = pytest.mark.timeout(90)


async def ascrape(port: int) -> dict[str, list]:
    return await asyncio.to_thread(scrape, port)


def values(samples: list, name: str | None = None, **labels: str) -> list[float]:
    return [
        s.value
        for s in samples
        if (name is None or s.name == name) and all(s.labels.get(k) == v for k, v in labels.items())
    ]


async def exporter(start, url: str, *args: str, interval: str = "0.3s"):
    port = free_port()
    p = await start("metrics", *args, "--listen", f"127.0.0.1:{port}", "--interval", interval, url=url)
    await p.wait_text("serving metrics")
    return p, port


async def test_a_stream_that_does_not_exist_is_warned_once(js, server_url, uniq):
    """`cg metrics nosuchstream` serves (a group may come later) and says once that there is no such
    stream; a stream that exists without groups, or a group's name that is no stream, says nothing."""
    await make_stream(js, uniq)
    for i in range(2):
        await make_stream(js, f"{uniq}-p{i}")
    (
        await run_cg(
            "elastic", "create", f"{uniq}-logs", "g", "2", "--partition-stream", f"{uniq}-p0,{uniq}-p1", url=server_url
        )
    ).ok()
    async with procs() as start:
        p, port = await exporter(start, server_url, uniq, f"{uniq}-missing", f"{uniq}-logs")

        async def refreshed() -> bool:
            return (await ascrape(port))["pcgroups_exporter_refreshes"][0].value >= 3

        await wait_for(refreshed, timeout=10, what="three refreshes")  # warned once, not per refresh
        p.signal(signal.SIGINT)
        r = await p.wait(15)
    assert r.code == 0, r.err
    warnings = [line for line in r.err.splitlines() if line.startswith("cg: warning:")]
    assert warnings == [f"cg: warning: no stream {uniq}-missing, nor a group on it: nothing to show yet"], r.err


async def test_elastic_pending_is_what_is_not_yet_acked_and_sourcing_lag_is_there(js, nc, server_url, uniq):
    await make_stream(js, uniq)
    await create_elastic(nc, uniq, "g", 4, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])
    await add_members(nc, uniq, "g", ["m1"])
    for i in range(12):
        await js.publish(f"{uniq}.{i}", b"x")
    async with procs() as start:
        _, port = await exporter(start, server_url, uniq)

        async def pending() -> float | None:
            m = await ascrape(port)
            rows = values(m.get("pcgroups_partition_pending_messages", []), stream=uniq, group="g")
            return sum(rows) if len(rows) == 4 else None

        await wait_for(lambda: _equals(pending, 12), timeout=10, what="12 pending over 4 partitions")
        m = await ascrape(port)
        assert values(m["pcgroups_elastic_source_lag_messages"], stream=uniq, group="g", source=uniq) == [0.0]
        assert values(m["pcgroups_group_members"], flavour="elastic", stream=uniq, group="g") == [1.0]
        assert values(m["pcgroups_member_partitions"], member="m1", stream=uniq) == [4.0]

        consumer = await start("elastic", "consume", uniq, "g", "m1", "--sleep", "0", url=server_url)
        await consumer.wait_output(lambda o: o.count("acked\n") == 12, what="12 acked")
        await wait_for(lambda: _equals(pending, 0), timeout=10, what="nothing pending once acked")
        consumer.kill()
        for i in range(5):
            await js.publish(f"{uniq}.{i}", b"y")
        await wait_for(lambda: _equals(pending, 5), timeout=10, what="the 5 new messages pending")


async def _equals(probe, expected: float) -> bool:
    return await probe() == expected


async def test_sourcing_lag_per_source_stream_and_a_broken_group_left_out(js, nc, server_url, uniq):
    from pcgroups.jetstream._store import ELASTIC_BUCKET

    orders, payments = f"{uniq}o", f"{uniq}p"
    await make_stream(js, orders)
    await make_stream(js, payments)
    await create_elastic(
        nc,
        orders,
        "agg",
        3,
        sources=[payments],
        partitioning_filters=[PartitioningFilter(f"{orders}.*", [1]), PartitioningFilter(f"{payments}.*", [1])],
    )
    await create_elastic(nc, orders, "broken", 3, partitioning_filters=[PartitioningFilter(f"{orders}.*", [1])])
    kv = await js.key_value(ELASTIC_BUCKET)
    await kv.put(f"{orders}.broken", b"not json")
    for i in range(4):
        await js.publish(f"{orders}.{i}", b"o")
        await js.publish(f"{payments}.{i}", b"p")
    async with procs() as start:
        _, port = await exporter(start, server_url, orders)

        async def sourced() -> bool:
            m = await ascrape(port)
            lags = {
                s.labels["source"]: s.value
                for s in m.get("pcgroups_elastic_source_lag_messages", [])
                if s.labels["stream"] == orders and s.labels["group"] == "agg"
            }
            pending = values(m.get("pcgroups_partition_pending_messages", []), stream=orders, group="agg")
            return lags == {orders: 0.0, payments: 0.0} and sum(pending) == 8

        await wait_for(sourced, timeout=10, what="both sources' lag and their 8 messages pending")
        m = await ascrape(port)
        assert values(m["pcgroups_group_members"], stream=orders, group="broken") == []  # left out, counted
        assert values(m["pcgroups_exporter_errors"], "pcgroups_exporter_errors_total", kind="group")[0] >= 1
        assert values(m["pcgroups_exporter_up"]) == [1.0]


async def test_static_instances_follow_starts_and_kills(js, nc, server_url, uniq):
    await make_stream(js, uniq, transform=partition_transform(uniq, 4))
    await create_static(nc, uniq, "g", 4, members=["m1", "m2"])
    for i in range(20):
        await js.publish(f"{uniq}.{i}", b"x")
    async with procs() as start:
        _, port = await exporter(start, server_url)

        async def member(name: str, metric: str) -> float | None:
            rows = values((await ascrape(port)).get(metric, []), flavour="static", stream=uniq, group="g", member=name)
            return rows[0] if rows else None

        async def instances(name: str, n: int) -> bool:
            return await member(name, "pcgroups_member_active_instances") == n

        await wait_for(lambda: instances("m1", 0), what="no instance of m1")
        # slow handlers: each member's first message stays in flight, nothing is acked
        a = await start("static", "consume", uniq, "g", "m1", "--sleep", "60s", url=server_url)
        b = await start("static", "consume", uniq, "g", "m1", "--sleep", "60s", url=server_url)
        c = await start("static", "consume", uniq, "g", "m2", "--sleep", "60s", url=server_url)
        for p in (a, b, c):
            await p.wait_text("consuming...")
        await wait_for(lambda: instances("m1", 2), timeout=10, what="two instances of m1")
        await wait_for(lambda: instances("m2", 1), timeout=10, what="one instance of m2")

        async def unacked() -> bool:  # not yet delivered + delivered and not acked = all published
            m = await ascrape(port)
            rows = [
                *values(m.get("pcgroups_partition_pending_messages", []), stream=uniq),
                *values(m.get("pcgroups_partition_ack_pending_messages", []), stream=uniq),
            ]
            return len(rows) == 4 and sum(rows) == 20

        await wait_for(unacked, timeout=10, what="20 messages not yet acked")
        m = await ascrape(port)
        assert sorted(
            s.labels["partition"] for s in m["pcgroups_partition_pending_messages"] if s.labels["stream"] == uniq
        ) == ["0,1", "2,3"]  # counted per member consumer
        await wait_for(lambda: _positive(member("m1", "pcgroups_member_pinned_seconds")), what="m1 pinned")

        a.kill()
        b.kill()
        await wait_for(lambda: instances("m1", 0), timeout=10, what="m1's instances gone")
        assert await member("m2", "pcgroups_member_active_instances") == 1
        d = await start("static", "consume", uniq, "g", "m1", "--sleep", "60s", url=server_url)
        await d.wait_text("consuming...")
        await wait_for(lambda: instances("m1", 1), timeout=10, what="m1's new instance")


async def _positive(aw) -> bool:
    return (await aw or 0) > 0


async def test_a_scrape_storm_costs_no_refresh(js, nc, server_url, uniq):
    await make_stream(js, uniq)
    await create_elastic(nc, uniq, "g", 3, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])
    await make_stream(js, uniq + "s", transform=partition_transform(uniq + "s", 3))
    await create_static(nc, uniq + "s", "g", 3, members=["m1"])
    async with procs() as start:
        _, port = await exporter(start, server_url, uniq, uniq + "s", interval="2s")

        def counters() -> tuple[float, float, float]:
            m = scrape(port)
            return (
                m["pcgroups_exporter_refreshes"][0].value,
                m["pcgroups_exporter_api_requests"][0].value,
                m["pcgroups_exporter_last_refresh_api_requests"][0].value,
            )

        await wait_for(lambda: counters()[0] >= 1, what="a first refresh")
        refreshes, requests, per_refresh = await asyncio.to_thread(counters)
        started = time.monotonic()
        for _ in range(50):
            m = await ascrape(port)
            assert values(m["pcgroups_group_members"], stream=uniq) == [0.0]
        elapsed = time.monotonic() - started
        refreshes2, requests2, per_refresh2 = await asyncio.to_thread(counters)
        assert refreshes2 - refreshes <= elapsed / 2 + 1, (refreshes, refreshes2, elapsed)
        # the requests come from refreshes alone: 12 for the buckets' snapshots (2 streams x 2 buckets x 3),
        # 2 for the static group, 3 for the elastic one, 1 for the dead-letter streams (none), 1 for the pools
        assert per_refresh == per_refresh2 == 2 * 2 * 3 + 2 + 3 + 1 + 1
        assert requests2 - requests == (refreshes2 - refreshes) * per_refresh


async def test_the_requests_counted_are_the_ones_the_server_answers(fresh_server):
    """The exporter's own count against the server's (``$JS.API.INFO``: the account's API calls), on a server
    nothing else uses: the server counts every request but the KV snapshots' pulls (one per bucket read)."""
    import json as jsonlib

    import nats

    from pcgroups.ops._exporter import GroupsExporter

    async with await nats.connect(fresh_server.url) as admin, await nats.connect(fresh_server.url) as own:
        js = admin.jetstream()
        await make_stream(js, "S", transform=partition_transform("S", 4))
        await create_static(admin, "S", "g", 4, members=["a", "b"])
        await make_stream(js, "E")
        await create_elastic(admin, "E", "g", 4, partitioning_filters=[PartitioningFilter("E.*", [1])])

        async def server_count() -> int:
            reply = await admin.request("$JS.API.INFO", b"")
            return jsonlib.loads(reply.data)["api"]["total"]

        ex = GroupsExporter(own)
        before = await server_count()
        for _ in range(5):
            await ex.refresh()
        after = await server_count()
        assert ex.up == 1 and len(ex.statuses) == 2
        assert ex.last_requests == 8 + 2 + 3  # 8 + 2 S + 3 E (no dead letters)
        pulls = 2  # the two config buckets' snapshot pulls
        pools = 1  # the pools' status request (core NATS, not JetStream)
        assert after - before - 1 == 5 * (ex.last_requests - pulls - pools)  # - 1: this INFO request itself


async def test_a_refresh_reads_a_streams_consumers_once_for_all_its_static_groups(fresh_server):
    """Every static group's status listed all the consumers of its stream: with G groups of one stream, a refresh
    read G x (every group's member consumers), 250,000 consumer infos at 500 groups (22 s here; docs/SCALE.md).
    The groups of a stream share one consumer list and one stream info per refresh."""
    import nats

    from pcgroups import static_consume
    from pcgroups.ops._exporter import GroupsExporter

    async with await nats.connect(fresh_server.url) as admin, await nats.connect(fresh_server.url) as own:
        await make_stream(admin.jetstream(), "S", transform=partition_transform("S", 2))
        for i in range(8):
            await create_static(admin, "S", f"g{i}", 2, members=["m1", "m2"])
        for i in range(3):  # members with a consumer (the others have none)
            await (await static_consume(admin, "S", f"g{i}", "m1", lambda msg: None)).stop()
        ex = GroupsExporter(own)
        await ex.refresh()
        assert ex.up == 1 and len(ex.statuses) == 8
        # the static bucket's snapshot (3), no elastic bucket (1), the dead-letter streams (1: none), then S's
        # consumer list and info, once, and the pools' status request (1)
        assert ex.last_requests == 3 + 1 + 1 + 2 + 1
        exists = {(st.group, m.member): m.exists for st in ex.statuses for m in st.members}
        assert exists == {(f"g{i}", m): m == "m1" and i < 3 for i in range(8) for m in ("m1", "m2")}


@pytest.mark.parametrize("concurrency", ["1", "3"])
async def test_instance_metrics_count_what_the_consumer_handles(js, nc, server_url, uniq, concurrency):
    await make_stream(js, uniq, transform=partition_transform(uniq, 2))
    await create_static(nc, uniq, "g", 2, members=["m1"])
    for i in range(7):
        await js.publish(f"{uniq}.{i}", b"x")
    port = free_port()
    async with procs() as start:
        p = await start(
            "static",
            "consume",
            uniq,
            "g",
            "m1",
            "--sleep",
            "0",
            "--concurrency",
            concurrency,
            "--metrics-listen",
            f"127.0.0.1:{port}",
            url=server_url,
        )
        await p.wait_output(lambda o: o.count("acked\n") == 7, what="7 acked")  # "consuming..." may come between

        async def handled() -> bool:
            m = await ascrape(port)
            labels = {"flavour": "static", "stream": uniq, "group": "g", "member": "m1"}
            return values(
                m["pcgroups_instance_messages_handled"], "pcgroups_instance_messages_handled_total", **labels
            ) == [7.0] and values(
                m["pcgroups_instance_handler_seconds"], "pcgroups_instance_handler_seconds_count", **labels
            ) == [7.0]

        await wait_for(handled, timeout=10, what="7 handled")
        p.signal(2)
        assert (await p.wait()).code == 0


async def test_a_standby_instance_counts_its_members_partitions(js, nc, server_url, uniq):
    """Two instances of m1, which owns both partitions: the standby's pcgroups_instance_partitions is 2 too."""
    await make_stream(js, uniq, transform=partition_transform(uniq, 2))
    await create_static(nc, uniq, "g", 2, members=["m1"])
    ports = [free_port(), free_port()]
    async with procs() as start:
        for port in ports:
            await start("static", "consume", uniq, "g", "m1", "--metrics-listen", f"127.0.0.1:{port}", url=server_url)
        await js.publish(f"{uniq}.a", b"x")  # the server gives the pin with a message

        async def both_say_two() -> bool:
            try:
                ms = [await ascrape(port) for port in ports]
            except OSError:  # not serving yet
                return False
            pinned = [values(m["pcgroups_instance_pinned"], member="m1") for m in ms]
            return sorted(pinned) == [[0.0], [1.0]] and all(
                values(m["pcgroups_instance_partitions"], member="m1") == [2.0] for m in ms
            )

        await wait_for(both_say_two, timeout=15, what="pinned and standby, each with 2 partitions")


async def test_an_automatic_member_serves_its_metrics_too(js, nc, server_url, uniq):
    await make_stream(js, uniq)
    await create_elastic(nc, uniq, "g", 2, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])
    for i in range(5):
        await js.publish(f"{uniq}.{i}", b"x")
    port = free_port()
    async with procs() as start:
        p = await start(
            "elastic",
            "consume",
            uniq,
            "g",
            "--auto",
            "--sleep",
            "0",
            "--metrics-listen",
            f"127.0.0.1:{port}",
            url=server_url,
        )
        await p.wait_output(lambda o: o.count("acked\n") == 5, what="5 acked")
        member = re.search(r"^\[(auto-\S+)\] subject=", p.out, re.M)[1]

        async def handled() -> bool:
            m = await ascrape(port)
            return values(
                m["pcgroups_instance_messages_handled"],
                "pcgroups_instance_messages_handled_total",
                flavour="elastic",
                stream=uniq,
                group="g",
                member=member,
            ) == [5.0]

        await wait_for(handled, timeout=10, what="5 handled by the generated member")


def test_importing_the_metrics_modules_imports_no_prometheus_client():
    import subprocess
    import sys

    code = (
        "import sys, pcgroups, pcgroups.ops._metrics, pcgroups.ops._exporter, cg.consume; "
        "print('prometheus_client' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert r.stdout.strip() == "False", r.stderr


def test_on_event_counts_pins_and_rebalances():
    metrics = InstanceMetrics("elastic", "s", "g", "m1")

    def value(name: str, **labels: str) -> float | None:
        return metrics.registry.get_sample_value(
            name, {"flavour": "elastic", "stream": "s", "group": "g", "member": "m1", **labels}
        )

    for event in [
        InstanceEvent("not-a-member", "m1"),
        InstanceEvent("added", "m1", (0, 1, 2)),
        InstanceEvent("pinned", "m1", (0, 1, 2)),
        InstanceEvent("partitions", "m1", (0, 1)),
        InstanceEvent("lost-pin", "m1"),
        InstanceEvent("pinned", "m1", (0, 1)),
        InstanceEvent("disconnected", "m1", detail="nats://127.0.0.1:4222"),
    ]:
        metrics.on_event(event)
    assert value("pcgroups_instance_pins_gained_total") == 2
    assert value("pcgroups_instance_pins_lost_total") == 1
    assert value("pcgroups_instance_pinned") == 1
    assert value("pcgroups_instance_partitions") == 2
    assert value("pcgroups_instance_rebalances_total", kind="added") == 1
    assert value("pcgroups_instance_rebalances_total", kind="partitions") == 1
    metrics.on_event(InstanceEvent("dropped", "m1"))
    metrics.on_event(InstanceEvent("standby", "m1"))
    assert value("pcgroups_instance_partitions") == 0
    assert value("pcgroups_instance_pinned") == 0
    assert value("pcgroups_instance_rebalances_total", kind="dropped") == 1


async def test_handler_wrapper_keeps_the_handler_kind_and_counts_errors():
    import inspect

    metrics = InstanceMetrics("static", "s", "g", "m1")
    labels = {"flavour": "static", "stream": "s", "group": "g", "member": "m1"}

    async def ok(msg):
        return msg

    def bad(msg):
        raise ValueError(msg)

    wrapped_ok, wrapped_bad = metrics.wrap(ok), metrics.wrap(bad)
    assert inspect.iscoroutinefunction(wrapped_ok) and not inspect.iscoroutinefunction(wrapped_bad)
    assert await wrapped_ok(1) == 1
    with pytest.raises(ValueError):
        wrapped_bad(2)
    get = metrics.registry.get_sample_value
    assert get("pcgroups_instance_messages_handled_total", labels) == 1
    assert get("pcgroups_instance_handler_errors_total", labels) == 1
    assert get("pcgroups_instance_handler_seconds_count", labels) == 2
    other = InstanceMetrics("static", "s", "g", "m2", families=metrics.families)  # one registry, two instances
    other.wrap(ok)
    assert await other.wrap(ok)(3) == 3
    assert get("pcgroups_instance_messages_handled_total", {**labels, "member": "m2"}) == 1


async def test_dead_letters_are_counted(js, nc, uniq):
    from pcgroups import static_consume
    from pcgroups.consume._retry import RetryPolicy
    from pcgroups.jetstream._api import ConsumerConfig

    await make_stream(js, uniq, transform=partition_transform(uniq, 1))
    await create_static(nc, uniq, "g", 1, members=["m1"])
    metrics = InstanceMetrics("static", uniq, "g", "m1")
    handled: list[str] = []

    async def handler(msg):
        if msg.data == b"poison":
            raise ValueError("poison")
        handled.append(msg.subject)
        await msg.ack()

    inst = await static_consume(
        nc,
        uniq,
        "g",
        "m1",
        metrics.wrap(handler),
        config=ConsumerConfig(max_ack_pending=10, ack_wait=5),
        concurrency=2,
        retry=RetryPolicy(max_deliver=2, backoff=0.01, on_dead_letter=metrics.on_dead_letter),
    )
    async with inst:
        await inst.wait_for_consuming(timeout=10)
        await js.publish(f"{uniq}.1", b"poison")
        await js.publish(f"{uniq}.2", b"fine")
        labels = {"flavour": "static", "stream": uniq, "group": "g", "member": "m1"}
        get = metrics.registry.get_sample_value
        await wait_for(lambda: get("pcgroups_instance_dead_lettered_total", labels) == 1, what="one dead letter")
        await wait_for(lambda: len(handled) == 1, what="the fine message handled")
        assert get("pcgroups_instance_handler_errors_total", labels) == 2


# ------------------------------------------------------------ bad input, secrets


async def test_bad_listen_and_interval_are_one_line(server_url):
    for args, fragment in [
        (("--listen", "9330"), "invalid --listen '9330': give HOST:PORT"),
        (("--listen", "127.0.0.1:70000"), "port from 1 to 65535"),
        (("--listen", "::1:9330"), "invalid --listen"),
        (("--interval", "0s"), "invalid --interval '0s': must be at least 0.1s"),
        (("bad.stream",), "stream"),
    ]:
        assert_cli_error(await acg("metrics", *args, url=server_url), fragment)
    assert_cli_error(
        await acg("static", "consume", "s", "g", "m1", "--metrics-listen", "localhost", url=server_url),
        "invalid --metrics-listen 'localhost'",
    )


async def test_port_in_use_is_one_line(server_url, uniq):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = await acg("metrics", "--listen", f"127.0.0.1:{port}", url=server_url)
        assert_cli_error(r, f"--listen: can not listen on 127.0.0.1:{port}: address already in use")
        r = await acg("static", "consume", uniq, "g", "m1", "--metrics-listen", f"127.0.0.1:{port}", url=server_url)
        assert_cli_error(r, "--metrics-listen: can not listen")


async def test_without_the_extra_it_says_what_to_install(server_url, tmp_path):
    blocker = tmp_path / "prometheus_client"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('not installed (test)')\n")
    import os

    env = cg_env(server_url, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    r = await acg("metrics", env=env)
    assert_cli_error(r, "pip install 'pcgroups[metrics]'")
    r = await acg("static", "consume", "s", "g", "m1", "--metrics-listen", "127.0.0.1:9", env=env)
    assert_cli_error(r, "pip install 'pcgroups[metrics]'")


async def test_exporter_prints_no_secret_and_ends_cleanly_on_ctrl_c(nats_server, uniq):
    url = nats_server.url.replace("nats://", "nats://alice:s3cret-pw@")
    async with procs() as start:
        p, port = await exporter(start, url, uniq)  # this test's stream: other tests' groups say nothing
        # (no stream of that name: one warning, within the 80 columns too)
        assert (await ascrape(port))["pcgroups_exporter_up"][0].value == 1
        p.signal(2)
        r = await p.wait()
    assert r.code == 0, r.err
    assert "s3cret-pw" not in r.out + r.err and "alice:***@" in r.err
    assert all(len(line) <= 80 for line in (r.out + r.err).splitlines()), r.out + r.err
    assert "Traceback" not in r.err


async def test_exporter_rides_out_a_server_restart(fresh_server):
    """Its metrics say down while the server is away, and so does /readyz (the last refresh failed), while
    /healthz says alive; both come back with the server."""
    from tests.helpers.http import aprobe, until

    async with procs() as start:
        p, port = await exporter(start, fresh_server.url)

        async def up(value: float) -> bool:
            return (await ascrape(port))["pcgroups_exporter_up"][0].value == value

        await wait_for(lambda: up(1), what="up")
        body = await until(port, "/readyz", 200)
        assert body["status"] == "ok" and body["refreshed_s_ago"] < 5 and "groups" in body
        fresh_server.stop()
        await wait_for(lambda: up(0), timeout=20, what="down while the server is away")
        await until(port, "/readyz", 503, "the last refresh failed")
        assert (await aprobe(port, "/healthz"))[0] == 200
        fresh_server.restart()
        await wait_for(lambda: up(1), timeout=20, what="up again after the restart")
        await until(port, "/readyz", 200)
        p.signal(2)
        r = await p.wait()
    assert r.code == 0
    assert "cg: warning: metrics refresh:" in r.err and "metrics refresh works again" in r.err, r.err


# ------------------------------------------------------------ the dashboard and the alerts

KNOWN = set(GROUP_METRICS) | set(EXPORTER_METRICS) | set(INSTANCE_METRICS) | set(POOL_METRICS)
SUFFIXES = ("_total", "_bucket", "_count", "_sum")


def _metric_names(expr: str) -> set[str]:
    names = set()
    for name in re.findall(r"\bpcgroups_[a-z_]+", expr):
        for suffix in SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in KNOWN:
                name = name[: -len(suffix)]
        names.add(name)
    return names


def test_dashboard_names_only_exported_metrics():
    board = json.loads((ROOT / "docs" / "grafana-pcgroups.json").read_text())
    exprs = [t["expr"] for panel in board["panels"] for t in panel.get("targets", [])]
    assert len(exprs) >= 6
    used = set()
    for expr in exprs:
        names = _metric_names(expr)
        assert names, expr
        assert names <= KNOWN, (expr, names - KNOWN)
        used |= names
    for needed in (
        "pcgroups_partition_pending_messages",
        "pcgroups_member_active_instances",
        "pcgroups_member_redelivered_messages",
        "pcgroups_member_pinned_seconds",
        "pcgroups_instance_handler_seconds",
        "pcgroups_elastic_source_lag_messages",
        "pcgroups_pool_workers",
        "pcgroups_pool_waiting_messages",
        "pcgroups_pool_in_flight_messages",
        "pcgroups_pool_slots",
        "pcgroups_pool_worker_handled_messages",
    ):
        assert needed in used


def alert_exprs() -> dict[str, str]:
    """alert name -> expr of the rules in docs/OPERATIONS.md."""
    text = (ROOT / "docs" / "OPERATIONS.md").read_text()
    return dict(re.findall(r"^\s+- alert: (\S+)\n(?:\s+#.*\n)*\s+expr: (.+)$", text, re.MULTILINE))


def test_alert_rules_in_operations_name_only_exported_metrics():
    exprs = alert_exprs()
    assert len(exprs) >= 4
    for expr in exprs.values():
        names = _metric_names(expr)
        assert names and names <= KNOWN, (expr, names - KNOWN)
    assert _metric_names(exprs["PcgroupsPoolWithoutWorkers"]) == {
        "pcgroups_pool_waiting_messages",
        "pcgroups_pool_workers",
    }
    assert _metric_names(exprs["PcgroupsPoolWaitingGrowing"]) == {
        "pcgroups_pool_waiting_messages",
        "pcgroups_pool_in_flight_messages",
        "pcgroups_pool_slots",
    }


async def test_the_pool_alerts_read_what_the_exporter_serves(js, server_url, uniq):
    """PcgroupsPoolWithoutWorkers's condition (messages waiting, the member's workers summing to 0) holds on what
    cg metrics serves while a dispatching member has no worker, and no longer once a worker handled them; the
    series PcgroupsPoolWaitingGrowing joins are there with the same labels (its `and` matches on them)."""
    await make_stream(js, uniq, transform=partition_transform(uniq, 2))
    (await run_cg("static", "create", "balanced", uniq, "g", "2", "m1", url=server_url)).ok()
    member = dict(flavour="static", stream=uniq, group="g", member="m1")

    def pool(m: dict[str, list]) -> tuple[list[float], list[float]]:
        return (
            values(m.get("pcgroups_pool_waiting_messages", []), **member),
            values(m.get("pcgroups_pool_workers", []), **member),
        )

    async with procs() as start:
        d = await start("static", "consume", uniq, "g", "m1", "--dispatch", url=server_url)
        await d.wait_text("consuming...\n")
        for i in range(6):
            await js.publish(f"{uniq}.k{i}", b"x")
        _, port = await exporter(start, server_url, uniq)

        async def without_workers() -> bool:
            waiting, workers = pool(await ascrape(port))
            return len(waiting) == 1 and waiting[0] > 0 and len(workers) == 2 and sum(workers) == 0

        await wait_for(without_workers, 15, what="messages waiting and no worker, as cg metrics serves them")
        w = await start("static", "--sleep", "0s", "worker", uniq, "g", "--name", "w1", url=server_url)
        await w.wait_output(lambda o: o.count("acked") >= 6, what="the 6 messages handled")

        async def served() -> bool:
            waiting, workers = pool(await ascrape(port))
            return waiting == [0] and sum(workers) == 1

        await wait_for(served, 15, what="nothing waiting and one worker")
        m = await ascrape(port)
        for name in ("pcgroups_pool_in_flight_messages", "pcgroups_pool_slots"):
            assert values(m[name], **member) == [0 if "flight" in name else 1], name
        assert values(
            m["pcgroups_pool_worker_handled_messages"],
            "pcgroups_pool_worker_handled_messages_total",
            worker="w1",
            **member,
        ) == [6]


_CONDITION = re.compile(r"^\s*(pcgroups_[a-z_]+)\s*(==|!=|>=|<=|>|<)\s*([0-9.]+)\s*$")
_COMPARE = {
    "==": float.__eq__,
    "!=": float.__ne__,
    ">=": float.__ge__,
    "<=": float.__le__,
    ">": float.__gt__,
    "<": float.__lt__,
}


def alert_expr(name: str) -> str:
    """The ``expr`` of alert ``name`` in docs/OPERATIONS.md's rules."""
    text = (ROOT / "docs" / "OPERATIONS.md").read_text()
    found = re.search(rf"- alert: {name}\n(?:\s+#.*\n)*\s+expr: (.+)\n", text)
    assert found, f"alert {name} not in docs/OPERATIONS.md"
    return found[1]


def firing(expr: str, scraped: dict[str, list]) -> set[tuple[str, ...]]:
    """Evaluate an alert expression of the form ``<metric> <op> <number> and on (<labels>) <metric> <op>
    <number>`` (PromQL's meaning) on scraped samples: the ``on`` label values for which it holds."""
    left, on, right = re.fullmatch(r"(.+?) and on \(([^)]*)\) (.+)", expr).groups()
    labels = [label.strip() for label in on.split(",")]

    def holding(condition: str) -> set[tuple[str, ...]]:
        name, op, number = _CONDITION.match(condition).groups()
        return {
            tuple(s.labels.get(label, "") for label in labels)
            for s in scraped.get(name, [])
            if _COMPARE[op](float(s.value), float(number))
        }

    return holding(left) & holding(right)


async def test_the_no_standby_alert_fires_for_a_lone_concurrent_instance_and_not_for_two(js, nc, server_url, uniq):
    """docs/OPERATIONS.md's PcgroupsNoStandby, evaluated on what the exporter serves: its condition holds
    at every refresh while one ``--concurrency 8`` instance works through a backlog (it counts
    instances, not the pulls a busy instance keeps), and stops holding once a standby runs."""
    expr = alert_expr("PcgroupsNoStandby")
    await make_stream(js, uniq, transform=partition_transform(uniq, 4))
    await create_static(nc, uniq, "kc", 4, members=["k1"])
    for i in range(30000):  # a backlog that keeps the instance busy for the whole check
        await nc.publish(f"{uniq}.{i % 100}", b"x")
    await nc.flush()
    member = ("static", uniq, "kc", "k1")
    async with procs() as start:
        _, port = await exporter(start, server_url, uniq, interval="0.2s")
        lone = await start(
            "static", "consume", uniq, "kc", "k1", "--concurrency", "8", "--sleep", "10ms", url=server_url
        )
        await lone.wait_text("acked")

        async def holds() -> bool:
            return member in firing(expr, await ascrape(port))

        await wait_for(holds, timeout=10, what="the alert's condition for the lone instance")
        checks = []
        for _ in range(12):  # as Prometheus' `for:` wants it: at every evaluation
            checks.append(await holds())
            await asyncio.sleep(0.25)
        assert all(checks), checks
        m = await ascrape(port)
        assert values(m["pcgroups_partition_pending_messages"], stream=uniq)[0] > 0, "the backlog ran out"

        standby = await start(
            "static", "consume", uniq, "kc", "k1", "--concurrency", "8", "--sleep", "10ms", url=server_url
        )
        await standby.wait_text("consuming...")
        await wait_for(lambda: _not(holds()), timeout=10, what="the condition gone with a standby")
        checks = []
        for _ in range(12):
            checks.append(await holds())
            await asyncio.sleep(0.25)
        assert not all(checks), checks


async def _not(aw) -> bool:
    return not await aw


async def test_the_dead_letter_alert_reads_what_the_exporter_serves(js, nc, server_url, uniq):
    """docs/OPERATIONS.md's PcgroupsParkedKeysOrDeadLettersGrowing, its parked-key condition evaluated on what cg
    metrics serves: it holds for the member whose partition has dead letters (written in the documented format),
    not for the other, and no longer once they are purged."""
    from tests.helpers.deadletters import make_dead_letter_stream, write_dead_letter

    expr = alert_expr("PcgroupsParkedKeysOrDeadLettersGrowing")
    parked, growing = expr.split(" or ")
    assert _metric_names(parked) == {"pcgroups_member_parked_keys"}
    assert _metric_names(growing) == {"pcgroups_member_dead_letters"}
    name, op, number = _CONDITION.match(parked).groups()
    await make_stream(js, uniq, transform=partition_transform(uniq, 4))
    await create_static(nc, uniq, "g", 4, members=["m1", "m2"])  # m1 owns 0 and 1
    await make_dead_letter_stream(nc, "static", uniq, "g")
    for i in range(2):
        await write_dead_letter(nc, "static", uniq, "g", partition=1, key=f"k{i}", subject=f"{uniq}.k{i}", origin_seq=i)

    def holding(m: dict[str, list]) -> set[str]:
        return {
            s.labels["member"]
            for s in m.get(name, [])
            if s.labels["stream"] == uniq and _COMPARE[op](s.value, float(number))
        }

    async with procs() as start:
        _, port = await exporter(start, server_url, uniq)
        await wait_for(lambda: _holds_for(port, holding, {"m1"}), 15, what="the condition for m1 only")
        m = await ascrape(port)
        assert values(m["pcgroups_member_dead_letters"], stream=uniq, member="m1", lane="dead") == [2]
        assert values(m[name], stream=uniq, member="m1") == [2] and values(m[name], stream=uniq, member="m2") == [0]
        (await run_cg("static", "dead-letters", "purge", uniq, "g", "--all", "--execute", url=server_url)).ok()
        await wait_for(lambda: _holds_for(port, holding, set()), 15, what="the condition gone with the dead letters")


async def _holds_for(port: int, holding, members: set[str]) -> bool:
    return holding(await ascrape(port)) == members


# ------------------------------------------------------------ permissions


async def test_the_observer_role_can_run_the_exporter(secured):
    """docs/SECURITY.md's observer reads the keys of its streams (ORDERS, EVENTS) in both buckets: the exporter
    shows every group with no error. Without the streams it may not read the whole buckets: those refusals are
    the role's scope, counted once each (kind=refused), not errors of every refresh (which would fire the
    PcgroupsExporterDown alert for good), and named the same each time (said once)."""
    from pcgroups.ops._exporter import GroupsExporter

    nc = await secured.connect("observer")
    try:
        ex = GroupsExporter(nc, streams=("ORDERS", "EVENTS"))
        for _ in range(2):
            await ex.refresh()
        assert ex.up == 1 and ex.last_error is None
        assert ex.errors == {"refresh": 0, "group": 0, "refused": 0}
        assert sorted((s.flavour, s.stream, s.group) for s in ex.statuses) == [
            ("elastic", "EVENTS", "audit"),
            ("elastic", "EVENTS", "billing"),
            ("static", "ORDERS", "shipping"),
        ]
        everything = GroupsExporter(nc)
        await everything.refresh()
        first = everything.last_error
        await everything.refresh()
        assert everything.up == 1 and everything.statuses == []
        assert everything.errors == {"refresh": 0, "group": 0, "refused": 2}  # a bucket each, counted once
        assert first == everything.last_error and "pcg_snap_" not in first, first
        assert (
            "publish to $JS.API.CONSUMER.CREATE.KV_static-consumer-groups.*.$KV.static-consumer-groups.> is not "
            "allowed" in first
        ), first
    finally:
        await nc.close()
