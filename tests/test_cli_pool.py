"""The worker pool through the real ``cg``, black-box: ``consume --dispatch`` and ``worker`` processes.

What a user sees: the dispatching instance prints no message line, one line per worker joining or leaving;
each worker prints ``consuming...`` once enrolled, then the message lines ``consume`` prints; a worker stopped
with SIGTERM finishes what it holds and exits 0; a killed worker's message is handled by another one; ``status``
lists the workers; bad input is one error line.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import signal

from tests.helpers.cli import assert_cli_error, cg_env, make_stream, message_lines, partition_transform, procs, run_cg

from .helpers.support import wait_for

ACKED = re.compile(
    r"^\[(?P<worker>[^\]]+)\] subject=(?P<subject>\S+), seq=(?P<seq>\d+), pinnedID=\S*\. "
    r"(Processing for \S+ \.\.\. )?acked$",
    re.M,
)


def acked(out: str) -> list[tuple[str, str, int]]:
    """(worker, subject, seq) of every acked line."""
    return [(m["worker"], m["subject"], int(m["seq"])) for m in ACKED.finditer(out)]


class Timeline:
    """The acked lines of several processes in the order they were printed (polled every 5 ms: messages of one
    key are at least a handler's --sleep apart)."""

    def __init__(self, procs: dict) -> None:
        self.procs = procs
        self.seen: dict[str, int] = {}
        self.lines: list[tuple[str, str, int]] = []
        self.task = asyncio.ensure_future(self._poll())

    async def _poll(self) -> None:
        while True:
            for name, p in list(self.procs.items()):
                done = acked(p.out)
                self.lines += done[self.seen.get(name, 0) :]
                self.seen[name] = len(done)
            await asyncio.sleep(0.005)


async def test_a_dispatcher_and_workers_started_and_stopped_at_will(nats_server, js, uniq):
    """The README's walk-through: a dispatcher, three workers, a burst on one key and traffic on others; a worker
    killed, two added, one stopped. Every message acked once (the killed worker's call aside), each key in
    order, never two messages of a key at once."""
    url = nats_server.url
    await make_stream(js, uniq, transform=partition_transform(uniq, 4))
    (await run_cg("static", "create", "balanced", uniq, "g", "4", "m1", url=url)).ok()
    env = cg_env(url, COLUMNS="80")
    async with procs() as start:  # CG_PRETTY: the dispatcher's status lines on stdout, as in a terminal
        d = await start("static", "consume", uniq, "g", "m1", "--dispatch", env=cg_env(url, CG_PRETTY="1"))
        await d.wait_text("consuming...\n")
        workers = {}
        for name in ("w1", "w2", "w3"):
            workers[name] = await start("static", "--sleep", "100ms", "worker", uniq, "g", "--name", name, env=env)
        for w in workers.values():
            await w.wait_text("consuming...\n")
        timeline = Timeline(workers)
        seqs: dict[str, list[int]] = {}
        for i in range(60):
            subject = f"{uniq}.A" if i < 30 else f"{uniq}.k{i % 6}"
            seqs.setdefault(subject, []).append((await js.publish(subject, b"x")).seq)

        def out() -> str:
            return "".join(w.out for w in workers.values())

        await wait_for(lambda: len(acked(out())) >= 10, 20, what="the workers at work")

        def mid_call() -> str | None:  # a worker whose last line is a call that has not ended
            return next(
                (
                    name
                    for name, w in workers.items()
                    if (lines := message_lines(w.out))
                    and w.out.splitlines()[-1] == lines[-1].group(0)
                    and not lines[-1]["end"]
                ),
                None,
            )

        victim = await wait_for(mid_call, 10, interval=0.005, what="a worker in the middle of a call")
        workers[victim].kill()
        killed_out = workers[victim].out
        for name in ("w4", "w5"):
            workers[name] = await start("static", "--sleep", "100ms", "worker", uniq, "g", "--name", name, env=env)
        await d.wait_output(lambda o: f"worker {victim} left" in o, timeout=10, what="the kill noticed")
        await wait_for(lambda: len({(s, q) for _, s, q in acked(out())}) == 60, 30, what="every message acked")
        calm = next(n for n in ("w4", "w5") if n != victim)
        workers[calm].signal(signal.SIGTERM)
        result = await workers[calm].wait(timeout=15)
        status = await run_cg("static", "status", uniq, "g", url=url)
        await asyncio.sleep(0.05)
        timeline.task.cancel()
        for w in workers.values():
            w.signal(signal.SIGINT)
        d.signal(signal.SIGINT)
        assert (await d.wait(timeout=15)).code == 0
    assert result.code == 0
    done = timeline.lines
    per_seq: dict[int, list[str]] = {}
    for worker, _, seq in done:
        per_seq.setdefault(seq, []).append(worker)
    twice = {seq: ws for seq, ws in per_seq.items() if len(ws) > 1}
    assert len(twice) <= 1 and all(victim in ws for ws in twice.values()), twice  # only the killed call again
    started_by_victim = [int(m["seq"]) for m in message_lines(killed_out)]
    for subject, want in seqs.items():  # each key in stream order
        got = [seq for _, s, seq in done if s == subject and seq not in twice]
        assert got == [q for q in want if q not in twice], subject
    assert not message_lines(d.out), "the dispatcher prints no message line"
    lines = d.out.splitlines()
    assert lines[0] == "consuming..." and "[m1] worker w1 joined: capacity 1" in lines
    assert f"[m1] worker {calm} left: stopped" in lines
    assert re.search(rf"\[m1\] worker {victim} left: no heartbeat for \d\.\ds", d.out)
    live = sorted(set(workers) - {victim, calm})
    assert status.code == 0 and f"member m1 dispatches to {len(live)} worker(s)" in status.out, status.out
    assert [line.split()[1] for line in status.out.splitlines() if line.startswith("m1      w")] == live
    assert started_by_victim and not message_lines(killed_out)[-1]["end"]  # killed in the middle of a call


async def test_a_worker_says_it_waits_for_a_dispatcher_and_enrols_when_one_starts(nats_server, js, uniq):
    url = nats_server.url
    await make_stream(js, uniq, transform=partition_transform(uniq, 2))
    (await run_cg("static", "create", "balanced", uniq, "g", "2", "m1", url=url)).ok()
    async with procs() as start:
        w = await start(
            "static",
            "worker",
            uniq,
            "g",
            "--name",
            "early",
            "--capacity",
            "2",
            env=cg_env(url, CG_PRETTY="1", COLUMNS="80"),
        )
        await w.wait_text("[early] no dispatching member yet: waiting for one", timeout=15)
        assert "consuming..." not in w.out
        d = await start("static", "consume", uniq, "g", "m1", "--dispatch", url=url)
        await w.wait_text("consuming...\n", timeout=15)
        await w.wait_text("[early] enrolled: member m1 hands it messages")
        await js.publish(f"{uniq}.x", b"x")
        await w.wait_output(lambda o: len(acked(o)) == 1, what="the message handled")
        w.signal(signal.SIGTERM)
        d.signal(signal.SIGTERM)
        assert (await w.wait()).code == 0 and (await d.wait()).code == 0


async def test_pool_metrics_on_a_dispatching_instance(nats_server, js, uniq):
    url = nats_server.url
    await make_stream(js, uniq, transform=partition_transform(uniq, 2))
    (await run_cg("static", "create", "balanced", uniq, "g", "2", "m1", url=url)).ok()
    from pcgroups.testing._server import free_port
    from tests.helpers.http import scrape

    port = free_port()
    async with procs() as start:
        d = await start(
            "static", "consume", uniq, "g", "m1", "--dispatch", "--metrics-listen", f"127.0.0.1:{port}", url=url
        )
        await d.wait_text("consuming...\n")
        w = await start("static", "--sleep", "0s", "worker", uniq, "g", "--name", "mw", "--capacity", "3", url=url)
        await w.wait_text("consuming...\n")
        for i in range(5):
            await js.publish(f"{uniq}.k{i}", b"x")
        await w.wait_output(lambda o: len(acked(o)) == 5, what="5 messages handled")

        async def counted():  # the outcomes reach the dispatcher a moment after the worker's lines
            m = await asyncio.to_thread(scrape, port)
            return m if [s.value for s in m["pcgroups_pool_worker_handled_messages"]] == [5] else None

        m = await wait_for(counted, 10, what="the 5 outcomes counted")
        for p in (w, d):
            p.signal(signal.SIGINT)
            await p.wait()
    [handled] = m["pcgroups_pool_worker_handled_messages"]
    assert handled.labels["worker"] == "mw" and handled.value == 5
    assert [s.value for s in m["pcgroups_pool_slots"]] == [3]
    assert {s.labels["state"]: s.value for s in m["pcgroups_pool_workers"]} == {"busy": 0, "idle": 1}


async def test_bad_pool_input_is_one_error_line(nats_server, uniq):
    url = nats_server.url
    for args, fragment in [
        (("static", "worker", uniq, "g", "--name", "a.b"), "invalid worker name"),
        (("elastic", "worker", uniq, "g", "--capacity", "0"), "invalid --capacity 0"),
        (("static", "consume", uniq, "g", "m1", "--dispatch", "--concurrency", "0"), "invalid --concurrency 0"),
        (("static", "consume", uniq, "g", "m1", "--dispatch", "--key-tokens", "x"), "--key-tokens"),
        (("static", "worker", "nostream", "g", "--name", "w"), "static consumer group g on stream nostream not found"),
    ]:
        assert_cli_error(await run_cg(*args, url=url), fragment)


class Calls:
    """Every message line of several workers as a call: (worker, seq, start, end, how it ended), the start and the
    end as seen by polling their outputs every 5 ms (calls here last seconds)."""

    def __init__(self, procs: dict) -> None:
        self.procs = procs
        self.calls: dict[tuple[str, int], list] = {}  # (worker, line number) -> [seq, start, end, ending]
        self.task = asyncio.ensure_future(self._poll())

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            for name, p in list(self.procs.items()):
                for i, m in enumerate(message_lines(p.out)):
                    call = self.calls.setdefault((name, i), [int(m["seq"]), now, None, ""])
                    if m["end"] and call[2] is None:
                        call[2], call[3] = now, m["end"]
            await asyncio.sleep(0.005)

    def by_seq(self) -> dict[int, list[tuple[str, float, float | None, str]]]:
        out: dict[int, list] = {}
        for (name, _), (seq, start, end, ending) in sorted(self.calls.items(), key=lambda kv: kv[1][1]):
            out.setdefault(seq, []).append((name, start, end, ending))
        return out

    def acked(self) -> set[int]:
        return {seq for seq, calls in self.by_seq().items() if any(c[3] == "acked" for c in calls)}

    def open(self) -> int:
        return sum(1 for seq, start, end, _ in self.calls.values() if end is None)


async def _two_dispatchers(start, url: str, uniq: str) -> tuple:
    """m1's two dispatching instances, status lines on stdout; (the pinned one, the standby) once one is pinned."""
    ds = [
        await start("static", "consume", uniq, "g", "m1", "--dispatch", env=cg_env(url, CG_PRETTY="1"))
        for _ in range(2)
    ]
    for d in ds:
        await d.wait_text("consuming...\n")
    return tuple(ds)


def _pinned(ds) -> tuple:
    pinned = [d for d in ds if "] pinned: " in d.out]
    assert len(pinned) == 1, [d.out for d in ds]
    return pinned[0], next(d for d in ds if d is not pinned[0])


async def test_a_dispatcher_paused_past_its_pin_offers_nothing_again(nats_server, js, uniq):
    """The pinned dispatcher is stopped (SIGSTOP) for 3 x PinnedTTL while the workers run a key's first message: the
    standby takes the pin and the message's running call over. Resumed, the paused dispatcher must offer nothing
    again (it lost its pin): each message runs once, acked once, the key's messages one after the other."""
    url = nats_server.url
    await make_stream(js, uniq, transform=partition_transform(uniq, 4))
    (await run_cg("static", "create", "balanced", uniq, "g", "4", "m1", url=url)).ok()
    async with procs() as start:
        ds = await _two_dispatchers(start, url, uniq)
        workers = {
            n: await start("static", "--sleep", "3s", "worker", uniq, "g", "--name", n, url=url)
            for n in ("w1", "w2", "w3")
        }
        for w in workers.values():
            await w.wait_text("consuming...\n")
        calls = Calls(workers)
        seqs = [(await js.publish(f"{uniq}.k", str(i).encode())).seq for i in range(3)]
        await wait_for(lambda: calls.by_seq().get(seqs[0]), 15, what="the first message running")
        await wait_for(lambda: any("] pinned: " in d.out for d in ds), 10, what="a pinned dispatcher")
        paused, _ = _pinned(ds)
        paused.signal(signal.SIGSTOP)
        await asyncio.sleep(6)
        paused.signal(signal.SIGCONT)
        await wait_for(lambda: calls.acked() >= set(seqs), 40, what="every message acked")
        await asyncio.sleep(4)  # a message offered again would be acked again by now (3 s calls)
        await wait_for(lambda: calls.open() == 0, 10, what="no call running")
        calls.task.cancel()
        for p in [*workers.values(), *ds]:
            p.signal(signal.SIGINT)
    done = calls.by_seq()
    assert sorted(done) == seqs and all(len(c) == 1 and c[0][3] == "acked" for c in done.values()), done
    runs = [done[s][0] for s in seqs]
    for before, after in itertools.pairwise(runs):  # one at a time, in order (5 ms of polling either side)
        assert after[1] >= before[2] - 0.05, runs


async def test_calls_running_when_their_dispatcher_dies_are_acked_not_run_again(nats_server, js, uniq):
    """SIGKILL of the pinned dispatcher while three workers run 2.5 s calls: the calls go on, ack (through the
    standby once it holds the pin), and none runs again."""
    url = nats_server.url
    await make_stream(js, uniq, transform=partition_transform(uniq, 4))
    (await run_cg("static", "create", "balanced", uniq, "g", "4", "m1", url=url)).ok()
    async with procs() as start:
        ds = await _two_dispatchers(start, url, uniq)
        workers = {
            n: await start("static", "--sleep", "2500ms", "worker", uniq, "g", "--name", n, url=url)
            for n in ("w1", "w2", "w3")
        }
        for w in workers.values():
            await w.wait_text("consuming...\n")
        calls = Calls(workers)
        seqs = [(await js.publish(f"{uniq}.k{i}", b"x")).seq for i in range(3)]
        await wait_for(lambda: calls.open() == 3, 15, what="three calls running")
        await wait_for(lambda: any("] pinned: " in d.out for d in ds), 10, what="a pinned dispatcher")
        _pinned(ds)[0].kill()
        await wait_for(lambda: calls.acked() >= set(seqs), 30, what="every message acked")
        await asyncio.sleep(2)  # a call run again would have started by now
        calls.task.cancel()
        for p in [*workers.values(), *ds]:
            p.signal(signal.SIGINT)
    done = calls.by_seq()
    assert sorted(done) == seqs and all(len(c) == 1 and c[0][3] == "acked" for c in done.values()), done


async def test_a_worker_says_when_no_dispatcher_answers_and_ends_with_its_group(nats_server, js, uniq):
    """A worker whose dispatchers all stopped says so (not only at its start), enrols again with the next one, and
    ends (exit 0, saying why) when the group is deleted, as the member instances do."""
    url = nats_server.url
    await make_stream(js, uniq, transform=partition_transform(uniq, 2))
    (await run_cg("static", "create", "balanced", uniq, "g", "2", "m1", url=url)).ok()
    async with procs() as start:
        d = await start("static", "consume", uniq, "g", "m1", "--dispatch", url=url)
        w = await start("static", "worker", uniq, "g", "--name", "w2", env=cg_env(url, CG_PRETTY="1", COLUMNS="200"))
        await w.wait_text("[w2] enrolled: member m1 hands it messages")
        d.signal(signal.SIGTERM)
        assert (await d.wait()).code == 0
        await w.wait_text("[w2] no dispatching member answered for", timeout=15)
        d = await start("static", "consume", uniq, "g", "m1", "--dispatch", url=url)
        await w.wait_output(lambda o: o.count("[w2] enrolled: member m1") == 2, what="enrolled again")
        (await run_cg("static", "delete", "-f", uniq, "g", url=url)).ok()
        assert (await d.wait()).code == 0
        r = await w.wait(timeout=15)
    assert r.code == 0 and f"static consumer group g on stream {uniq} was deleted" in r.err, r


async def test_status_shows_a_members_workers_once_with_a_standby_dispatcher(nats_server, js, uniq):
    url = nats_server.url
    await make_stream(js, uniq, transform=partition_transform(uniq, 2))
    (await run_cg("static", "create", "balanced", uniq, "g", "2", "m1", url=url)).ok()
    async with procs() as start:
        ds = await _two_dispatchers(start, url, uniq)
        workers = [await start("static", "worker", uniq, "g", "--name", n, url=url) for n in ("w1", "w2")]
        for w in workers:
            await w.wait_text("consuming...\n")
        await js.publish(f"{uniq}.k", b"x")
        await wait_for(lambda: any("] pinned: " in d.out for d in ds), 10, what="a pinned dispatcher")
        status = (await run_cg("static", "status", uniq, "g", url=url)).ok()
        as_json = json.loads((await run_cg("static", "status", uniq, "g", "--json", url=url)).ok().out)
    lines = status.out.splitlines()
    assert sum(1 for line in lines if line.startswith("member m1 dispatches to 2 worker(s)")) == 1, status.out
    rows = lines[next(i for i, line in enumerate(lines) if line.startswith("MEMBER  WORKER")) + 1 :]
    assert [row.split()[:2] for row in rows] == [["m1", "w1"], ["m1", "w2"]], status.out
    assert sorted(p["pinned"] for p in as_json["pools"]) == [False, True]  # the JSON has both instances
