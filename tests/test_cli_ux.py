"""``cg`` as a newcomer meets it, one test (or a few) per finding of the walk-through, black-box through the
real ``cg`` on a real server where the finding is about ``cg``:

- flags where the Go tool takes them (``cg static --sleep 200ms consume ...``, ``--no-force``, ``--version``);
- errors in the user's words (the group not found, not its work queue; nothing to step down; what differs;
  numbers; help metavars);
- warnings where a mistake was silent (a static group on a stream without partition numbers, more members
  than partitions, a member named twice, ``ls`` of no stream, changes under automatic membership, dropping
  a non-member), and the terminal's summary of a membership change;
- a dropped member's instance says so and waits to be added again;
- the traffic script through a server restart.

The rendering at 80 columns (every digit of every number kept) is tests/test_cli_render.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import re
import signal
import subprocess

import nats
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
from tests.helpers.support import wait_for


@pytest.fixture
async def static_stream(js, uniq):
    """Subjects <uniq>.*, partitioned into 4 by the stream's transform."""
    await make_stream(js, uniq, transform=partition_transform(uniq, 4))
    return uniq


# ---------------------------------------------------------------- flags where the Go tool takes them


def test_flavour_options_are_moved_next_to_the_flavour():
    from cg.plugin import hoist_to_command

    flavours, names = ["static", "elastic"], ["--sleep"]
    assert hoist_to_command(["static", "consume", "s", "g", "m1", "--sleep", "1s"], flavours, names) == [
        "static",
        "--sleep",
        "1s",
        "consume",
        "s",
        "g",
        "m1",
    ]
    assert hoist_to_command(
        ["--server", "static", "elastic", "ls", "--sleep=2s", "s"], flavours, names, ["--server"]
    ) == ["--server", "static", "elastic", "--sleep=2s", "ls", "s"]
    assert hoist_to_command(["static", "ls", "--", "--sleep", "1s"], flavours, names) == [
        "static",
        "ls",
        "--",
        "--sleep",
        "1s",
    ]  # after --: arguments
    assert hoist_to_command(["demo", "--sleep", "1s"], flavours, names) == ["demo", "--sleep", "1s"]


async def test_sleep_anywhere_after_the_flavour_as_the_go_tool_takes_it(nats_server, js, static_stream):
    s, url = static_stream, nats_server.url
    (await run_cg("static", "create", "balanced", s, "g", "4", "m1", url=url)).ok()
    for i in range(4):
        await js.publish(f"{s}.{i}", b"x")
    runs = {
        ("static", "--sleep", "70ms", "consume", s, "g", "m1"): "70ms",  # the Go tool's position
        ("static", "consume", s, "g", "m1", "--sleep=30ms"): "30ms",  # consume's own (nats plugin)
        ("static", "consume", "--sleep", "40ms", s, "g", "m1"): "40ms",
    }
    async with procs() as start:
        for argv, sleep in runs.items():
            p = await start(*argv, url=url)
            await p.wait_output(lambda o: len(message_lines(o)) >= 1, what="a message line")
            p.signal(signal.SIGINT)
            res = await p.wait(timeout=15)
            assert res.code == 0, res.err
            assert {m["sleep"] for m in message_lines(res.out)} == {sleep}, (argv, res.out)
            await js.publish(f"{s}.0", b"x")
    # on any command of the flavour, as the Go tool (a bad value is an error there too)
    assert (await run_cg("static", "ls", s, "--sleep", "1s", url=url)).ok().out == "static consumer groups: [g]\n"
    assert (await run_cg("elastic", "--sleep", "1s", "ls", s, url=url)).ok().out == "elastic consumer groups: []\n"
    assert_cli_error(await run_cg("static", "ls", s, "--sleep", "soon", url=url), "invalid --sleep")
    assert (await run_cg("static", "ls", s, "--version", url=url)).ok().out == "0.1.0\n"
    r = await run_cg("static", "delete", s, "g", "--no-force", url=url, input="n\n")  # fisk bools negate
    assert_cli_error(r, "operation canceled")


def test_help_shows_what_the_user_types(nats_server):
    r = subprocess.run(
        [*_cg(), "static", "consume", "--help"], capture_output=True, text=True, env=cg_env(), timeout=30
    )
    assert r.returncode == 0
    assert "Usage: cg static consume [OPTIONS] STREAM GROUP MEMBER" in r.stdout
    assert "--sleep DURATION" in r.stdout and "(default: 20ms)" in r.stdout
    for typer_ism in ("{stream}", "<str>", "<bool>", "<int>", "╭"):
        assert typer_ism not in r.stdout
    r = subprocess.run([*_cg(), "elastic", "add", "-h"], capture_output=True, text=True, env=cg_env(), timeout=30)
    assert "STREAM GROUP MEMBER..." in r.stdout
    r = subprocess.run([*_cg(), "static", "--help"], capture_output=True, text=True, env=cg_env(), timeout=30)
    assert "--sleep DURATION" in r.stdout and "consume" in r.stdout


def _cg() -> list[str]:
    from tests.helpers.cli import cg_argv

    return cg_argv()


