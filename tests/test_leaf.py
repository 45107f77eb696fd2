"""Groups across a leaf node connection: a hub (JetStream domain ``hub``) and a leaf (domain ``leaf``) on
loopback, configured as docs/DEPLOYMENT.md says (tests/helpers/leafnodes.py reads it from there).

The streams live on one side and ``cg`` runs on the other with ``--js-domain`` (or a context's domain or
API prefix), members on both sides of one group; an elastic group on the hub sources a stream of the leaf.
Every message is checked handled once; the configs and consumers are checked where they live. The
server-free tests at the end cover the pieces: API prefixes, permission subjects, option precedence,
external sources.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import nats
import pytest

from pcgroups import JetStreamApi, create_static, delete_static, get_static_config, list_static_groups
from pcgroups.config import PartitioningFilter
from pcgroups.connect import ConnectionOptions, connect, resolve
from pcgroups.elastic._sources import Layout, SourceStream, externals_by_stream, layout_of, source_config
from pcgroups.errors import ConfigError, PCGroupsError
from pcgroups.jetstream._api import domain_of, prefix_of
from pcgroups.jetstream._permissions import Violation, kv_subjects
from tests.helpers.cli import (
    assert_cli_error,
    cg_env,
    closed_port_url,
    kv_value,
    make_stream,
    message_lines,
    partition_transform,
    procs,
    run_cg,
)
from tests.helpers.leafnodes import HubAndLeaf
from tests.helpers.support import wait_for

STATIC, ELASTIC = "static-consumer-groups", "elastic-consumer-groups"
FAST = 5.0  # a refused request fails at once; the timeout below is far longer
BIG = 512 * 1024  # bytes: 8 such messages need the flow control of a source (about 2.5 MB pass without it)
# a hub user who may read the leaf's groups but not change them (the permission test's own)
READER = """
    { user: reader, password: $READER_PASSWORD, permissions: {
        publish: { allow: ["$JS.leaf.API.STREAM.INFO.>", "$JS.leaf.API.DIRECT.GET.>", "$JS.leaf.API.CONSUMER.LIST.>"] }
        subscribe: { allow: ["_INBOX.>"] } } }
"""


@pytest.fixture(scope="module")
def pair():
    with HubAndLeaf(extra_users=READER, extra_names=("reader",)) as hl:
        yield hl


@pytest.fixture
async def ljs(pair):
    """JetStream on the leaf, as its own clients see it."""
    nc = await nats.connect(pair.leaf_url)
    yield nc.jetstream()
    await nc.close()


@pytest.fixture
async def hjs(pair):
    """JetStream on the hub, as its own clients see it."""
    nc = await nats.connect(pair.hub_url)
    yield nc.jetstream()
    await nc.close()


async def consuming(start, *runs: tuple[tuple[str, ...], str]) -> list:
    """Start ``cg`` consume processes (``(args, url)`` each), one after the other ready (``consuming...``)."""
    ps = []
    for args, url in runs:
        ps.append(await start(*args, url=url))
        await ps[-1].wait_text("consuming...\n", timeout=20)
    return ps


def on_leaf(*args: str) -> tuple[str, ...]:
    """``cg`` arguments that work on the leaf's JetStream from the hub."""
    return ("--js-domain", "leaf", *args)


async def elastic_on_leaf(pair, ljs, s: str) -> None:
    """Stream ``s`` on the leaf, and elastic group ``g`` of 4 partitions on it created from the hub."""
    await make_stream(ljs, s)
    (await run_cg(*on_leaf("elastic", "create", s, "g", "4", "--filter", f"{s}.*"), url=pair.hub_url)).ok()


async def handled(ps, n: int, timeout: float = 30) -> list:
    """Wait until the processes ``ps`` acked ``n`` messages in all; their message lines."""
    await wait_for(lambda: sum(p.out.count("acked\n") for p in ps) >= n, timeout=timeout, what=f"{n} acked")
    return [m for p in ps for m in message_lines(p.out)]


