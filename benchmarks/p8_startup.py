"""P8: ``cg`` start-up, each command a fresh process, against ``python -c pass`` in the same run.

- ``cg --version``, ``cg --help``, ``cg --fisk-introspect``: no server, only what they import;
- ``cg static ls STREAM`` against the scenario's local server (one static group defined);
- the floor of an admin command: ``python`` + ``import nats`` + connect + one JetStream request
  (``STREAM.INFO`` of the static groups' KV bucket) + close, what no Python CLI can go below.

The commands run interleaved (one of each per round, so a load change hits them all alike); each
figure is the median of the rounds (8 quick, 20 full). ``cg`` is the console script next to the
interpreter when it is installed there, else ``python -c 'from cg.main import main; ...'``, with
this checkout first on ``PYTHONPATH``, no ``NATS_*`` variables and an empty nats context folder.
Byte-code caching is on (``PYTHONDONTWRITEBYTECODE`` removed): the warm-up run writes the ``.pyc``
files an installed package has, so no round compiles source.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pcgroups import create_static

from .common import Result, Row, Size, median, ratio, server_and_connection, static_stream

STREAM = "P8"
ROUNDS = {"quick": 8, "full": 20}
ROOT = Path(__file__).resolve().parent.parent

FLOOR = """\
import asyncio, sys
import nats

async def main():
    nc = await nats.connect(sys.argv[1])
    await nc.request("$JS.API.STREAM.INFO.KV_static-consumer-groups", b"", timeout=5)
    await nc.close()

asyncio.run(main())
"""


def cg_argv() -> list[str]:
    script = Path(sys.executable).with_name("cg")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from cg.main import main; sys.exit(main())"]


def commands(url: str) -> dict[str, list[str]]:
    cg = cg_argv()
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "floor": [sys.executable, "-c", FLOOR, url],
        "cg --version": [*cg, "--version"],
        "cg --help": [*cg, "--help"],
        "cg --fisk-introspect": [*cg, "--fisk-introspect"],
        "cg static ls": [*cg, "--server", url, "static", "ls", STREAM],
    }


def environment(config_home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NATS_", "CG_")) and k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["XDG_CONFIG_HOME"] = config_home
    return env


def time_one(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall-clock seconds of one run and its stdout; a failed run is an error."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv, env=env, cwd=str(ROOT), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30
    )
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[-3:])} exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
    return seconds, proc.stdout


def measure(url: str, rounds: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="pcg-p8-") as config_home:
        env = environment(config_home)
        cases = commands(url)
        samples: dict[str, list[float]] = {name: [] for name in cases}
        for name, argv in cases.items():  # one warm-up run each (page cache, .pyc files)
            _, out = time_one(argv, env)
            if name == "cg static ls" and out.strip() != "static consumer groups: [g]":
                raise RuntimeError(f"cg static ls printed {out!r}")
        for _ in range(rounds):
            for name, argv in cases.items():
                samples[name].append(time_one(argv, env)[0])
    return samples


async def run(size: Size) -> Result:
    res = Result("P8", "cg start-up: a fresh process per command vs python -c pass")
    async with server_and_connection() as (server, nc):
        await static_stream(nc.jetstream(), STREAM, 4)
        await create_static(nc, STREAM, "g", 4, members=["m1"])
        samples = await asyncio.to_thread(measure, server.url, ROUNDS.get(size.name, 8))
    med = {name: median(values) for name, values in samples.items()}
    base = med["python -c pass"]
    label = "python -c pass"

    def row(metric: str, name: str, target: str = "", limit: float | None = None) -> Row:
        r = ratio(med[name], base)
        met = None if limit is None or r is None else r <= limit
        return Row(metric, med[name], "s", base, label, r, target, met)

    rounds = len(samples["python -c pass"])
    res.rows += [
        row(f"cg --version, median of {rounds}", "cg --version", "<= 4", 4.0),
        row("cg --help", "cg --help"),
        row("cg --fisk-introspect", "cg --fisk-introspect"),
        row("cg static ls STREAM (local server)", "cg static ls", "<= 8", 8.0),
        row("floor: import nats + connect + one request", "floor"),
        Row(
            "cg static ls STREAM vs the floor",
            med["cg static ls"],
            "s",
            med["floor"],
            "floor",
            ratio(med["cg static ls"], med["floor"]),
        ),
    ]
    res.details = {"median_s": med, "samples_s": samples, "rounds": rounds, "cg": cg_argv()}
    return res
