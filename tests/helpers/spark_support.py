"""Helpers for the Spark tests: partitioned streams on the real test server, plain nats-py reads."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import nats
from nats.js.api import StreamConfig, SubjectTransform


def fnv1a32(b: bytes) -> int:
    h = 0x811C9DC5
    for x in b:
        h = ((h ^ x) * 0x01000193) & 0xFFFFFFFF
    return h


def partition_of(key: str, n: int) -> int:
    """The partition the server's ``{{partition(n,1)}}`` transform gives a one-token key."""
    return fnv1a32(key.encode()) % n


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def make_stream(
    url: str, name: str, prefix: str, partitions: int, *, allow_direct: bool = True, tokens: int = 1, **cfg
) -> None:
    """Stream ``name`` on ``<prefix>.*`` stored as ``<p>.<prefix>.<key>`` (tokens=1), or on
    ``<prefix>.*.*`` stored as ``<p>.<prefix>.<kind>.<key>``, partitioned by the key (tokens=2)."""
    nc = await nats.connect(url)
    try:
        if tokens == 1:
            subjects, src = [f"{prefix}.*"], f"{prefix}.*"
            dest = f"{{{{partition({partitions},1)}}}}.{prefix}.{{{{wildcard(1)}}}}"
        else:
            subjects, src = [f"{prefix}.*.*"], f"{prefix}.*.*"
            dest = f"{{{{partition({partitions},2)}}}}.{prefix}.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}"
        await nc.jetstream().add_stream(
            StreamConfig(
                name=name,
                subjects=subjects,
                allow_direct=allow_direct,
                subject_transform=SubjectTransform(src=src, dest=dest),
                **cfg,
            )
        )
    finally:
        await nc.close()


async def make_plain_stream(url: str, name: str, subjects: list[str], **cfg) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(StreamConfig(name=name, subjects=subjects, **cfg))
    finally:
        await nc.close()


async def publish(url: str, items: list[tuple[str, bytes]], headers: bool = True) -> list[int]:
    """Publish ``(subject, data)`` pairs with acks (async window); returns their stream sequences."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(publish_async_max_pending=5000)
        futs = []
        for i, (subject, data) in enumerate(items):
            futs.append(await js.publish_async(subject, data, headers={"i": str(i)} if headers else None))
        acks = await asyncio.wait_for(asyncio.gather(*futs), 60)
        return [a.seq for a in acks]
    finally:
        await nc.close()


async def stream_state(url: str, name: str) -> dict:
    nc = await nats.connect(url)
    try:
        msg = await nc.request(f"$JS.API.STREAM.INFO.{name}", b"", timeout=5)
        return json.loads(msg.data)["state"]
    finally:
        await nc.close()


async def read_stream(url: str, name: str, filter_subject: str = ">") -> list[tuple[int, str, bytes, dict]]:
    """Every stored message ``(seq, subject, data, headers)`` in stream order, with plain nats-py."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        info = await js.stream_info(name)
        total = info.state.messages
        out = []
        if total == 0:
            return out
        sub = await js.pull_subscribe(
            filter_subject,
            stream=name,
            config=nats.js.api.ConsumerConfig(ack_policy="none", mem_storage=True, inactive_threshold=10),
        )
        while True:
            try:
                msgs = await sub.fetch(500, timeout=1)
            except nats.errors.TimeoutError:
                break
            for m in msgs:
                out.append((m.metadata.sequence.stream, m.subject, m.data, dict(m.headers or {})))
            if msgs and msgs[-1].metadata.num_pending == 0:
                break
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()


async def put_kv_json(url: str, bucket: str, key: str, value: dict) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        try:
            kv = await js.key_value(bucket)
        except Exception:
            kv = await js.create_key_value(bucket=bucket)
        await kv.put(key, json.dumps(value, separators=(",", ":")).encode())
    finally:
        await nc.close()