def once_each(lines, subjects: list[str]) -> None:
    """Every subject handled exactly once (the elastic work queue numbers its own sequences)."""
    got = sorted(m["subject"] for m in lines if m["end"] == "acked")
    assert got == sorted(subjects), got


async def publish(js, stream: str, first: int, count: int, size: int = 1) -> list[str]:
    subjects = [f"{stream}.{i}" for i in range(first, first + count)]
    for s in subjects:
        await js.publish(s, b"x" * size)
    return subjects


async def test_a_static_group_on_the_leaf_is_run_from_the_hub_with_members_on_both_sides(pair, ljs, uniq):
    """The issue's failing path: create and delete from the hub wrote the config to a bare $KV subject."""
    hub, leaf, s = pair.hub_url, pair.leaf_url, uniq
    await make_stream(ljs, s, transform=partition_transform(s, 4))
    (await run_cg(*on_leaf("static", "create", "balanced", s, "g", "4", "m1", "m2"), url=hub)).ok()
    assert json.loads(await kv_value(ljs, STATIC, f"{s}.g"))["members"] == ["m1", "m2"]  # on the leaf
    assert (await run_cg(*on_leaf("static", "ls", s), url=hub)).ok().lines == ["static consumer groups: [g]"]
    async with procs() as start:
        # m1 runs twice, on the hub and on the leaf (one pinned, one standby); m2 on the leaf
        ps = await consuming(
            start,
            (on_leaf("static", "consume", s, "g", "m1", "--sleep", "1ms"), hub),
            (("static", "consume", s, "g", "m1", "--sleep", "1ms"), leaf),
            (("static", "consume", s, "g", "m2", "--sleep", "1ms"), leaf),
        )
        m1, m1_leaf, m2 = ps
        subjects = await publish(ljs, s, 0, 40)
        once_each(await handled(ps, 40), subjects)
        assert message_lines(m2.out)
        assert bool(message_lines(m1.out)) != bool(message_lines(m1_leaf.out))  # one m1 instance consumed
        standby = m1_leaf if message_lines(m1.out) else m1

        status = json.loads((await run_cg(*on_leaf("static", "status", s, "g", "--json"), url=hub)).ok().out)
        pin = {m["member"]: m["pinned_id"] for m in status["members"]}
        assert pin["m1"] and pin["m2"]
        (await run_cg(*on_leaf("static", "step-down", s, "g", "m1"), url=hub)).ok()
        subjects += await publish(ljs, s, 40, 40)
        once_each(await handled(ps, 80), subjects)
        assert message_lines(standby.out), "the other m1 instance took over after the step-down"
        status = json.loads((await run_cg(*on_leaf("static", "status", s, "g", "--json"), url=hub)).ok().out)
        assert {m["member"]: m["pinned_id"] for m in status["members"]}["m1"] not in (None, pin["m1"])
        plan = (await run_cg(*on_leaf("static", "reset", s, "g", "--to-earliest"), url=hub)).ok()
        assert any(line.startswith("m1: ") for line in plan.lines), plan.out
        (await run_cg(*on_leaf("static", "delete", s, "g", "-f"), url=hub)).ok()
        for p in ps:
            assert (await p.wait(timeout=20)).code == 0  # the group was deleted: they end normally
    assert await kv_value(ljs, STATIC, f"{s}.g") is None
    assert (await ljs.consumers_info(s)) == []


