"""HTTP from the tests: the probes (/healthz, /readyz) and the Prometheus metrics an instance or cg metrics serves."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.support import wait_for


def probe(port: int, path: str) -> tuple[int, dict]:
    """(status, JSON body) of GET http://127.0.0.1:port/path; (0, {}) when nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
    except (ConnectionError, TimeoutError, urllib.error.URLError):  # nothing listens, or no answer in time
        return 0, {}


async def aprobe(port: int, path: str) -> tuple[int, dict]:
    return await asyncio.to_thread(probe, port, path)


async def until(port: int, path: str, code: int, reason: str = "", timeout: float = 15) -> dict:
    """Wait until ``path`` answers ``code`` (and a reason containing ``reason``); its body."""
    seen: list[tuple[int, dict]] = []

    async def answered() -> bool:
        seen[:] = [await aprobe(port, path)]
        got, body = seen[0]
        return got == code and reason in body.get("reason", "")

    try:
        await wait_for(answered, timeout=timeout, interval=0.1, what=f"{path} {code} {reason}")
    except AssertionError as e:
        raise AssertionError(f"{e}; last answer: {seen}") from None
    return seen[0][1]


def scrape(port: int) -> dict[str, list]:
    """name -> samples of the metrics served on 127.0.0.1:port (a real HTTP GET, the real parser)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}