@pytest.mark.parametrize(
    "argv,said",
    [
        (
            ["--sleep", "200ms", "static", "consume", "s", "g", "m1"],
            "--sleep goes after cg static: cg static --sleep 200ms consume s g m1",
        ),
        (
            ["--sleep=1s", "elastic", "consume", "s", "g", "m1"],
            "--sleep goes after cg elastic: cg elastic --sleep=1s consume s g m1",
        ),
        (
            ["static", "--concurrency", "8", "consume", "s", "g", "m1"],
            "--concurrency goes after cg static consume: cg static consume s g m1 --concurrency 8",
        ),
        (["--json", "elastic", "ls", "s"], "--json goes after cg elastic ls: cg elastic ls s --json"),
        (["statik", "ls", "s"], "no such command 'statik' (did you mean static?); try 'cg -h' for help"),
        (["static", "staus", "s", "g"], "no such command 'staus' (did you mean status?); try 'cg static -h' for help"),
        (["static", "ls", "--concurrency", "3", "s"], "no such option: --concurrency; try 'cg static ls -h' for help"),
        # an option without its value, at the end or before the command it would take for one
        (["static", "consume", "s", "g", "m1", "--sleep"], "option '--sleep' needs a value"),
        (["static", "--sleep", "consume", "s", "g", "m1"], "option '--sleep' needs a value"),
        (["elastic", "consume", "s", "g", "m1", "--sleep"], "option '--sleep' needs a value"),
        (["elastic", "--sleep"], "option '--sleep' needs a value"),
        (["static", "worker", "s", "g", "--sleep"], "option '--sleep' needs a value"),
        (["elastic", "worker", "s", "g", "--sleep"], "option '--sleep' needs a value"),
        (["static", "ls", "s", "-s"], "option '-s' needs a value"),
        (["-s", "static", "ls", "s"], "option '-s' needs a value"),
        (["static", "consume", "s", "g", "m1", "--concurrency"], "option '--concurrency' needs a value"),
        (
            ["static", "create", "s", "g2", "10", "m1", "m2"],
            "cg static create takes balanced or mapped first: cg static create balanced|mapped s g2 10 m1 m2",
        ),
        # a suggestion only for a likely typo, among the options that go there (the root's go anywhere)
        (["--bogus", "static", "ls", "s"], "no such option: --bogus; try 'cg -h' for help"),
        (
            ["static", "ls", "s", "--servr", "x"],
            "no such option: --servr (did you mean --server?); try 'cg static ls -h' for help",
        ),
        (
            ["static", "consume", "s", "g", "m1", "--concurency", "2"],
            "no such option: --concurency (did you mean --concurrency?); try 'cg static consume -h' for help",
        ),
    ],
)
def test_a_misplaced_flag_or_a_typo_says_what_was_meant(argv, said):
    """No server needed: parsing fails before anything connects."""
    from tests.helpers.cli import cg_inproc

    r = cg_inproc(*argv)
    assert r.code == 1 and r.out == "" and r.err == f"cg: error: {said}\n", r.err


def test_the_shell_suggests_what_a_typo_meant(nats_server, clean_env):
    from cg.app import build
    from cg.prompt import Repl
    from pcgroups.connect import ConnectionOptions

    repl = Repl("static", ConnectionOptions(server=nats_server.url), build(), input=None, history_file=clean_env / "h")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err, repl.bound():
        for line in ("staus", "elastik", "bogus"):
            repl.execute(line)
    assert err.getvalue().splitlines() == [
        "cg: error: unknown command: staus (did you mean status? type help for the list)",
        "cg: error: unknown command: elastik (did you mean elastic? type help for the list)",
        "cg: error: unknown command: bogus (type help for the list)",
    ]


# ---------------------------------------------------------------- errors in the user's words


async def test_errors_name_what_the_user_typed(nats_server, js, static_stream, uniq):
    s, url = static_stream, nats_server.url
    await make_stream(js, f"{uniq}e")
    r = await run_cg("elastic", "consume", f"{uniq}e", "nosuchgroup", "m1", url=url)
    assert_cli_error(r, f"elastic consumer group nosuchgroup on stream {uniq}e not found")
    assert "-nosuchgroup" not in r.err  # not the internal work queue's name
    assert_cli_error(
        await run_cg("static", "consume", s, "nosuch", "m1", url=url),
        f"static consumer group nosuch on stream {s} not found",
    )
    (await run_cg("static", "create", "balanced", s, "g", "4", "m1", "m2", url=url)).ok()
    assert_cli_error(
        await run_cg("static", "step-down", s, "g", "m1", url=url),
        "member m1 of static consumer group g has no running instance: nothing to step down",
    )
    r = await run_cg("static", "create", "balanced", s, "g", "8", "m1", "m3", url=url)
    assert_cli_error(r, "partitions: 4 now, 8 asked; members: m1 m2 now, m1 m3 asked")
    assert_cli_error(
        await run_cg("static", "create", "balanced", s, "h", "4.5", "m1", url=url),
        "invalid MAX-MEMBERS: '4.5' is not a whole number",
    )
    assert_cli_error(
        await run_cg("static", "create", "balanced", s, "h", "0", "m1", url=url),
        "the max number of members must be at least 1, got 0",
    )
    assert_cli_error(await run_cg("demo", "--rate", "5"), "invalid --rate 5: must be between 10 and 2000")
    assert_cli_error(await run_cg("static", "info", s, url=url), "missing argument 'GROUP'")


#: Every duration option of cg, given a number without a unit: (argv, the option, the number).
BARE_DURATIONS = [
    (["static", "consume", "s", "g", "m1", "--sleep", "200"], "--sleep", "200"),
    (["elastic", "--sleep", "2.5", "consume", "s", "g", "m1"], "--sleep", "2.5"),
    (["elastic", "consume", "s", "g", "--auto", "--lease-ttl", "5"], "--lease-ttl", "5"),
    (["static", "status", "s", "g", "--watch", "--interval", "2"], "--interval", "2"),
    (["elastic", "reset", "s", "g", "--by-duration", "5"], "--by-duration", "5"),
    (["--timeout", "5", "static", "ls", "s"], "--timeout", "5"),
    (["elastic", "remove-source", "s", "g", "x", "--wait", "30"], "--wait", "30"),
    (["metrics", "--interval", "5"], "--interval", "5"),
    (["tools", "traffic", "--sleep", "10"], "--sleep", "10"),
    (["demo", "--duration", "20"], "--duration", "20"),
]


