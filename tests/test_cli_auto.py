"""``cg elastic consume --auto``, ``cg elastic add/drop --sticky`` and the leases in ``cg elastic status``,
against a real server, the way a new user tries them."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time

from pcgroups.elastic._membership import list_leases
from tests.helpers.cli import assert_cli_error, kv_value, make_stream, message_lines, procs, run_cg
from tests.helpers.support import wait_for

BUCKET = "elastic-consumer-groups"


async def _config(js, stream: str, group: str) -> dict:
    return json.loads(await kv_value(js, BUCKET, f"{stream}.{group}"))


async def test_sticky_add_and_drop_write_mappings_moving_the_fewest_partitions(nats_server, js, uniq):
    url, s = nats_server.url, uniq
    await make_stream(js, s)
    (await run_cg("elastic", "create", s, "g", "4", "--filter", f"{s}.*", url=url)).ok()
    (await run_cg("elastic", "add", s, "g", "a", "b", url=url)).ok()  # balanced: a 0,1  b 2,3

    r = (await run_cg("elastic", "add", s, "g", "c", "--sticky", url=url)).ok()
    assert r.lines == [
        "added members: [a b c]",
        "member mapping: [{Member:a Partitions:[0 1]} {Member:b Partitions:[2]} {Member:c Partitions:[3]}]",
    ]
    cfg = await _config(js, s, "g")
    assert "members" not in cfg  # the membership is now the mappings: Go members read them as they are
    assert cfg["member_mappings"] == [
        {"member": "a", "partitions": [0, 1]},
        {"member": "b", "partitions": [2]},
        {"member": "c", "partitions": [3]},
    ]

    r = (await run_cg("elastic", "drop", s, "g", "a", "--sticky", url=url)).ok()
    # only a's partitions move; b and c keep theirs
    assert r.lines == [
        "dropped members: [b c]",
        "member mapping: [{Member:b Partitions:[0 2]} {Member:c Partitions:[1 3]}]",
    ]

    # a plain add on a mapped group says what to use instead, and changes nothing
    before = await kv_value(js, BUCKET, f"{s}.g")
    assert_cli_error(await run_cg("elastic", "add", s, "g", "x", url=url), "--sticky")
    # more members than partitions can't all own one: refused, nothing written
    assert_cli_error(await run_cg("elastic", "add", s, "g", "x", "y", "z", "--sticky", url=url), "at most 4 members")
    assert await kv_value(js, BUCKET, f"{s}.g") == before


async def test_consume_needs_a_member_unless_auto_and_a_sane_lease_ttl(nats_server, js, uniq):
    url, s = nats_server.url, uniq
    await make_stream(js, s)
    (await run_cg("elastic", "create", s, "g", "2", "--filter", f"{s}.*", url=url)).ok()
    assert_cli_error(await run_cg("elastic", "consume", s, "g", url=url), "--auto")
    assert_cli_error(
        await run_cg("elastic", "consume", s, "g", "--auto", "--lease-ttl", "500ms", url=url), "at least 1s"
    )
    assert_cli_error(
        await run_cg("elastic", "consume", s, "g", "--auto", "--lease-ttl", "soon", url=url), "--lease-ttl"
    )
    assert_cli_error(
        await run_cg("elastic", "consume", s, "nope", "--auto", url=url),
        f"elastic consumer group nope on stream {s} not found",
    )


async def test_three_auto_instances_spread_the_partitions_and_a_killed_one_moves_within_the_lease_ttl(
    nats_server, js, uniq
):
    """The new user's first try, through cg: `cg elastic consume foo cg --auto` three times."""
    url, s, ttl = nats_server.url, uniq, 2.0
    await make_stream(js, s)
    (await run_cg("elastic", "create", s, "cg", "6", "--filter", f"{s}.*", url=url)).ok()
    async with procs() as start:
        ps = [
            await start("elastic", "consume", s, "cg", "--auto", "--lease-ttl", "2s", "--sleep", "1ms", url=url)
            for _ in range(3)
        ]
        for p in ps:
            await p.wait_text("consuming...\n", timeout=20)
        assert all(p.out == "consuming...\n" for p in ps)  # a pipe: stdout keeps the reference's lines
        owners: dict[str, list[int]] = {}

        async def spread() -> bool:
            cfg = await _config(js, s, "cg")
            owners.clear()
            owners.update({m["member"]: sorted(m["partitions"]) for m in cfg.get("member_mappings", [])})
            return len(owners) == 3 and all(len(v) == 2 for v in owners.values())

        await wait_for(spread, timeout=20, what="two partitions for each of the three instances")
        assert all(n.startswith("auto-") for n in owners)

        r = (await run_cg("elastic", "status", s, "cg", "--json", url=url)).ok()
        leases = json.loads(r.out)["leases"]
        assert sorted(x["member"] for x in leases) == sorted(owners)
        assert all(0 < x["expires_in"] <= ttl and x["ttl"] == ttl for x in leases)
        plain = (await run_cg("elastic", "status", s, "cg", url=url)).ok().out
        assert "leases (automatic membership):" in plain and all(n in plain for n in owners)

        for i in range(60):
            await js.publish(f"{s}.{i}", b"x")
        await wait_for(lambda: sum(p.out.count("acked\n") for p in ps) >= 60, timeout=20, what="60 acked")
        names = [message_lines(p.out)[0]["member"] for p in ps]  # each instance's member, by its messages
        assert sorted(names) == sorted(owners)

        victim, survivors = ps[0], ps[1:]
        victim.signal(signal.SIGKILL)
        killed_at = time.monotonic()
        await victim.wait(timeout=10)

        async def dropped() -> bool:
            cfg = await _config(js, s, "cg")
            owners = {m["member"]: m["partitions"] for m in cfg.get("member_mappings", [])}
            return names[0] not in owners and sorted(p for v in owners.values() for p in v) == list(range(6))

        await wait_for(dropped, timeout=ttl + 10, what="the killed member dropped, its partitions re-owned")
        moved_after = time.monotonic() - killed_at
        for i in range(60, 120):
            await js.publish(f"{s}.{i}", b"x")
        await wait_for(lambda: sum(p.out.count("acked\n") for p in ps) >= 120, timeout=20, what="120 acked")
        flowing_after = time.monotonic() - killed_at
        # the lease TTL, the expiry marker's lag, the debounce: well inside TTL + 3 s on a busy machine
        assert moved_after <= ttl + 3, moved_after

        (await run_cg("elastic", "delete", s, "cg", "-f", url=url)).ok()
        results = [await p.wait(timeout=20) for p in survivors]
    assert all(r.code == 0 for r in results), [r.err for r in results]
    acked = {int(m["seq"]) for p in ps for m in message_lines(p.out) if m["end"] == "acked"}
    assert acked == set(range(1, 121)), sorted(set(range(1, 121)) - acked)
    print(f"kill -> mappings changed {moved_after:.2f}s, all 120 acked {flowing_after:.2f}s after the kill")


