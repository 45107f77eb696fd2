"""A group's dead letters through the real ``cg``: ``dead-letters ls|show|replay|purge`` on entries written in the
documented format (tests/helpers/deadletters.py), ``delete``'s dead letters, and the failing handler of ``consume``
and ``worker`` (``--fail``), whose failed attempts and dead letters each say so in one line, never ``acked``.

The last tests run a member end to end: its failing messages dead-lettered and its key parked by the runtime, then
replayed into it. They need the member's side of dead letters (pcgroups.consume)."""

from __future__ import annotations

import json
import re

import pytest

from pcgroups.deadletters import LANE_REPLAY, dead_letter_stream, list_dead_letters
from pcgroups.errors import NotFoundError
from pcgroups.jetstream import JetStreamApi
from tests.helpers.cli import assert_cli_error, cg_env, make_stream, message_lines, partition_transform, procs, run_cg
from tests.helpers.deadletters import make_dead_letter_stream, write_dead_letter

from .helpers.support import wait_for

FAILED = re.compile(
    r"^\[(?P<member>[^\]]+)\] subject=(?P<subject>\S+), seq=(?P<seq>\d+), pinnedID=\S*\. "
    r"(Processing for \S+ \.\.\. )?failed: SimulatedFailure: subject (?P=subject) matches --fail (?P<pattern>\S+)$",
    re.M,
)
ACKED = re.compile(
    r"^\[(?P<member>[^\]]+)\] subject=(?P<subject>\S+), seq=(?P<seq>\d+), pinnedID=\S*\. "
    r"(Processing for \S+ \.\.\. )?acked$",
    re.M,
)
DEAD = re.compile(
    r"^\[(?P<member>[^\]]+)\] subject=(?P<subject>\S+), seq=(?P<seq>\d+) dead-lettered(: (?P<reason>.*))? "
    r"\(cg (?P<kind>\w+) dead-letters ls \S+ \S+\)$",
    re.M,
)


async def _group(nc, url: str, uniq: str) -> None:
    """Static group g on stream ``uniq`` (``<uniq>.<token>``): m1 owns partitions 0 and 1, m2 2 and 3."""
    await make_stream(nc.jetstream(), uniq, transform=partition_transform(uniq, 4))
    (await run_cg("static", "create", "mapped", uniq, "g", "4", "m1:0,1", "m2:2,3", url=url)).ok()


def m1_subjects(uniq: str, prefix: str, n: int) -> list[str]:
    """``n`` subjects ``<uniq>.<prefix><i>`` in m1's partitions."""
    from pcgroups.partitions import partition_of_subject

    subjects = (f"{uniq}.{prefix}{i}" for i in range(20 * n))
    return [s for s in subjects if partition_of_subject(s, 4, [1], f"{uniq}.*") in (0, 1)][:n]


async def _three(nc, uniq: str) -> list[int]:
    await make_dead_letter_stream(nc, "static", uniq, "g")
    return [
        await write_dead_letter(
            nc,
            "static",
            uniq,
            "g",
            partition=p,
            key=f"{uniq}.{k}",
            subject=f"{uniq}.{k}",
            origin_seq=o,
            parked=parked,
            data=data,
            headers={"Order-Id": k},
            reason="ValueError: no such order",
        )
        for p, k, o, parked, data in (
            (0, "a", 3, False, b"body of a"),
            (0, "a", 5, True, b"a again"),
            (2, "b", 9, False, b"\xff\x00"),
        )
    ]


