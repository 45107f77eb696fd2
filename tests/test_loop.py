"""The control loop's contract (pcgroups/loop.py), on a toy loop: no server needed.

Events are handled one at a time in arrival order; the first result ends the loop; stop() halts once
and is idempotent; an exception ends the loop with the error (never a zombie); wait() raises that
error; wait_for_consuming raises the end or times out. The consume contexts built on it are covered
with a real server in test_instance.py, test_static.py, test_elastic.py and test_membership.py.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from pcgroups import PCGroupsError
from pcgroups.consume._loop import CONTINUE, ControlLoop, Outcome, Stop


@dataclass(frozen=True)
class Note:
    text: str


@dataclass(frozen=True)
class End:
    error: BaseException | None


class Toy(ControlLoop[Note | End]):
    member_name = "toy"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []
        self.halts = 0
        self.closed_with: list[BaseException | None] = []
        self.attached = asyncio.Event()
        self._launch("toy")

    def _halt(self) -> None:
        self.halts += 1

    async def _attached(self) -> None:
        await self.attached.wait()

    async def _handle(self, event: Note | End | Stop) -> Outcome:
        match event:
            case Note(text="boom"):
                raise RuntimeError("boom")
            case Note(text=text):
                self.seen.append(text)
            case End(error=error):
                return error
            case Stop():
                self.seen.append("stop")
                return None
        return CONTINUE

    async def _close(self, result: BaseException | None) -> BaseException | None:
        self.closed_with.append(result)
        return result


async def test_events_in_order_until_a_result():
    toy = Toy()
    for text in ("a", "b", "c"):
        toy._post(Note(text))
    err = PCGroupsError("over")
    toy._post(End(err))
    toy._post(Note("after"))
    assert await asyncio.wait_for(toy.done(), 2) is err
    assert toy.seen == ["a", "b", "c"] and toy.error is err and toy.closed_with == [err]


async def test_stop_halts_once_and_is_idempotent():
    toy = Toy()
    first, second = toy.stop(), toy.stop()
    assert await asyncio.wait_for(first, 2) is None and await asyncio.wait_for(second, 2) is None
    assert toy.halts == 1 and toy.seen == ["stop"]
    assert await toy.stop() is None and toy.halts == 1  # after the end too


async def test_async_with_stops_on_exit():
    async with Toy() as toy:
        toy._post(Note("x"))
    assert toy._done.done() and toy.seen == ["x", "stop"]


async def test_an_exception_ends_the_loop_with_the_error(caplog):
    toy = Toy()
    toy._post(Note("boom"))
    err = await asyncio.wait_for(toy.done(), 2)
    assert isinstance(err, RuntimeError) and str(err) == "boom"
    assert "toy: control loop failed" in caplog.text


async def test_wait_returns_on_a_normal_end_and_raises_the_error():
    ended = Toy()
    ended.stop()
    assert await asyncio.wait_for(ended.wait(), 2) is None
    failed = Toy()
    err = PCGroupsError("over")
    failed._post(End(err))
    with pytest.raises(PCGroupsError) as raised:
        await asyncio.wait_for(failed.wait(), 2)
    assert raised.value is err
    assert await failed.done() is err  # done() still returns it


async def test_wait_for_consuming_returns_raises_the_end_or_times_out():
    toy = Toy()
    with pytest.raises(asyncio.TimeoutError, match=r"toy did not start consuming within 0\.05s"):
        await toy.wait_for_consuming(0.05)
    toy.attached.set()
    await asyncio.wait_for(toy.wait_for_consuming(), 2)
    other = Toy()
    other._post(End(None))
    with pytest.raises(PCGroupsError, match="ended before consuming"):
        await other.wait_for_consuming(2)
    await toy.stop()
