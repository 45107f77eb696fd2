"""Worker subprocesses (``benchmarks.worker``): spawn, read their JSON lines, kill, stop."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Worker:
    """One worker process; ``events`` fills from its stdout as lines arrive."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str):
        self.proc = proc
        self.name = name
        self.events: list[dict] = []
        self.ready = asyncio.Event()
        self.last_start: float = 0.0
        self.starts: list[float] = []
        self.start_events: list[dict] = []
        self.count = 0
        self._reader = asyncio.create_task(self._read())

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            self._on(ev)
        self._ended()

    def _on(self, ev: dict) -> None:
        """One JSON line of the worker."""
        kind = ev.get("ev")
        if kind == "start":
            self.start_events.append(ev)
            self.starts.append(ev["t"])
            self.last_start = ev["t"]
        elif kind == "count":
            self.count = ev["n"]
        else:
            if kind == "ready":
                self.ready.set()
            self.events.append(ev)

    def _ended(self) -> None:
        """Its stdout closed (the process ended)."""

    def first_start_after(self, t: float) -> float | None:
        """Wall-clock time of the first message this worker started after ``t``."""
        i = bisect.bisect_right(self.starts, t)
        return self.starts[i] if i < len(self.starts) else None

    def kill(self) -> float:
        """SIGKILL; returns the wall-clock time it was sent."""
        t = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        return t

    async def stop(self, timeout: float = 10.0) -> None:
        if self.alive:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(self._reader, 5)


async def start_module(module: str, *args: str) -> asyncio.subprocess.Process:
    """``python -m MODULE ARGS`` from the repository, stdout piped, in a session of its own."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        cwd=str(ROOT),
        env=env,
        start_new_session=True,
    )


async def spawn(url: str, flavour: str, stream: str, group: str, member: str, *, name: str = "", **options) -> Worker:
    """A ``benchmarks.worker`` process; ``options`` are its flags (True: a flag alone; False, None: left out)."""
    args = [url, flavour, stream, group, member]
    for k, v in options.items():
        if v is True:
            args.append(f"--{k.replace('_', '-')}")
        elif v is not False and v is not None:
            args += [f"--{k.replace('_', '-')}", str(v)]
    return Worker(await start_module("benchmarks.worker", *args), name or member)


async def ready(worker: Worker, timeout: float) -> Worker:
    """``worker`` once it said it is ready; stopped (then the error raised) when it does not in time."""
    try:
        await asyncio.wait_for(worker.ready.wait(), timeout)
    except BaseException:
        await worker.stop()
        raise
    return worker


async def stop_all(workers: list[Worker]) -> None:
    await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)
