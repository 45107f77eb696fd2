"""A one-partition static group to test dispatchers on, and publishing keyed messages to it."""

from __future__ import annotations

import asyncio

from nats.js.api import StreamConfig, SubjectTransform

from pcgroups import create_static


async def one_partition_group(js, nc, stream: str) -> None:
    await js.add_stream(
        StreamConfig(
            name=stream,
            subjects=[f"{stream}.>"],
            subject_transform=SubjectTransform(src=f"{stream}.*", dest="0.{{wildcard(1)}}"),
        )
    )
    await create_static(nc, stream, "g", 1, members=["m"])


async def publish(js, stream: str, keys: list[str], start: int = 0, body: bytes | None = None) -> None:
    futs = [await js.publish_async(f"{stream}.{k}", body or str(i).encode()) for i, k in enumerate(keys, start)]
    await asyncio.wait_for(asyncio.gather(*futs), 30)
