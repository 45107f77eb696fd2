"""``cg ... consume`` says what its instance is doing, black-box through the real ``cg``:

- two instances of m1: one says it is pinned, the other that it is a standby; a step-down swaps them;
- a status line never lands inside a message line (written in two parts around the processing), in a
  terminal (status lines on stdout) as in a pipe (stdout keeps only the reference's lines).

``CG_PRETTY=1`` stands for a terminal: status lines go to stdout, which the test reads as it comes.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import signal

import pytest

from tests.helpers.cli import MSG_LINE, cg_env, make_stream, message_lines, partition_transform, procs, run_cg

STATUS = re.compile(
    r"^\[m\d\] (pinned|standby|lost the pin|not a member|added|partitions now|dropped|"
    r"disconnected|reconnected)\b"
)


def statuses(text: str) -> list[str]:
    return [line for line in text.splitlines() if STATUS.match(line)]


def last_state(text: str) -> str | None:
    said = [s.split()[1].rstrip(":") for s in statuses(text) if re.match(r"^\[m1\] (pinned|standby|lost)", s)]
    return said[-1] if said else None


async def test_two_instances_of_a_member_say_pinned_and_standby_and_swap_on_step_down(nats_server, js, uniq):
    url = nats_server.url
    await make_stream(js, uniq, transform=partition_transform(uniq, 2))
    (await run_cg("static", "create", "balanced", uniq, "g", "2", "m1", url=url)).ok()
    env = cg_env(url, CG_PRETTY="1", COLUMNS="80")
    async with procs() as start:
        a = await start("static", "consume", uniq, "g", "m1", env=env)
        await a.wait_text("consuming...\n")
        b = await start("static", "consume", uniq, "g", "m1", env=env)
        await b.wait_text("consuming...\n")
        await js.publish(f"{uniq}.first", b"x")  # the server gives the pin with a message
        await a.wait_output(lambda o: "acked" in o + b.out, what="the first message handled")
        pinned, standby = (a, b) if message_lines(a.out) else (b, a)
        await pinned.wait_text("[m1] pinned: partitions 0-1\n")
        await standby.wait_text("[m1] standby: another instance of m1 holds the pin\n")
        # A step-down unpins; the server gives the pin to the pull that waits longest: the standby's.
        # Should it come back to the same instance, step down again.
        for attempt in range(5):
            (await run_cg("static", "step-down", uniq, "g", "m1", url=url)).ok()
            await js.publish(f"{uniq}.after{attempt}", b"x")
            await asyncio.sleep(0)
            try:
                await standby.wait_output(lambda o: last_state(o) == "pinned", timeout=4, what="the swap")
                break
            except AssertionError:
                continue
        await pinned.wait_output(lambda o: last_state(o) == "standby", timeout=10, what="the old holder standby")
        for p in (a, b):
            p.signal(signal.SIGINT)
        done = [await p.wait(timeout=15) for p in (a, b)]
    assert all(r.code == 0 for r in done)
    old, new = statuses(pinned.out), statuses(standby.out)
    assert old[0] == "[m1] pinned: partitions 0-1" and "[m1] lost the pin: another instance of it took over" in old
    assert old[-1] == "[m1] standby: another instance of m1 holds the pin"
    assert new[0] == "[m1] standby: another instance of m1 holds the pin" and new[-1] == "[m1] pinned: partitions 0-1"
    for said in (old, new):
        assert all(x != y for x, y in itertools.pairwise(said)), said  # once per change
        assert all(len(line) <= 80 for line in said)


@pytest.mark.parametrize("where", ["pipe", "terminal"])
async def test_status_lines_never_split_a_message_line(nats_server, js, uniq, where):
    """Membership changes and step-downs while every message is processed for 30 ms: each stdout line is
    whole (a pipe's stdout has only the reference's lines; a terminal's also the status lines)."""
    url = nats_server.url
    await make_stream(js, uniq)
    (await run_cg("elastic", "create", uniq, "g", "4", "--filter", f"{uniq}.*", url=url)).ok()
    env = cg_env(url, CG_PRETTY="1" if where == "terminal" else "0", COLUMNS="200")
    async with procs() as start:
        p = await start("elastic", "consume", uniq, "g", "m1", "--sleep", "30ms", env=env)
        await p.wait_text("consuming...\n")
        (await run_cg("elastic", "add", uniq, "g", "m1", url=url)).ok()
        for round_ in range(4):
            for i in range(8):
                await js.publish(f"{uniq}.k{round_}{i}", b"x")
            await p.wait_output(lambda o: "Processing" in o.rsplit("\n", 1)[-1], what="a message line open")
            change = (
                ("add", uniq, "g", "m2"),
                ("drop", uniq, "g", "m2"),
                ("step-down", uniq, "g", "m1"),
                ("add", uniq, "g", "m3"),
            )[round_]
            (await run_cg("elastic", *change, url=url)).ok()
        (await run_cg("elastic", "drop", uniq, "g", "m3", url=url)).ok()  # m1 owns every partition again
        await p.wait_output(lambda o: o.count("acked\n") == 32, timeout=30, what="32 acked")
        p.signal(signal.SIGINT)
        res = await p.wait(timeout=15)
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    reference = [line for line in lines if line == "consuming..." or MSG_LINE.match(line)]
    said = statuses(res.out) if where == "terminal" else statuses(res.err)
    assert len(message_lines(res.out)) == 32 and all(m["end"] == "acked" for m in message_lines(res.out))
    if where == "pipe":
        assert lines == reference  # the reference's lines only, each whole
        assert statuses(res.out) == []
    else:
        assert sorted(lines) == sorted(reference + said)  # nothing else, nothing cut
    assert "[m1] pinned: partitions 0-3" in said
    assert "[m1] partitions now 0-1" in said and "[m1] partitions now 0-3" in said


def test_the_printer_holds_status_lines_until_the_message_line_ends(capsys):
    """Server-free: the printer's own rule, for both destinations of status lines."""
    from cg.consume import Printer

    for on_stdout in (True, False):
        p = Printer(status_on_stdout=on_stdout)
        p.expect_header(["consuming..."])
        p.status("[m1] not a member of the group yet")  # before consuming...: waits for it
        p.announce()
        p.ready()
        p.begin("[m1] subject=a, seq=1, pinnedID=x. Processing for 1s ... ")
        p.status("[m1] partitions now 0-1")
        p.line("consuming...")  # a reference line waits as well
        out, err = capsys.readouterr()
        early = ["[m1] not a member of the group yet"]
        assert (
            out
            == "\n".join(["consuming...", *(early if on_stdout else [])])
            + "\n[m1] subject=a, seq=1, pinnedID=x. Processing for 1s ... "
        )
        p.end("acked")
        out2, err2 = capsys.readouterr()
        if on_stdout:
            assert (err, out2, err2) == ("", "acked\n[m1] partitions now 0-1\nconsuming...\n", "")
        else:
            assert (err, out2, err2) == (early[0] + "\n", "acked\nconsuming...\n", "[m1] partitions now 0-1\n")


def test_a_line_said_at_once_cuts_an_open_message_line_on_a_terminal_only(capsys):
    """Server-free: what a first Ctrl-C says goes out at once; on a terminal the open message line ends first
    and comes again whole with its end; in a pipe stdout keeps the reference's line as it is."""
    from cg.consume import Printer

    for on_stdout in (True, False):
        p = Printer(status_on_stdout=on_stdout)
        p.ready()
        p.begin("[m1] subject=a, seq=1, pinnedID=x. Processing for 10s ... ")
        p.interrupt("cg: stopping")
        out, err = capsys.readouterr()
        assert err == "cg: stopping\n"
        p.end("acked")
        out2, _ = capsys.readouterr()
        head = "[m1] subject=a, seq=1, pinnedID=x. Processing for 10s ... "
        assert out + out2 == (f"{head}\n{head}acked\n" if on_stdout else f"{head}acked\n")


def test_consuming_comes_before_a_message_handled_before_the_ready_check_ended(capsys):
    from cg.consume import Printer

    p = Printer(status_on_stdout=False)
    p.expect_header(["consuming..."])
    p.begin("[m1] subject=a, seq=1, pinnedID=x. Processing for 1m0s ... ")  # a long handler, started at once
    p.announce()  # the ready check ends meanwhile
    assert capsys.readouterr().out == "consuming...\n[m1] subject=a, seq=1, pinnedID=x. Processing for 1m0s ... "


def pin_state(text: str, member: str) -> str | None:
    said = [s.split()[1].rstrip(":") for s in statuses(text) if re.match(rf"^\[{member}\] (pinned|standby|lost)", s)]
    return said[-1] if said else None


async def test_a_plain_and_a_concurrent_instance_of_a_member_say_standby_and_lost_pin(nats_server, js, uniq):
    """An elastic member run once with ``--concurrency 8`` and once without: the second says standby, and
    each hand-over is said by both (the one that loses the pin says so), whichever flags each has."""
    url = nats_server.url
    await make_stream(js, uniq)
    (await run_cg("elastic", "create", uniq, "g", "4", "--filter", f"{uniq}.*", url=url)).ok()
    (await run_cg("elastic", "add", uniq, "g", "m2", url=url)).ok()
    env = cg_env(url, CG_PRETTY="1", COLUMNS="80")
    async with procs() as start:
        a = await start("elastic", "consume", uniq, "g", "m2", "--concurrency", "8", env=env)
        await a.wait_text("consuming...\n")
        await js.publish(f"{uniq}.first", b"x")
        await a.wait_text("[m2] pinned: partitions 0-3\n")
        b = await start("elastic", "consume", uniq, "g", "m2", env=env)
        await b.wait_text("[m2] standby: another instance of m2 holds the pin\n", timeout=15)
        holder, other = a, b
        for swap in range(2):  # a step-down hands the pin over (should it come back, step down again)
            for attempt in range(6):
                (await run_cg("elastic", "step-down", uniq, "g", "m2", url=url)).ok()
                await js.publish(f"{uniq}.s{swap}{attempt}", b"x")
                try:
                    await other.wait_output(lambda o: pin_state(o, "m2") == "pinned", timeout=4, what="the swap")
                    break
                except AssertionError:
                    continue
            await holder.wait_output(lambda o: pin_state(o, "m2") == "standby", timeout=10, what="standby again")
            assert "[m2] lost the pin: another instance of it took over" in statuses(holder.out)
            holder, other = other, holder
        for p in (a, b):
            p.signal(signal.SIGINT)
        done = [await p.wait(timeout=15) for p in (a, b)]
    assert all(r.code == 0 for r in done), [r.err for r in done]
    # the plain one works by the consumer the concurrent one made, and says so once, as it starts
    assert [line for line in done[1].err.splitlines() if "warning" in line] == [
        "cg: warning: member m2's consumer: max_ack_pending 16384, this instance asked 1: this instance uses the "
        "consumer as another instance of m2 made it (the member's instances share it; stop them all to change it)"
    ]
    assert "warning" not in done[0].err


async def test_pinned_comes_before_the_first_message_line_in_a_terminal(nats_server, js, uniq):
    """Messages wait when the instance starts, so the first is handled at once: ``[m1] pinned`` still comes
    before its line (after ``consuming...``), start after start."""
    url = nats_server.url
    await make_stream(js, uniq)
    env = cg_env(url, CG_PRETTY="1", COLUMNS="80")
    for start_ in range(4):  # a group each: a stopped instance's pin outlives it for a PinnedTTL
        group = f"g{start_}"
        (await run_cg("elastic", "create", uniq, group, "2", "--filter", f"{uniq}.*", url=url)).ok()
        (await run_cg("elastic", "add", uniq, group, "m1", url=url)).ok()
        for i in range(3):
            await js.publish(f"{uniq}.k{start_}{i}", b"x")
        async with procs() as start:
            p = await start("elastic", "consume", uniq, group, "m1", env=env)
            await p.wait_output(lambda o: o.count("acked\n") == 3, what="3 acked")
            p.signal(signal.SIGINT)
            res = await p.wait(timeout=15)
        assert res.code == 0, res.err
        lines = res.out.splitlines()
        first = next(i for i, line in enumerate(lines) if MSG_LINE.match(line))
        assert lines[:first] == ["consuming...", "[m1] pinned: partitions 0-1"], lines


async def test_not_a_member_fits_80_columns_with_the_command_whole(nats_server, js, uniq):
    """In an 80-column terminal the status line wraps before the command to run, never inside it."""
    url = nats_server.url
    await make_stream(js, uniq)
    (await run_cg("elastic", "create", uniq, "g", "2", "--filter", f"{uniq}.*", url=url)).ok()
    async with procs() as start:
        p = await start("elastic", "consume", uniq, "g", "m1", env=cg_env(url, CG_PRETTY="1", COLUMNS="80"))
        await p.wait_text(f"(cg elastic add {uniq} g m1)\n")
        p.signal(signal.SIGINT)
        res = await p.wait(timeout=15)
    assert res.code == 0, res.err
    assert f"[m1] not a member of the group yet: waiting to be added\n    (cg elastic add {uniq} g m1)\n" in res.out
    assert all(len(line) <= 80 for line in res.out.splitlines()), res.out


def test_status_lines_wrap_around_a_command_and_only_split_one_wider_than_a_line():
    from cg.consume import wrap_status

    said = wrap_status("[m1] not a member of the group yet: waiting to be added (cg elastic add bar cg m1)", 79)
    assert said.splitlines() == [
        "[m1] not a member of the group yet: waiting to be added",
        "    (cg elastic add bar cg m1)",
    ]
    long = (
        "[m1] not a member of the group yet: waiting to be added (cg elastic add " + "s" * 40 + " " + "g" * 30 + " m1)"
    )
    assert all(len(line) <= 79 for line in wrap_status(long, 79).splitlines())
    assert wrap_status("[m1] pinned: partitions 0-3", 79) == "[m1] pinned: partitions 0-3"


async def test_a_call_frozen_past_its_pin_says_superseded_not_acked(nats_server, js, uniq):
    """A pinned instance stopped (SIGSTOP) in the middle of a call for longer than PinnedTTL: the standby takes
    over and handles the message; once resumed, the frozen call says it was superseded and does not ack."""
    url = nats_server.url
    await make_stream(js, uniq, transform=partition_transform(uniq, 1))
    (await run_cg("static", "create", "balanced", uniq, "g", "1", "m1", url=url)).ok()
    async with procs() as start:
        a = await start("static", "--sleep", "1s", "consume", uniq, "g", "m1", url=url)
        await a.wait_text("consuming...\n")
        await js.publish(f"{uniq}.x", b"x")
        await a.wait_output(lambda o: "Processing for 1s" in o, what="the call under way")
        a.signal(signal.SIGSTOP)
        try:
            b = await start("static", "--sleep", "1s", "consume", uniq, "g", "m1", url=url)
            await b.wait_output(
                lambda o: any(m["end"] == "acked" for m in message_lines(o)),
                timeout=30,
                what="the standby took over and handled the message",
            )
        finally:
            a.signal(signal.SIGCONT)
        await a.wait_output(lambda o: "Processing for 1s ... superseded" in o, what="the frozen call's end")
        for p in (a, b):
            p.signal(signal.SIGINT)
        done = [await p.wait(timeout=15) for p in (a, b)]
    assert all(r.code == 0 for r in done), [r.err for r in done]
    [frozen] = message_lines(a.out)
    assert frozen["end"] == "superseded: another instance took over (not acked)", a.out
    assert [m["seq"] for m in message_lines(b.out)] == [frozen["seq"]]


async def test_consume_started_while_the_server_is_down_says_so_once_and_waits(fresh_server, uniq):
    """No server answers at the address: one warning line, and the instance consumes once it is back."""
    import nats

    url = fresh_server.url
    nc = await nats.connect(url)
    try:
        await make_stream(nc.jetstream(), uniq, transform=partition_transform(uniq, 2))
        await nc.jetstream().publish(f"{uniq}.a", b"before")
    finally:
        await nc.close()
    (await run_cg("static", "create", "balanced", uniq, "g", "2", "m1", url=url)).ok()
    await asyncio.to_thread(fresh_server.stop)
    async with procs() as start:
        p = await start("static", "consume", uniq, "g", "m1", url=url)
        await asyncio.sleep(0)
        err = b""
        while b"trying again" not in err:
            err += await asyncio.wait_for(p.proc.stderr.readline(), 10)
        assert p.proc.returncode is None
        await asyncio.to_thread(fresh_server.start)
        await p.wait_output(lambda o: " acked\n" in o, 20, "the message acked")
        p.signal(signal.SIGINT)
        r = await p.wait(10)
    assert r.code == 0
    said = (err.decode() + r.err).splitlines()
    assert said[0] == (
        f"cg: warning: can't connect to {url}: connection refused; trying again every 2s until "
        "it answers (Ctrl-C to stop)"
    ), said
    assert not [line for line in said[1:] if "can't connect" in line or "error" in line], said
