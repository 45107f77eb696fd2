"""What a long-running instance costs, sampled from inside its own process (the soak's worker, tests/soak.py).

:func:`sample_forever` prints one JSON line every ``every`` seconds:

``{"ev": "sample", "t": <time.time()>, "rss_kb": .., "fds": .., "tasks": .., "lag_max_ms": .., "lag_mean_ms": ..}``

- ``rss_kb``: the resident set size (``/proc/self/statm``);
- ``fds``: the open file descriptors (``/proc/self/fd``, less the one the listing itself opens);
- ``tasks``: the asyncio tasks not yet done (``asyncio.all_tasks()``, this sampler's own included);
- ``lag_*``: how late the event loop woke a ``tick``-second sleep, the worst and the mean since the last
  line: the time callbacks and tasks held the loop (and the process waited for a CPU);
- ``state``: what ``state()`` says, when given (an instance has more tasks as a member than waiting to be
  one: a task count compares with the same state's).

Linux only (it reads ``/proc``).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable

PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def rss_kb(pid: int | str = "self") -> int:
    """Resident set size of ``pid`` in KiB."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * PAGE_KB


def open_fds(pid: int | str = "self") -> int:
    """Open file descriptors of ``pid`` (for ``self``, not counting the listing's own)."""
    return len(os.listdir(f"/proc/{pid}/fd")) - (1 if pid == "self" else 0)


async def sample_forever(
    every: float, emit: Callable[[str], None], *, tick: float = 0.1, state: Callable[[], str] | None = None
) -> None:
    """Print a sample line every ``every`` seconds until cancelled."""
    loop = asyncio.get_running_loop()
    lags: list[float] = []
    due = loop.time() + every
    while True:
        before = loop.time()
        await asyncio.sleep(tick)
        lags.append(max(0.0, loop.time() - before - tick))
        if loop.time() < due:
            continue
        due += every
        line = {
            "ev": "sample",
            "t": time.time(),
            "rss_kb": rss_kb(),
            "fds": open_fds(),
            "tasks": len(asyncio.all_tasks()),
            "lag_max_ms": round(max(lags) * 1000, 1),
            "lag_mean_ms": round(sum(lags) / len(lags) * 1000, 2),
        }
        if state is not None:
            line["state"] = state()
        emit(json.dumps(line))
        lags.clear()
