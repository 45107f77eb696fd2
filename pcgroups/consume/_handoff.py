"""``async for msg in instance``, for owners who pull messages instead of registering a handler.

:class:`Handoff` is the handler of an instance started with ``handler=None``: it hands each message
to the ``async for`` loop and waits for the loop body. The message is acked when the body finished
and the loop asked for the next one (unless the body settled it itself); when the loop ends without
asking (``break``, an exception in the body) the message is nak'd, so it is redelivered at once.
Order and exclusivity are a handler's: one message at a time, in stream order per partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from ._msg import Msg


class Handoff:
    """The handler of an instance iterated with ``async for`` (see the module docstring); ``done`` is
    the instance's end (None, or the error the loop raises)."""

    def __init__(self, done: asyncio.Future[Any]) -> None:
        self._done = done
        self._queue: asyncio.Queue[tuple[Msg, asyncio.Future[bool]]] = asyncio.Queue()

    async def handler(self, msg: Msg) -> None:
        body: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        await self._queue.put((msg, body))
        if await body:
            if not msg.settled:
                await msg.ack()
        elif not msg.settled:
            await msg.nak()

    async def messages(self) -> AsyncIterator[Msg]:
        """The messages, one at a time, until the instance ends (its error, if any, is raised)."""
        while True:
            item = await self._next()
            if item is None:
                error = self._done.result()
                if error is not None:
                    raise error
                return
            msg, body = item
            try:
                yield msg
            except BaseException:
                if not body.done():
                    body.set_result(False)
                raise
            if not body.done():
                body.set_result(True)

    async def _next(self) -> tuple[Msg, asyncio.Future[bool]] | None:
        if not self._queue.empty():
            return self._queue.get_nowait()
        getter = asyncio.ensure_future(self._queue.get())
        try:
            await asyncio.wait({getter, self._done}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()
        return getter.result() if getter.done() and not getter.cancelled() else None