async def test_ls_and_show_in_a_pipe_as_json_and_in_a_terminal(nats_server, nc, uniq):
    url = nats_server.url
    await _group(nc, url, uniq)
    seqs = await _three(nc, uniq)
    lines = (await run_cg("static", "dead-letters", "ls", uniq, "g", url=url)).ok().out.splitlines()
    assert lines[0].split() == [
        "SEQ",
        "LANE",
        "PARTITION",
        "KEY",
        "SUBJECT",
        "MEMBER",
        "DELIVERIES",
        "PARKED",
        "DEAD-LETTERED",
        "REASON",
    ]
    rows = [line.split(maxsplit=9) for line in lines[1:]]
    assert [(int(r[0]), r[1], r[3], r[7]) for r in rows] == [
        (seqs[0], "dead", f"{uniq}.a", "no"),
        (seqs[1], "dead", f"{uniq}.a", "yes"),
        (seqs[2], "dead", f"{uniq}.b", "no"),
    ]
    assert rows[0][-1].endswith("ValueError: no such order") and rows[1][-1].endswith("(followed its parked key)")
    listed = json.loads((await run_cg("static", "dead-letters", "ls", uniq, "g", "--json", url=url)).ok().out)
    keys = ("seq", "subject", "key", "member", "deliveries", "reason", "parked", "origin_stream", "origin_seq", "lane")
    assert {k: listed[0][k] for k in keys} == {
        "seq": seqs[0],
        "subject": f"{uniq}.a",
        "key": f"{uniq}.a",
        "member": "m1",
        "deliveries": 3,
        "reason": "ValueError: no such order",
        "parked": False,
        "origin_stream": uniq,
        "origin_seq": 3,
        "lane": "dead",
    }
    shown = (await run_cg("static", "dead-letters", "show", uniq, "g", str(seqs[0]), url=url)).ok().out
    assert "reason         ValueError: no such order\n" in shown and "headers:\n  Order-Id: a\n" in shown
    assert shown.endswith("data (9 bytes):\nbody of a\n")
    binary = json.loads(
        (await run_cg("static", "dead-letters", "show", uniq, "g", str(seqs[2]), "--json", url=url)).out
    )
    assert binary["data_base64"] == "/wA=" and binary["headers"] == {"Order-Id": "b"}
    pretty = (await _cg_env("static", "dead-letters", "ls", uniq, "g", url=url, CG_PRETTY="1", COLUMNS="80")).ok().out
    assert f"dead letters of static consumer group g on stream {uniq}: 3 dead" in pretty
    assert "ValueError: no such order" in pretty
    empty = await run_cg("static", "dead-letters", "ls", uniq, "g2", url=url)
    assert_cli_error(empty, f"static consumer group g2 on stream {uniq} does not exist, and has no dead letters")


def test_ls_in_an_80_column_terminal_keeps_every_number_whole():
    """The table drops its least telling columns rather than cut a sequence, and folds keys and reasons."""
    import io
    from datetime import UTC, datetime

    from rich.console import Console

    from cg.deadletters import entries_table
    from pcgroups.deadletters import DeadLetter

    key = "orders.customer-12345.order-777"
    entries = [
        DeadLetter(
            seq=123456789 + i,
            lane="D" if i else "R",
            partition=7,
            key=key,
            subject=key,
            member="member-one",
            deliveries=5,
            reason=f"SimulatedFailure: subject {key} matches --fail orders.>",
            parked=bool(i),
            origin_stream="ORDERS",
            origin_seq=99,
            time=datetime.now(UTC),
        )
        for i in range(2)
    ]
    for width in (80, 200):
        shown, left_out = entries_table("static", "ORDERS", "g", entries, width=width)
        buf = io.StringIO()
        Console(file=buf, width=width, color_system=None).print(shown)
        text = buf.getvalue()
        assert max(len(line) for line in text.splitlines()) <= width
        assert "123456789" in text and "123456790" in text and "replaying" in text
        assert (left_out == []) == (width == 200), left_out


async def _cg_env(*args: str, url: str, **env: str):
    from tests.helpers.cli import acg

    return await acg(*args, env=cg_env(url, **env))


