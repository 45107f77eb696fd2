"""The library's own CPU per message, without a server: ``PullSession._on_msg`` -> ``Delivery`` -> the dispatcher ->
a handler that does ``await msg.ack()`` -> ``Msg.respond`` -> a publish that does nothing. No NATS server, no
nats-py parsing, no socket: what is left is pcgroups' code and asyncio's tasks and turns. Messages come as a pull's
answers do, in bursts (read from one socket read), with a loop turn between bursts.

    python -m benchmarks.path [--cases k1,k8,k64] [--messages N] [--reps R] [--burst B] [--calls]

Prints, per case (``kK``: concurrency K), the least CPU per message of the repetitions, and the loop turns and
tasks per message; ``--calls`` the Python calls per message (cProfile counts, by function). To compare two
versions of the library, run it from a directory holding the other one's ``pcgroups`` (``python -m`` puts the
working directory first on the path), alternately with this checkout's:

    git archive REV pcgroups | tar -x -C /tmp/old && (cd /tmp/old && PYTHONPATH=$OLDPWD python -m benchmarks.path)
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import pstats
import time
from typing import Any

from nats.aio.msg import Msg as NatsMsg

from pcgroups.consume._dispatchers import as_handle
from pcgroups.consume._keys import key_by_subject
from pcgroups.consume._options import ConsumeOptions, Member, dispatcher_factory
from pcgroups.consume._retry import RetryPolicy
from pcgroups.consume._session import PullSession

PIN = "PIN0PIN0PIN0PIN0PIN0PI"
KEYS = 1000


class Connection:
    """What a session asks of its NATS connection here: a publish that sends nothing."""

    is_closed = False
    max_payload = 1 << 20

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "", headers: Any = None) -> None:
        return None

    def new_inbox(self) -> str:
        return "_INBOX.path"


class Api:
    def pull_subject(self, stream: str, consumer: str) -> str:
        return f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"

    def reconnect_if_silent(self, *args: Any) -> bool:
        return False


def deliveries(n: int) -> list[NatsMsg]:
    return [
        NatsMsg(
            _client=None,  # type: ignore[arg-type]
            subject=f"0.k{i % KEYS}",
            reply=f"$JS.ACK.S.g-m.1.{i}.{i}.1700000000000000000.{n - i}",
            data=b"x" * 64,
            headers={"Nats-Pin-Id": PIN},
        )
        for i in range(1, n + 1)
    ]


async def one(case: str, n: int, burst: int, profile: cProfile.Profile | None = None) -> tuple[float, float, float]:
    """(CPU us per message, loop turns per message, tasks per message) of ``n`` messages through a session."""
    k = int(case[1:])
    done = asyncio.Event()
    count = [0]

    async def handler(msg: Any) -> None:
        await msg.ack()
        count[0] += 1
        if count[0] == n:
            done.set()

    options = ConsumeOptions(handler=handler, concurrency=k)
    factory = dispatcher_factory(
        Connection(),  # type: ignore[arg-type]
        options,
        Member("static", "S", "g", "m"),
        remote=None,
        handle=as_handle(handler),
        key=key_by_subject,
        retry=RetryPolicy(),
        max_ack_pending=16384,
        on_worker=lambda *a: None,
    )
    session = PullSession(
        Connection(),  # type: ignore[arg-type]
        Api(),  # type: ignore[arg-type]
        stream="S",
        consumer="g-m",
        ack_wait=30,
        options=options,
        dispatcher=factory,
    )
    session.delivery.guarded = False
    session.delivery.pin_given(PIN, time.monotonic())
    session.delivery.pulled(time.monotonic())
    dispatching = asyncio.create_task(session.dispatcher.run())
    msgs = deliveries(n)
    loop = asyncio.get_running_loop()
    turns, tasks = [0], [0]
    run_once = loop._run_once  # type: ignore[attr-defined]

    def counted() -> None:
        turns[0] += 1
        run_once()

    def factory_counted(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        tasks[0] += 1
        return asyncio.Task(coro, loop=loop, **kw)

    loop._run_once = counted  # type: ignore[attr-defined]
    loop.set_task_factory(factory_counted)  # type: ignore[arg-type]
    gc.collect()
    if profile is not None:
        profile.enable()
    c0 = time.process_time()
    on_msg = session._on_msg
    for i in range(0, n, burst):
        session._pending = burst
        for m in msgs[i : i + burst]:
            await on_msg(m)
        await asyncio.sleep(0)
        session.delivery.pulled(time.monotonic())
    await asyncio.wait_for(done.wait(), 60)
    cpu = time.process_time() - c0
    if profile is not None:
        profile.disable()
    loop._run_once = run_once  # type: ignore[attr-defined]
    loop.set_task_factory(None)
    session.delivery.close()
    dispatching.cancel()
    try:
        await dispatching
    except BaseException:
        pass
    return cpu / n * 1e6, turns[0] / n, tasks[0] / n


def calls(case: str, n: int, burst: int) -> None:
    profile = cProfile.Profile()
    asyncio.run(one(case, n, burst, profile))
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(nc for (_, _, _), (_, nc, _, _, _) in stats.items())
    print(f"{case}: {total / n:.1f} Python calls per message")
    rows = sorted(
        ((nc / n, f"{f.rsplit('/', 1)[-1]}:{line}:{name}") for (f, line, name), (_, nc, _, _, _) in stats.items()),
        reverse=True,
    )
    for per, where in rows:
        if per >= 0.5:
            print(f"  {per:5.2f} {where}")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.path", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="k1,k8,k64")
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--burst", type=int, default=100)
    p.add_argument("--calls", action="store_true")
    a = p.parse_args()
    for case in a.cases.split(","):
        if a.calls:
            calls(case, 20_000, a.burst)
            continue
        got = [asyncio.run(one(case, a.messages, a.burst)) for _ in range(a.reps)]
        best = min(got)
        print(
            f"{case:5s} {best[0]:6.2f} us/msg (least of {a.reps}: {', '.join(f'{g[0]:.2f}' for g in got)}), "
            f"loop turns {best[1]:.3f}, tasks {best[2]:.3f} per message",
            flush=True,
        )


if __name__ == "__main__":
    main()
