"""``cg elastic consume --auto``, ``cg elastic add/drop --sticky`` and the leases in ``cg elastic status``,
against a real server, the way a new user tries them."""

from __future__ import annotations

import json
import signal
import time

from tests.support import wait_for
from tests.test_cli_common import assert_cli_error, kv_value, make_stream, message_lines, procs, run_cg

BUCKET = "elastic-consumer-groups"


async def _config(js, stream: str, group: str) -> dict:
    return json.loads(await kv_value(js, BUCKET, f"{stream}.{group}"))


async def test_sticky_add_and_drop_write_mappings_moving_the_fewest_partitions(nats_server, js, uniq):
    url, s = nats_server.url, uniq
    await make_stream(js, s)
    (await run_cg("elastic", "create", s, "g", "4", "--filter", f"{s}.*", url=url)).ok()
    (await run_cg("elastic", "add", s, "g", "a", "b", url=url)).ok()  # balanced: a 0,1  b 2,3

    r = (await run_cg("elastic", "add", s, "g", "c", "--sticky", url=url)).ok()
    assert r.lines == ["added members: [a b c]",
                       "member mapping: [{Member:a Partitions:[0 1]} {Member:b Partitions:[2]} "
                       "{Member:c Partitions:[3]}]"]
    cfg = await _config(js, s, "g")
    assert "members" not in cfg  # the membership is now the mappings: Go members read them as they are
    assert cfg["member_mappings"] == [{"member": "a", "partitions": [0, 1]}, {"member": "b", "partitions": [2]},
                                      {"member": "c", "partitions": [3]}]

    r = (await run_cg("elastic", "drop", s, "g", "a", "--sticky", url=url)).ok()
    # only a's partitions move; b and c keep theirs
    assert r.lines == ["dropped members: [b c]",
                       "member mapping: [{Member:b Partitions:[0 2]} {Member:c Partitions:[1 3]}]"]

    # a plain add on a mapped group says what to use instead, and changes nothing
    before = await kv_value(js, BUCKET, f"{s}.g")
    assert_cli_error(await run_cg("elastic", "add", s, "g", "x", url=url), "--sticky")
    # more members than partitions can't all own one: refused, nothing written
    assert_cli_error(await run_cg("elastic", "add", s, "g", "x", "y", "z", "--sticky", url=url),
                     "at most 4 members")
    assert await kv_value(js, BUCKET, f"{s}.g") == before


async def test_consume_needs_a_member_unless_auto_and_a_sane_lease_ttl(nats_server, js, uniq):
    url, s = nats_server.url, uniq
    await make_stream(js, s)
    (await run_cg("elastic", "create", s, "g", "2", "--filter", f"{s}.*", url=url)).ok()
    assert_cli_error(await run_cg("elastic", "consume", s, "g", url=url), "--auto")
    assert_cli_error(await run_cg("elastic", "consume", s, "g", "--auto", "--lease-ttl", "500ms", url=url),
                     "at least 1s")
    assert_cli_error(await run_cg("elastic", "consume", s, "g", "--auto", "--lease-ttl", "soon", url=url),
                     "--lease-ttl")
    assert_cli_error(await run_cg("elastic", "consume", s, "nope", "--auto", url=url),
                     f"elastic consumer group nope on stream {s} not found")


async def test_three_auto_instances_spread_the_partitions_and_a_killed_one_moves_within_the_lease_ttl(
        nats_server, js, uniq):
    """The new user's first try, through cg: `cg elastic consume foo cg --auto` three times."""
    url, s, ttl = nats_server.url, uniq, 2.0
    await make_stream(js, s)
    (await run_cg("elastic", "create", s, "cg", "6", "--filter", f"{s}.*", url=url)).ok()
    async with procs() as start:
        ps = [await start("elastic", "consume", s, "cg", "--auto", "--lease-ttl", "2s", "--sleep", "1ms", url=url)
              for _ in range(3)]
        for p in ps:
            await p.wait_text("consuming...\n", timeout=20)
        names = [p.out.split("joined as member ", 1)[1].split(" ", 1)[0] for p in ps]
        assert len(set(names)) == 3 and all(n.startswith("auto-") for n in names)

        async def spread() -> bool:
            cfg = await _config(js, s, "cg")
            owners = {m["member"]: sorted(m["partitions"]) for m in cfg.get("member_mappings", [])}
            return sorted(owners) == sorted(names) and all(len(v) == 2 for v in owners.values())

        await wait_for(spread, timeout=20, what="two partitions for each of the three instances")

        r = (await run_cg("elastic", "status", s, "cg", "--json", url=url)).ok()
        leases = json.loads(r.out)["leases"]
        assert sorted(x["member"] for x in leases) == sorted(names)
        assert all(0 < x["expires_in"] <= ttl and x["ttl"] == ttl for x in leases)
        plain = (await run_cg("elastic", "status", s, "cg", url=url)).ok().out
        assert "leases (automatic membership):" in plain and all(n in plain for n in names)

        for i in range(60):
            await js.publish(f"{s}.{i}", b"x")
        await wait_for(lambda: sum(p.out.count("acked\n") for p in ps) >= 60, timeout=20, what="60 acked")

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