async def consumer_names(url: str, stream: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        msg = await nc.request(f"$JS.API.CONSUMER.NAMES.{stream}", b"{}", timeout=5)
        return json.loads(msg.data).get("consumers") or []
    finally:
        await nc.close()


# ---------------------------------------------------------------- a standalone cluster on loopback
class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers on 127.0.0.1, each a JVM started with the pyspark
    wheel's own ``bin/spark-class`` (the wheel has no ``sbin/start-master.sh``), in a session of its own so
    that :meth:`close` also ends the executors (and their Python workers) the workers started."""

    def __init__(self, workdir: str, *, workers: int = 2, cores: int = 1, memory: str = "1g"):
        import pyspark

        self.home = os.path.dirname(pyspark.__file__)
        self.workdir, self.workers, self.cores, self.memory = workdir, workers, cores, memory
        self.procs: list[subprocess.Popen] = []
        self.port = self.ui_port = 0
        os.makedirs(os.path.join(workdir, "conf"), exist_ok=True)  # an empty conf dir: no user's defaults

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "PYSPARK_"))}
        env.update(
            SPARK_HOME=self.home,
            SPARK_CONF_DIR=os.path.join(self.workdir, "conf"),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_DAEMON_MEMORY="256m",
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
        )
        return env

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        with open(os.path.join(self.workdir, f"{name}.log"), "w") as log:
            proc = subprocess.Popen(
                [os.path.join(self.home, "bin", "spark-class"), *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(),
                cwd=self.workdir,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        from pcgroups.testing._server import free_ports

        self.port, self.ui_port = free_ports(2)
        self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(self.ui_port),
            ],
        )
        for i in range(self.workers):
            work = os.path.join(self.workdir, f"worker{i}")
            os.makedirs(work, exist_ok=True)
            [ui] = free_ports(1)
            self._spawn(
                f"worker{i}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--webui-port",
                    str(ui),
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--work-dir",
                    work,
                    self.url,
                ],
            )
        deadline = time.monotonic() + timeout
        while len(self.alive_workers()) < self.workers:
            dead = [p.args[1] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the Spark cluster did not start ({'ended: ' + ', '.join(dead) if dead else 'slow'})"
                    f": {self.tail('master')}"
                )
            time.sleep(0.5)
        return self

    def state(self) -> dict:
        """The master's JSON status (its web UI's ``/json/``)."""
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
            return json.loads(r.read())

    def alive_workers(self) -> list[dict]:
        try:
            return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]
        except OSError:
            return []

    def tail(self, name: str, lines: int = 30) -> str:
        try:
            with open(os.path.join(self.workdir, f"{name}.log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def submit(self, script: str, args: list[str], *, py_files: str, out: str) -> subprocess.Popen:
        """``spark-submit`` ``script`` to the cluster (a driver of its own, in a session of its own), its stdout
        to ``out``: 2 executors of 1 core, the package shipped with ``--py-files``."""
        cmd = [
            os.path.join(self.home, "bin", "spark-submit"),
            "--master",
            self.url,
            "--py-files",
            py_files,
            "--conf",
            "spark.executor.cores=1",
            "--conf",
            "spark.cores.max=2",
            "--conf",
            "spark.executor.memory=512m",
            "--conf",
            "spark.driver.memory=512m",
            "--conf",
            "spark.driver.host=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.ui.showConsoleProgress=false",
            "--conf",
            "spark.sql.shuffle.partitions=2",
            "--conf",
            f"spark.pyspark.python={sys.executable}",
            script,
            *args,
        ]
        with open(out, "w") as log, open(out + ".err", "w") as err:
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=self.env(),
                cwd=self.workdir,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        """SIGTERM every session started here (drivers, workers, master: the last started first), then SIGKILL
        what is left after 10 s."""
        for proc in reversed(self.procs):
            kill_session(proc, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in reversed(self.procs):
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            kill_session(proc, signal.SIGKILL)
            proc.wait()


def kill_session(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the process group of ``proc`` (started with ``start_new_session``): it and its children."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def json_lines(path: str) -> list[dict]:
    """The JSON lines of a job's stdout (other lines skipped)."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return out