async def test_an_elastic_group_on_the_leaf_is_changed_from_the_hub_while_both_sides_consume(pair, ljs, uniq):
    hub, leaf, s = pair.hub_url, pair.leaf_url, uniq
    await elastic_on_leaf(pair, ljs, s)
    (await run_cg(*on_leaf("elastic", "add", s, "g", "m1", "m2"), url=hub)).ok()
    async with procs() as start:
        m1, m2 = await consuming(
            start,
            (on_leaf("elastic", "consume", s, "g", "m1", "--sleep", "1ms"), hub),
            (("elastic", "consume", s, "g", "m2", "--sleep", "1ms"), leaf),
        )
        subjects = await publish(ljs, s, 0, 20)
        once_each(await handled([m1, m2], 20), subjects)
        assert message_lines(m1.out) and message_lines(m2.out)

        r = (await run_cg(*on_leaf("elastic", "drop", s, "g", "m2"), url=hub)).ok()
        assert r.lines[0] == "dropped members: [m1]"
        subjects += await publish(ljs, s, 20, 20)
        once_each(await handled([m1, m2], 40), subjects)
        late = {m["member"] for p in (m1, m2) for m in message_lines(p.out) if int(m["subject"].split(".")[1]) >= 20}
        assert late == {"m1"}
        (await run_cg(*on_leaf("elastic", "delete", s, "g", "-f"), url=hub)).ok()
        for p in (m1, m2):
            assert (await p.wait(timeout=20)).code == 0
    assert await kv_value(ljs, ELASTIC, f"{s}.g") is None


async def test_auto_instances_on_both_sides_share_the_partitions_and_take_over(pair, ljs, uniq):
    """--auto from the hub writes its lease and the membership through the leaf's domain."""
    hub, leaf, s = pair.hub_url, pair.leaf_url, uniq
    await elastic_on_leaf(pair, ljs, s)
    auto = ("elastic", "consume", s, "g", "--auto", "--lease-ttl", "2s", "--sleep", "1ms")
    async with procs() as start:
        # the hub's first: it creates the lease bucket on the leaf
        a, b = await consuming(start, (on_leaf(*auto), hub), (auto, leaf))

        async def owners() -> dict[str, list[int]]:
            cfg = json.loads(await kv_value(ljs, ELASTIC, f"{s}.g") or b"{}")
            return {m["member"]: m["partitions"] for m in cfg.get("member_mappings") or []}

        async def spread() -> bool:
            now = await owners()
            return len(now) == 2 and all(len(v) == 2 for v in now.values())

        await wait_for(spread, timeout=20, what="two partitions for each instance")
        subjects = await publish(ljs, s, 0, 20)
        once_each(await handled([a, b], 20), subjects)
        status = json.loads((await run_cg("elastic", "status", s, "g", "--json", url=leaf)).ok().out)
        assert a.proc is not None
        hub_member = next(x["member"] for x in status["leases"] if x["pid"] == a.proc.pid)

        a.signal(signal.SIGKILL)
        await a.wait(timeout=10)

        async def taken_over() -> bool:
            now = await owners()
            return hub_member not in now and sorted(p for v in now.values() for p in v) == [0, 1, 2, 3]

        await wait_for(taken_over, timeout=15, what="the killed hub instance's partitions re-owned on the leaf")
        subjects += await publish(ljs, s, 20, 20)
        once_each(await handled([a, b], 40), subjects)


def _context(tmp_path: Path, name: str, **fields: str) -> dict:
    ctx_dir = tmp_path / "nats" / "context"
    ctx_dir.mkdir(parents=True, exist_ok=True)
    (ctx_dir / f"{name}.json").write_text(json.dumps(fields))
    return cg_env(None, XDG_CONFIG_HOME=str(tmp_path), NATS_CONTEXT=name)


