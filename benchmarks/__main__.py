"""``python -m benchmarks [--quick|--full] [--only P1,P3] [--json PATH] [--plain]``

Runs the scenarios one after the other, each on an embedded nats-server of its own, prints the table
and writes the JSON (default ``bench-results/bench.json``). Exit status 0 even when a target is missed
(the table says so); 1 when a scenario failed to run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from .common import FULL, QUICK, Result, Size
from .report import render

SCENARIOS = ["P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8", "P9", "P10", "P11", "P12"]


MODULES = {
    "P1": "p1_throughput",
    "P2": "p2_strict",
    "P3": "p3_failover",
    "P4": "p4_elastic",
    "P5": "p5_sourcing",
    "P6": "p6_keys",
    "P7": "p7_consume",
    "P8": "p8_startup",
    "P9": "p9_aggregate",
    "P10": "p10_pool",
    "P11": "p11_flavours",
    "P12": "p12_speed",
}


def _module(sid: str):
    return importlib.import_module(f".{MODULES[sid]}", __package__)


def machine() -> dict:
    from pcgroups.testing._server import nats_server_binary

    try:
        server_version = subprocess.run(
            [nats_server_binary(), "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except Exception as e:
        server_version = f"unknown ({e})"
    try:
        import importlib.metadata as md

        nats_py = md.version("nats-py")
    except Exception:
        nats_py = "unknown"
    mem_total = None
    try:
        with open("/proc/meminfo") as f:
            mem_total = round(int(f.readline().split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "mem_total_gib": mem_total,
        "loadavg_at_start": list(os.getloadavg()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "nats_py": nats_py,
        "nats_server": server_version,
    }


async def run_all(size: Size, only: list[str], progress) -> list[Result]:
    results = []
    for sid in only:
        progress(f"{sid} ...")
        t0 = time.monotonic()
        try:
            module = _module(sid)
            res = await asyncio.wait_for(module.run(size), size.time_limit * getattr(module, "TIME_LIMIT_FACTOR", 1))
        except Exception as e:
            res = Result(sid, sid, error=f"{type(e).__name__}: {e}")
            logging.getLogger("benchmarks").exception("%s failed", sid)
        res.seconds = time.monotonic() - t0
        progress(f"{sid} done in {res.seconds:.1f}s" + (f" (error: {res.error})" if res.error else ""))
        results.append(res)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="small sizes (default)")
    g.add_argument("--full", action="store_true", help="the sizes of the targets (100k messages, 10 kills, ...)")
    p.add_argument("--only", default="", help="comma-separated scenario ids, e.g. P1,P3")
    p.add_argument("--json", default="bench-results/bench.json", help="where to write the results")
    p.add_argument("--plain", action="store_true", help="plain-text table (default: rich on a terminal)")
    p.add_argument("-v", "--verbose", action="store_true", help="pcgroups logs on stderr")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        stream=sys.stderr,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    size = FULL if args.full else QUICK
    only = [s.strip().upper() for s in args.only.split(",") if s.strip()] or SCENARIOS
    unknown = [s for s in only if s not in SCENARIOS]
    if unknown:
        p.error(f"unknown scenario(s): {', '.join(unknown)} (known: {', '.join(SCENARIOS)})")

    def progress(text: str) -> None:
        print(f"[bench {size.name}] {text}", file=sys.stderr, flush=True)

    info = machine()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    results = asyncio.run(run_all(size, only, progress))
    rows = [r for res in results for r in res.rows]
    doc = {
        "version": 1,
        "size": size.name,
        "started": started,
        "seconds": round(time.monotonic() - t0, 1),
        "machine": info | {"loadavg_at_end": list(os.getloadavg())},
        "scenarios": [r.as_dict() for r in results],
        "summary": {
            "rows": len(rows),
            "met": sum(1 for r in rows if r.met is True),
            "missed": sum(1 for r in rows if r.met is False),
            "errors": [r.id for r in results if r.error],
        },
    }
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    render(results, doc, plain=args.plain or not sys.stdout.isatty())
    print(f"results written to {out}", file=sys.stderr)
    return 1 if doc["summary"]["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