async def test_replay_and_purge_print_their_plan_and_apply_it_with_execute(nats_server, nc, uniq):
    url = nats_server.url
    await _group(nc, url, uniq)
    seqs = await _three(nc, uniq)
    plan = (await run_cg("static", "dead-letters", "replay", uniq, "g", "--key", f"{uniq}.a", url=url)).ok()
    assert plan.out.splitlines() == [
        f"seq {seqs[0]}: key {uniq}.a (partition 0, member m1): {uniq}.a, origin seq 3, dead",
        f"seq {seqs[1]}: key {uniq}.a (partition 0, member m1): {uniq}.a, origin seq 5, dead",
    ]
    assert plan.err == "plan only, nothing changed (add --execute to apply): would replay 2 dead letters\n"
    assert [e.lane for e in await list_dead_letters(nc, "static", uniq, "g")] == ["D", "D", "D"]
    done = (
        await run_cg("static", "dead-letters", "replay", uniq, "g", "--key", f"{uniq}.a", "--execute", url=url)
    ).ok()
    assert done.err.startswith("done: 2 dead letters moved to lane R (replaying); one instance of m1 runs them")
    assert "(m1: no instance running: they wait until one starts)" in done.err
    after = await list_dead_letters(nc, "static", uniq, "g")
    assert [(e.key, e.lane, e.origin_seq) for e in after] == [
        (f"{uniq}.b", "D", 9),
        (f"{uniq}.a", LANE_REPLAY, 3),
        (f"{uniq}.a", LANE_REPLAY, 5),
    ]
    as_json = json.loads(
        (await run_cg("static", "dead-letters", "purge", uniq, "g", "--seq", str(seqs[2]), "--json", url=url)).ok().out
    )
    assert (as_json["action"], as_json["executed"], [e["seq"] for e in as_json["entries"]]) == (
        "purge",
        False,
        [seqs[2]],
    )
    purged = (await run_cg("static", "dead-letters", "purge", uniq, "g", "--all", "--execute", url=url)).ok()
    assert purged.err.startswith("done: deleted 3 dead letters")
    assert await list_dead_letters(nc, "static", uniq, "g") == []
    nothing = (await run_cg("static", "dead-letters", "replay", uniq, "g", "--all", url=url)).ok()
    assert nothing.out == "" and nothing.err == "nothing to replay\n"


async def test_delete_keeps_dead_letters_unless_asked_and_removes_an_empty_stream(nats_server, nc, uniq):
    url = nats_server.url
    api = JetStreamApi(nc)
    await _group(nc, url, uniq)
    await _three(nc, uniq)
    name = dead_letter_stream("static", uniq, "g")
    kept = (await run_cg("static", "delete", uniq, "g", "-f", url=url)).ok()
    assert kept.out == "" and kept.err == (
        f"cg: warning: static consumer group g's 3 dead letters are kept in stream {name} (cg static dead-letters ls "
        f"{uniq} g lists them; cg static delete {uniq} g --with-dead-letters deletes them)\n"
    )
    assert (await api.stream_info(name))["state"]["messages"] == 3
    listed = await run_cg("static", "dead-letters", "ls", uniq, "g", url=url)
    assert listed.ok().err.startswith(f"cg: warning: static consumer group g on stream {uniq} was deleted; its dead")
    assert len(listed.out.splitlines()) == 4
    again = await run_cg("static", "delete", uniq, "g", "-f", url=url)
    assert_cli_error(
        again, f"its dead-letter stream {name} is left, with 3 dead letters (--with-dead-letters deletes it)"
    )
    (await run_cg("static", "delete", uniq, "g", "-f", "--with-dead-letters", url=url)).ok()
    with pytest.raises(NotFoundError):
        await api.stream_info(name)
    (await run_cg("static", "create", "balanced", uniq, "h", "4", "m1", url=url)).ok()  # an empty one goes with it
    await make_dead_letter_stream(nc, "static", uniq, "h")
    quiet = (await run_cg("static", "delete", uniq, "h", "-f", url=url)).ok()
    assert quiet.err == ""
    with pytest.raises(NotFoundError):
        await api.stream_info(dead_letter_stream("static", uniq, "h"))
    (await run_cg("static", "create", "balanced", uniq, "w", "4", "m1", url=url)).ok()
    await make_dead_letter_stream(nc, "static", uniq, "w")
    await write_dead_letter(nc, "static", uniq, "w", partition=1, key="k", subject="k", origin_seq=1)
    pretty = (await _cg_env("static", "delete", uniq, "w", "-f", "--with-dead-letters", url=url, CG_PRETTY="1")).ok()
    assert "its instances end; its 1 dead letter deleted with it" in pretty.out


