"""P12: what key-level concurrency and the interpreter cost per message, on a stored backlog without work.

- **concurrency without work**: one member instance (1 partition, a backlog over 1,000 keys, a handler that only
  acks) with ``concurrency`` K = 8, 64, 256 (and 1,000, for information) against the same instance with
  concurrency 1 on the same backlog and the same consumer window (max_ack_pending 16384, the keyed default):
  concurrency must never cost throughput;
- **concurrency 64 with 1 ms of work** (``asyncio.sleep(0.001)``): against its ideal, min(64 / the handlers'
  measured duration, the concurrency-1 rate); asyncio's sleep lasts longer than asked here (its timer is
  millisecond-grained), so the ideal is taken from what the handlers took, not from 1 ms;
- **Python 3.13 against 3.11**: the same instance's client CPU per message (concurrency 1 and 64) on each
  interpreter, and ``cg static consume`` in P7's setting (8 partitions, 4 members, a process each, asyncio's loop),
  rounds alternating. The other interpreter is ``PCG_BENCH_PYTHON313``, else ``.venv-3.13`` of the checkout (what
  ``scripts/test`` makes), else ``python3.13`` when it imports nats; without one the rows say so.

Each instance runs in a child process of its own (``python -m benchmarks.p12_speed child ...``, on asyncio's loop)
on a fresh group over the shared backlog; its rate and CPU are counted over the acks from a tenth of the backlog
to the end (start-up left out). Rounds alternate the cases (the order turned round every other round); the
ratio reported is the median of the rounds' ratios (each round's cases ran within seconds of each other)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from .common import Result, Row, Size, publish_all, ratio, server_and_connection, static_stream
from .procs import ROOT

STREAM = "P12"
KEYS = 1000
WINDOW = 16384  # the keyed default (FAIR_WINDOW): every case, concurrency 1 included, on the same consumer window
WORK = 0.001
CASES = {"k1": (1, 0.0), "k8": (8, 0.0), "k64": (64, 0.0), "k256": (256, 0.0), "k1000": (1000, 0.0), "k64w": (64, WORK)}
TARGET_KEYS = ("k8", "k64", "k256")
INTERPRETER_CASES = ("k1", "k64")
PY313_TARGET = 1.1
TIME_LIMIT_FACTOR = 2


def python313() -> str | None:
    """The other interpreter (see the module docstring), or None."""
    for candidate in (os.environ.get("PCG_BENCH_PYTHON313"), str(ROOT / ".venv-3.13" / "bin" / "python")):
        if candidate and os.path.exists(candidate):
            return candidate
    found = shutil.which("python3.13")
    if found and subprocess.run([found, "-c", "import nats"], capture_output=True).returncode == 0:
        return found
    return None


async def child_case(python: str, url: str, case: str, n: int, group: str, library: str | None = None) -> dict:
    """One case in a child process on ``python`` (``library``: a directory whose ``pcgroups`` it imports instead of
    this checkout's): {rate, cpu_us, handler_s}."""
    path = [library, str(ROOT), os.environ.get("PYTHONPATH")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    proc = await asyncio.create_subprocess_exec(
        python,
        "-m",
        "benchmarks.p12_speed",
        "child",
        url,
        case,
        str(n),
        group,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=library or str(ROOT),  # (python -m puts the working directory first on the path)
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120 + n / 1000)
    if proc.returncode != 0:
        raise RuntimeError(f"{case} on {python}: exit {proc.returncode}: {err.decode()[-500:]}")
    return json.loads(out.decode().strip().splitlines()[-1])


async def consume_case(url: str, case: str, n: int, group: str) -> dict:
    """In the child: a static member over the backlog with the case's concurrency and work."""
    import nats

    from pcgroups import ConsumerConfig, create_static, static_consume

    k, work = CASES[case]
    warm = n // 10
    done = asyncio.Event()
    state = {"count": 0, "t0": 0.0, "c0": 0.0, "t1": 0.0, "c1": 0.0, "busy": 0.0, "timed": 0}

    async def handler(msg) -> None:
        if work:
            t = time.perf_counter()
            await asyncio.sleep(work)
            await msg.ack()
            if state["t0"]:
                state["busy"] += time.perf_counter() - t
                state["timed"] += 1
        else:
            await msg.ack()
        state["count"] += 1
        if state["count"] == warm:
            state["t0"], state["c0"] = time.perf_counter(), time.process_time()
        elif state["count"] == n:
            state["t1"], state["c1"] = time.perf_counter(), time.process_time()
            done.set()

    nc = await nats.connect(url)
    try:
        await create_static(nc, STREAM, group, 1, members=["m"])
        cfg = ConsumerConfig(ack_wait=30, max_ack_pending=WINDOW)
        inst = await static_consume(nc, STREAM, group, "m", handler, concurrency=k, config=cfg)
        try:
            await asyncio.wait_for(done.wait(), 60 + n / 1000)
        finally:
            await inst.stop()
    finally:
        await nc.close()
    counted = n - warm
    return {
        "rate": counted / (state["t1"] - state["t0"]),
        "cpu_us": (state["c1"] - state["c0"]) / counted * 1e6,
        "handler_s": state["busy"] / state["timed"] if state["timed"] else None,
        "python": sys.version.split()[0],
    }


async def interpreters(url: str, nc, size: Size, py313: str) -> tuple[dict, dict[str, str]]:
    """Rounds alternating 3.11 (this interpreter) and 3.13: the library's cases, then cg in P7's setting; and the
    cases that could not run, with why."""
    from pcgroups.jetstream._api import JetStreamApi

    from . import p7_consume as p7

    stream = "P12CG"
    await p7.backlog(nc, stream, "static", size.p7_idle_messages)
    pythons = {"3.11": sys.executable, "3.13": py313}
    got: dict[str, dict[str, list[float]]] = {v: {} for v in pythons}
    missing: dict[str, str] = {}  # a case that could not run: why
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    check = subprocess.run([py313, "-c", "import cg"], capture_output=True, text=True, cwd=str(ROOT), env=env)
    if check.returncode != 0:  # e.g. nats-py there but not pcgroups' install (cg reads its version)
        why = (check.stderr.strip().splitlines() or [f"exit {check.returncode}"])[-1]
        missing["cg"] = f"cg does not start on Python 3.13: {why[-160:]}"
    for r in range(size.p12_rounds):
        order = list(pythons.items()) if r % 2 == 0 else list(pythons.items())[::-1]
        for version, python in order:
            for case in INTERPRETER_CASES:
                res = await child_case(python, url, case, size.p12_messages, f"py{version[-2:]}{case}r{r}")
                got[version].setdefault(case, []).append(res["cpu_us"])
            if "cg" in missing:
                continue
            side = p7.Side("cg", env=p7.ASYNCIO, python=python)
            try:
                _, cpu, _, _ = await p7.one_round(
                    url, nc, JetStreamApi(nc), side, stream, f"cg{version[-2:]}r{r}", 0.0, size.p7_idle_messages // 4
                )
            except Exception as e:  # e.g. an interpreter with nats-py but not pcgroups installed: cg can not start
                missing["cg"] = f"cg did not run on Python {version}: {str(e)[-200:] or type(e).__name__}"
                continue
            got[version].setdefault("cg", []).append(cpu)
    return got, missing


async def run(size: Size) -> Result:
    res = Result("P12", "key-level concurrency without work, 1 ms of work, and Python 3.13 against 3.11")
    n = size.p12_messages
    py313 = python313()
    rounds: list[dict[str, dict]] = []
    async with server_and_connection() as (server, nc):
        await static_stream(nc.jetstream(), STREAM, 1)
        await publish_all(nc, [f"{STREAM}.k{i % KEYS}" for i in range(n)], payload=b"x" * 64)
        for r in range(size.p12_rounds):
            order = list(CASES) if r % 2 == 0 else list(CASES)[::-1]
            rounds.append(
                {case: await child_case(sys.executable, server.url, case, n, f"{case}r{r}") for case in order}
            )
        versions, missing = await interpreters(server.url, nc, size, py313) if py313 else (None, {})

    def med(values: list[float]) -> float:
        return statistics.median(values)

    k1 = med([r["k1"]["rate"] for r in rounds])
    k1_cpu = med([r["k1"]["cpu_us"] for r in rounds])
    for case in ("k8", "k64", "k256", "k1000"):
        k = CASES[case][0]
        per_round = [r[case]["rate"] / r["k1"]["rate"] for r in rounds]
        rr = med(per_round)
        res.rows.append(
            Row(
                f"concurrency {k}, no work, {n:,} stored messages over 1,000 keys (median of the rounds' ratios; "
                f"CPU {med([r[case]['cpu_us'] for r in rounds]):.1f} vs {k1_cpu:.1f} us/msg)",
                med([r[case]["rate"] for r in rounds]),
                "msg/s",
                k1,
                "concurrency 1, same backlog and window",
                rr,
                ">= 1.0" if case in TARGET_KEYS else "info",
                rr >= 1.0 if case in TARGET_KEYS else None,
            )
        )
    ideals = [min(64 / r["k64w"]["handler_s"], r["k1"]["rate"]) for r in rounds]
    handler_ms = med([r["k64w"]["handler_s"] for r in rounds]) * 1000
    rw = med([r["k64w"]["rate"] / ideal for r, ideal in zip(rounds, ideals, strict=True)])
    res.rows.append(
        Row(
            f"concurrency 64, 1 ms of work (asyncio.sleep; the handlers took {handler_ms:.2f} ms)",
            med([r["k64w"]["rate"] for r in rounds]),
            "msg/s",
            med(ideals),
            "min(64 / handler duration, concurrency-1 rate)",
            rw,
            ">= 0.9",
            rw >= 0.9,
        )
    )
    if versions is None:
        res.rows.append(
            Row(
                "Python 3.13 against 3.11: not measured (no Python 3.13 with nats-py: PCG_BENCH_PYTHON313)",
                None,
                "",
                target=f"<= {PY313_TARGET}",
            )
        )
    else:
        labels = {
            "k1": "library, concurrency 1, client CPU per message",
            "k64": "library, concurrency 64, client CPU per message",
            "cg": "cg static consume, P7's setting (4 members, asyncio), member CPU per message",
        }
        for case, what in labels.items():
            if case in missing:
                res.rows.append(Row(f"Python 3.13 against 3.11: {what}: not measured ({missing[case]})", None, ""))
                continue
            a, b = med(versions["3.13"][case]), med(versions["3.11"][case])
            r = ratio(a, b)
            res.rows.append(
                Row(
                    f"Python 3.13 against 3.11: {what} (median)",
                    a,
                    "us",
                    b,
                    "Python 3.11, same run",
                    r,
                    f"<= {PY313_TARGET}",
                    r is not None and r <= PY313_TARGET,
                )
            )
    res.details = {
        "messages": n,
        "keys": KEYS,
        "window": WINDOW,
        "rounds": rounds,
        "python313": py313,
        "interpreters_cpu_us": versions,
        "interpreters_not_measured": missing,
    }
    return res


async def compare(rev: str, cases: list[str], n: int, rounds: int) -> None:
    """The cases with the library of git revision ``rev`` against this checkout's, on one backlog, alternated."""
    import tempfile

    with tempfile.TemporaryDirectory() as old:
        archive = subprocess.run(["git", "archive", rev, "pcgroups"], cwd=ROOT, check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
        sides = {rev: old, "this": None}
        got: dict[str, dict[str, list[dict]]] = {side: {} for side in sides}
        async with server_and_connection() as (server, nc):
            await static_stream(nc.jetstream(), STREAM, 1)
            await publish_all(nc, [f"{STREAM}.k{i % KEYS}" for i in range(n)], payload=b"x" * 64)
            for r in range(rounds):
                for side, library in list(sides.items())[:: 1 if r % 2 == 0 else -1]:
                    for case in cases:
                        res = await child_case(sys.executable, server.url, case, n, f"{case}{side[:7]}r{r}", library)
                        got[side].setdefault(case, []).append(res)
                        print(
                            f"round {r} {side:8s} {case:6s} {res['rate']:9,.0f} msg/s {res['cpu_us']:6.1f} us CPU/msg"
                        )
    for side, by_case in got.items():
        base = by_case[cases[0]]
        print(
            f"{side}: "
            + " | ".join(
                f"{case} {statistics.median(r['rate'] for r in rs):,.0f} msg/s "
                f"x{statistics.median(r['rate'] / b['rate'] for r, b in zip(rs, base, strict=True)):.2f} "
                f"{statistics.median(r['cpu_us'] for r in rs):.1f} us"
                for case, rs in by_case.items()
            )
        )
        if "k64w" in by_case and "k1" in by_case:  # target 2: against min(64 / the handlers' duration, the k1 rate)
            ideal = [min(64 / w["handler_s"], b["rate"]) for w, b in zip(by_case["k64w"], by_case["k1"], strict=True)]
            rw = statistics.median(w["rate"] / i for w, i in zip(by_case["k64w"], ideal, strict=True))
            ms = statistics.median(w["handler_s"] for w in by_case["k64w"]) * 1000
            print(f"{side}: k64w x{rw:.2f} of min(64 / handler duration ({ms:.2f} ms), k1 rate)")


def main() -> None:
    """``child URL CASE N GROUP``: one case (what P12 runs); ``compare REV [CASES [N [ROUNDS]]]``: the cases (default
    k1,k8,k64,k256) with the library of git revision REV against this checkout's, alternated, ratios to the first."""
    args = sys.argv[1:]
    if len(args) == 5 and args[0] == "child":
        _, url, case, n, group = args
        print(json.dumps(asyncio.run(consume_case(url, case, int(n), group))))
    elif 2 <= len(args) <= 5 and args[0] == "compare":
        cases = (args[2] if len(args) > 2 else "k1,k8,k64,k256").split(",")
        n, rounds = int(args[3]) if len(args) > 3 else 30_000, int(args[4]) if len(args) > 4 else 4
        asyncio.run(compare(args[1], cases, n, rounds))
    else:
        print("usage: python -m benchmarks.p12_speed child URL CASE N GROUP | compare REV [CASES [N [ROUNDS]]]")
        sys.exit(2)


if __name__ == "__main__":
    main()
