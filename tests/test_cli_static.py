"""``cg static ...`` against a real server: reference output lines, wire vectors, delete confirmation,
consume (lines, flush before processing, exit codes, signals) and the issue's fail-over scenario."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest

from tests.helpers.cli import (
    SCRIPTS,
    acg,
    assert_cli_error,
    cg_env,
    kv_value,
    make_stream,
    message_lines,
    partition_transform,
    procs,
    run_cg,
)
from tests.helpers.support import WIRE_VECTORS, wait_for

BUCKET = "static-consumer-groups"


@pytest.fixture
async def stream(js, uniq):
    """A fresh origin stream with the static partitioning transform (10 partitions)."""
    await make_stream(js, uniq, transform=partition_transform(uniq))
    return uniq


# ---------------------------------------------------------------- create, ls, info, wire vectors


async def test_wire_vectors_give_the_exact_kv_values(nats_server, js, stream):
    """The reference's CLI invocations (stream renamed) store byte-identical configs; create is
    idempotent and a different config for the same group is an error."""
    vectors = WIRE_VECTORS["static"]
    for v in vectors:
        args = [stream if a == "foo" else a for a in v["cli"]]
        (await run_cg(*args, url=nats_server.url)).ok()
        group = v["cli"][4]
        assert await kv_value(js, BUCKET, f"{stream}.{group}") == v["kv"].encode(), v["cli"]
        r = (await run_cg(*args, url=nats_server.url)).ok()  # idempotent
        assert r.out == ""
    r = await run_cg("static", "create", "balanced", stream, "g1", "10", "m1", "m3", url=nats_server.url)
    assert_cli_error(r, "doesn't match")
    r = (await run_cg("static", "ls", stream, url=nats_server.url)).ok()
    groups = [v["cli"][4] for v in vectors]
    assert r.out.startswith("static consumer groups: [") and sorted(
        r.out.strip()[len("static consumer groups: [") : -1].split()
    ) == sorted(groups)


async def test_info_lines(nats_server, nc, stream):
    from pcgroups.static._admin import create_static

    url = nats_server.url
    (
        await run_cg("static", "create", "balanced", stream, "b", "10", "m1", "m2", "--filter", f"{stream}.*", url=url)
    ).ok()
    r = (await run_cg("static", "info", stream, "b", url=url)).ok()
    assert r.lines == [
        f"config: max members=10, filters=[{stream}.*]",
        "members: [m1 m2]",
        "currently active members: []",
    ]
    (await run_cg("static", "create", "mapped", stream, "m", "4", "m1:0,1", "m2:2,3", url=url)).ok()
    r = (await run_cg("static", "info", stream, "m", url=url)).ok()
    assert r.lines == [
        "config: max members=4, filters=[]",
        "Member mappings: [{Member:m1 Partitions:[0 1]} {Member:m2 Partitions:[2 3]}]",
        "currently active members: []",
    ]
    await create_static(nc, stream, "empty", 3)
    r = (await run_cg("static", "info", stream, "empty", url=url)).ok()
    assert r.lines == [
        "config: max members=3, filters=[]",
        "no members or mappings defined",
        "currently active members: []",
    ]
    r = (await run_cg("static", "info", stream, "m", "--json", url=url)).ok()
    assert json.loads(r.out) == {
        "stream": stream,
        "group": "m",
        "kind": "static",
        "active_members": [],
        "config": {
            "max_members": 4,
            "member_mappings": [{"member": "m1", "partitions": [0, 1]}, {"member": "m2", "partitions": [2, 3]}],
        },
    }


async def test_member_info_and_step_down_lines(nats_server, stream):
    url = nats_server.url
    (await run_cg("static", "create", "balanced", stream, "g", "4", "m1", "m2", url=url)).ok()
    r = (await run_cg("static", "member-info", stream, "g", "m1", url=url)).ok()
    assert r.lines == [
        "member m1 is part of the consumer group membership",
        "***Warning*** member m1 is part of the consumer group membership but has NO active instance",
    ]
    for alias in ("memberinfo", "minfo"):
        r = (await run_cg("static", alias, stream, "g", "m9", url=url)).ok()
        assert r.lines == ["member m9 is not part of the consumer group membership"]
    r = (await run_cg("static", "minfo", stream, "g", "m2", "--json", url=url)).ok()
    assert json.loads(r.out) == {
        "stream": stream,
        "group": "g",
        "kind": "static",
        "member": "m2",
        "in_membership": True,
        "active": False,
    }
    # nobody consumes yet: nothing to step down (step-down with instances: the consume test)
    assert_cli_error(
        await run_cg("static", "step-down", stream, "g", "m1", url=url),
        "member m1 of static consumer group g has no running instance: nothing to step down",
    )


async def test_pretty_tables_on_a_terminal(nats_server, stream):
    """CG_PRETTY=1 stands in for a terminal: rich tables, not the reference lines."""
    url = nats_server.url
    (await run_cg("static", "create", "balanced", stream, "t", "3", "alpha", "beta", url=url)).ok()
    r = (await acg("static", "info", stream, "t", env=cg_env(url, CG_PRETTY="1"))).ok()
    assert "config: max members" not in r.out
    assert "alpha" in r.out and "beta" in r.out and "member  partitions  active" in r.out  # cg's table style
    r = (await acg("static", "ls", stream, env=cg_env(url, CG_PRETTY="1"))).ok()
    assert [line.strip() for line in r.out.splitlines()[1:]] == ["t"], r.out  # a list under its title


async def test_delete_confirmation(nats_server, js, stream):
    url = nats_server.url
    prompt = (
        "WARNING: this operation will cause all existing consumer members to terminate consuming are you sure? (y/n): "
    )
    (await run_cg("static", "create", "balanced", stream, "d", "2", "m1", url=url)).ok()
    answers = ("n\n", "", "yes\n", "Y\n", " n\n")
    results = await asyncio.gather(*(acg("static", "delete", stream, "d", url=url, input=a) for a in answers))
    for r in results:
        assert_cli_error(r, "operation canceled")
        assert r.out == prompt
    assert await kv_value(js, BUCKET, f"{stream}.d") is not None
    r = (await acg("static", "delete", stream, "d", url=url, input="y\n")).ok()
    assert r.out == prompt and r.err == ""
    assert await kv_value(js, BUCKET, f"{stream}.d") is None
    (await run_cg("static", "create", "balanced", stream, "d", "2", "m1", url=url)).ok()
    r = (await acg("static", "rm", stream, "d", "-f", url=url)).ok()
    assert r.out == ""
    assert await kv_value(js, BUCKET, f"{stream}.d") is None


# ---------------------------------------------------------------- consume


async def _publish(js, stream: str, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        await js.publish(f"{stream}.{i}", b"x")


async def test_consume_prints_reference_lines_and_exits_0_when_the_group_is_deleted(nats_server, js, stream):
    url = nats_server.url
    (await run_cg("static", "create", "balanced", stream, "c", "10", "m1", url=url)).ok()
    async with procs() as start:
        p = await start("static", "consume", stream, "c", "m1", url=url)
        await p.wait_text("consuming...\n")
        r = (await run_cg("static", "member-info", stream, "c", "m1", url=url)).ok()
        assert r.lines == ["member m1 is part of the consumer group membership", "member m1 is active"]
        r = (await run_cg("static", "info", stream, "c", url=url)).ok()
        assert r.lines[-1] == "currently active members: [m1]"
        await _publish(js, stream, 10)
        await p.wait_output(lambda o: o.count("acked\n") == 10, what="10 acked lines")
        first_pin = message_lines(p.out)[-1]["pin"]
        for alias in ("step-down", "stepdown", "sd"):
            r = (await run_cg("static", alias, stream, "c", "m1", url=url)).ok()
            assert r.out == ""
        await _publish(js, stream, 1, start=10)
        await p.wait_output(lambda o: o.count("acked\n") == 11, what="a message after the step-down")
        assert message_lines(p.out)[-1]["pin"] != first_pin  # unpinned, pinned again with a new id
        r = (await acg("static", "delete", "-f", stream, "c", url=url)).ok()
        res = await p.wait(timeout=15)
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    assert lines[0] == "consuming..."
    msgs = message_lines(res.out)
    assert len(msgs) == 11 and len(lines) == 12
    assert sorted(m["subject"] for m in msgs) == sorted(f"{stream}.{i}" for i in range(11))  # token stripped
    assert all(m["member"] == "m1" and m["sleep"] == "20ms" and m["end"] == "acked" and m["pin"] for m in msgs)
    assert sorted(int(m["seq"]) for m in msgs) == list(range(1, 12))
    assert "Traceback" not in res.err


@pytest.mark.parametrize("event_loop", ["asyncio", "default"])
async def test_consume_flushes_before_processing_and_sigterm_waits_for_the_handler(nats_server, js, stream, event_loop):
    """On asyncio's event loop and on the default one (uvloop's when the extra is installed)."""
    url = nats_server.url
    (await run_cg("static", "create", "balanced", stream, "s", "10", "m1", url=url)).ok()
    env = cg_env(url, CG_EVENT_LOOP=event_loop)
    async with procs() as start:
        p = await start("static", "join", stream, "s", "m1", "--sleep", "1.5s", url=url, env=env)
        await p.wait_text("consuming...\n")
        await _publish(js, stream, 1)
        t0 = time.monotonic()
        await p.wait_text("Processing for 1.5s ... ", timeout=10)
        assert "acked" not in p.out  # the partial line came before the processing
        p.signal(signal.SIGTERM)
        res = await p.wait(timeout=15)
        assert time.monotonic() - t0 >= 1.4  # the handler in flight finished first
    assert res.code == 0, res.err
    assert res.out.endswith("Processing for 1.5s ... acked\n")
    info = await js.consumer_info(stream, "s-m1")
    assert info.num_ack_pending == 0 and info.num_pending == 0


async def test_a_member_runs_plain_then_with_concurrency_then_plain_but_not_beside_other_settings(
    nats_server, js, stream
):
    """The README's walk-through: a member run plain, then with --concurrency, then plain again; each run
    updates the member's consumer and says so in one stderr line. Beside a running instance with other
    settings a new one is refused with one line naming them, and the consumer is left as it was."""
    url = nats_server.url
    (await run_cg("static", "create", "balanced", stream, "w", "10", "m1", url=url)).ok()
    sent = 0

    async def run(*extra: str) -> str:
        nonlocal sent
        async with procs() as start:
            p = await start("static", "consume", stream, "w", "m1", *extra, url=url)
            await p.wait_text("consuming...\n")
            await _publish(js, stream, 1, start=sent)
            sent += 1
            await p.wait_output(lambda o: o.count("acked\n") == 1, what="the message acked")
            p.signal(signal.SIGINT)
            res = await p.wait(timeout=15)
        assert res.code == 0 and "Traceback" not in res.err, res.err
        return res.err

    said = "member m1's consumer: max_ack_pending {} (updated: no other instance was running)"
    assert "consumer:" not in await run()
    for extra, change, now in ((["--concurrency", "4"], "1 -> 16384", 16384), ([], "16384 -> 1", 1)):
        err = await run(*extra)
        assert next(line for line in err.splitlines() if "consumer:" in line).endswith(said.format(change)), err
        assert (await js.consumer_info(stream, "w-m1")).config.max_ack_pending == now

    async with procs() as start:
        p = await start("static", "consume", stream, "w", "m1", url=url)
        await p.wait_text("consuming...\n")
        before = (await js.consumer_info(stream, "w-m1")).config
        r = await acg("static", "consume", stream, "w", "m1", "--concurrency", "4", url=url, timeout=30)
        assert_cli_error(
            r,
            "another instance of member m1 is running with other consumer settings (max_ack_pending "
            "1 there, 16384 asked): stop the other instances of m1, or start this one with the same",
        )
        assert len(r.err.splitlines()) == 1 and r.out == ""
        assert (await js.consumer_info(stream, "w-m1")).config == before
        await _publish(js, stream, 1, start=sent)
        await p.wait_output(lambda o: o.count("acked\n") == 1, what="the running instance still consuming")


async def test_consume_ends_with_status_1_when_the_config_changes(nats_server, js, stream):
    url = nats_server.url
    (await run_cg("static", "create", "balanced", stream, "x", "10", "m1", "m2", url=url)).ok()
    async with procs() as start:
        p = await start("static", "consume", stream, "x", "m1", url=url)
        await p.wait_text("consuming...\n")
        kv = await js.key_value(BUCKET)
        await kv.put(f"{stream}.x", b'{"max_members":10,"members":["m1","m3"]}')
        res = await p.wait(timeout=15)
    assert_cli_error(res, "change")
    assert res.out == "consuming...\n"


async def test_ctrl_c_before_anything_arrives_exits_0(nats_server, stream):
    url = nats_server.url
    (await run_cg("static", "create", "balanced", stream, "i", "2", "m1", url=url)).ok()
    async with procs() as start:
        p = await start("static", "consume", stream, "i", "m1", url=url)
        await p.wait_text("consuming...\n")
        p.signal(signal.SIGINT)
        res = await p.wait(timeout=10)
    assert res.code == 0 and res.out == "consuming...\n" and res.err == ""


async def test_acceptance_two_m1_instances_fail_over_after_sigkill(nats_server, js, uniq):
    """The issue's scenario on a fresh stream: static_stream_setup.sh, generate_traffic.sh,
    `cg static create balanced <s> cg 10 m1 m2`, two `consume ... m1` and one `consume ... m2`.
    One m1 instance prints messages, the other waits; SIGKILL the first and the second carries on;
    every message is processed by someone."""
    url = nats_server.url
    env = cg_env(url)
    setup = await asyncio.create_subprocess_exec(
        str(SCRIPTS / "static_stream_setup.sh"), "--stream", uniq, env=env, stdout=asyncio.subprocess.DEVNULL
    )
    assert await asyncio.wait_for(setup.wait(), 30) == 0
    (await run_cg("static", "create", "balanced", uniq, "cg", "10", "m1", "m2", url=url)).ok()
    traffic = None
    async with procs() as start:
        a = await start("static", "consume", uniq, "cg", "m1", url=url)
        await a.wait_text("consuming...\n")
        b = await start("static", "consume", uniq, "cg", "m1", url=url)
        c = await start("static", "consume", uniq, "cg", "m2", url=url)
        await b.wait_text("consuming...\n")
        await c.wait_text("consuming...\n")
        # bounded traffic: at most 3000 messages (30 s), stopped once the scenario is over
        traffic = await asyncio.create_subprocess_exec(
            str(SCRIPTS / "generate_traffic.sh"),
            "--stream",
            uniq,
            "--count",
            "3000",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await wait_for(
                lambda: len(message_lines(a.out)) + len(message_lines(b.out)) >= 20, timeout=20, what="m1 messages"
            )
            await c.wait_output(lambda o: len(message_lines(o)) >= 10, what="m2 messages")
            active, standby = (a, b) if message_lines(a.out) else (b, a)
            assert message_lines(active.out) and not message_lines(standby.out), "both m1 instances got messages"
            await wait_for(lambda: len(message_lines(active.out)) >= 30, timeout=20, what="more m1 messages")
            assert not message_lines(standby.out)
            active.kill()
            killed_at = time.monotonic()
            await standby.wait_output(lambda o: len(message_lines(o)) >= 20, timeout=20, what="the standby carrying on")
            takeover = time.monotonic() - killed_at
            c_before = len(message_lines(c.out))
            await c.wait_output(lambda o: len(message_lines(o)) > c_before + 5, what="m2 still consuming")
        finally:
            traffic.send_signal(signal.SIGINT)
            _t_out, t_err = await asyncio.wait_for(traffic.communicate(), 15)
        assert traffic.returncode == 0, t_err
        published = (await js.stream_info(uniq)).state.last_seq

        async def drained() -> bool:
            infos = [await js.consumer_info(uniq, f"cg-{m}") for m in ("m1", "m2")]
            return all(i.num_pending == 0 and i.num_ack_pending == 0 for i in infos)

        await wait_for(drained, timeout=30, what="both members' consumers drained")
        seen = {int(m["seq"]) for p in (a, b, c) for m in message_lines(p.out)}
        assert seen == set(range(1, published + 1)), f"missing {sorted(set(range(1, published + 1)) - seen)[:10]}"
        m1_members = {m["member"] for p in (a, b) for m in message_lines(p.out)}
        assert m1_members == {"m1"} and {m["member"] for m in message_lines(c.out)} == {"m2"}
        assert takeover < 15
        for p in (standby, c):
            p.signal(signal.SIGTERM)
            assert (await p.wait(timeout=15)).code == 0
