"""Helpers shared by tests: waiting on conditions (never fixed sleeps)."""

from __future__ import annotations

import asyncio
import time


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
