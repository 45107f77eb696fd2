"""Helpers shared by tests: waiting on conditions (never fixed sleeps)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"
# Observed from the Go reference cg (orbit.go pcgroups v0.2.1) on nats-server 2.15.1: exact KV values, sources and
# per-member filter subjects for a dozen groups (the "about" field says how they were taken).
WIRE_VECTORS = json.loads((DATA / "wire-vectors.json").read_text())


async def wait_for(predicate, timeout: float = 10.0, interval: float = 0.02, what: str = "condition"):
    """Poll ``predicate`` (sync or async) until it is truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
