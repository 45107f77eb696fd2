"""Bytes that are not UTF-8 where the server allows any: a message's subject or header value, a KV key.

The server takes ``PUB foo.\\xff`` from any client. nats-py decoded subjects as strict UTF-8 in its reader
task, and the error ended that task for good: the connection read nothing more, the member owning the
partition stopped and, after its reconnect, got the same message again (pcgroups.connect.tolerate_undecodable).
The messages are published here through a raw socket, as such a client would.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket

import nats
from nats.js.api import StreamConfig, SubjectTransform

from pcgroups import (
    ConsumerConfig,
    PartitioningFilter,
    create_elastic,
    create_static,
    elastic_consume,
    list_static_groups,
    static_consume,
)
from pcgroups.spark import _nats
from pcgroups.spark._options import ConnectionOptions, SourceOptions
from tests.helpers.cli import procs, run_cg

from .helpers.support import wait_for

FAST = ConsumerConfig(max_ack_pending=1, ack_wait=1)


def raw_publish(url: str, *frames: bytes) -> None:
    """Send protocol ``frames`` (``PUB``/``HPUB`` lines and payloads) on a raw connection, then a PING, and
    wait for the PONG: the server has processed them."""
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.recv(4096)  # INFO
        s.sendall(b'CONNECT {"verbose":false,"headers":true}\r\n' + b"".join(frames) + b"PING\r\n")
        got = b""
        while b"PONG" not in got:
            chunk = s.recv(4096)
            assert chunk and b"-ERR" not in chunk, chunk
            got += chunk


def pub(subject: bytes, payload: bytes = b"bad") -> bytes:
    return b"PUB %s %d\r\n%s\r\n" % (subject, len(payload), payload)


def hpub(subject: bytes, header: bytes, payload: bytes = b"hdr") -> bytes:
    head = b"NATS/1.0\r\n" + header + b"\r\n\r\n"
    return b"HPUB %s %d %d\r\n%s%s\r\n" % (subject, len(head), len(head) + len(payload), head, payload)


async def one_partition_stream(js, stream: str) -> None:
    await js.add_stream(
        StreamConfig(
            name=stream,
            subjects=[f"{stream}.*"],
            allow_direct=True,
            subject_transform=SubjectTransform(
                src=f"{stream}.*", dest=f"{{{{partition(1,1)}}}}.{stream}.{{{{wildcard(1)}}}}"
            ),
        )
    )


async def publish_bad_then_good(url: str, js, stream: str) -> None:
    """Stream sequence 1: a subject with 0xff; 2: a header value with 0xff; 3-5: ordinary messages."""
    raw_publish(url, pub(f"{stream}.".encode() + b"\xff"), hpub(f"{stream}.h".encode(), b"Note: caf\xe9"))
    for i in range(3):
        await js.publish(f"{stream}.ok{i}", b"x")


def handled(seen: list):
    async def handler(msg):
        seen.append((msg.sequence, msg.subject, (msg.headers or {}).get("Note")))
        await msg.ack()

    return handler


def expected(stream: str) -> list:
    return [
        (1, f"{stream}.\ufffd", None),
        (2, f"{stream}.h", "caf\ufffd"),
        *((3 + i, f"{stream}.ok{i}", None) for i in range(3)),
    ]


async def test_a_static_member_goes_on_past_a_subject_that_is_not_utf8(nats_server, nc, js, uniq, caplog):
    """Every message handled in order, the bad one with U+FFFD; one warning names its sequence and stream."""
    caplog.set_level(logging.WARNING)
    await one_partition_stream(js, uniq)
    await create_static(nc, uniq, "g", 1, members=["m1"])
    seen: list = []
    async with await static_consume(nc, uniq, "g", "m1", handled(seen), config=FAST):
        await publish_bad_then_good(nats_server.url, js, uniq)
        await wait_for(lambda: len(seen) == 5, 10, what="5 messages handled")
    assert seen == expected(uniq)
    warnings = [r.getMessage() for r in caplog.records if "not valid UTF-8" in r.getMessage()]
    assert warnings == [
        f"the subject of message 1 of stream {uniq} (consumer g-m1) is not valid UTF-8 "
        f"(0.{uniq}.\\xff): delivered with U+FFFD in place of the invalid bytes"
    ]


async def test_an_elastic_member_with_concurrency_goes_on_past_it(nats_server, nc, js, uniq):
    await js.add_stream(StreamConfig(name=uniq, subjects=[f"{uniq}.*"]))
    await create_elastic(nc, uniq, "g", 1, partitioning_filters=[PartitioningFilter(f"{uniq}.*", [1])])
    await run_cg("elastic", "add", uniq, "g", "m1", url=nats_server.url)
    seen: list = []
    async with await elastic_consume(
        nc, uniq, "g", "m1", handled(seen), config=ConsumerConfig(ack_wait=1), concurrency=4
    ) as inst:
        await inst.wait_for_consuming(10)
        await publish_bad_then_good(nats_server.url, js, uniq)
        await wait_for(lambda: len(seen) == 5, 10, what="5 messages handled")
    assert sorted((s[1], s[2]) for s in seen) == sorted((s[1], s[2]) for s in expected(uniq))


async def test_cg_consume_goes_on_and_exits_at_once_on_sigterm(nats_server, js, uniq):
    url = nats_server.url
    await one_partition_stream(js, uniq)
    (await run_cg("static", "create", "balanced", uniq, "g", "1", "m1", url=url)).ok()
    async with procs() as start:
        p = await start("static", "consume", uniq, "g", "m1", url=url)
        await p.wait_text("consuming...")
        await publish_bad_then_good(url, js, uniq)
        await p.wait_output(lambda o: o.count(" acked\n") == 5, what="5 acked lines")
        p.signal(signal.SIGTERM)
        r = await p.wait(5)
    assert r.code == 0, r.err
    assert f"subject={uniq}.\ufffd, seq=1," in r.out
    assert r.err.count("not valid UTF-8") == 1 and f"message 1 of stream {uniq}" in r.err, r.err


async def test_a_kv_key_that_is_not_utf8_is_listed_not_fatal(nats_server, nc, js, uniq):
    await one_partition_stream(js, uniq)
    await create_static(nc, uniq, "g", 1, members=["m1"])
    raw_publish(nats_server.url, pub(f"$KV.static-consumer-groups.{uniq}.".encode() + b"\xff", b"{}"))
    assert sorted(await asyncio.wait_for(list_static_groups(nc, uniq), 10)) == ["g", "\ufffd"]


async def test_spark_reads_it_with_u_fffd_in_both_read_modes(nats_server, js, uniq):
    url = nats_server.url
    await one_partition_stream(js, uniq)
    await publish_bad_then_good(url, js, uniq)
    nc = await _nats.connect(ConnectionOptions(servers=(url,)))
    try:
        for mode in ("direct", "consumer"):
            plan = await _nats.resolve(
                nc, SourceOptions.parse({"servers": url, "stream": uniq, "partitionCount": "1", "readMode": mode})
            )
            cls = _nats.DirectRangeReader if mode == "direct" else _nats.ConsumerRangeReader
            r = cls(
                nc,
                ConnectionOptions(servers=(url,)),
                uniq,
                0,
                1,
                6,
                plan.layout.filter_subjects(0),
                batch=10,
                include_headers=True,
            )
            await r.open()
            rows = []
            try:
                while (cols := await asyncio.wait_for(r.next_batch(), 10)) is not None:
                    rows += list(
                        zip(cols.sequence, cols.subject, (dict(h).get("Note") for h in cols.headers), strict=False)
                    )
            finally:
                await r.close()
            assert rows == expected(uniq), mode
    finally:
        await nc.close()


async def test_a_plain_client_of_the_library_survives_it(nats_server, uniq):
    """A connection made with nats-py (not pcgroups.connect) gets the tolerance from the first library call."""
    from pcgroups import JetStreamApi

    nc = await nats.connect(nats_server.url)
    try:
        JetStreamApi(nc)
        got: list[str] = []

        async def received(msg):
            got.append(msg.subject)

        await nc.subscribe(f"{uniq}.>", cb=received)
        await nc.flush()
        raw_publish(nats_server.url, pub(f"{uniq}.".encode() + b"\xfe"), pub(f"{uniq}.ok".encode()))
        await wait_for(lambda: len(got) == 2, 5, what="both messages")
        assert got == [f"{uniq}.\ufffd", f"{uniq}.ok"]
        assert (await nc.request("$JS.API.INFO", b"", timeout=5)).data  # the connection still reads
    finally:
        await nc.close()