async def test_a_group_on_the_hub_is_run_from_the_leaf_through_a_context(pair, hjs, uniq, tmp_path):
    """The other direction, and a context's domain or API prefix honoured by every command (not only tools)."""
    s = uniq
    await make_stream(hjs, s, transform=partition_transform(s, 2))
    env = _context(tmp_path, "edge", url=pair.leaf_url, jetstream_domain="hub")
    async with procs() as start:
        r = await start("static", "create", "balanced", s, "g", "2", "m1", env=env)
        assert (await r.wait()).code == 0, r
        m1 = await start("static", "consume", s, "g", "m1", "--sleep", "1ms", env=env)
        await m1.wait_text("consuming...\n", timeout=20)
        subjects = await publish(hjs, s, 0, 10)
        once_each(await handled([m1], 10), subjects)
        by_prefix = _context(tmp_path, "edge-prefix", url=pair.leaf_url, jetstream_api_prefix="$JS.hub.API")
        ls = await start("static", "ls", s, env=by_prefix)
        assert (await ls.wait()).out == "static consumer groups: [g]\n"
        d = await start("static", "delete", s, "g", "-f", env=env)
        assert (await d.wait()).code == 0
        assert (await m1.wait(timeout=20)).code == 0
    assert await kv_value(hjs, STATIC, f"{s}.g") is None


async def test_an_elastic_group_on_the_hub_sources_a_stream_of_the_leaf(pair, ljs, hjs, uniq):
    hub, leaf, s = pair.hub_url, pair.leaf_url, uniq
    await make_stream(ljs, s)
    # a backlog, sourced too: 4 MB, so that the source's flow control crosses the connection
    subjects = await publish(ljs, s, 0, 8, size=BIG)
    # a domain nobody answers for: one clear line, nothing created
    r = await run_cg("elastic", "create", s, "g", "4", "--filter", f"{s}.*", "--source-domain", "nowhere", url=hub)
    assert_cli_error(r, f"origin stream {s} (in domain nowhere)")
    (await run_cg("elastic", "create", s, "g", "4", "--filter", f"{s}.*", "--source-domain", "leaf", url=hub)).ok()
    wq = (await hjs.stream_info(f"{s}-g")).config  # the work queue is on the hub
    assert wq.sources[0].external.api == "$JS.leaf.API"
    info = (await run_cg("elastic", "info", s, "g", url=hub)).ok()
    assert info.lines[-1] == f"streams (stream): {s} in domain leaf ({s}.* by 1)"
    (await run_cg("elastic", "add", s, "g", "m1", url=hub)).ok()
    async with procs() as start:
        (m1,) = await consuming(start, (("elastic", "consume", s, "g", "m1", "--sleep", "1ms"), hub))
        subjects += await publish(ljs, s, 8, 10)
        once_each(await handled([m1], 18), subjects)
        # a replay sources the leaf's stream again from its start: its positions are asked of the leaf
        r = (await run_cg("elastic", "reset", s, "g", "--to-earliest", "--execute", url=hub)).ok()
        assert "done" in r.err
        once_each(await handled([m1], 36), subjects * 2)
    (await run_cg("elastic", "delete", s, "g", "-f", url=hub)).ok()

    # a source "in another domain" that is the group's own (hub): sourced as a plain one, else it never starts
    await make_stream(hjs, f"{s}o")
    (
        await run_cg("elastic", "create", f"{s}o", "g", "2", "--filter", f"{s}o.*", "--source-domain", "hub", url=hub)
    ).ok()
    assert (await hjs.stream_info(f"{s}o-g")).config.sources[0].external is None

    # and the other way: a work queue on the leaf sourcing a stream of the hub
    await make_stream(hjs, f"{s}h")
    (
        await run_cg("elastic", "create", f"{s}h", "g", "2", "--filter", f"{s}h.*", "--source-domain", "hub", url=leaf)
    ).ok()
    await publish(hjs, f"{s}h", 0, 8, size=BIG)
    await wait_for(lambda: _last_seq(ljs, f"{s}h-g", 8), timeout=15, what="8 sourced on the leaf")


async def _last_seq(js, stream: str, n: int) -> bool:
    return (await js.stream_info(stream)).state.last_seq == n