async def test_a_failing_handler_says_failed_and_dead_lettered_never_acked(nats_server, nc, uniq):
    """``--fail`` with key-level concurrency: each attempt at a matching message is a line ending ``failed:`` and
    the reason, the message given up one ``dead-lettered`` line; the other keys are acked."""
    url = nats_server.url
    await _group(nc, url, uniq)
    bad, good = m1_subjects(uniq, "bad", 2), m1_subjects(uniq, "good", 4)
    async with procs() as start:
        c = await start(
            *["static", "--sleep", "1ms", "consume", uniq, "g", "m1", "--concurrency", "2", "--max-deliver", "2"],
            *["--fail", bad[0], "--fail", f"{uniq}.bad{bad[1].rsplit('bad', 1)[1]}"],
            url=url,
        )
        await c.wait_text("consuming...")
        for s in [*bad, *good]:
            await nc.jetstream().publish(s, b"x")
        await c.wait_output(lambda o: len(DEAD.findall(o)) >= 2, 20, "the dead-lettered lines")
        await c.wait_output(lambda o: len(ACKED.findall(o)) >= 4, 10, "the others")
        out = c.out
    failed = [(m["subject"], m["pattern"]) for m in FAILED.finditer(out)]
    assert sorted(failed) == sorted([(bad[0], bad[0]), (bad[0], bad[0]), (bad[1], bad[1]), (bad[1], bad[1])])
    assert sorted(m["subject"] for m in DEAD.finditer(out)) == sorted(bad)  # --max-deliver 2: two attempts, then this
    assert all(m["kind"] == "static" for m in DEAD.finditer(out))
    assert sorted(m["subject"] for m in ACKED.finditer(out)) == sorted(good)  # never the bad ones


async def test_a_worker_that_fails_says_so_and_its_dispatcher_dead_letters(nats_server, nc, uniq):
    url = nats_server.url
    await _group(nc, url, uniq)
    bad, good = m1_subjects(uniq, "bad", 1)[0], m1_subjects(uniq, "good", 1)[0]
    async with procs() as start:
        d = await start("static", "consume", uniq, "g", "m1", "--dispatch", "--max-deliver", "2", url=url)
        await d.wait_text("consuming...")
        w = await start("static", "--sleep", "1ms", "worker", uniq, "g", "--name", "w1", "--fail", bad, url=url)
        await w.wait_text("consuming...")
        for s in (bad, good):
            await nc.jetstream().publish(s, b"x")
        await d.wait_output(lambda o: f"subject={bad}" in o and "dead-lettered" in o, 20, "the dead letter")
        await w.wait_output(lambda o: f"subject={good}" in o and "acked" in o, 20, "the good one")
        worker_out = w.out
    assert [m["subject"] for m in FAILED.finditer(worker_out)] == [bad, bad]
    assert [m["subject"] for m in ACKED.finditer(worker_out)] == [good]


# ---------------------------------------------------------------- end to end: the runtime's side too