@pytest.mark.parametrize("argv,option,number", BARE_DURATIONS, ids=[" ".join(a[0]) for a in BARE_DURATIONS])
def test_a_duration_without_a_unit_is_refused_as_go_refuses_it(argv, option, number):
    """``--sleep 200`` once meant 200 s. Every duration option reads Go's durations: a number needs a unit
    (``0`` excepted), before anything connects."""
    from tests.helpers.cli import cg_inproc

    r = cg_inproc(*argv)
    assert_cli_error(r)
    assert r.err == f'cg: error: invalid {option}: missing unit in duration "{number}" (e.g. {number}ms or {number}s)\n'


def test_the_shell_wants_a_unit_too(nats_server, clean_env):
    from cg.app import build
    from cg.prompt import Repl
    from pcgroups.connect import ConnectionOptions

    repl = Repl("static", ConnectionOptions(server=nats_server.url), build(), input=None, history_file=clean_env / "h")
    with (
        contextlib.redirect_stdout(io.StringIO()) as out,
        contextlib.redirect_stderr(io.StringIO()) as err,
        repl.bound(),
    ):
        repl.execute("processing-time 200")
        repl.execute("processing-time 0")
        repl.execute("processing-time")
    assert err.getvalue() == 'cg: error: invalid --sleep: missing unit in duration "200" (e.g. 200ms or 200s)\n'
    assert out.getvalue().splitlines()[-1] == "processing time: 0"


