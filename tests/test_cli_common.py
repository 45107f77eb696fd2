"""cg as a whole: --fisk-introspect, nats plugin argv replays, help without a server, the error table and the
demo scripts."""

from __future__ import annotations

import asyncio
import json
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.cli import (
    SCRIPTS,
    acg,
    assert_cli_error,
    cg,
    cg_argv,
    cg_env,
    closed_port_url,
    kv_value,
    make_stream,
    partition_transform,
)
from tests.helpers.fisk_sim import all_nats_argvs, check_fisk_model, nats_argv
from tests.helpers.support import wait_for


def test_fisk_introspect_needs_no_server_and_prints_one_valid_model():
    """What `nats plugins register cg` runs: exit 0, one JSON document, empty stderr, no network."""
    env = cg_env(closed_port_url(), NATS_CONTEXT="does-not-exist")
    start = time.monotonic()
    p = subprocess.run(cg_argv("--fisk-introspect"), capture_output=True, env=env, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stderr == b""
    assert p.stdout.endswith(b"}\n") and p.stdout.count(b"\n") == 1
    model = json.loads(p.stdout)
    check_fisk_model(model)
    assert (model["name"], model["help"], model["version"]) == ("cg", "Partitioned Consumer Group CLI tool", "0.1.0")
    assert time.monotonic() - start < 10
    from cg.app import ALIASES

    def find(*path):
        node = model
        for name in path:
            node = next(c for c in node["commands"] if c["name"] == name)
        return node

    for path, aliases in ALIASES.items():
        assert find(*path).get("aliases") == aliases, path
    assert [c["name"] for c in model["commands"]] == ["demo", "static", "elastic", "metrics", "tools"]
    roots = {f["name"] for f in model["flags"]}
    assert {"context", "server", "creds", "timeout", "js-domain", "tlsfirst", "no-context"} <= roots
    assert all("short" not in f for f in model["flags"])
    assert {f["name"] for f in find("static", "consume")["flags"]} == {
        "sleep",
        "concurrency",
        "key-header",
        "key-tokens",
        "max-ack-pending",
        "metrics-listen",
        "dispatch",
        "otel",
        "fail",
        "max-deliver",
        "park-keys",
    }
    assert find("static", "consume")["flags"][0]["default"] == ["20ms"]
    assert [c["name"] for c in find("elastic", "dead-letters")["commands"]] == ["ls", "show", "replay", "purge"]
    assert {f["name"] for f in find("static", "dead-letters", "replay")["flags"]} == {
        "key",
        "seq",
        "all",
        "execute",
        "json",
    }
    assert find("static", "delete")["flags"][0]["short"] == ord("f")
    assert {f["name"] for f in find("elastic", "create")["flags"]} == {
        "filter",
        "wildcards",
        "source",
        "partition-stream",
        "start",
        "source-domain",
        "source-api",
        "max-buffered-msgs",
        "max-buffered-bytes",
    }
    assert find("elastic", "add-source")["args"][0]["place_holder"] == "STREAM GROUP SOURCE"


def test_help_and_version_need_no_server():
    url = closed_port_url()
    for args in (
        ["--help"],
        ["-h"],
        ["static", "--help"],
        ["static", "create", "balanced", "-h"],
        ["elastic", "consume", "--help"],
        ["elastic", "create", "-h"],
    ):
        r = cg(*args, url=url, timeout=20).ok()
        assert "Usage" in r.out and r.err == "", args
    listed = cg("--help", url=url).ok().out.split("Commands:", 1)[1].split()
    assert {"demo", "static", "elastic", "metrics", "tools"} <= set(listed)  # the README uses `cg tools`
    assert cg("--version", url=url).ok().out == "0.1.0\n"


def _write_context(tmp_path: Path, name: str, url: str) -> dict:
    ctx_dir = tmp_path / "nats" / "context"
    ctx_dir.mkdir(parents=True)
    (ctx_dir / f"{name}.json").write_text(json.dumps({"description": "test", "url": url}))
    return cg_env(None, XDG_CONFIG_HOME=str(tmp_path))


async def test_nats_plugin_argvs_reach_the_right_commands(nats_server, js, uniq, tmp_path):
    """Replays the argvs `nats cg ...` would run (aliases resolved, flags as --name=value, proxied
    globals after the path, positionals folded so their order survives) against the real server."""
    p = subprocess.run(cg_argv("--fisk-introspect"), capture_output=True, env=cg_env(), timeout=30)
    model = json.loads(p.stdout)
    url = nats_server.url
    rng = random.Random(7)
    env = _write_context(tmp_path, "plugtest", url)  # only the context knows the server
    await make_stream(js, uniq, transform=partition_transform(uniq))

    def argvs(path, positionals, flags=None, globals_=None):
        out = list(all_nats_argvs(model, path, positionals, flags, globals_))
        out.append(nats_argv(model, path, positionals, flags, globals_, rng=rng))
        return out

    for argv in argvs(
        ["static", "create", "balanced"], [uniq, "grp", "4", "m2", "m1"], {"filter": [f"{uniq}.*"]}, {"server": url}
    ):
        (await acg(*argv, env=cg_env())).ok()
    assert (
        await kv_value(js, "static-consumer-groups", f"{uniq}.grp")
        == f'{{"max_members":4,"filters":["{uniq}.*"],"members":["m2","m1"]}}'.encode()
    )

    for argv in argvs(["static", "list"], [uniq], None, {"context": "plugtest"}):
        r = (await acg(*argv, env=env)).ok()
        assert r.out == "static consumer groups: [grp]\n", argv
    for argv in argvs(["static", "minfo"], [uniq, "grp", "m1"], {"json": True}, {"context": "plugtest"}):
        r = (await acg(*argv, env=env)).ok()
        assert json.loads(r.out)["member"] == "m1" and json.loads(r.out)["in_membership"] is True

    for argv in argvs(
        ["elastic", "create"],
        [uniq, "eg", "3"],
        {"filter": [f"{uniq}.*"], "wildcards": ["1"], "max-buffered-msgs": "-1"},
        {"server": url, "timeout": "10s"},
    ):
        (await acg(*argv, env=cg_env())).ok()
    assert (
        await kv_value(js, "elastic-consumer-groups", f"{uniq}.eg")
        == (
            f'{{"max_members":3,"partitioning_filters":[{{"filter":"{uniq}.*","partitioning_wildcards":[1]}}],'
            f'"max_buffered_msg":-1}}'
        ).encode()
    )
    r = (
        await acg(
            *nats_argv(model, ["elastic", "add"], [uniq, "eg", "b", "a"], None, {"context": "plugtest"}, rng=rng),
            env=env,
        )
    ).ok()
    assert r.out == "added members: [b a]\n"
    r = (
        await acg(
            *nats_argv(model, ["elastic", "memberinfo"], [uniq, "eg", "a"], None, {"context": "plugtest"}, rng=rng),
            env=env,
        )
    ).ok()
    assert r.lines[0] == "member a is part of the consumer group membership"

    r = await acg(
        *nats_argv(model, ["static", "rm"], [uniq, "grp"], {"force": True}, {"server": url}, rng=rng), env=cg_env()
    )
    r.ok()
    assert await kv_value(js, "static-consumer-groups", f"{uniq}.grp") is None
    r = await acg(
        *nats_argv(
            model, ["elastic", "rm"], [uniq, "eg"], {"force": True}, {"server": url, "no-context": True}, rng=rng
        ),
        env=cg_env(),
    )
    r.ok()


async def test_options_anywhere_and_env(nats_server, js, uniq):
    """Connection options are root options, yet may come after the command (hoisted)."""
    bad = closed_port_url()
    await make_stream(js, uniq)
    r = (await acg("static", "ls", uniq, "--server", nats_server.url, url=bad)).ok()
    assert r.out == "static consumer groups: []\n"
    r = (await acg("static", "ls", "-s", nats_server.url, uniq, url=bad)).ok()
    assert r.out == "static consumer groups: []\n"
    r = (await acg("static", "ls", uniq, url=nats_server.url)).ok()  # NATS_URL
    assert r.out == "static consumer groups: []\n"
    assert_cli_error(await acg("static", "ls", "x", url=bad), "can't connect to")


async def test_bad_invocations_exit_1_with_one_error_line(nats_server, js, nc, uniq):
    """~25 bad invocations, each a real subprocess: status 1, `cg: error:` first on stderr, nothing
    on stdout, never a traceback."""
    from pcgroups.elastic._admin import create_elastic
    from pcgroups.static._admin import create_static

    url = nats_server.url
    s = uniq
    await make_stream(js, s, transform=partition_transform(s))
    await create_static(nc, s, "sg", 2, members=["m1", "m2"])
    await create_elastic(nc, s, "eg", 2, partitioning_filters=None)
    table = [
        (["static", "info", s], "missing argument"),
        (["static", "create", "balanced", s, "g"], "missing argument"),
        (["static", "create", "balanced", s, "g", "x", "m1"], "invalid MAX-MEMBERS: 'x' is not a whole number"),
        (["static", "create", "balanced", s, "g", "0", "m1"], "max number of members must be at least 1"),
        (["static", "create", "balanced", s, "g", "-1", "m1"], "-1"),
        (["static", "create", "balanced", s, "g.x", "2", "m1"], 'invalid group name "g.x"'),
        (["static", "create", "balanced", s, "g", "2", "m.1"], 'invalid member name "m.1"'),
        (["static", "create", "balanced", "a.b", "g", "2", "m1"], 'invalid stream name "a.b"'),
        (["static", "create", "balanced", f"no{s}", "g", "2", "m1"], "does not exist"),
        (["static", "create", "mapped", s, "g", "2", "m1:0,x"], 'partition "x" is not an integer'),
        (["static", "create", "mapped", s, "g", "2", "m1"], "missing ':'"),
        (["static", "create", "mapped", s, "g", "2", "m1:0", "m2:0"], "partition numbers must be used only once"),
        (["static", "create", "balanced", s, "sg", "3", "m1"], "doesn't match"),
        (["static", "info", s, "eg"], "not found"),
        (["elastic", "info", s, "sg"], "not found"),
        (["static", "info", s, "nope"], "not found"),
        (["static", "step-down", s, "sg", "m9"], "not part of"),
        (["static", "delete", s, "nope", "-f"], "not found"),
        (["static", "consume", s, "sg", "m1", "--sleep", "xx"], "invalid --sleep"),
        (["static", "consume", s, "sg", "m9"], "m9 is not a member of static consumer group sg (members: "),
        (["elastic", "create", s, "g", "2", "--filter", "a.b"], "at least one * wildcard"),
        (["elastic", "create", s, "g", "2", "--filter", "a.*", "--wildcards", "1", "--wildcards", "2"], "--wildcards"),
        (["elastic", "create", s, "g", "2", "--filter", "a.*", "--wildcards", "x"], "can't parse partition x"),
        (["elastic", "create", s, "g", "2", "--filter", "a.*", "--wildcards", "2"], "wildcard"),
        (["elastic", "create-mapping", s, "eg", "m1:0,1,2"], "partition"),
        (["elastic", "add", s, "nope", "m1"], "not found"),
        (["static", "nope"], "no such command"),
        (["static", "ls", s, "--bogus"], "no such option"),
        (["--timeout", "0", "static", "ls", s], "timeout"),
        (["--context", "missingctx", "static", "ls", s], "unknown context"),
        (["-s", closed_port_url(), "static", "ls", s], "can't connect to"),
    ]
    sem = asyncio.Semaphore(4)

    async def one(args):
        async with sem:
            return await acg(*args, url=url)

    results = await asyncio.gather(*(one(args) for args, _ in table))
    for (args, fragment), r in zip(table, results, strict=False):
        try:
            assert_cli_error(r, fragment)
            assert r.out == "", r.out
        except AssertionError as e:
            raise AssertionError(f"cg {' '.join(args)}: {e}") from None


async def test_stream_setup_and_traffic_scripts(nats_server, js, uniq):
    """The reference's demo scripts, without the nats CLI."""
    env = cg_env(nats_server.url)

    def run(*a: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(a, capture_output=True, text=True, timeout=30, env=env)

    p = run(str(SCRIPTS / "static_stream_setup.sh"), "--stream", uniq)
    assert p.returncode == 0, p.stderr
    info = await js.stream_info(uniq)
    assert info.config.subjects == [f"{uniq}.*"]
    assert (info.config.subject_transform.src, info.config.subject_transform.dest) == (
        f"{uniq}.*",
        f"{{{{partition(10,1)}}}}.{uniq}.{{{{wildcard(1)}}}}",
    )
    assert run(str(SCRIPTS / "static_stream_setup.sh"), "--stream", uniq).returncode == 0  # idempotent

    p = run(str(SCRIPTS / "elastic_stream_setup.sh"), "--stream", uniq + "e")
    assert p.returncode == 0, p.stderr
    info = await js.stream_info(uniq + "e")
    assert info.config.subjects == [f"{uniq}e.*"] and info.config.subject_transform is None

    p = run(str(SCRIPTS / "generate_traffic.sh"), "--stream", uniq, "--count", "150", "--sleep", "1ms")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("published 150 messages")
    info = await js.stream_info(uniq)
    assert info.state.messages == 150
    # foo.<n> for n < 100, transformed into <partition>.foo.<n>
    msg = await js.get_msg(uniq, 101)
    token, _, rest = msg.subject.partition(".")
    assert rest == f"{uniq}.0" and 0 <= int(token) < 10

    # by default it runs until Ctrl-C, then reports and exits 0
    proc = subprocess.Popen(
        [str(SCRIPTS / "generate_traffic.sh"), "--stream", uniq],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        await wait_for(lambda: _stream_messages(js, uniq, 160), timeout=15, what="traffic")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert re.match(r"published \d+ messages to " + uniq + r"\.<0\.\.\d+>", out), out


async def _stream_messages(js, stream: str, at_least: int) -> bool:
    return (await js.stream_info(stream)).state.messages >= at_least


def test_go_formatting_helpers():
    from cg.output import go_duration, go_list, go_mappings
    from pcgroups.config import MemberMapping

    cases = {
        0: "0s",
        0.02: "20ms",
        0.0255: "25.5ms",
        1: "1s",
        1.5: "1.5s",
        90: "1m30s",
        60: "1m0s",
        3600: "1h0m0s",
        5400.25: "1h30m0.25s",
        1.5e-6: "1.5µs",
        1e-9: "1ns",
        0.000999: "999µs",
        -2: "-2s",
    }
    for seconds, text in cases.items():
        assert go_duration(seconds) == text, seconds
    assert go_list([]) == "[]" and go_list(["a", "b"]) == "[a b]" and go_list([0, 1]) == "[0 1]"
    assert (
        go_mappings([MemberMapping("m1", [0, 1]), MemberMapping("m2", [])])
        == "[{Member:m1 Partitions:[0 1]} {Member:m2 Partitions:[]}]"
    )


def test_filter_and_wildcard_pairing():
    from cg.common import CLIError, partitioning_filters
    from pcgroups.config import PartitioningFilter as PF

    assert partitioning_filters(["a.*.*", "b.*", "c.>"], ["2,1"]) == [
        PF("a.*.*", [2, 1]),
        PF("b.*", [1]),
        PF("c.>", []),
    ]
    assert partitioning_filters(["a.*.*"], ["2 1"]) == [PF("a.*.*", [2, 1])]
    assert partitioning_filters(["a.*.*"], [""]) == [PF("a.*.*", [])]  # explicit: hash the whole subject
    with pytest.raises(CLIError, match="pairs with one --filter"):
        partitioning_filters(["a.*"], ["1", "1"])
    with pytest.raises(CLIError, match="can't parse partition x"):
        partitioning_filters(["a.*"], ["1,x"])