async def test_a_failing_message_is_dead_lettered_parked_and_replayed_into_its_member(nats_server, nc, uniq):
    """The README's walk-through, checked: a strict member whose handler fails on one subject goes on with the
    others; the message is dead-lettered after --max-deliver attempts, and with --park-keys its key's later messages
    follow it, unrun; replayed into a member running without --fail, they run in their order, their entries go, and
    the key's next message runs at once."""
    url = nats_server.url
    await _group(nc, url, uniq)
    poison, others = m1_subjects(uniq, "p", 1)[0], m1_subjects(uniq, "k", 3)
    js = nc.jetstream()
    async with procs() as start:
        failing = await start(
            "static",
            "--sleep",
            "1ms",
            "consume",
            uniq,
            "g",
            "m1",
            "--fail",
            poison,
            "--max-deliver",
            "3",
            "--park-keys",
            url=url,
        )
        await failing.wait_text("consuming...")
        for i, s in enumerate([poison, *others, poison, poison]):
            await js.publish(s, f"{i}".encode())
        await failing.wait_output(lambda o: o.count("dead-lettered") >= 3, 20, "the failed message and two followers")
        assert len([m for m in FAILED.finditer(failing.out)]) == 3  # its attempts; the followers never ran
        acked = [m["subject"] for m in message_lines(failing.out) if m["end"] == "acked"]
        assert acked == others
        entries = await list_dead_letters(nc, "static", uniq, "g")
        assert [(e.key, e.parked, e.lane, e.data) for e in entries] == [
            (poison, False, "D", b"0"),
            (poison, True, "D", b"4"),
            (poison, True, "D", b"5"),
        ]
        assert entries[0].deliveries == 3 and "matches --fail" in entries[0].reason and entries[0].member == "m1"
        failing.signal(2)
        assert (await failing.wait(15)).code == 0
        fixed = await start("static", "--sleep", "1ms", "consume", uniq, "g", "m1", "--park-keys", url=url)
        await fixed.wait_text("consuming...")
        await js.publish(poison, b"6")  # still parked: it follows the others into the stream
        (await run_cg("static", "dead-letters", "replay", uniq, "g", "--key", poison, "--execute", url=url)).ok()
        await wait_for(lambda: _none_left(nc, uniq), 20, what="the replayed dead letters run and deleted")

        def handled(o: str) -> int:  # its line is printed once its ack (which deletes the entry) returned
            return sum(1 for m in message_lines(o) if m["subject"] == poison and m["end"] == "acked")

        await fixed.wait_output(lambda o: handled(o) >= 4, 5, "the four replayed messages' lines")
        assert handled(fixed.out) == 4, fixed.out
        # each replayed line shows the sequence its message had when it was dead-lettered
        dead = [m["seq"] for out in (failing.out, fixed.out) for m in DEAD.finditer(out) if m["subject"] == poison]
        replayed = [m["seq"] for m in message_lines(fixed.out) if m["subject"] == poison and m["end"] == "acked"]
        assert replayed == dead, fixed.out
        await js.publish(poison, b"7")  # no longer parked
        await fixed.wait_output(lambda o: o.count(f"subject={poison}") >= 5, 10, "the key running again")


async def _none_left(nc, uniq: str) -> bool:
    return await list_dead_letters(nc, "static", uniq, "g") == []


async def test_a_replay_runs_in_a_member_that_has_no_other_message(nats_server, nc, uniq):
    """A replay needs no traffic: the member's running instance runs what is replayed into it even when no message
    of its partitions comes (nothing else would ever give it the pin), and the dead letters leave the stream."""
    url = nats_server.url
    await _group(nc, url, uniq)
    subject = m1_subjects(uniq, "idle", 1)[0]
    await make_dead_letter_stream(nc, "static", uniq, "g")
    await write_dead_letter(
        nc, "static", uniq, "g", partition=_partition_of(uniq, subject), key=subject, subject=subject, origin_seq=1
    )
    async with procs() as start:
        idle = await start("static", "--sleep", "1ms", "consume", uniq, "g", "m1", url=url)
        await idle.wait_text("consuming...")
        (await run_cg("static", "dead-letters", "replay", uniq, "g", "--all", "--execute", url=url)).ok()
        await wait_for(lambda: _none_left(nc, uniq), 30, what="the replayed dead letter run in the idle member")
        await idle.wait_output(lambda o: any(m["subject"] == subject for m in ACKED.finditer(o)), 5, "its line")


def _partition_of(uniq: str, subject: str) -> int:
    from pcgroups.partitions import partition_of_subject

    return partition_of_subject(subject, 4, [1], f"{uniq}.*")