async def test_the_library_uses_the_domain_bound_to_its_connection(pair, ljs, uniq):
    s = uniq
    await make_stream(ljs, s, transform=partition_transform(s, 2))
    nc = await connect(ConnectionOptions(server=pair.hub_url, js_domain="leaf", no_context=True))
    plain = await nats.connect(pair.hub_url)
    try:
        await create_static(nc, s, "g", 2, members=["m1"])  # no api=: the connection's domain
        assert json.loads(await kv_value(ljs, STATIC, f"{s}.g"))["members"] == ["m1"]
        assert JetStreamApi(plain).prefix == "$JS.API"
        with pytest.raises(PCGroupsError):
            await get_static_config(plain, s, "g")  # the hub's own JetStream has no such group
        assert JetStreamApi.bind(plain, domain="leaf").domain == "leaf"
        assert await list_static_groups(plain, s) == ["g"]
        assert JetStreamApi(plain, domain="hub").prefix == "$JS.hub.API"  # a call's own api= still wins
        await delete_static(plain, s, "g")
        assert await kv_value(ljs, STATIC, f"{s}.g") is None
    finally:
        for c in (nc, plain):
            await c.close()


async def test_refused_requests_name_their_subjects_under_the_domain(pair, ljs, uniq):
    hub, s = pair.hub_url, uniq
    await make_stream(ljs, s, transform=partition_transform(s, 2))
    (await run_cg(*on_leaf("static", "create", "balanced", s, "g", "2", "m1"), url=hub)).ok()
    reader = pair.user_url("reader")
    info = (await run_cg(*on_leaf("--timeout", "20s", "static", "info", s, "g"), url=reader)).ok()
    assert "members: [m1]" in info.lines  # it may read the leaf's groups
    started = time.monotonic()
    r = await run_cg(*on_leaf("--timeout", "20s", "static", "create", "balanced", s, "g2", "2", "m1"), url=reader)
    assert_cli_error(r, f"publish to $JS.leaf.API.$KV.{STATIC}.{s}.g2 is not allowed for this user")
    assert time.monotonic() - started < FAST
    (await run_cg(*on_leaf("static", "delete", s, "g", "-f"), url=hub)).ok()


# ---------------------------------------------------------------- server-free


def test_api_prefixes_of_domains_and_prefixes():
    assert prefix_of() == "$JS.API"
    assert prefix_of("leaf") == "$JS.leaf.API" and domain_of("$JS.leaf.API") == "leaf"
    assert prefix_of(None, "JS.acme.API.") == "JS.acme.API" and domain_of("JS.acme.API") is None
    for bad in ("a.b", "a b", "x*", ">"):
        with pytest.raises(ConfigError, match="invalid JetStream domain"):
            prefix_of(bad)
    for bad in ("JS..API", "JS.*.API", "JS.a b"):
        with pytest.raises(ConfigError, match="invalid JetStream API prefix"):
            prefix_of(None, bad)
    with pytest.raises(ConfigError, match="not both"):
        prefix_of("leaf", "JS.x.API")


def test_kv_permission_subjects_carry_the_domain():
    plain = kv_subjects("b", "k")
    assert plain[0] == "$KV.b.k" and "$JS.API.DIRECT.GET.KV_b.$KV.b.k" in plain
    leaf = kv_subjects("b", "k", "$JS.leaf.API")
    assert leaf[:2] == ["$JS.leaf.API.$KV.b.k", "$KV.b.k"]
    assert "$JS.leaf.API.DIRECT.GET.KV_b.$KV.b.k" in leaf and not any(x.startswith("$JS.API.") for x in leaf)
    # a refused subject nobody guarded is shown with its prefix in capitals (nats-py lower-cases it)
    v = Violation.parse('nats: permissions violation for publish to "$js.leaf.api.$kv.b.k"')
    assert v is not None and v.error().subject == "$JS.leaf.API.$KV.b.k"


