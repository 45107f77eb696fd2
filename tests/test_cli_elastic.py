"""``cg elastic ...`` against a real server: wire vectors (KV values, work-queue sources, add order),
reference output lines, membership commands, interactive create on a terminal, consume."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import signal

import pytest

from tests.helpers.cli import (
    acg,
    assert_cli_error,
    cg_argv,
    cg_env,
    kv_value,
    make_stream,
    message_lines,
    procs,
    run_cg,
)
from tests.helpers.support import WIRE_VECTORS

BUCKET = "elastic-consumer-groups"
PROMPT = "WARNING: this operation will cause all existing consumer members to terminate consuming are you sure? (y/n): "


@pytest.fixture
async def stream(js, uniq):
    """A fresh origin stream, subjects <stream>.> (the vectors' `src` renamed)."""
    await make_stream(js, uniq, subjects=[f"{uniq}.>"])
    return uniq


def _rename(text: str, stream: str) -> str:
    return text.replace("src.", f"{stream}.")


def _cli_args(v: dict, stream: str) -> list[str]:
    """The vector's invocation with the stream renamed; the answers the reference read from stdin
    for each --filter become --wildcards (a lone index list is the default: every `*` in order)."""
    args = [stream if a == "src" else _rename(a, stream) for a in v["cli"]]
    answers = [line for line in v["stdin"].splitlines() if line.strip()]
    if "--filter" in args:
        for answer in answers:
            args += ["--wildcards", ",".join(answer.split())]
    return args


async def test_wire_vectors(nats_server, js, stream):
    """Exact KV values, the work-queue stream's source transforms, and `add m2 m1 m3` order."""
    url = nats_server.url
    for v in WIRE_VECTORS["elastic"]:
        group = v["cli"][3]
        args = _cli_args(v, stream)
        r = (await run_cg(*args, url=url)).ok()  # stdin is not a terminal: no prompts
        assert r.out == "", args
        assert await kv_value(js, BUCKET, f"{stream}.{group}") == _rename(v["kv"], stream).encode(), args
        info = await js.stream_info(f"{stream}-{group}")
        sources = [
            {"name": s.name, "subject_transforms": [{"src": t.src, "dest": t.dest} for t in s.subject_transforms or []]}
            for s in info.config.sources
        ]
        expected = json.loads(_rename(json.dumps(v["stream_sources"]), stream))
        for s in expected:
            s["name"] = stream
        assert sources == expected, args
        (await run_cg(*args, url=url)).ok()  # idempotent
        r = (await run_cg("elastic", "add", stream, group, "m2", "m1", "m3", url=url)).ok()
        assert r.out == "added members: [m2 m1 m3]\n"
        assert await kv_value(js, BUCKET, f"{stream}.{group}") == _rename(v["kv_after_add"], stream).encode()
    r = await run_cg("elastic", "create", stream, "e1", "5", "--filter", f"{stream}.*", url=url)
    assert_cli_error(r, "can not be updated")
    r = (await run_cg("elastic", "ls", stream, url=url)).ok()
    assert r.out.startswith("elastic consumer groups: [")
    assert sorted(r.out.strip()[len("elastic consumer groups: [") : -1].split()) == ["e1", "e2", "e3"]


async def test_info_membership_and_mapping_lines(nats_server, js, stream):
    url = nats_server.url
    s = stream
    (
        await run_cg(
            "elastic",
            "create",
            s,
            "g",
            "6",
            "--filter",
            f"{s}.a.*.*",
            "--wildcards",
            "2 1",
            "--filter",
            f"{s}.b.*",
            "--max-buffered-msgs",
            "100",
            url=url,
        )
    ).ok()
    r = (await run_cg("elastic", "info", s, "g", url=url)).ok()
    assert r.lines == [
        "config: max members=6, max buffered msgs=100, max buffered bytes=0",
        f"filter={s}.a.*.*, partitioning wildcards [2 1]",
        f"filter={s}.b.*, partitioning wildcards [1]",
        "no members or mappings defined",
        "currently active members: []",
    ]
    r = (await run_cg("elastic", "add", s, "g", "b", "a", url=url)).ok()
    assert r.out == "added members: [b a]\n"
    r = (await run_cg("elastic", "add", s, "g", "c", "a", url=url)).ok()
    assert r.out == "added members: [b a c]\n"
    r = (await run_cg("elastic", "drop", s, "g", "a", url=url)).ok()
    assert r.out == "dropped members: [b c]\n"
    r = (await run_cg("elastic", "info", s, "g", url=url)).ok()
    assert r.lines[3:] == ["members: [b c]", "currently active members: []"]
    r = (await run_cg("elastic", "member-info", s, "g", "b", url=url)).ok()
    assert r.lines == [
        "member b is part of the consumer group membership",
        "***Warning*** member b is part of the consumer group membership but has NO active instance",
    ]
    r = (await run_cg("elastic", "minfo", s, "g", "a", url=url)).ok()
    assert r.lines == ["member a is not currently part of the consumer group membership"]

    for alias in ("create-mapping", "cm", "createmapping"):
        r = (await run_cg("elastic", alias, s, "g", "m1:0,1,2", "m2:3,4,5", url=url)).ok()
        assert r.out == "member mapping: [{Member:m1 Partitions:[0 1 2]} {Member:m2 Partitions:[3 4 5]}]\n"
    assert (
        await kv_value(js, BUCKET, f"{s}.g")
        == (
            f'{{"max_members":6,"partitioning_filters":[{{"filter":"{s}.a.*.*","partitioning_wildcards":[2,1]}},'
            f'{{"filter":"{s}.b.*","partitioning_wildcards":[1]}}],"max_buffered_msg":100,'
            '"member_mappings":[{"member":"m1","partitions":[0,1,2]},{"member":"m2","partitions":[3,4,5]}]}'
        ).encode()
    )
    r = (await run_cg("elastic", "info", s, "g", url=url)).ok()
    assert r.lines[3] == "Member mappings: [{Member:m1 Partitions:[0 1 2]} {Member:m2 Partitions:[3 4 5]}]"
    r = (await run_cg("elastic", "info", s, "g", "--json", url=url)).ok()
    doc = json.loads(r.out)
    assert doc["config"]["member_mappings"][1] == {"member": "m2", "partitions": [3, 4, 5]}
    assert doc["config"]["max_buffered_msg"] == 100 and doc["active_members"] == []
    for alias in ("delete-mapping", "dm", "deletemapping"):
        r = (await run_cg("elastic", alias, s, "g", url=url)).ok()
        assert r.out == ""
    r = (await run_cg("elastic", "info", s, "g", url=url)).ok()
    assert r.lines[3] == "no members or mappings defined"

    (await run_cg("elastic", "create", s, "w", "3", url=url)).ok()  # no --filter, no terminal
    r = (await run_cg("elastic", "info", s, "w", url=url)).ok()
    assert r.lines == [
        "config: max members=3, max buffered msgs=0, max buffered bytes=0",
        "no partitioning filters defined (whole subject used)",
        "no members or mappings defined",
        "currently active members: []",
    ]


async def test_delete_confirmation(nats_server, js, stream):
    url = nats_server.url
    (await run_cg("elastic", "create", stream, "d", "2", url=url)).ok()
    for answer in ("n\n", ""):
        r = await acg("elastic", "delete", stream, "d", url=url, input=answer)
        assert_cli_error(r, "operation canceled")
        assert r.out == PROMPT
    await js.stream_info(f"{stream}-d")
    r = (await acg("elastic", "rm", stream, "d", url=url, input="y\n")).ok()
    assert r.out == PROMPT
    assert await kv_value(js, BUCKET, f"{stream}.d") is None
    import nats.js.errors

    with pytest.raises(nats.js.errors.NotFoundError):
        await js.stream_info(f"{stream}-d")
    (await run_cg("elastic", "create", stream, "d", "2", url=url)).ok()
    assert (await acg("elastic", "delete", "-f", stream, "d", url=url)).ok().out == ""


async def test_interactive_create_on_a_terminal(nats_server, js, stream):
    """With no --filter and stdin a terminal, cg asks for filters and indexes as the reference does."""
    master, slave = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        *cg_argv("elastic", "create", stream, "i", "4"),
        stdin=slave,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=cg_env(nats_server.url),
    )
    os.close(slave)
    out = b""

    async def expect(text: bytes, count: int = 1) -> None:
        nonlocal out
        while out.count(text) < count:
            chunk = await asyncio.wait_for(proc.stdout.read(1024), 15)
            assert chunk, f"cg ended; stdout so far {out!r}"
            out += chunk

    try:
        await expect(b"filter (empty when done): ")
        os.write(master, f"{stream}.*\n".encode())
        await expect(b"space separated partitioning wildcard indexes: ")
        os.write(master, b"x\n")  # not a number: told, asked again
        await expect(b"space separated partitioning wildcard indexes: ", 2)
        os.write(master, b"1\n")
        await expect(b"filter (empty when done): ", 2)
        os.write(master, b"\n")
        code = await asyncio.wait_for(proc.wait(), 15)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        os.close(master)
    err = (await proc.stderr.read()).decode()
    assert code == 0, err
    assert b"can't parse partition x" in out
    assert (
        await kv_value(js, BUCKET, f"{stream}.i")
        == (
            f'{{"max_members":4,"partitioning_filters":[{{"filter":"{stream}.*","partitioning_wildcards":[1]}}]}}'
        ).encode()
    )
    assert "whole subject" not in err