@pytest.mark.parametrize(
    "argv,module",
    [
        (["static", "ls", "{S}"], "prompt_toolkit"),  # the check that the cli extra is there
        (["static", "ls", "{S}"], "typer"),  # the parser
        (["static", "ls", "{S}"], "cg.app"),  # the command tree
        (["static", "ls", "{S}"], "nats"),  # connecting
        (["static", "consume", "{S}", "g", "m1"], "cg.consume"),
    ],
)
async def test_ctrl_c_while_a_command_starts_exits_130_quietly(nats_server, static_stream, tmp_path, argv, module):
    """Ctrl-C in a command's first moments, while Python imports what it needs (tests/data/sigint_at sends
    SIGINT then): exit status 130 and nothing said, as later on."""
    from tests.helpers.cli import ROOT, cg_argv

    seen = tmp_path / "seen"
    env = cg_env(
        nats_server.url,
        PCG_TEST_SIGINT_AT=module,
        PCG_TEST_SIGINT_SEEN=str(seen),
        PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "data" / "sigint_at"), str(ROOT)]),
    )
    done = await asyncio.to_thread(
        subprocess.run,
        cg_argv(*[a.replace("{S}", static_stream) for a in argv]),
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert seen.read_text() == module  # the Ctrl-C came at that moment
    assert (done.returncode, done.stderr) == (130, ""), done.stderr


async def test_ctrl_c_at_a_question_ends_its_line(nats_server, static_stream):
    """Ctrl-C at ``delete``'s (y/n): exit 130, nothing deleted, and the question's line ended, so the shell's
    next prompt does not land behind it."""
    from tests.helpers.cli import cg_argv

    s = static_stream
    (await run_cg("static", "create", "balanced", s, "g", "4", "m1", url=nats_server.url)).ok()
    p = await asyncio.create_subprocess_exec(
        *cg_argv("static", "delete", s, "g"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cg_env(nats_server.url),
    )
    try:
        out = b""
        while not out.endswith(b"(y/n): "):
            out += await asyncio.wait_for(p.stdout.read(1), 15)
        p.send_signal(signal.SIGINT)
        rest, err = await asyncio.wait_for(p.communicate(), 15)
    finally:
        if p.returncode is None:
            p.kill()
            await p.wait()
    assert p.returncode == 130 and err == b"", err
    assert rest == b"\n"
    assert (await run_cg("static", "ls", s, url=nats_server.url)).ok().out == "static consumer groups: [g]\n"


async def test_delete_with_no_answer_on_stdin_says_how_to_delete_without_asking(nats_server, static_stream):
    """``delete`` run with nothing on stdin (not a terminal) and stdout a terminal: the question's line ends
    before the error, which says that ``-f`` deletes without asking; nothing is deleted."""
    import pty

    from tests.helpers.cli import cg_argv

    s = static_stream
    (await run_cg("static", "create", "balanced", s, "g", "4", "m1", url=nats_server.url)).ok()
    primary, secondary = pty.openpty()
    try:
        done = await asyncio.to_thread(
            subprocess.run,
            cg_argv("static", "delete", s, "g"),
            stdin=subprocess.DEVNULL,
            stdout=secondary,
            stderr=subprocess.PIPE,
            env=cg_env(nats_server.url),
            timeout=30,
        )
        os.close(secondary)
        shown = b""
        with contextlib.suppress(OSError):  # the terminal's end once read out
            while chunk := os.read(primary, 4096):
                shown += chunk
    finally:
        os.close(primary)
    assert done.returncode == 1
    assert done.stderr == b"cg: error: operation canceled: no answer (stdin ended); -f deletes without asking\n"
    assert shown.endswith(b"are you sure? (y/n): \r\n"), shown
    assert (await run_cg("static", "ls", s, url=nats_server.url)).ok().out == "static consumer groups: [g]\n"


async def test_create_and_delete_say_one_line_in_a_terminal_and_nothing_in_a_pipe(nats_server, js, static_stream, uniq):
    s, e, url = static_stream, f"{uniq}e", nats_server.url
    await make_stream(js, e)
    tty = cg_env(url, CG_PRETTY="1")
    runs = [
        (
            ["static", "create", "balanced", s, "g", "4", "m1", "m2"],
            f"static consumer group g on stream {s} created: 4 partitions, members m1 m2",
        ),
        (
            ["static", "create", "balanced", s, "g", "4", "m1", "m2"],
            f"static consumer group g on stream {s} already exists as asked: 4 partitions, members m1 m2",
        ),
        (
            ["static", "create", "mapped", s, "h", "4", "m1:0-1", "m2:2,3"],
            f"static consumer group h on stream {s} created: 4 partitions, mapped m1 0-1, m2 2-3",
        ),
        (
            ["elastic", "create", e, "g", "4", "--filter", f"{e}.*"],
            f"elastic consumer group g on stream {e} created: 4 partitions by {e}.*, no members yet (work queue {e}-g)",
        ),
        (["static", "delete", s, "g", "-f"], f"deleted static consumer group g on stream {s}: its instances end"),
        (
            ["elastic", "delete", e, "g", "-f"],
            f"deleted elastic consumer group g on stream {e} and its work queue {e}-g: its instances end",
        ),
    ]
    for argv, said in runs:
        r = (await acg(*argv, env=tty)).ok()
        assert r.out == said + "\n" and r.err == "", (argv, r.out, r.err)
    for argv, _ in runs[:1] + runs[3:5]:  # a pipe: the reference's silence
        r = (await run_cg(*argv, url=url)).ok()
        assert r.out == "" and r.err == "", (argv, r.out, r.err)


# ---------------------------------------------------------------- warnings where a mistake was silent


async def test_static_group_on_a_stream_without_partition_numbers_is_refused_unless_forced(nats_server, js, uniq):
    url = nats_server.url
    await make_stream(js, uniq)  # subjects <uniq>.*, no transform
    r = await run_cg("static", "create", "balanced", uniq, "g", "4", "m1", url=url)
    assert_cli_error(r, f"the subjects of stream {uniq} ({uniq}.*) do not start with a partition number")
    assert f"{{{{partition(4,1)}}}}.{uniq}.{{{{wildcard(1)}}}}" in r.err and "--force" in r.err
    assert await kv_value(js, "static-consumer-groups", f"{uniq}.g") is None
    r = (await run_cg("static", "create", "balanced", uniq, "g", "4", "m1", "--force", url=url)).ok()
    assert r.err.startswith("cg: warning: the subjects of stream") and r.out == ""
    assert await kv_value(js, "static-consumer-groups", f"{uniq}.g") is not None
    # a transform making another number of partitions: created, with a warning naming the lost ones
    await make_stream(js, f"{uniq}t", transform=partition_transform(f"{uniq}t", 10))
    r = (await run_cg("static", "create", "balanced", f"{uniq}t", "g", "4", "m1", url=url)).ok()
    assert "makes 10 partitions, the group has 4: partitions 4..9 would never be consumed" in r.err


async def test_members_twice_or_beyond_the_partitions(nats_server, js, static_stream, uniq):
    s, url = static_stream, nats_server.url
    assert_cli_error(
        await run_cg("static", "create", "balanced", s, "g", "4", "m1", "m2", "m1", url=url), "member m1 is given twice"
    )
    r = (await run_cg("static", "create", "balanced", s, "g", "4", "a", "b", "c", "d", "e", url=url)).ok()
    assert "cg: warning: 5 members for 4 partitions in static consumer group g: e gets no partition" in r.err
    await make_stream(js, f"{uniq}e")
    e = f"{uniq}e"
    (await run_cg("elastic", "create", e, "eg", "2", url=url)).ok()
    assert_cli_error(await run_cg("elastic", "add", e, "eg", "x", "x", url=url), "member x is given twice")
    r = (await run_cg("elastic", "add", e, "eg", "m1", "m2", "m3", url=url)).ok()
    assert r.out == "added members: [m1 m2 m3]\n" and "m3 gets no partition until a member leaves" in r.err
    r = (await run_cg("elastic", "add", e, "eg", "m1", url=url)).ok()
    assert "m1 is already a member of elastic consumer group eg" in r.err
    r = await run_cg("elastic", "drop", e, "eg", "m2", "m9", url=url)
    assert_cli_error(r, "m9 is not a member of elastic consumer group eg (members: m1 m2 m3): nothing dropped")
    assert (await run_cg("elastic", "info", e, "eg", url=url)).ok().lines[-2] == "members: [m1 m2 m3]"


@pytest.mark.parametrize("kind", ["static", "elastic"])
async def test_ls_without_a_bucket_prints_an_empty_list_and_of_no_stream_an_error(fresh_server, kind):
    import json

    import nats

    url = fresh_server.url
    assert_cli_error(
        await run_cg(kind, "ls", "foo", url=url),
        f"stream foo does not exist (and no {kind} consumer group is defined under that name)",
    )
    nc = await nats.connect(url)
    try:
        await make_stream(nc.jetstream(), "foo")
    finally:
        await nc.close()
    assert (await run_cg(kind, "ls", "foo", url=url)).ok().out == f"{kind} consumer groups: []\n"
    r = (await run_cg(kind, "list", "foo", "--json", url=url)).ok()
    assert json.loads(r.out) == {"stream": "foo", "kind": kind, "groups": []}


async def test_ls_of_no_stream_is_an_error_unless_groups_are_defined_under_that_name(nats_server, js, uniq):
    url = nats_server.url
    assert_cli_error(await run_cg("elastic", "ls", f"{uniq}NO", url=url), f"stream {uniq}NO does not exist")
    parts = [f"{uniq}P{i}" for i in range(2)]
    for i, name in enumerate(parts):
        await make_stream(js, name, subjects=[f"{uniq}.p{i}.>"])
    (
        await run_cg("elastic", "create", f"{uniq}LOGS", "shipper", "2", "--partition-stream", ",".join(parts), url=url)
    ).ok()
    r = (await run_cg("elastic", "ls", f"{uniq}LOGS", url=url)).ok()  # no stream, yet a group's name
    assert r.out == "elastic consumer groups: [shipper]\n"


async def test_membership_changes_under_automatic_membership_warn(nats_server, nc, js, uniq):
    from pcgroups import ConsumerConfig, create_elastic, elastic_consume

    url = nats_server.url
    await make_stream(js, uniq)
    await create_elastic(nc, uniq, "auto", 4)
    inst = await elastic_consume(nc, uniq, "auto", None, lambda msg: None, auto=True, config=ConsumerConfig(ack_wait=2))
    try:
        await inst.wait_settled(10)
        r = await run_cg("elastic", "add", uniq, "auto", "m9", "--sticky", url=url)
        assert r.code == 0, r.err
        assert "runs with automatic membership (1 live instance): the next rebalance rewrites this change" in r.err
    finally:
        await inst.stop()


async def test_a_membership_change_in_a_terminal_shows_before_after_and_what_moved(nats_server, js, uniq):
    url = nats_server.url
    await make_stream(js, uniq)
    (await run_cg("elastic", "create", uniq, "g", "6", url=url)).ok()
    (await run_cg("elastic", "add", uniq, "g", "e1", "e2", url=url)).ok()
    r = (await acg("elastic", "add", uniq, "g", "e3", env=cg_env(url, CG_PRETTY="1", COLUMNS="80"))).ok()
    assert "added members" not in r.out  # the terminal's summary, not the reference's line
    assert "members  e1 e2 -> e1 e2 e3" in r.out and "moved    3 of 6 partitions" in r.out
    rows = {tuple(line.split()) for line in r.out.splitlines()}
    assert ("e1", "e2", "2") in rows and ("e2", "e3", "4-5") in rows
    r = (await acg("elastic", "drop", uniq, "g", "e1", env=cg_env(url, CG_PRETTY="1"))).ok()
    assert "keep running, waiting to be added again" in r.out
    r = await acg("elastic", "delete-mapping", uniq, "g", env=cg_env(url, CG_PRETTY="1"))
    assert_cli_error(
        r,
        f"has no member mappings to delete: its members were given with add (e2 e3); drop them with "
        f"cg elastic drop {uniq} g e2 e3",
    )  # and nothing changed:
    assert "e2 e3" in (await acg("elastic", "info", uniq, "g", env=cg_env(url))).ok().out
    (await acg("elastic", "drop", uniq, "g", "e2", "e3", env=cg_env(url))).ok()
    r = (await acg("elastic", "create-mapping", uniq, "g", "a:0,1,2", "b:3,4,5", env=cg_env(url))).ok()
    assert r.out == "member mapping: [{Member:a Partitions:[0 1 2]} {Member:b Partitions:[3 4 5]}]\n"
    r = (await acg("elastic", "delete-mapping", uniq, "g", env=cg_env(url, CG_PRETTY="1"))).ok()
    assert "the group has no members now" in r.out and "a b -> none" in r.out
    assert (await acg("elastic", "delete-mapping", uniq, "g", env=cg_env(url))).ok().out == ""  # the reference's


async def test_leaving_a_group_with_no_member_warns_that_messages_queue_up(nats_server, js, uniq):
    url = nats_server.url
    await make_stream(js, uniq)
    (await run_cg("elastic", "create", uniq, "g", "4", url=url)).ok()
    (await run_cg("elastic", "add", uniq, "g", "m1", "m2", url=url)).ok()
    warning = (
        f"cg: warning: elastic consumer group g has no members now: its messages queue up in work queue "
        f"{uniq}-g (up to its limits) until cg elastic add or create-mapping\n"
    )
    r = (await run_cg("elastic", "drop", uniq, "g", "m1", url=url)).ok()
    assert r.err == "" and r.out == "dropped members: [m2]\n"  # m2 still consumes
    r = (await run_cg("elastic", "drop", uniq, "g", "m2", url=url)).ok()
    assert r.err == warning and r.out == "dropped members: []\n"
    (await run_cg("elastic", "create-mapping", uniq, "g", "m1:0-3", url=url)).ok()
    r = (await run_cg("elastic", "delete-mapping", uniq, "g", url=url)).ok()
    assert r.err == warning
    r = (await acg("elastic", "add", uniq, "g", "m1", env=cg_env(url, CG_PRETTY="1"))).ok()
    r = (await acg("elastic", "drop", uniq, "g", "m1", env=cg_env(url, CG_PRETTY="1"))).ok()
    assert r.err == warning and "members  m1 -> none" in r.out  # a terminal: the summary too


async def test_a_reset_to_a_time_in_the_future_warns(nats_server, js, static_stream):
    s, url = static_stream, nats_server.url
    (await run_cg("static", "create", "balanced", s, "g", "4", "m1", url=url)).ok()
    for i in range(3):
        await js.publish(f"{s}.{i}", b"x")
    r = (await run_cg("static", "reset", s, "g", "--to-time", "2999-01-01T00:00:00Z", url=url)).ok()
    assert r.err.splitlines()[0] == (
        "cg: warning: --to-time 2999-01-01T00:00:00Z is in the future: no message is at "
        "or after it, so this skips everything pending, as --to-latest does"
    ), r.err
    r = (await run_cg("static", "reset", s, "g", "--to-time", "2001-01-01T00:00:00Z", url=url)).ok()
    assert "warning" not in r.err, r.err


@pytest.mark.parametrize("kind", ["static", "elastic"])
async def test_deleting_the_group_under_a_handler_does_not_promise_a_redelivery(nats_server, nc, js, uniq, kind):
    """The handler's ack finds no consumer because the group is gone: its line says so, not the reference's
    "it will be or may already have been re-delivered" (the handler ends within the stop's drain, AckWait)."""
    from pcgroups import delete_elastic, delete_static

    url = nats_server.url
    if kind == "static":
        await make_stream(js, uniq, transform=partition_transform(uniq, 4))
        (await run_cg("static", "create", "balanced", uniq, "g", "4", "m1", url=url)).ok()
    else:
        await make_stream(js, uniq)
        (await run_cg("elastic", "create", uniq, "g", "4", url=url)).ok()
        (await run_cg("elastic", "add", uniq, "g", "m1", url=url)).ok()
    async with procs() as start:
        p = await start(kind, "consume", uniq, "g", "m1", "--sleep", "1500ms", url=url)
        await p.wait_text("consuming...")
        await js.publish(f"{uniq}.1", b"x")
        await p.wait_text("Processing for 1.5s ... ")
        await (delete_static if kind == "static" else delete_elastic)(nc, uniq, "g")
        r = await p.wait(15)
    assert r.code == 0, r.err
    [line] = message_lines(r.out)
    assert line["end"] == "not acked: the group was deleted", r.out
    assert "re-delivered" not in r.out + r.err
    assert r.err.splitlines()[-1] == f"{kind} consumer group g on stream {uniq} was deleted"


@pytest.mark.parametrize("kind", ["static", "elastic"])
async def test_the_stream_deleted_under_a_group_is_named_with_the_way_out(nats_server, js, uniq, kind):
    """``nats str rm`` of a static group's stream (or an elastic group's work queue) under a running member:
    the error has a line of its own, names the stream and says how to recover; so do status, info, consume
    and reset afterwards; and delete, the way out, works."""
    url = nats_server.url
    if kind == "static":
        await make_stream(js, uniq, transform=partition_transform(uniq, 4))
        (await run_cg("static", "create", "balanced", uniq, "g", "4", "m1", url=url)).ok()
        gone, said = (
            uniq,
            (
                f"the stream {uniq} of static consumer group g was deleted: delete the group "
                f"(cg static delete {uniq} g), then create the stream and the group again"
            ),
        )
    else:
        await make_stream(js, uniq)
        (await run_cg("elastic", "create", uniq, "g", "4", url=url)).ok()
        (await run_cg("elastic", "add", uniq, "g", "m1", url=url)).ok()
        gone, said = (
            f"{uniq}-g",
            (
                f"the work queue {uniq}-g of elastic consumer group g was deleted: delete the "
                f"group (cg elastic delete {uniq} g), then create it again"
            ),
        )
    async with procs() as start:
        p = await start(kind, "consume", uniq, "g", "m1", "--sleep", "2s", url=url)
        await p.wait_text("consuming...")
        await js.publish(f"{uniq}.1", b"x")
        await p.wait_text("Processing for 2s ... ")
        await js.delete_stream(gone)
        r = await p.wait(15)
    assert r.code == 1 and r.out.endswith("Processing for 2s ... \n"), r.out  # the open line ended
    assert r.err.splitlines()[-1] == f"cg: error: {said}", r.err
    for argv in (
        ["status", uniq, "g"],
        ["info", uniq, "g"],
        ["consume", uniq, "g", "m1"],
        ["reset", uniq, "g", "--to-latest"],
    ):
        assert_cli_error(await run_cg(kind, *argv, url=url), said)
    (await run_cg(kind, "delete", uniq, "g", "-f", url=url)).ok()
    assert_cli_error(await run_cg(kind, "info", uniq, "g", url=url), "not found")


# ---------------------------------------------------------------- a dropped member's instance


async def test_a_dropped_members_instance_says_so_and_waits_to_be_added_again(nats_server, js, uniq):
    url = nats_server.url
    await make_stream(js, uniq)
    (await run_cg("elastic", "create", uniq, "g", "2", "--filter", f"{uniq}.*", url=url)).ok()

    async def handled(p, n: int) -> None:
        await p.wait_output(lambda o: o.count("acked\n") >= n, what=f"{n} acked")

    async with procs() as start:
        p = await start("elastic", "consume", uniq, "g", "m1", "--sleep", "1ms", url=url)
        await p.wait_text("consuming...\n")
        (await run_cg("elastic", "add", uniq, "g", "m1", url=url)).ok()
        await js.publish(f"{uniq}.a", b"1")
        await handled(p, 1)
        (await run_cg("elastic", "drop", uniq, "g", "m1", url=url)).ok()

        async def no_consumer() -> bool:
            return [c.name async for c in _consumers(js, f"{uniq}-g")] == []

        await wait_for(no_consumer, 15, what="m1's consumer released")
        assert p.proc.returncode is None  # still running, idle
        (await run_cg("elastic", "add", uniq, "g", "m1", url=url)).ok()
        await js.publish(f"{uniq}.b", b"2")
        await handled(p, 2)  # back to work without a restart
        (await acg("elastic", "delete", uniq, "g", "-f", url=url)).ok()
        res = await p.wait(timeout=15)
    assert res.code == 0
    notes = res.err.splitlines()
    assert notes == [
        f"[m1] not a member of the group yet: waiting to be added (cg elastic add {uniq} g m1)",
        "[m1] added to the group: partitions 0-1",
        "[m1] pinned: partitions 0-1",
        "[m1] dropped from the group: this instance keeps running, waiting to be added again (Ctrl-C to stop it)",
        "[m1] added to the group: partitions 0-1",
        "[m1] pinned: partitions 0-1",
        f"elastic consumer group g on stream {uniq} was deleted",
    ], res.err
    assert res.out.splitlines()[0] == "consuming..." and len(message_lines(res.out)) == 2


async def _consumers(js, stream: str):
    for info in await js.consumers_info(stream):
        yield info


# ---------------------------------------------------------------- the traffic script


@pytest.mark.parametrize("count,to", [(10, "acme.<0..9>"), (1, "acme.0"), (250, "acme.<0..99>")])
async def test_traffic_names_the_subjects_it_published_to(nats_server, js, uniq, count, to):
    await make_stream(js, uniq, subjects=[f"{uniq}.*.*"])
    r = (
        await acg(
            "tools",
            "traffic",
            "--stream",
            uniq,
            "--subject",
            f"{uniq}.acme",
            "--count",
            str(count),
            "--sleep",
            "0s",
            url=nats_server.url,
        )
    ).ok()
    assert r.out.startswith(f"published {count} messages to {uniq}.{to} (stream {uniq}) in "), r.out


async def test_clean_deletes_pcgroups_buckets_only_when_they_hold_nothing(fresh_server, uniq):
    """``cg tools clean``: a bucket holding a group or a live lease is kept, said with the way out; once the
    groups are deleted and the instances stopped (delete takes their empty dead-letter streams with them), the three
    KV streams go, and nothing else."""
    url = fresh_server.url
    nc = await nats.connect(url)
    js = nc.jetstream()

    async def streams() -> list[str]:
        return sorted(s.config.name for s in await js.streams_info())

    try:
        await make_stream(js, uniq, transform=partition_transform(uniq, 2))
        (await run_cg("static", "create", "balanced", uniq, "sg", "2", "m1", url=url)).ok()
        (await run_cg("elastic", "create", uniq, "eg", "2", "--filter", f"{uniq}.*", url=url)).ok()
        async with procs() as start:
            auto = await start("elastic", "consume", uniq, "eg", "--auto", url=url)
            await auto.wait_text("consuming...", timeout=20)
            r = (await acg("tools", "clean", url=url)).ok()
            assert r.out == ""
            assert r.err.splitlines() == [
                f"cg: warning: KV bucket static-consumer-groups kept: it holds static groups ({uniq}.sg); delete "
                f"them first: cg static delete {uniq} sg ...",
                f"cg: warning: KV bucket elastic-consumer-groups kept: it holds elastic groups ({uniq}.eg); delete "
                f"them first: cg elastic delete {uniq} eg ...",
                r.err.splitlines()[-1],
            ]
            assert r.err.splitlines()[-1].startswith(
                "cg: warning: KV bucket pcgroups-leases kept: it holds the leases of running --auto instances ("
            )
            (await run_cg("static", "delete", uniq, "sg", "-f", url=url)).ok()
            (await run_cg("elastic", "delete", uniq, "eg", "-f", url=url)).ok()
            assert (await auto.wait(20)).code == 0
        assert "KV_pcgroups-leases" in await streams()
        r = (await acg("tools", "clean", url=url)).ok()
        assert (r.out, r.err) == (
            "KV bucket static-consumer-groups deleted (stream KV_static-consumer-groups)\n"
            "KV bucket elastic-consumer-groups deleted (stream KV_elastic-consumer-groups)\n"
            "KV bucket pcgroups-leases deleted (stream KV_pcgroups-leases)\n",
            "",
        )
        assert await streams() == [uniq]
        assert (await acg("tools", "clean", url=url)).ok().out == "no pcgroups KV bucket to delete\n"
    finally:
        await nc.close()


async def test_traffic_keeps_going_through_a_server_restart(fresh_server, uniq):
    import nats

    url = fresh_server.url
    nc = await nats.connect(url)
    try:
        await make_stream(nc.jetstream(), uniq)
    finally:
        await nc.close()
    proc = await asyncio.create_subprocess_exec(
        str(SCRIPTS / "generate_traffic.sh"),
        "--stream",
        uniq,
        "--count",
        "400",
        "--sleep",
        "5ms",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=cg_env(url),
    )
    try:

        async def count() -> int:
            c = await nats.connect(url, max_reconnect_attempts=1)
            try:
                return (await c.jetstream().stream_info(uniq)).state.messages
            finally:
                await c.close()

        async def some() -> bool:
            return await count() >= 50

        await wait_for(some, 20, what="the first publishes")
        await asyncio.to_thread(fresh_server.restart)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err
    summary = re.fullmatch(
        r"published 400 messages to \S+\.<0\.\.99> \(stream \S+\) in ([0-9.]+)s, (\d+)/s "
        r"\(each publish waits for its ack, then a 5ms pause\)(, \d+ publishes retried)?\n",
        out.decode(),
    )
    assert summary, out
    seconds = float(summary[1])  # printed to 0.1 s: the rate was computed from the exact time
    assert 400 / (seconds + 0.05) - 1 <= int(summary[2]) <= 400 / (seconds - 0.05) + 1  # the rate is the one measured
    assert "lost the connection" in err.decode() and "reconnected after" in err.decode()
    assert await count() == 400  # nothing lost, nothing twice


# ---------------------------------------------------------------- the README's walk-through


#: The README sections that run in order on one server, every code block of each (streams foo, bar, SHOP,
#: ORDERS, PAYMENTS, REFUNDS, LOGS_*; the clean-up removes them all), then the library's example.
WALKTHROUGH = (
    "## The CLI, step by step",
    "### Key-level concurrency from the CLI",
    "### A worker pool from the CLI: fair sharding across processes",
    "### Dead letters from the CLI",
    "### Groups over several streams",
    "### Replay and skip",
    "### Clean up",
    "### As a `nats` CLI plugin",
)


def _blocks(text: str, heading: str) -> list[str]:
    """The shell code blocks of a README section (up to the next heading)."""
    section = text.split(heading + "\n", 1)[1]
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]
    return [block.split("\n", 1)[1] for block in section.split("```")[1::2] if not block.startswith("python")]


def _walkthrough() -> list[tuple[str, str]]:
    """(section, command) for every command of :data:`WALKTHROUGH`'s blocks, comments dropped; not the server
    (the fixture's), the connection example, or the nats CLI's (not installed here)."""
    from tests.helpers.cli import ROOT

    text = (ROOT / "README.md").read_text()
    commands = []
    for heading in WALKTHROUGH:
        for block in _blocks(text, heading):
            for line in block.splitlines():
                line = line.split(" # ", 1)[0].strip()
                if line.startswith(("cg ", "scripts/", "for ", "kill ")) and "--server" not in line:
                    commands.append((heading, line))
    return commands


def _instance(argv: list[str]) -> bool:
    """A member instance or a worker (``cg static --sleep 200ms worker ...`` too)."""
    return bool({"consume", "worker"} & set(argv[:5]))


def _long_running(command: str) -> bool:
    """What a reader starts in a terminal of its own (or with ``&``): instances and open-ended traffic."""
    argv = command.rstrip("&").split()
    return (
        command.endswith("&")
        or _instance(argv)
        or "generate_traffic" in argv[0]
        or (argv[:3] == ["cg", "tools", "traffic"] and "--count" not in argv)
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_readme_runs_top_to_bottom_on_one_server(fresh_server):
    """Every command of the walk-throughs, in order, on one fresh server: the long-running ones (consume, the
    traffic) started in the background as a reader would in other terminals, the others through a shell
    (loops, ``$(...)``) and must exit 0 without an error line; the clean-up leaves no stream behind; then the
    library's example runs on what is left, handles messages and ends cleanly on Ctrl-C."""
    import shlex

    from tests.helpers.cli import CG_BIN, ROOT, Proc

    commands = _walkthrough()
    sections = [heading for heading, _ in commands]
    assert all(heading in sections for heading in WALKTHROUGH[:-1]), sections  # the plugin's: nats only
    assert any("SHOP" in c for _, c in commands) and any("REFUNDS" in c for _, c in commands)
    assert commands[-2][1].startswith("cg tools stream-rm foo bar SHOP ORDERS"), commands[-2]
    assert commands[-1][1] == "cg tools clean", commands[-1]
    env = cg_env(fresh_server.url, CG=str(CG_BIN), PATH=f"{CG_BIN.parent}{os.pathsep}{os.environ['PATH']}")
    instances: list[Proc] = []
    traffic: list[asyncio.subprocess.Process] = []
    jobs: list[Proc | asyncio.subprocess.Process] = []  # started with &, in order: `kill %1` stops the last one
    dead_lettered = False  # an instance said so: a reader lists the dead letters after seeing that line

    async def stop(p: asyncio.subprocess.Process) -> None:
        if p.returncode is None:
            p.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(p.wait(), 10)
            except TimeoutError:
                p.kill()
                await p.wait()

    try:
        for heading, command in commands:
            if heading == "### Clean up" and traffic:  # as the README says: the traffic stopped first
                for p in traffic:
                    await stop(p)
                traffic.clear()
            if command.startswith("kill %"):
                job = jobs.pop()
                if isinstance(job, Proc):
                    job.signal(signal.SIGINT)
                    assert (await job.wait(15)).code == 0, command
                else:
                    traffic.remove(job)
                    await stop(job)
                continue
            if " dead-letters " in command and not dead_lettered:
                await wait_for(lambda: any("dead-lettered" in p.out for p in instances), 30, what="a dead letter")
                dead_lettered = True
            if _long_running(command):
                argv = shlex.split(command.rstrip("&"))
                if _instance(argv):
                    proc = await Proc(*argv[1:], env=env).start()
                    instances.append(proc)
                    if command.endswith("&"):
                        jobs.append(proc)
                    await proc.wait_text("consuming...\n", timeout=20)
                    continue
                if argv[0].startswith("scripts/"):
                    argv[0] = str(ROOT / argv[0])
                traffic.append(
                    await asyncio.create_subprocess_exec(
                        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, env=env, cwd=ROOT
                    )
                )
                if command.endswith("&"):
                    jobs.append(traffic[-1])
                continue
            p = await asyncio.create_subprocess_exec(
                "bash",
                "-c",
                command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                cwd=ROOT,
            )
            try:
                out, err = await asyncio.wait_for(p.communicate(b"y\n"), 60)
            except TimeoutError:
                p.kill()
                raise AssertionError(f"{command!r} did not end within 60 s") from None
            assert p.returncode == 0, (command, out.decode(), err.decode())
            assert b"cg: error" not in err, (command, err.decode())
        r = await acg("tools", "stream-rm", "foo", env=env)
        assert r.code == 1 and r.err == "cg: error: no stream foo\n", r.err  # the clean-up removed them
        nc = await nats.connect(fresh_server.url)
        try:
            assert [s.config.name for s in await nc.jetstream().streams_info()] == []  # the KV buckets too
        finally:
            await nc.close()
        await _the_library_example(fresh_server.url, env)
    finally:
        for p in traffic:
            await stop(p)
        for proc in instances:
            await proc.close()


async def _the_library_example(url: str, env: dict) -> None:
    """README's library example, as written (its URL the test server's): it consumes, prints each message and
    ends on Ctrl-C without a traceback."""
    import sys
    import tempfile

    from tests.helpers.cli import ROOT

    text = (ROOT / "README.md").read_text()
    code = text.split("## The library\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    assert "nats://127.0.0.1:4222" in code
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code.replace("nats://127.0.0.1:4222", url))
    p = await asyncio.create_subprocess_exec(
        sys.executable,
        f.name,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**env, "PYTHONUNBUFFERED": "1"},
    )  # its lines as a terminal shows them
    try:
        line = await asyncio.wait_for(p.stdout.readline(), 20)
        assert line == b"consuming invoices.* (Ctrl-C to stop)\n", (line, await _stderr_of(p))
        (
            await acg(
                "tools",
                "traffic",
                "--stream",
                "invoices",
                "--subject",
                "invoices",
                "--count",
                "3",
                "--size",
                "2",
                env=env,
            )
        ).ok()
        handled = [await asyncio.wait_for(p.stdout.readline(), 15) for _ in range(3)]
        assert sorted(h.split()[1] for h in handled) == [b"invoices.0", b"invoices.1", b"invoices.2"], handled
        p.send_signal(signal.SIGINT)
        _rest, err = await asyncio.wait_for(p.communicate(), 15)
    finally:
        os.unlink(f.name)
        if p.returncode is None:
            p.kill()
            await p.wait()
    assert p.returncode == 0 and err == b"", err.decode()


async def _stderr_of(p: asyncio.subprocess.Process) -> str:
    """What a process that went wrong said (it is ended first if it still runs)."""
    if p.returncode is None:
        p.kill()
        await p.wait()
    return (await p.stderr.read()).decode() if p.stderr else ""
