"""``cg static|elastic consume --concurrency K`` against a real server, black-box through ``cg``: messages
of different keys handled at once while each key stays in order (``--key-header``, ``--key-tokens``,
the library's default keys), and the bad combinations of the options as one line, exit status 1, before
anything is created.

With K > 1 each message gets two whole lines, ``[m] subject=s, seq=n, pinnedID=p. Processing for d ...``
before the handler and the same head with ``acked`` after it (cg/consume.py); the order of those lines
on stdout is the order in which handlers started and ended.
"""

from __future__ import annotations

import asyncio
import re
import signal
import time

import pytest

from tests.helpers.cli import acg, assert_cli_error, cg_env, make_stream, partition_transform, procs, run_cg

LINE = re.compile(
    r"^\[(?P<member>[^\]]+)\] subject=(?P<subject>\S+), seq=(?P<seq>\d+), pinnedID=(?P<pin>\S*)\. "
    r"(?P<what>Processing for \S+ \.\.\.|acked)$"
)


def events(out: str) -> list[tuple[str, int, str]]:
    """("start" | "end", seq, subject) per whole line, in output order; any other line fails the test."""
    found = []
    for line in out.splitlines():
        if line == "consuming...":
            continue
        m = LINE.match(line)
        assert m, f"not a whole message line: {line!r}"
        found.append(("end" if m["what"] == "acked" else "start", int(m["seq"]), m["subject"]))
    return found


def check_keyed(out: str, key_of: dict[int, str]) -> int:
    """Every message started then acked once; no two messages of a key at once and each key in stream
    order. Returns the most handlers seen running at once."""
    running: dict[int, str] = {}
    started: dict[str, list[int]] = {}
    most = 0
    for what, seq, _ in events(out):
        key = key_of[seq]
        if what == "start":
            assert key not in running.values(), f"seq {seq} started while key {key} had one running"
            running[seq] = key
            started.setdefault(key, []).append(seq)
            most = max(most, len(running))
        else:
            assert running.pop(seq) == key
    assert not running, f"started and never acked: {running}"
    for key in set(key_of.values()):
        assert started.get(key) == sorted(s for s, k in key_of.items() if k == key), (key, started.get(key))
    return most


async def test_static_key_header_runs_keys_at_once_each_in_order(nats_server, js, uniq):
    """One partition, four header keys: up to four handlers at once (never two of a key), each key in order."""
    url = nats_server.url
    await make_stream(js, uniq, transform=partition_transform(uniq))
    (await run_cg("static", "create", "balanced", uniq, "g", "10", "m1", url=url)).ok()
    key_of = {}
    for i in range(12):  # the same subject, so the same partition: only the header tells them apart
        ack = await js.publish(f"{uniq}.7", str(i).encode(), headers={"Order": f"o{i % 4}"})
        key_of[ack.seq] = f"o{i % 4}"
    async with procs() as start:
        p = await start(
            "static",
            "consume",
            uniq,
            "g",
            "m1",
            "--concurrency",
            "4",
            "--key-header",
            "Order",
            "--sleep",
            "300ms",
            url=url,
        )
        await p.wait_output(lambda o: o.count("acked\n") == 12, timeout=20, what="12 acked lines")
    assert check_keyed(p.out, key_of) == 4
    assert {subject for _, _, subject in events(p.out)} == {f"{uniq}.7"}
    info = await js.consumer_info(uniq, "g-m1")
    assert info.config.max_ack_pending == 16384 and info.num_ack_pending == 0  # fair by default


async def test_static_default_key_is_the_subject(nats_server, js, uniq):
    """No key option on a static group: the subject (partition token stripped) is the key."""
    url = nats_server.url
    await make_stream(js, uniq, transform=partition_transform(uniq))
    (await run_cg("static", "create", "balanced", uniq, "g", "10", "m1", url=url)).ok()
    key_of = {}
    for i in range(6):
        ack = await js.publish(f"{uniq}.{i % 2}", b"x")
        key_of[ack.seq] = f"{uniq}.{i % 2}"
    async with procs() as start:
        p = await start("static", "consume", uniq, "g", "m1", "--concurrency", "4", "--sleep", "300ms", url=url)
        await p.wait_output(lambda o: o.count("acked\n") == 6, timeout=20, what="6 acked lines")
    assert check_keyed(p.out, key_of) == 2
    assert {subject for _, _, subject in events(p.out)} == set(key_of.values())


