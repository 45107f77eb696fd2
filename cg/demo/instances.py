"""The demo's member instances, a process each (``python -m cg.demo.worker``): :class:`Worker` starts one,
follows what it reports (its calls go to the group's recorder, its pin to the demo's view), SIGKILLs it
(a crash) or stops it (SIGTERM: the handler in flight finishes)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from .script import ELASTIC_GROUP, ELASTIC_STREAM, STATIC_GROUP, STATIC_STREAM, Plan

if TYPE_CHECKING:
    from pcgroups.testing import Recorder

ROOT = str(Path(__file__).resolve().parent.parent.parent)  # the tree cg is in: the workers import the same


class Tally(Protocol):
    """What the instances report to (the demo's run): each flavour's record, the acks, who holds which pin."""

    recorders: dict[str, Recorder]
    acked: dict[str, Counter[int]]
    pins: dict[str, str]


class Worker:
    """One member instance process and what it reported."""

    def __init__(self, demo: Tally, flavour: str, member: str, name: str):
        self.demo = demo
        self.flavour = flavour
        self.member = member
        self.name = name
        self.proc: asyncio.subprocess.Process | None = None
        self.reader: asyncio.Task | None = None
        self.ready = asyncio.Event()
        self.pin: str | None = None
        self.state = "starting"
        self.killed_at: float | None = None
        self.error: str | None = None

    @property
    def recorder(self) -> Recorder:
        return self.demo.recorders[self.flavour]

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and self.state not in ("killed", "done")

    async def start(self, url: str, log_dir: str, plan: Plan) -> None:
        stream, group = (STATIC_STREAM, STATIC_GROUP) if self.flavour == "static" else (ELASTIC_STREAM, ELASTIC_GROUP)
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.pop("CG_PRETTY", None)
        with open(os.path.join(log_dir, f"{self.name}.log"), "wb") as log:  # noqa: ASYNC230 - a local log file, once per start
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "cg.demo.worker",
                url,
                self.flavour,
                stream,
                group,
                self.member,
                self.name,
                "--ack-wait",
                str(plan.ack_wait),
                "--work",
                str(plan.work),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                env=env,
                limit=1 << 20,
            )
        self.reader = asyncio.create_task(self._read(), name=f"demo-read-{self.name}")

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            ev = obj.get("ev")
            if ev in ("start", "end"):
                call = self.recorder.feed(obj)
                if ev == "end" and call is not None and call.outcome == "ack":
                    self.demo.acked[self.flavour][call.partition] += 1
                    self.demo.acked[self.name][0] += 1
            elif ev == "pin":
                self.pin = obj.get("pin")
                if self.pin:
                    self.demo.pins[self.pin] = self.name
            elif ev == "ready":
                self.state = "running"
                self.ready.set()
            elif ev == "done":
                self.error = obj.get("error")
                if self.state != "killed":
                    self.state = "done"
        if self.state not in ("killed", "done"):
            self.state = "exited"
        self.pin = None

    def kill(self) -> float:
        """SIGKILL (a crash). Returns the time it was sent."""
        self.killed_at = time.time()
        self.state = "killed"
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
        return self.killed_at

    async def settle_kill(self) -> None:
        """After a kill: read what it printed before it died, then close its open call."""
        if self.reader is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.reader), 5)
            except (TimeoutError, Exception):
                pass
        self.pin = None
        if self.killed_at is not None:
            self.recorder.close_instance(self.name, t=self.killed_at)

    async def stop(self, timeout: float) -> None:
        """SIGTERM (the in-flight handler finishes), SIGKILL if it lingers."""
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.send_signal(signal.SIGTERM)
            except (ProcessLookupError, OSError):
                pass
            try:
                await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                try:
                    proc.kill()
                except ProcessLookupError:
                    pass
                await proc.wait()
        if self.reader is not None:
            try:
                await asyncio.wait_for(self.reader, 5)
            except (TimeoutError, Exception):
                self.reader.cancel()
        if self.killed_at is not None:
            self.recorder.close_instance(self.name, t=self.killed_at)