def test_the_options_domain_beats_the_contexts_and_a_context_domain_beats_its_prefix(tmp_path):
    def ctx(**fields: str) -> dict[str, str]:
        d = tmp_path / "nats" / "context"
        d.mkdir(parents=True, exist_ok=True)
        (d / "c.json").write_text(json.dumps(fields))
        return {"XDG_CONFIG_HOME": str(tmp_path), "NATS_CONTEXT": "c", "HOME": str(tmp_path)}

    env = ctx(jetstream_domain="hub", jetstream_api_prefix="JS.x.API")
    assert resolve(env=env).api_prefix == "$JS.hub.API"
    assert resolve(ConnectionOptions(js_api_prefix="JS.y.API"), env=env).api_prefix == "JS.y.API"
    assert resolve(ConnectionOptions(js_domain="leaf"), env=env).api_prefix == "$JS.leaf.API"
    assert resolve(env=ctx(jetstream_api_prefix="JS.x.API")).jetstream_kwargs() == {"prefix": "JS.x.API"}
    with pytest.raises(PCGroupsError, match="--js-domain and --js-api-prefix exclude each other"):
        resolve(ConnectionOptions(js_domain="a", js_api_prefix="JS.b.API"), env=env)
    with pytest.raises(ConfigError, match=r"invalid JetStream domain 'a\.b'"):
        resolve(ConnectionOptions(js_domain="a.b", no_context=True), env={})


def test_an_external_source_round_trips_through_the_work_queue_config():
    pf = PartitioningFilter("orders.*", [1])
    src = SourceStream("ORDERS", (pf,), external_api="$JS.leaf.API")
    cfg = source_config(src, 4)
    assert list(cfg) == ["name", "subject_transforms", "external"]
    assert cfg["external"] == {"api": "$JS.leaf.API", "deliver": ""}
    layout = layout_of({"sources": [cfg]}, [pf])
    assert layout.streams == (src,) and layout.external and layout.streams[0].domain == "leaf"
    assert src.describe() == "ORDERS in domain leaf (orders.* by 1)"
    assert Layout((SourceStream("A"),)).shape() != Layout((SourceStream("A", external_api="$JS.x.API"),)).shape()
    assert externals_by_stream("leaf", None, ["A", "B"]) == {"A": "$JS.leaf.API", "B": "$JS.leaf.API"}
    assert externals_by_stream({"B": "leaf"}, {"A": "JS.x.API"}, ["A", "B"]) == {"A": "JS.x.API", "B": "$JS.leaf.API"}
    assert externals_by_stream(None, None, ["A"]) == {}
    with pytest.raises(ConfigError, match="source domain given for C"):
        externals_by_stream({"C": "leaf"}, None, ["A"])


async def test_wrong_domains_and_prefixes_are_one_line_errors_before_connecting():
    url = closed_port_url()  # nothing listens: each error comes before a connection is tried
    for args, fragment in [
        (("--js-domain", "a.b", "static", "ls", "S"), "invalid JetStream domain 'a.b'"),
        (
            ("--js-domain", "a", "--js-api-prefix", "JS.b.API", "static", "ls", "S"),
            "--js-domain and --js-api-prefix exclude each other",
        ),
        (("--js-api-prefix", "JS.*.API", "static", "ls", "S"), "invalid JetStream API prefix 'JS.*.API'"),
        (("elastic", "create", "S", "g", "2", "--source-domain", "le af"), "--source-domain le af: invalid JetStream"),
        (("elastic", "create", "S", "g", "2", "--source-domain", "T=leaf"), "T is not one of the group's streams (S)"),
        (
            ("elastic", "create", "S", "g", "2", "--source-domain", "leaf", "--source-api", "JS.x.API"),
            "--source-domain and --source-api both say where stream S is",
        ),
        (("elastic", "consume", "S", "g", "--auto", "--source-domain", "leaf"), "give them with --create"),
        (("elastic", "add-source", "S", "g", "T", "--source-api", "JS..API"), "invalid JetStream API prefix"),
    ]:
        assert_cli_error(await run_cg(*args, url=url), fragment)