async def test_auto_refuses_a_group_managed_by_hand_and_writes_nothing(nats_server, nc, js, uniq):
    """A hand-managed group (members added, or mappings) is not taken over by --auto: one error line
    naming the members and what to do; the config stays as it was and no lease is left."""
    url, s = nats_server.url, uniq
    await make_stream(js, s)
    (await run_cg("elastic", "create", s, "g", "6", "--filter", f"{s}.*", url=url)).ok()
    (await run_cg("elastic", "add", s, "g", "m1", "m2", "m3", url=url)).ok()
    before = await kv_value(js, BUCKET, f"{s}.g")
    for extra in ([], ["m4"], ["--create", "6", "--filter", f"{s}.*"]):
        r = await run_cg("elastic", "consume", s, "g", "--auto", *extra, url=url)
        assert_cli_error(r, "managed by hand")
        assert len(r.err.splitlines()) == 1, r.err
        assert f"elastic consumer group g on stream {s}" in r.err and "members m1 m2 m3" in r.err, r.err
        assert f"cg elastic drop {s} g m1 m2 m3" in r.err, r.err
    assert await kv_value(js, BUCKET, f"{s}.g") == before
    assert await list_leases(nc, s, "g") == []

    (await run_cg("elastic", "drop", s, "g", "m1", "m2", "m3", url=url)).ok()
    (await run_cg("elastic", "create-mapping", s, "g", "m1:0,1,2", "m2:3,4,5", url=url)).ok()
    before = await kv_value(js, BUCKET, f"{s}.g")
    r = await run_cg("elastic", "consume", s, "g", "--auto", url=url)
    assert_cli_error(r, "managed by hand")
    assert "members m1 m2" in r.err and f"cg elastic delete-mapping {s} g" in r.err, r.err
    assert await kv_value(js, BUCKET, f"{s}.g") == before

    # once the hand-made membership is gone, --auto takes the group
    (await run_cg("elastic", "delete-mapping", s, "g", url=url)).ok()
    async with procs() as start:
        p = await start("elastic", "consume", s, "g", "--auto", url=url)
        await p.wait_text("consuming...\n", timeout=20)
        await wait_for(lambda: list_leases(nc, s, "g"), timeout=10, what="the instance's lease")
        p.signal(signal.SIGINT)
        r = await p.wait(timeout=15)
    assert r.code == 0 and r.out == "consuming...\n", r
    # the joined line is a status line (stderr in a pipe); its own leave is not "dropped"
    joined = re.search(r"^\[(auto-[0-9a-f]{8})\] joined the group \(automatic membership, lease TTL 5s\)$", r.err, re.M)
    assert joined, r.err
    assert "dropped" not in r.err and "keeps running" not in r.err, r.err