async def _elastic_group(js, s: str, url: str) -> None:
    """An elastic group of one partition over ``<s>.<customer>.<order>``, partitioned by the customer."""
    await make_stream(js, s, subjects=[f"{s}.*.*"])
    (await run_cg("elastic", "create", s, "g", "1", "--filter", f"{s}.*.*", "--wildcards", "1", url=url)).ok()
    (await run_cg("elastic", "add", s, "g", "m1", url=url)).ok()


async def test_elastic_key_tokens_group_by_the_tokens_given(nats_server, js, uniq):
    """--key-tokens 3: the order token is the key, so one customer's orders are handled at once."""
    url = nats_server.url
    await _elastic_group(js, uniq, url)
    key_of = {}
    for i in range(8):
        ack = await js.publish(f"{uniq}.acme.o{i % 2}", b"x")
        key_of[ack.seq] = f"o{i % 2}"
    async with procs() as start:
        p = await start(
            "elastic",
            "consume",
            uniq,
            "g",
            "m1",
            "--concurrency",
            "4",
            "--key-tokens",
            "3",
            "--max-ack-pending",
            "8",
            "--sleep",
            "300ms",
            url=url,
        )
        await p.wait_output(lambda o: o.count("acked\n") == 8, timeout=20, what="8 acked lines")
    assert check_keyed(p.out, key_of) == 2


@pytest.mark.parametrize("tokens,warned", [("3", None), ("2,5", "5"), ("4,5", "4,5")])
async def test_key_tokens_past_the_groups_subjects_are_warned_once(nats_server, js, uniq, tokens, warned):
    """The group's filter <s>.*.* has 3 tokens: a --key-tokens position past them is one cg: warning line
    (the instance runs anyway); positions within them say nothing."""
    url = nats_server.url
    await _elastic_group(js, uniq, url)
    async with procs() as start:
        p = await start("elastic", "consume", uniq, "g", "m1", "--concurrency", "4", "--key-tokens", tokens, url=url)
        await p.wait_text("consuming...\n", timeout=20)
        p.signal(signal.SIGINT)
        r = await p.wait(15)
    assert r.code == 0, r.err
    warnings = [line for line in r.err.splitlines() if line.startswith("cg: warning:")]
    if warned is None:
        assert warnings == [], r.err
    else:
        assert warnings == [
            f"cg: warning: --key-tokens {warned}: the group's subjects ({uniq}.*.*) have at most 3 "
            f"tokens, so the key has nothing from {'that position' if ',' not in warned else 'those positions'}"
        ], r.err


@pytest.mark.parametrize("kind", ["static", "elastic"])
async def test_key_tokens_past_the_streams_subjects_are_warned_without_filters(nats_server, js, uniq, kind):
    """A group with no filters, static or elastic: its stream's subjects tell how many tokens the handler's
    subject has (static: as the stream's transform writes them, the partition token stripped)."""
    url = nats_server.url
    if kind == "static":
        await make_stream(js, uniq, transform=partition_transform(uniq, 2))  # <p>.<uniq>.<token>
        (await run_cg("static", "create", "balanced", uniq, "g", "2", "m1", url=url)).ok()
    else:
        await make_stream(js, uniq)  # <uniq>.*
        (await run_cg("elastic", "create", uniq, "g", "2", url=url)).ok()
        (await run_cg("elastic", "add", uniq, "g", "m1", url=url)).ok()
    for tokens, warned in (("2", False), ("5", True)):
        async with procs() as start:
            p = await start(kind, "consume", uniq, "g", "m1", "--concurrency", "4", "--key-tokens", tokens, url=url)
            await p.wait_text("consuming...\n", timeout=20)
            p.signal(signal.SIGINT)
            r = await p.wait(15)
        assert r.code == 0, r.err
        warnings = [line for line in r.err.splitlines() if line.startswith("cg: warning:")]
        assert warnings == (
            [
                f"cg: warning: --key-tokens 5: the group's subjects ({uniq}.*) have at most 2 tokens, "
                "so the key has nothing from that position"
            ]
            if warned
            else []
        ), r.err