async def test_interactive_create_with_no_filter_says_the_whole_subject_is_the_key(nats_server, js, stream):
    """An empty first answer at the filter prompt creates a whole-subject group, and cg says so."""
    master, slave = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        *cg_argv("elastic", "create", stream, "w", "10"),
        stdin=slave,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=cg_env(nats_server.url),
    )
    os.close(slave)
    try:
        out = b""
        while b"filter (empty when done): " not in out:
            chunk = await asyncio.wait_for(proc.stdout.read(1024), 15)
            assert chunk, f"cg ended; stdout so far {out!r}"
            out += chunk
        os.write(master, b"\n")
        rest, err = await asyncio.wait_for(proc.communicate(), 15)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        os.close(master)
    assert proc.returncode == 0, err
    assert out + rest == b"filter (empty when done): "  # stdout: the reference's prompt only
    assert err.decode() == (
        f"created elastic consumer group w on stream {stream} with no partitioning filter: "
        "the whole subject is the key\n"
    )
    stored = json.loads(await kv_value(js, BUCKET, f"{stream}.w"))
    assert stored["max_members"] == 10 and not stored.get("partitioning_filters"), stored


async def test_consume_waits_for_membership_prints_lines_and_exits_0_on_delete(nats_server, js, stream):
    url = nats_server.url
    s = stream
    (await run_cg("elastic", "create", s, "c", "4", "--filter", f"{s}.*", url=url)).ok()
    async with procs() as start:
        p = await start("elastic", "join", s, "c", "m1", "--sleep", "5ms", url=url)
        await p.wait_text("consuming...\n")  # not a member yet: it waits to be added
        r = (await run_cg("elastic", "add", s, "c", "m1", url=url)).ok()
        assert r.out == "added members: [m1]\n"

        async def active() -> bool:
            r = await run_cg("elastic", "member-info", s, "c", "m1", url=url)
            return r.lines == ["member m1 is part of the consumer group membership and is active"]

        from tests.helpers.support import wait_for

        await wait_for(active, timeout=15, what="m1 active")
        for i in range(12):
            await js.publish(f"{s}.{i}", b"x")
        await p.wait_output(lambda o: o.count("acked\n") == 12, what="12 acked lines")
        r = (await run_cg("elastic", "info", s, "c", url=url)).ok()
        assert r.lines[-1] == "currently active members: [m1]"
        for alias in ("step-down", "stepdown", "sd"):
            assert (await run_cg("elastic", alias, s, "c", "m1", url=url)).ok().out == ""
        (await acg("elastic", "delete", s, "c", "-f", url=url)).ok()
        res = await p.wait(timeout=15)
    assert res.code == 0, res.err
    msgs = message_lines(res.out)
    assert len(msgs) == 12 and res.out.splitlines()[0] == "consuming..."
    assert sorted(m["subject"] for m in msgs) == sorted(f"{s}.{i}" for i in range(12))
    assert all(m["sleep"] == "5ms" and m["end"] == "acked" and m["member"] == "m1" for m in msgs)
    # seq is the work-queue stream's sequence
    assert sorted(int(m["seq"]) for m in msgs) == list(range(1, 13))


async def test_consume_ends_with_status_1_on_a_config_change_it_cant_follow(nats_server, js, stream):
    url = nats_server.url
    (await run_cg("elastic", "create", stream, "x", "4", url=url)).ok()
    (await run_cg("elastic", "add", stream, "x", "m1", url=url)).ok()
    async with procs() as start:
        p = await start("elastic", "consume", stream, "x", "m1", url=url)
        await p.wait_text("consuming...\n")
        kv = await js.key_value(BUCKET)
        await kv.put(f"{stream}.x", b'{"max_members":5,"partitioning_filters":null,"members":["m1"]}')
        res = await p.wait(timeout=15)
    assert_cli_error(res, "configuration")
    assert res.out == "consuming...\n"


async def test_sigint_exits_0(nats_server, stream):
    url = nats_server.url
    (await run_cg("elastic", "create", stream, "q", "2", url=url)).ok()
    (await run_cg("elastic", "add", stream, "q", "m1", url=url)).ok()
    async with procs() as start:
        p = await start("elastic", "consume", stream, "q", "m1", url=url)
        await p.wait_text("consuming...\n")
        p.signal(signal.SIGINT)
        res = await p.wait(timeout=15)
    assert res.code == 0 and res.err == "" and res.out == "consuming...\n"