async def test_a_named_auto_member_whose_leases_expired_joins_again(nats_server, nc, js, uniq):
    """The config automatic membership wrote is its own even when every lease expired (the instances
    were killed): a restarted instance of the same named member joins, nothing to refuse."""
    url, s = nats_server.url, uniq
    await make_stream(js, s)
    (await run_cg("elastic", "create", s, "g", "2", "--filter", f"{s}.*", url=url)).ok()

    async def owned() -> bool:
        return (await _config(js, s, "g")).get("member_mappings") == [{"member": "w1", "partitions": [0, 1]}]

    async def no_leases() -> bool:
        return await list_leases(nc, s, "g") == []

    async with procs() as start:
        p = await start("elastic", "consume", s, "g", "w1", "--auto", "--lease-ttl", "1s", url=url)
        await wait_for(owned, timeout=20, what="w1 owning both partitions")
        p.kill()
        await p.wait(timeout=10)
        await wait_for(no_leases, timeout=10, what="w1's lease expired")
        assert await owned()  # nobody left to rewrite it: w1 is still mapped, without a lease
        again = await start("elastic", "consume", s, "g", "w1", "--auto", "--lease-ttl", "1s", url=url)
        await again.wait_text("consuming...\n", timeout=20)
        await wait_for(lambda: list_leases(nc, s, "g"), timeout=10, what="the new lease")
        again.signal(signal.SIGINT)
        r = await again.wait(timeout=15)
    assert r.code == 0 and "cg: error" not in r.err, r.err


async def test_ctrl_c_on_an_auto_instance_with_the_server_down_ends_at_once(fresh_server, uniq):
    """The server is gone: Ctrl-C ends the instance within about a second (the lease expires by itself),
    and what the library says reads as cg's notes, not Go log lines."""
    url, s = fresh_server.url, uniq
    import nats

    nc = await nats.connect(url)
    try:
        await make_stream(nc.jetstream(), s)
        (await run_cg("elastic", "create", s, "g", "2", "--filter", f"{s}.*", url=url)).ok()
        async with procs() as start:
            p = await start("elastic", "consume", s, "g", "--auto", url=url)
            await p.wait_text("consuming...\n", timeout=20)

            async def mapped() -> bool:
                return bool((await _config(nc.jetstream(), s, "g")).get("member_mappings"))

            await wait_for(mapped, timeout=10, what="the instance's member in the group")
            await nc.close()
            fresh_server.stop()
            await asyncio.sleep(1.5)  # the instance's requests are under way and can only time out
            p.signal(signal.SIGINT)
            stopped = time.monotonic()
            r = await p.wait(timeout=15)
            took = time.monotonic() - stopped
    finally:
        await nc.close()
    print(f"Ctrl-C with the server down: exit after {took:.2f}s\n{r.err}")
    assert r.code == 0, r.err
    assert took < 5.0, (took, r.err.splitlines())  # it took 10.4 s, a request timeout and more, before
    # status lines and cg's notes only: no Go log lines, no "dropped" for its own leave
    assert all(line.startswith(("[", "cg: warning: ")) for line in r.err.splitlines()), r.err
    assert "dropped" not in r.err, r.err