async def test_elastic_default_key_is_the_partitioning_tokens(nats_server, js, uniq):
    """No key option: the partitioning wildcard (the customer) is the key, so one customer is serial and
    two customers run at once."""
    url = nats_server.url
    await _elastic_group(js, uniq, url)
    key_of = {}
    for i in range(6):
        customer = "acme" if i % 3 else "zeta"
        ack = await js.publish(f"{uniq}.{customer}.o{i}", b"x")
        key_of[ack.seq] = customer
    async with procs() as start:
        p = await start("elastic", "join", uniq, "g", "m1", "--concurrency", "3", "--sleep", "300ms", url=url)
        await p.wait_output(lambda o: o.count("acked\n") == 6, timeout=20, what="6 acked lines")
    assert check_keyed(p.out, key_of) == 2


async def test_elastic_auto_takes_the_concurrency_too(nats_server, js, uniq):
    """--auto --create with --concurrency: the flags reach the automatic-membership instance."""
    url = nats_server.url
    await make_stream(js, uniq)
    key_of = {}
    for i in range(8):
        ack = await js.publish(f"{uniq}.k{i % 4}", b"x")
        key_of[ack.seq] = f"k{i % 4}"
    async with procs() as start:
        p = await start(
            "elastic",
            "consume",
            uniq,
            "g",
            "--auto",
            "--create",
            "1",
            "--filter",
            f"{uniq}.*",
            "--concurrency",
            "4",
            "--sleep",
            "300ms",
            url=url,
        )
        await p.wait_output(lambda o: o.count("acked\n") == 8, timeout=20, what="8 acked lines")
    assert check_keyed(p.out, key_of) == 4


async def test_sigterm_waits_for_every_handler_in_flight(nats_server, js, uniq):
    """SIGTERM with four handlers running: no new one starts, the four finish and are acked, exit 0."""
    url = nats_server.url
    await _elastic_group(js, uniq, url)
    for i in range(8):
        await js.publish(f"{uniq}.c{i % 4}.o", b"x")
    async with procs() as start:
        p = await start("elastic", "consume", uniq, "g", "m1", "--concurrency", "4", "--sleep", "1.5s", url=url)
        await p.wait_output(lambda o: o.count("Processing") == 4, timeout=20, what="four handlers running")
        t0 = time.monotonic()
        p.signal(signal.SIGTERM)
        res = await p.wait(timeout=15)
    assert res.code == 0, res.err
    assert time.monotonic() - t0 >= 0.5  # it waited for the handlers (1.5 s each, started just before)
    ends = [seq for what, seq, _ in events(res.out) if what == "end"]
    starts = [seq for what, seq, _ in events(res.out) if what == "start"]
    assert sorted(starts) == sorted(ends) == [1, 2, 3, 4], res.out
    assert (await js.stream_info(f"{uniq}-g")).state.messages == 4  # the other four wait for the next instance


async def test_a_first_ctrl_c_says_at_once_that_it_stops_after_the_message_in_flight(nats_server, js, uniq):
    """Ctrl-C during a long handler: one stderr line at once (the stop itself waits up to AckWait for the
    handler), then exit 0."""
    url = nats_server.url
    await make_stream(js, uniq, transform=partition_transform(uniq, 2))
    (await run_cg("static", "create", "balanced", uniq, "g", "2", "m1", url=url)).ok()
    await js.publish(f"{uniq}.k", b"x")
    async with procs() as start:
        p = await start("static", "--sleep", "10s", "consume", uniq, "g", "m1", url=url)
        await p.wait_text("Processing for 10s ... ", timeout=20)
        p.signal(signal.SIGINT)
        said = ""
        deadline = time.monotonic() + 1.0  # well before the stop's 2 s
        while "cg: stopping" not in said and time.monotonic() < deadline:
            said += (await asyncio.wait_for(p.proc.stderr.readline(), deadline - time.monotonic())).decode()
        assert said.endswith("cg: stopping after the message in flight (at most 2s; Ctrl-C again: now)\n"), said
        res = await p.wait(timeout=15)
    assert res.code == 0, res.err


