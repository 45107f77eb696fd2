"""Smoke tests of scripts/bench: the quick size of two scenarios runs and writes the JSON shape the
table and BENCHMARKS.md are made from; P8, P9 and P7's elastic side run. No timing targets are asserted
here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROW_KEYS = {"metric", "value", "unit", "baseline", "baseline_label", "ratio", "target", "met"}


def test_quick_bench_writes_the_json_shape(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "P5,P4", "--json", str(out), "--plain"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| id | metric | pcgroups |" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["version"] == 1 and doc["size"] == "quick"
    assert {"nproc", "python", "nats_py", "nats_server", "loadavg_at_start"} <= set(doc["machine"])
    assert [s["id"] for s in doc["scenarios"]] == ["P5", "P4"]
    for scenario in doc["scenarios"]:
        assert scenario["error"] is None
        assert scenario["title"] and scenario["rows"] and isinstance(scenario["details"], dict)
        for row in scenario["rows"]:
            assert set(row) == ROW_KEYS
            for key in ("value", "baseline", "ratio"):
                assert row[key] is None or isinstance(row[key], (int, float))
            assert row["met"] in (True, False, None)
            if row["met"] is not None:
                assert row["target"]
    assert any(r["met"] is not None for s in doc["scenarios"] for r in s["rows"])
    summary = doc["summary"]
    assert summary["rows"] == sum(len(s["rows"]) for s in doc["scenarios"])
    assert summary["errors"] == []


def test_unknown_scenario_is_a_usage_error(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--only", "P99", "--json", str(tmp_path / "x.json")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "unknown scenario" in proc.stderr


def test_p8_times_each_start_up_path_in_a_fresh_process(tmp_path):
    """P8 runs every command it times (static ls must list the scenario's group) and reports their ratios."""
    out = tmp_path / "p8.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--only", "P8", "--json", str(out), "--plain"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (scenario,) = json.loads(out.read_text())["scenarios"]
    assert scenario["error"] is None
    medians = scenario["details"]["median_s"]
    assert set(medians) == {
        "python -c pass",
        "floor",
        "cg --version",
        "cg --help",
        "cg --fisk-introspect",
        "cg static ls",
    }
    assert all(len(v) == 8 for v in scenario["details"]["samples_s"].values())
    rows = {r["metric"].split(",")[0]: r for r in scenario["rows"]}
    assert rows["cg --version"]["met"] in (True, False) and rows["cg static ls STREAM (local server)"]["target"]


def test_p9_drains_the_same_messages_through_both_groups(tmp_path):
    """P9 runs an aggregate group and a one-stream group over the same messages to the last ack."""
    out = tmp_path / "p9.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "P9", "--json", str(out), "--plain"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (scenario,) = json.loads(out.read_text())["scenarios"]
    assert scenario["error"] is None
    details = scenario["details"]
    assert details["messages"] == 20_000 and len(details["rounds"]["aggregate"]) == 2
    assert all(0 < sourced <= total for total, sourced in details["rounds"]["one"] + details["rounds"]["aggregate"])


async def test_p7_elastic_side_acks_the_backlog_through_cg_elastic_consume(nats_server, nc, uniq):
    """P7's elastic side: an elastic group of P7's shape over a plain stream, each member's share acked by
    `cg elastic consume` processes (the round waits for every ack), timed on the work queue's acks; the
    group and its work queue are gone afterwards."""
    from benchmarks import p7_consume as p7
    from pcgroups.errors import NotFoundError
    from pcgroups.jetstream._api import JetStreamApi

    api = JetStreamApi(nc)
    await p7.backlog(nc, uniq, "elastic", 400)
    side = p7.Side("elastic", env=p7.ASYNCIO)
    _, cpu, server_cpu, span = await p7.one_round(
        nats_server.url, nc, api, side, uniq, "g", 0.0, 200, ["m1", "m2"], server_pid=nats_server.proc.pid
    )
    assert span is not None and span > 0 and cpu >= 0 and server_cpu is not None
    with pytest.raises(NotFoundError):
        await api.stream_info(f"{uniq}-g")


def test_p7_compares_static_with_elastic_round_by_round():
    """The target is the median of the rounds' static/elastic ratios, not the ratio of the best rounds."""
    from benchmarks import p7_consume as p7

    static = [(1.0, 200.0, 100.0, 0.5), (3.0, 300.0, 150.0, 0.7)]
    elastic = [(2.0, 250.0, 120.0, 0.6), (2.5, 260.0, 130.0, 0.8)]
    rows = p7.static_vs_elastic({"cg": static, "elastic": elastic}, {"cg": static, "elastic": elastic})
    target = rows[0]
    assert target.ratio == pytest.approx((0.5 + 1.2) / 2) and target.met is True
    assert (target.value, target.baseline) == (2.0, 2.25)
    assert [r.ratio for r in rows[1:]] == [pytest.approx(250 / 255), pytest.approx(125 / 125), pytest.approx(0.6 / 0.7)]
    assert p7.static_vs_elastic({"cg": static}, {}) == []