BAD = [
    (["--concurrency", "0"], "invalid --concurrency 0: must be between 1 and 1000"),
    (["--concurrency", "-2"], "invalid --concurrency -2: must be between 1 and 1000"),
    (["--concurrency", "100000000"], "invalid --concurrency 100000000: must be between 1 and 1000"),
    (["--concurrency", "1001"], "invalid --concurrency 1001: must be between 1 and 1000"),
    (["--concurrency", "99999999999999999999"], "invalid --concurrency 99999999999999999999: must be between 1"),
    (["--concurrency", "two"], "invalid --concurrency: 'two' is not a whole number"),
    (
        ["--concurrency", "4", "--key-header", "K", "--key-tokens", "1"],
        "--key-header and --key-tokens can't be combined",
    ),
    (["--key-header", "K"], "--key-header needs --concurrency greater than 1"),
    (["--key-tokens", "1"], "--key-tokens needs --concurrency greater than 1"),
    (
        ["--concurrency", "4", "--key-tokens", "0,2"],
        "invalid --key-tokens '0,2': give subject token positions counted from 1",
    ),
    (["--concurrency", "4", "--key-tokens", "a"], "invalid --key-tokens 'a'"),
    (["--concurrency", "4", "--key-header", "Order Id"], "invalid --key-header 'Order Id': give a header name"),
    (["--concurrency", "4", "--max-ack-pending", "3"], "--max-ack-pending 3 is less than --concurrency 4"),
    (["--max-ack-pending", "0"], "invalid --max-ack-pending 0: must be between 1 and 100000"),
    (["--max-ack-pending", "100001"], "invalid --max-ack-pending 100001: must be between 1 and 100000"),
]


@pytest.mark.parametrize("flavour", ["static", "elastic"])
async def test_bad_combinations_are_one_line_and_create_nothing(nats_server, js, uniq, flavour):
    url = nats_server.url
    await make_stream(js, uniq, transform=partition_transform(uniq) if flavour == "static" else None)
    if flavour == "static":
        (await run_cg("static", "create", "balanced", uniq, "g", "2", "m1", url=url)).ok()
    else:
        (await run_cg("elastic", "create", uniq, "g", "2", "--filter", f"{uniq}.*", url=url)).ok()
        (await run_cg("elastic", "add", uniq, "g", "m1", url=url)).ok()
    for args, fragment in BAD:
        r = await run_cg(flavour, "consume", uniq, "g", "m1", *args, url=url)
        assert_cli_error(r, fragment)
        assert len(r.err.splitlines()) == 1, r.err
    r = await acg(flavour, "consume", uniq, "g", "m1", "--concurrency", "2", "--max-ack-pending", "1", url=url)
    assert_cli_error(r, "--max-ack-pending 1 is less than --concurrency 2")  # the real executable too
    stream = uniq if flavour == "static" else f"{uniq}-g"
    names = [c.name for c in await js.consumers_info(stream)]
    assert names == [], names  # nothing was created


async def test_consume_at_a_closed_port_says_so_and_waits_until_ctrl_c():
    """No server answers at the address: one warning line (a connection refused is worth waiting for), then the
    instance waits; Ctrl-C ends it with status 0."""
    import asyncio

    from tests.helpers.cli import closed_port_url

    async with procs() as start:
        p = await start(
            "static",
            "consume",
            "s",
            "g",
            "m1",
            "--max-ack-pending",
            "4",
            "--timeout",
            "1s",
            env=cg_env(closed_port_url()),
        )
        first = (await asyncio.wait_for(p.proc.stderr.readline(), 20)).decode()
        p.signal(signal.SIGINT)
        r = await p.wait(10)
    assert first.startswith("cg: warning: can't connect to ") and "trying again" in first, first
    assert r.code == 0 and r.err == "", r.err
