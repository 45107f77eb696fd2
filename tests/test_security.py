"""The least-privilege roles of docs/SECURITY.md on a nats-server that enforces them.

The server's authorization block is read from docs/SECURITY.md itself (its ``conf`` block), so the
documented permissions are the tested ones. The test adds its own passwords, a ``root`` user to set up
the streams and traffic, and two deliberately broken users (a member without its ack permission, a user
that may not subscribe to its inbox). Each role does its job and is refused the rest; every refusal is a
:class:`PermissionDeniedError` (``cg: error: permission denied: ...``, one line) long before the request
timeout, which is set to 20 s here so that a wait for it could not pass unnoticed.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import nats
import pytest

from pcgroups import (
    ConsumerConfig,
    JetStreamApi,
    PermissionDeniedError,
    add_members,
    create_static,
    delete_elastic,
    delete_static,
    elastic_consume,
    elastic_member_step_down,
    get_static_config,
    list_leases,
    partition_of_subject,
    serve_worker,
    set_member_mappings,
    static_consume,
    static_member_step_down,
)
from pcgroups.config import MemberMapping
from pcgroups.deadletters import execute_plan, list_dead_letters, plan_purge
from pcgroups.jetstream import Connection, Violation
from pcgroups.pool import _wire as pool_wire
from pcgroups.spark import _nats as spark_nats
from pcgroups.spark._options import SinkOptions, SourceOptions
from pcgroups.static._admin import create_static_consumers
from tests.helpers.cli import assert_cli_error, cg, cg_env, run_cg
from tests.helpers.deadletters import make_dead_letter_stream, write_dead_letter
from tests.helpers.secured import AUDIT_POOL, FAST, PARTITIONS, ROLES, SECURITY, TIMEOUT, Secured, documented_allow

from .helpers.support import wait_for


async def publish(s: Secured, subjects: list[str]) -> None:
    nc = await nats.connect(s.url, user="root", password=s.passwords["root"])
    js = nc.jetstream()
    for subject in subjects:
        await js.publish(subject, b"x")
    await nc.close()


async def refused(aw, subject: str, operation: str = "publish") -> PermissionDeniedError:
    """``aw`` fails with a PermissionDeniedError naming ``subject``, long before the request timeout."""
    t0 = time.monotonic()
    with pytest.raises(PermissionDeniedError) as info:
        await asyncio.wait_for(aw, TIMEOUT)
    took = time.monotonic() - t0
    assert took < FAST, f"refused only after {took:.1f}s"
    e = info.value
    assert (e.operation, e.subject) == (operation, subject), str(e)
    assert f"{operation} to {subject} is not allowed" in str(e) and "\n" not in str(e)
    return e


def recorder():
    got: list = []

    async def handler(msg) -> None:
        got.append(msg.subject)
        await msg.ack()

    return got, handler


CONFIG = ConsumerConfig(ack_wait=2, max_ack_pending=1)


# --- admin ----------------------------------------------------------------------------------------------------
async def test_admin_changes_memberships_but_cannot_consume(secured):
    nc = await secured.connect("admin")
    try:
        await create_static(nc, "ORDERS", "shipping", PARTITIONS, members=["m1", "m2"])  # idempotent: reads it
        await add_members(nc, "EVENTS", "billing", ["m3"])
        await set_member_mappings(nc, "EVENTS", "billing", [MemberMapping("m1", [0, 1]), MemberMapping("m2", [2, 3])])
        for args in (
            ("elastic", "delete-mapping", "EVENTS", "billing"),
            ("elastic", "add", "EVENTS", "billing", "m1", "m2"),
            ("elastic", "drop", "EVENTS", "billing", "m2"),
            ("elastic", "add", "EVENTS", "billing", "m2"),
            ("static", "ls", "ORDERS"),
            ("elastic", "info", "EVENTS", "billing"),
        ):
            (await run_cg(*secured.cli("admin"), *args)).ok()
        # an operator, not a worker: it cannot run an instance (its first refusal: the config watch)
        await refused(
            static_consume(nc, "ORDERS", "shipping", "m1", recorder()[1], config=CONFIG),
            "$JS.API.CONSUMER.CREATE.KV_static-consumer-groups",
        )
    finally:
        await nc.close()


# --- members --------------------------------------------------------------------------------------------------
async def consuming(secured: Secured, nc, flavour: str, stream: str, group: str, member: str):
    """An instance of ``member`` that handled messages, and was stepped down once by the admin."""
    got, handler = recorder()
    consume = static_consume if flavour == "static" else elastic_consume
    inst = await consume(nc, stream, group, member, handler, config=CONFIG)
    await inst.wait_for_consuming(10)
    await publish(secured, [f"{stream.lower()}.k{i}" for i in range(12)])  # m1 owns 2 of the 4 partitions
    await wait_for(lambda: len(got) >= 3, 15, what=f"{member}'s messages")
    (await run_cg(*secured.cli("admin"), flavour, "step-down", stream, group, member)).ok()
    return inst, handler


async def test_static_member_consumes_its_partitions_only(secured):
    nc = await secured.connect("shipping-m1")
    try:
        inst, handler = await consuming(secured, nc, "static", "ORDERS", "shipping", "m1")
        api = JetStreamApi(nc, timeout=TIMEOUT)
        # checked before anything is deleted: m2's consumer first (its own it may delete), then the config
        await refused(delete_static(nc, "ORDERS", "shipping"), "$JS.API.CONSUMER.DELETE.ORDERS.shipping-m2")
        await refused(
            static_consume(nc, "ORDERS", "shipping", "m2", handler, config=CONFIG),
            "$JS.API.CONSUMER.INFO.ORDERS.shipping-m2",
        )
        await refused(api.consumer_info("ORDERS", "shipping-m2"), "$JS.API.CONSUMER.INFO.ORDERS.shipping-m2")
        await refused(api.list_consumers("EVENTS-billing"), "$JS.API.CONSUMER.LIST.EVENTS-billing")
        await refused(api.consumer_info("EVENTS-billing", "m1"), "$JS.API.CONSUMER.INFO.EVENTS-billing.m1")
        assert inst.consuming  # the refusals of other requests did not end the instance
        assert await asyncio.wait_for(inst.stop(), 10) is None
    finally:
        await nc.close()


async def test_a_member_whose_consumer_the_admin_made_cannot_read_other_partitions(secured):
    """shipping-m2 attaches to the consumer the admin made; it may not delete it nor give it other filters (the
    way a member that creates its own consumer can read every partition: docs/SECURITY.md, Wider than needed)."""
    nc = await secured.connect("shipping-m2")
    try:
        inst, _ = await consuming(secured, nc, "static", "ORDERS", "shipping", "m2")
        api = JetStreamApi(nc, timeout=TIMEOUT)
        info = await api.consumer_info("ORDERS", "shipping-m2")
        wider = ConsumerConfig(
            **{
                **CONFIG.__dict__,
                "durable_name": "shipping-m2",
                "filter_subjects": [f"{p}.>" for p in range(PARTITIONS)],
            }
        )
        await refused(
            api.create_consumer("ORDERS", wider, action="update"), "$JS.API.CONSUMER.CREATE.ORDERS.shipping-m2"
        )
        await refused(api.delete_consumer("ORDERS", "shipping-m2"), "$JS.API.CONSUMER.DELETE.ORDERS.shipping-m2")
        await refused(api.consumer_info("ORDERS", "shipping-m1"), "$JS.API.CONSUMER.INFO.ORDERS.shipping-m1")
        assert (
            (await api.consumer_info("ORDERS", "shipping-m2"))["config"]["filter_subjects"]
            == info["config"]["filter_subjects"]
            == ["2.>", "3.>"]
        )
        assert inst.consuming
        assert await asyncio.wait_for(inst.stop(), 10) is None
    finally:
        await nc.close()


async def test_elastic_member_cannot_change_or_delete_its_group(secured):
    nc = await secured.connect("billing-member")
    try:
        inst, _ = await consuming(secured, nc, "elastic", "EVENTS", "billing", "m1")
        api = JetStreamApi(nc, timeout=TIMEOUT)
        await refused(add_members(nc, "EVENTS", "billing", ["m9"]), "$KV.elastic-consumer-groups.EVENTS.billing")
        await refused(delete_elastic(nc, "EVENTS", "billing"), "$JS.API.STREAM.DELETE.EVENTS-billing")
        await refused(api.delete_stream("EVENTS-billing"), "$JS.API.STREAM.DELETE.EVENTS-billing")
        await refused(api.list_consumers("EVENTS-audit"), "$JS.API.CONSUMER.LIST.EVENTS-audit")
        await refused(api.consumer_info("ORDERS", "shipping-m1"), "$JS.API.CONSUMER.INFO.ORDERS.shipping-m1")
        assert inst.consuming
        assert await asyncio.wait_for(inst.stop(), 10) is None
    finally:
        await nc.close()


async def test_auto_member_joins_by_lease_and_stays_in_its_group(secured):
    nc = await secured.connect("audit-member")
    got, handler = recorder()
    try:
        inst = await elastic_consume(nc, "EVENTS", "audit", "", handler, config=CONFIG, auto=True, lease_ttl=2)
        await inst.wait_settled(15)
        await inst.wait_for_consuming(10)
        await publish(secured, [f"events.a{i}" for i in range(8)])
        await wait_for(lambda: len(got) >= 8, 15, what="every message (the only member owns every partition)")
        api = JetStreamApi(nc, timeout=TIMEOUT)
        await refused(api.delete_stream("EVENTS-audit"), "$JS.API.STREAM.DELETE.EVENTS-audit")
        await refused(
            add_members(nc, "EVENTS", "billing", ["m9"]),  # it may not even read billing's config
            "$JS.API.DIRECT.GET.KV_elastic-consumer-groups.$KV.elastic-consumer-groups.EVENTS.billing",
        )
        await refused(api.list_consumers("EVENTS-billing"), "$JS.API.CONSUMER.LIST.EVENTS-billing")
        # it may delete its group's config but not the work queue: the delete is refused before it changes anything
        r = await run_cg(*secured.cli("audit-member"), "elastic", "delete", "-f", "EVENTS", "audit")
        assert_cli_error(r, "permission denied: publish to $JS.API.STREAM.DELETE.EVENTS-audit is not allowed")
        assert (await JetStreamApi(nc).stream_info("EVENTS-audit"))["config"]["name"] == "EVENTS-audit"
        (await run_cg(*secured.cli("admin"), "elastic", "info", "EVENTS", "audit")).ok()  # the config is there
        assert inst.consuming
        assert await asyncio.wait_for(inst.stop(), 15) is None
    finally:
        await nc.close()


async def test_admin_can_do_what_the_observer_can(secured):
    for args in (
        ("elastic", "status", "EVENTS", "audit"),
        ("elastic", "status", "EVENTS", "billing", "--json"),
        ("static", "status", "ORDERS", "shipping"),
        ("static", "member-info", "ORDERS", "shipping", "m1"),
    ):
        r = (await run_cg(*secured.cli("admin"), *args)).ok()
        assert r.out.strip(), args


# --- observer -------------------------------------------------------------------------------------------------
async def test_observer_reads_everything_and_cannot_consume_or_ack(secured):
    for args in (
        ("static", "ls", "ORDERS"),
        ("static", "info", "ORDERS", "shipping"),
        ("static", "status", "ORDERS", "shipping", "--json"),
        ("static", "member-info", "ORDERS", "shipping", "m1"),
        ("elastic", "ls", "EVENTS", "--json"),
        ("elastic", "info", "EVENTS", "billing", "--json"),
        ("elastic", "status", "EVENTS", "billing"),
        ("elastic", "status", "EVENTS", "audit", "--json"),
    ):
        r = (await run_cg(*secured.cli("observer"), *args)).ok()
        assert r.out.strip(), args
    assert "shipping" in (await run_cg(*secured.cli("observer"), "static", "ls", "ORDERS")).out
    nc = await secured.connect("observer")
    try:
        assert await list_leases(nc, "EVENTS", "audit") == []  # the lease bucket is readable (no live instance)
        await refused(
            static_consume(nc, "ORDERS", "shipping", "m1", recorder()[1], config=CONFIG),
            "$JS.API.CONSUMER.CREATE.KV_static-consumer-groups",
        )
        await refused(
            elastic_member_step_down(nc, "EVENTS", "billing", "m1"), "$JS.API.CONSUMER.UNPIN.EVENTS-billing.m1"
        )
        # an ack (or a pull) is a plain publish, never answered: the watch reports the refusal
        seen: list[Violation] = []
        stop = Connection.of(nc).permissions.listen(seen.append)
        await nc.publish("$JS.ACK.ORDERS.shipping-m1.1.1.1.1.0", b"+ACK")
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.ORDERS.shipping-m1", b'{"batch":1}')
        await wait_for(lambda: len(seen) >= 2, FAST, what="the refused ack and pull")
        stop()
        assert [v.operation for v in seen] == ["publish", "publish"]
        assert seen[0].error().subject == "$JS.ACK.orders.shipping-m1.1.1.1.1.0"  # nats-py lower-cases it
    finally:
        await nc.close()


# --- Spark ----------------------------------------------------------------------------------------------------
async def test_spark_reader_reads_the_partitions_and_nothing_else(secured):
    opts = SourceOptions.parse(
        {
            "servers": secured.url,
            "user": "spark-reader",
            "password": secured.passwords["spark-reader"],
            "stream": "ORDERS",
            "group": "shipping",
            "requestTimeout": f"{TIMEOUT:g}s",
        }
    )
    await publish(secured, [f"orders.r{i}" for i in range(8)])
    nc = await spark_nats.connect(opts.conn)
    try:
        plan = await spark_nats.resolve(nc, opts)
        assert plan.mode == "direct" and plan.layout.partition_count == PARTITIONS
        last = plan.state.last_seq
        rows = 0
        for p in range(PARTITIONS):
            reader = spark_nats.DirectRangeReader(
                nc, opts.conn, "ORDERS", p, 1, last + 1, (f"{p}.>",), batch=100, include_headers=False
            )
            await reader.open()
            while (cols := await reader.next_batch()) is not None:
                rows += len(cols)
            await reader.close()
        assert rows == last
        await refused(
            spark_nats.api(nc, opts.conn, "CONSUMER.INFO.ORDERS.shipping-m1"),
            "$JS.API.CONSUMER.INFO.ORDERS.shipping-m1",
        )
        await refused(
            spark_nats.api(nc, opts.conn, "CONSUMER.MSG.NEXT.ORDERS.shipping-m1", {"batch": 1}),
            "$JS.API.CONSUMER.MSG.NEXT.ORDERS.shipping-m1",
        )
    finally:
        await nc.close()


async def test_spark_writer_publishes_and_reads_nothing(secured):
    opts = SinkOptions.parse(
        {"servers": secured.url, "user": "spark-writer", "password": secured.passwords["spark-writer"]}
    )
    nc = await spark_nats.connect(opts.conn)
    try:
        sent, dups = await spark_nats.publish_all(
            nc.jetstream(),
            [(f"orders.w{i}", b"w", {}) for i in range(20)],
            window=8,
            timeout=TIMEOUT,
            expected_stream=None,
        )
        assert (sent, dups) == (20, 0)
        await refused(spark_nats.stream_info(nc, opts.conn, "ORDERS"), "$JS.API.STREAM.INFO.ORDERS")
        for window in (1, 8):  # a refused publish is never acked: it fails at once, not after the timeout
            rows = [("orders.w", b"w", {}), ("Events.Refused", b"w", {}), ("orders.w", b"w", {})]
            await refused(
                spark_nats.publish_all(nc.jetstream(), rows, window=window, timeout=TIMEOUT, expected_stream=None),
                "Events.Refused",
            )
    finally:
        await nc.close()


# --- what a missing permission looks like ----------------------------------------------------------------------
async def test_a_refusal_is_one_cli_line_naming_subject_and_permission(secured):
    t0 = time.monotonic()
    r = await asyncio.to_thread(
        cg, *secured.cli("observer"), "static", "delete", "-f", "ORDERS", "shipping", env=cg_env()
    )
    assert time.monotonic() - t0 < FAST + 5  # a subprocess start, not the 20 s request timeout
    assert_cli_error(
        r,
        "permission denied: publish to $JS.API.CONSUMER.DELETE.ORDERS.shipping-m1 is not allowed "
        "for this user (missing publish permission)",
    )  # checked before the config is deleted
    assert len(r.err.splitlines()) == 1, r.err
    r = await run_cg(*secured.cli("observer"), "static", "consume", "ORDERS", "shipping", "m1")
    assert_cli_error(
        r, "permission denied: publish to $JS.API.CONSUMER.CREATE.KV_static-consumer-groups is not allowed"
    )
    assert len(r.err.splitlines()) == 1, r.err
    r = await run_cg(*secured.cli("no-inbox"), "elastic", "info", "EVENTS", "billing")
    assert_cli_error(r, "permission denied: subscribe to _INBOX.")
    assert "allow _INBOX.> or the inbox prefix" in r.err and len(r.err.splitlines()) == 1, r.err


async def test_a_member_without_its_ack_permission_ends_at_once(secured):
    """shipping-noack: shipping-m1's permissions without $JS.ACK. Its handler's first ack is refused and
    the instance ends with that error instead of taking the message again and again."""
    nc = await secured.connect("shipping-noack")
    _got, handler = recorder()
    try:
        inst = await static_consume(nc, "ORDERS", "shipping", "m1", handler, config=CONFIG)
        await inst.wait_for_consuming(10)
        await publish(secured, [f"orders.n{i}" for i in range(8)])
        error = await asyncio.wait_for(inst.done(), 15)
        assert isinstance(error, PermissionDeniedError), error
        assert error.subject == "$JS.ACK.ORDERS.shipping-m1.>" and error.operation == "publish"
    finally:
        await nc.close()


# --- the worker pool -------------------------------------------------------------------------------------------
POOL = "$PCG.POOL.static.ORDERS.shipping"
POOL_CONFIG = ConsumerConfig(ack_wait=2, max_ack_pending=16)  # a window: several messages at the workers at once


def m1_subjects(prefix: str, n: int) -> list[str]:
    """``n`` subjects ``orders.<prefix><i>`` in m1's partitions (0 and 1)."""
    subjects = (f"orders.{prefix}{i}" for i in range(10 * n))
    return [s for s in subjects if partition_of_subject(s, PARTITIONS, [1], "orders.*") in (0, 1)][:n]


def violations(nc) -> list[Violation]:
    """Every permission violation the server reports on ``nc`` from now on (PermissionWatch passes on only those
    of JetStream, KV, pool and inbox subjects)."""
    seen: list[Violation] = []
    forward = nc._error_cb

    async def on_error(e: Exception) -> None:
        v = Violation.parse(e)
        if v is not None:
            seen.append(v)
        await forward(e)

    nc._error_cb = on_error
    return seen


class Pool:
    """A dispatching instance of m1 (user shipping-dispatcher) and workers, each on a connection of its own."""

    def __init__(self, secured: Secured):
        self.secured = secured
        self.handled: list[tuple[str, str, int]] = []  # (worker, subject, delivery count)
        self.connections: list = []
        self.workers: list = []
        self.dispatcher = None
        self.slow: set[str] = set()
        self.started: list[str] = []
        self.events: list = []  # the dispatching instance's

    async def connect(self, user: str):
        nc = await self.secured.connect(user)
        self.connections.append(nc)
        return nc

    async def start(self, *workers: tuple[str, str]) -> Pool:
        nc = await self.connect("shipping-dispatcher")
        self.dispatcher = await static_consume(
            nc, "ORDERS", "shipping", "m1", None, dispatch=True, config=POOL_CONFIG, on_event=self.events.append
        )
        await self.dispatcher.wait_for_consuming(15)
        for user, name in workers:
            self.workers.append(
                await serve_worker(
                    await self.connect(user),
                    "static",
                    "ORDERS",
                    "shipping",
                    self.handler(name),
                    name=name,
                    ack_wait=POOL_CONFIG.ack_wait,
                )
            )
        for w in self.workers:
            await w.wait_for_consuming(10)
        return self

    def handler(self, name: str):
        async def handle(msg) -> None:
            self.started.append(msg.subject)
            if msg.subject in self.slow:  # longer than AckWait: the worker's +WPI keeps it
                await asyncio.sleep(POOL_CONFIG.ack_wait * 1.5)
            await msg.ack_sync()  # a request: the reply comes to the worker's own inbox
            self.handled.append((name, msg.subject, msg.deliveries))

        return handle

    async def close(self) -> None:
        for w in self.workers:
            assert await asyncio.wait_for(w.stop(), 15) is None
        if self.dispatcher is not None:
            assert await asyncio.wait_for(self.dispatcher.stop(), 15) is None
        for nc in self.connections:
            await nc.close()


@pytest.fixture
async def pool(secured):
    p = Pool(secured)
    try:
        yield p
    finally:
        await p.close()


async def test_workers_take_their_offers_and_ack_them(secured, pool):
    """A worker of each kind (shipping-w1, its own user; shipping-worker, one user for all) enrols, takes offers
    and acks them (+WPI included: a call longer than AckWait is not redelivered); cg status shows the pool to
    the observer. The shared user can read the other worker's offers: the documented price of sharing."""
    spy = await pool.connect("shipping-worker")
    offers = await spy.subscribe(f"{POOL}.W.w1.*.work")
    await pool.start(("shipping-w1", "w1"), ("shipping-worker", "wx"))
    subjects = m1_subjects("pool", 12)
    pool.slow = {subjects[0]}
    await publish(secured, subjects[:1])  # first: its worker is busy with it, the other takes the rest
    await wait_for(lambda: subjects[0] in pool.started, 10, what="the slow call started")
    await publish(secured, subjects[1:])

    def mine() -> list[tuple[str, str, int]]:  # earlier tests' calls come too
        return [(w, s, d) for w, s, d in pool.handled if s in subjects]

    await wait_for(lambda: len(mine()) >= len(subjects), 20, what="every message handled")
    assert sorted(s for _, s, _ in mine()) == sorted(subjects)
    assert {w for w, _, _ in mine()} == {"w1", "wx"}
    assert [d for _, _, d in mine()] == [1] * len(subjects)  # none redelivered, the slow one included
    root = JetStreamApi(await pool.connect("root"), timeout=TIMEOUT)

    async def settled() -> bool:
        info = await root.consumer_info("ORDERS", "shipping-m1")
        return info["num_ack_pending"] == info["num_pending"] == 0

    await wait_for(settled, 10, what="m1's consumer with nothing pending")
    offer = await offers.next_msg(FAST)  # one of w1's offers, read by another worker's user
    assert offer.headers["Pcg-Delivery"].startswith("ORDERS.shipping-m1.") and offer.data  # body and all
    assert "Pcg-Ack" not in offer.headers and "Pcg-Pin" not in offer.headers  # nothing to pull or ack with
    r = (await run_cg(*secured.cli("observer"), "static", "status", "ORDERS", "shipping", "--json")).ok()
    [pool_status] = json.loads(r.out)["pools"]
    assert sorted(w["name"] for w in pool_status["workers"]) == ["w1", "wx"]
    for w in pool.workers:
        assert w.consuming


async def test_a_worker_cannot_read_configs_touch_groups_or_take_what_it_was_not_given(secured):
    """shipping-w1's user, besides running its worker: no JetStream API at all, no other worker's offers, no
    inbox but its own (the dispatcher's pulled messages come to the dispatcher's inbox), no dispatcher's part."""
    nc = await secured.connect("shipping-w1")
    try:
        api = JetStreamApi(nc, timeout=TIMEOUT)
        await refused(api.stream_info("ORDERS"), "$JS.API.STREAM.INFO.ORDERS")
        config_bucket = "$JS.API.STREAM.INFO.KV_static-consumer-groups"
        await refused(get_static_config(nc, "ORDERS", "shipping"), config_bucket)
        await refused(delete_static(nc, "ORDERS", "shipping"), "$JS.API.STREAM.INFO.ORDERS")
        await refused(create_static_consumers(nc, "ORDERS", "shipping"), config_bucket)
        await refused(static_member_step_down(nc, "ORDERS", "shipping", "m1"), config_bucket)
        await refused(add_members(nc, "EVENTS", "billing", ["m9"]), "$JS.API.STREAM.INFO.KV_elastic-consumer-groups")
        await refused(
            static_consume(nc, "ORDERS", "shipping", "m1", recorder()[1], config=CONFIG), "$JS.API.STREAM.INFO.ORDERS"
        )
        await refused(api.consumer_info("ORDERS", "shipping-m1"), "$JS.API.CONSUMER.INFO.ORDERS.shipping-m1")
        # plain publishes and subscriptions, never answered: the server's refusals
        seen = violations(nc)
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.ORDERS.shipping-m1", b'{"batch":1}')
        await nc.publish("$JS.API.DIRECT.GET.ORDERS", b'{"seq":1}')
        await nc.publish("$JS.API.DIRECT.GET.KV_static-consumer-groups.$KV.static-consumer-groups.ORDERS.shipping", b"")
        await nc.publish(f"{POOL}.HELLO", b"{}")
        await nc.publish(f"{POOL}.W.wx.00000000.work", b"x")
        await nc.publish(f"{POOL}.STATUS", b"")
        for subject in (
            "_INBOX.>",
            f"{POOL}.W.wx.*.work",
            f"{POOL}.W.*.*.work",
            f"{POOL}.HB",
            f"{POOL}.D.*.R.*",
            "orders.*",
            "$JS.ACK.ORDERS.>",
        ):
            await nc.subscribe(subject)
        await wait_for(lambda: len(seen) >= 13, FAST, what="thirteen refusals")
        assert sorted((v.operation, v.subject) for v in seen) == sorted(
            [
                ("publish", "$js.api.consumer.msg.next.orders.shipping-m1"),
                ("publish", "$js.api.direct.get.orders"),
                ("publish", "$js.api.direct.get.kv_static-consumer-groups.$kv.static-consumer-groups.orders.shipping"),
                ("publish", f"{POOL}.HELLO".lower()),
                ("publish", f"{POOL}.W.wx.00000000.work".lower()),
                ("publish", f"{POOL}.STATUS".lower()),
                ("subscribe", "_inbox.>"),
                ("subscribe", f"{POOL}.W.wx.*.work".lower()),
                ("subscribe", f"{POOL}.W.*.*.work".lower()),
                ("subscribe", f"{POOL}.HB".lower()),
                ("subscribe", f"{POOL}.D.*.R.*".lower()),
                ("subscribe", "orders.*"),
                ("subscribe", "$js.ack.orders.>"),
            ]
        )
    finally:
        await nc.close()


async def test_a_forged_reply_subject_does_not_steer_the_dispatcher(secured):
    """The dispatcher answers a heartbeat on the worker's own subject, never on the reply subject the heartbeat
    names, and answers no status request on a $ subject. Otherwise whoever may send one (a worker, an observer)
    could make it publish where only it may: an automatic member may write its group's config, and the answer
    would overwrite it (every instance of the group would end on the broken config)."""
    events: list = []
    nc = await secured.connect("audit-dispatcher")
    root = await nats.connect(secured.url, user="root", password=secured.passwords["root"])
    try:
        inst = await elastic_consume(
            nc,
            "EVENTS",
            "audit",
            "",
            None,
            config=CONFIG,
            auto=True,
            lease_ttl=2,
            dispatch=True,
            on_event=events.append,
        )
        await inst.wait_settled(15)
        await inst.wait_for_consuming(10)
        config = "$KV.elastic-consumer-groups.EVENTS.audit"
        hb = pool_wire.Heartbeat("evil", "0000beef", 1, stopping=True).encode()

        async def forged() -> bool:  # again until taken, as a worker beats (the instance may be starting over)
            await root.publish(f"{AUDIT_POOL}.STATUS", b"", reply=config)
            await root.publish(f"{AUDIT_POOL}.HB", hb, reply=config)
            await root.flush()
            return any(e.kind == "worker-joined" for e in events)

        await wait_for(forged, FAST, interval=0.2, what="the heartbeat taken")
        (await run_cg(*secured.cli("admin"), "elastic", "info", "EVENTS", "audit")).ok()  # the config as it was
        assert inst.consuming
        assert await asyncio.wait_for(inst.stop(), 15) is None
    finally:
        await root.close()
        await nc.close()


async def test_a_heartbeat_whose_name_or_id_is_no_subject_token_is_ignored(secured, pool):
    """The answer and the offers go to the worker's own subjects, made of its name and id: a heartbeat whose
    name or id is not one token of a subject is ignored (the dispatcher would publish where it may not)."""
    await pool.start(("shipping-w1", "w1"))
    worker = await pool.connect("shipping-worker")
    for name, wid in (
        ("a b", "0000bee1"),
        ("a.b", "0000bee2"),
        ("evil2", "x.y"),
        ("evil3", "*"),
        ("evil4", ""),
        ("ok", "0000bee3"),
    ):
        await worker.publish(
            f"{POOL}.HB", pool_wire.Heartbeat(name, wid, 1, stopping=True).encode(), reply=f"{POOL}.W.x.y.hb"
        )
    await wait_for(lambda: any(e.detail.startswith("ok:") for e in pool.events), FAST, what="the valid heartbeat")
    subjects = m1_subjects("names", 3)
    await publish(secured, subjects)
    await wait_for(lambda: {s for _, s, _ in pool.handled} >= set(subjects), 15, what="later messages handled")
    joined = [e.detail.split(":")[0] for e in pool.events if e.kind == "worker-joined"]
    assert sorted(joined) == ["ok", "w1"], joined
    assert pool.dispatcher.consuming


async def test_a_worker_that_takes_an_offer_can_neither_pull_nor_ack_the_members_consumer(secured, pool):
    """A worker user (shipping-w1, as the worker w1 of raw NATS) takes an offer, then tries what the offer could give
    away: a pull (``+NXT``) and an ack on the member's consumer, with the offer's pin if it has one, and the same
    on the offer's reply subject. The JetStream publishes are refused, the reply subject takes none of them (the
    dispatcher acks only on a worker's word for its own offer), and nothing is delivered to the worker."""
    await pool.start()
    nc = await pool.connect("shipping-w1")
    seen = violations(nc)
    wid = "0000cafe"
    offers = await nc.subscribe(f"{POOL}.W.w1.{wid}.work")
    inbox = "_INBOX_shipping_w1.pull"
    pulled = await nc.subscribe(inbox)
    hb = pool_wire.Heartbeat("w1", wid, 1).encode()

    async def enrolled() -> bool:
        await nc.publish(f"{POOL}.HB", hb, reply=f"{POOL}.W.w1.{wid}.hb")
        return any(e.kind == "worker-joined" and e.detail.startswith("w1:") for e in pool.events)

    await wait_for(enrolled, FAST, interval=0.2, what="the raw worker enrolled")
    subjects = m1_subjects("grab", 20)
    await publish(secured, subjects)
    offer = await offers.next_msg(10)
    headers = offer.headers or {}
    ack = headers.get("Pcg-Ack") or "$JS.ACK." + headers["Pcg-Delivery"]
    pin = headers.get("Pcg-Pin", "")
    pull = (f'+NXT {{"batch":50,"group":"PCG","id":"{pin}"}}').encode()
    for subject in (ack, offer.reply):
        await nc.publish(subject, pull, reply=inbox)
        await nc.publish(subject, b"+ACK")
        await nc.publish(subject, b"+TERM")
    await nc.flush()
    with pytest.raises(nats.errors.TimeoutError):
        got = await pulled.next_msg(3)
        pytest.fail(f"the worker pulled {got.subject}: {got.data[:60]!r}")
    assert seen and {(v.operation, ".".join(v.subject.split(".")[:4])) for v in seen} == {
        ("publish", "$js.ack.orders.shipping-m1")
    }, seen
    root = JetStreamApi(await pool.connect("root"), timeout=TIMEOUT)
    info = await root.consumer_info("ORDERS", "shipping-m1")
    assert info["num_ack_pending"] >= 1 and info["num_redelivered"] == 0, info  # the offer: not acked, not termed


async def test_a_worker_of_another_name_than_its_users_ends_at_once(secured):
    """shipping-w1's user may take only the offers of the worker named w1: a worker named w2 is refused its
    subscription and ends with that error at once (cg: one line, exit status 1), instead of waiting for offers."""
    nc = await secured.connect("shipping-w1")
    try:
        w = await serve_worker(nc, "static", "ORDERS", "shipping", recorder()[1], name="w2")
        error = await asyncio.wait_for(w.done(), FAST)
        assert isinstance(error, PermissionDeniedError), error
        assert (error.operation, error.subject) == ("subscribe", f"{POOL}.W.w2.{w.id}.work"), str(error)
    finally:
        await nc.close()
    r = await run_cg(*secured.cli("shipping-w1"), "static", "worker", "ORDERS", "shipping", "--name", "w2")
    assert_cli_error(r, f"permission denied: subscribe to {POOL}.W.w2.")
    assert len(r.err.splitlines()) == 1, r.err


async def test_a_member_without_the_pools_permissions_cannot_dispatch(secured):
    """shipping-m1 has no pool subjects: started with dispatch=True it ends at once, naming the first one."""
    nc = await secured.connect("shipping-m1")
    try:
        inst = await static_consume(nc, "ORDERS", "shipping", "m1", None, dispatch=True, config=CONFIG)
        error = await asyncio.wait_for(inst.done(), 10)
        assert isinstance(error, PermissionDeniedError), error
        assert (error.operation, error.subject) == ("subscribe", f"{POOL}.HB"), str(error)
    finally:
        await nc.close()


# --- dead letters ---------------------------------------------------------------------------------------------
DLQ = "ORDERS~shipping~static~dlq"


async def dead_letters(secured: Secured, key: str, n: int) -> list[int]:
    """``n`` dead letters of ``key`` in ORDERS/shipping's partition 0, the first failed, the others parked behind
    it, written by root as a member writes them (tests/helpers/deadletters.py): their sequences."""
    root = await nats.connect(secured.url, user="root", password=secured.passwords["root"])
    try:
        await make_dead_letter_stream(root, "static", "ORDERS", "shipping")
        return [
            await write_dead_letter(
                root,
                "static",
                "ORDERS",
                "shipping",
                partition=0,
                key=key,
                subject=key,
                origin_seq=1000 + i,
                parked=i > 0,
            )
            for i in range(n)
        ]
    finally:
        await root.close()


async def test_admin_lists_replays_and_purges_dead_letters_the_observer_counts_them(secured):
    """The admin reads, replays and purges a group's dead letters; the observer sees how many each member has, and
    their keys, not their contents; a member may read them (its parked keys) but neither purge nor tell a replay."""
    seqs = await dead_letters(secured, "orders.dl", 3)
    admin, observer = secured.cli("admin"), secured.cli("observer")
    listed = json.loads((await run_cg(*admin, "static", "dead-letters", "ls", "ORDERS", "shipping", "--json")).ok().out)
    assert [e["seq"] for e in listed if e["key"] == "orders.dl"] == seqs
    shown = (await run_cg(*admin, "static", "dead-letters", "show", "ORDERS", "shipping", str(seqs[0]))).ok()
    assert "origin         stream ORDERS, seq 1000" in shown.out
    long_key = "orders." + "x" * 150  # named by its hash in the subject: reading its name takes STREAM.MSG.GET
    await dead_letters(secured, long_key, 1)
    status = json.loads((await run_cg(*observer, "static", "status", "ORDERS", "shipping", "--json")).ok().out)
    m1 = next(m for m in status["members"] if m["member"] == "m1")
    assert m1["dead_letters"] >= 4 and "orders.dl" in m1["parked_keys"] and status["dead_letter_stream"] == DLQ
    assert long_key not in m1["parked_keys"] and any(k.startswith("~") for k in m1["parked_keys"])
    status = json.loads((await run_cg(*admin, "static", "status", "ORDERS", "shipping", "--json")).ok().out)
    assert long_key in next(m for m in status["members"] if m["member"] == "m1")["parked_keys"]
    assert_cli_error(
        await run_cg(*observer, "static", "dead-letters", "ls", "ORDERS", "shipping"),
        f"permission denied: publish to $JS.API.STREAM.MSG.GET.{DLQ} is not allowed",
    )
    member = await secured.connect("shipping-m1")
    try:
        plan = await plan_purge(member, "static", "ORDERS", "shipping", keys=["orders.dl"])
        assert [e.seq for e in plan.entries] == seqs  # it may read them: its parked keys
        await refused(execute_plan(member, plan), f"$JS.API.STREAM.PURGE.{DLQ}")
    finally:
        await member.close()
    replay = ["static", "dead-letters", "replay", "ORDERS", "shipping", "--seq", str(seqs[0]), "--execute"]
    (await run_cg(*admin, *replay)).ok()
    purge = ["static", "dead-letters", "purge", "ORDERS", "shipping", "--key", "orders.dl", "--key", long_key]
    (await run_cg(*admin, *purge, "--execute")).ok()
    listed = json.loads((await run_cg(*admin, "static", "dead-letters", "ls", "ORDERS", "shipping", "--json")).ok().out)
    assert [e for e in listed if e["key"] in ("orders.dl", long_key)] == []


async def test_a_member_dead_letters_what_keeps_failing_and_runs_it_when_replayed(secured):
    """shipping-m1 under its role: a message that keeps failing goes to the group's dead-letter stream and its key is
    parked (a later message of the key follows it, unrun); the admin's replay gives both back to m1's pinned instance,
    which runs them in their order, deletes their entries, and the key runs again."""
    from pcgroups import RetryPolicy

    poison = m1_subjects("poison", 1)[0]
    failing, got = [True], []

    async def handler(msg) -> None:
        if msg.subject == poison and failing[0]:
            raise RuntimeError("poisoned")
        got.append((msg.subject, bytes(msg.data)))
        await msg.ack()

    nc = await secured.connect("shipping-m1")
    root = await nats.connect(secured.url, user="root", password=secured.passwords["root"])
    try:
        retry = RetryPolicy(max_deliver=2, backoff=0.05, park_keys=True)
        inst = await static_consume(nc, "ORDERS", "shipping", "m1", handler, config=CONFIG, retry=retry)
        await inst.wait_for_consuming(10)
        js = root.jetstream()
        await js.publish(poison, b"first")
        await js.publish(poison, b"second")
        await js.publish(m1_subjects("fine", 1)[0], b"other")

        async def dead() -> list:
            return [e for e in await list_dead_letters(root, "static", "ORDERS", "shipping", keys=[poison])]

        await wait_for(lambda: _len_at_least(dead(), 2), 20, what="the failed message and the one parked behind it")
        entries = await dead()
        assert [(e.data, e.parked, e.lane) for e in entries] == [(b"first", False, "D"), (b"second", True, "D")]
        assert entries[0].member == "m1" and "poisoned" in entries[0].reason
        await wait_for(lambda: any(s != poison for s, _ in got), 10, what="the other key's message")
        assert all(s != poison for s, _ in got)
        failing[0] = False  # the fix deployed
        replay = ["static", "dead-letters", "replay", "ORDERS", "shipping", "--key", poison, "--execute"]
        (await run_cg(*secured.cli("admin"), *replay)).ok()
        await wait_for(lambda: _len_at_least(_empty(dead()), 1), 20, what="the replayed entries run and deleted")
        assert [d for s, d in got if s == poison] == [b"first", b"second"]
        await js.publish(poison, b"third")  # the key is no longer parked
        await wait_for(lambda: [d for s, d in got if s == poison] == [b"first", b"second", b"third"], 10)
        assert inst.consuming and await asyncio.wait_for(inst.stop(), 10) is None
    finally:
        await root.close()
        await nc.close()


async def _len_at_least(aw, n: int) -> bool:
    return len(await aw) >= n


async def _empty(aw) -> list:
    return [None] if not await aw else []


async def test_admin_deletes_the_groups(secured):
    """Last: the admin role's delete (static: the config and the members' consumers; elastic: the work queue)."""
    for args in (
        ("static", "delete", "-f", "ORDERS", "shipping"),
        ("elastic", "delete", "-f", "EVENTS", "billing"),
        ("elastic", "delete", "-f", "EVENTS", "audit"),
    ):
        (await run_cg(*secured.cli("admin"), *args)).ok()
    r = await run_cg(*secured.cli("admin"), "elastic", "ls", "EVENTS")
    assert r.ok().out.strip() == "elastic consumer groups: []", r.out


# --- server-free -----------------------------------------------------------------------------------------------
def test_the_admin_role_holds_the_observers():
    assert set(documented_allow("observer")) <= set(documented_allow("admin"))


def test_the_nsc_lists_are_the_configuration():
    block = re.search(r"```sh\n(.*?)```", SECURITY.read_text(encoding="utf-8"), re.S).group(1)
    commands = {m.group(1): m.group(0) for m in re.finditer(r"--name (\S+) .*?(?=\n\n|\Z)", block, re.S)}
    assert sorted(commands) == sorted(ROLES)
    for user, command in commands.items():
        assert re.findall(r"--allow-sub '([^']+)'", command) == documented_allow(user, "subscribe"), user
        assert re.findall(r"--allow-pub '([^']+)'", command) == documented_allow(user), user


def test_the_per_worker_template_gives_each_worker_shipping_w1s_lists():
    """docs/SECURITY.md, A user per worker: the scoped signing key's template, for a user named w1, is shipping-w1
    (with an inbox prefix under _INBOX_workers)."""
    block = re.findall(r"```sh\n(.*?)```", SECURITY.read_text(encoding="utf-8"), re.S)[1]
    subs = [s.replace("{{name()}}", "w1") for s in re.findall(r"--allow-sub '([^']+)'", block)]
    assert subs == ["_INBOX_workers.w1.>", *documented_allow("shipping-w1", "subscribe")[1:]]
    assert re.findall(r"--allow-pub '([^']+)'", block) == documented_allow("shipping-w1")
    assert all("{{" not in s or ".{{name()}}." in s for s in re.findall(r"--allow-\w+ '([^']+)'", block))


def test_a_violation_is_named_as_the_caller_wrote_the_subject():
    v = Violation.parse('nats: permissions violation for publish to "$js.api.stream.info.orders"')
    assert v == Violation("publish", "$js.api.stream.info.orders")
    assert v.error(["$JS.API.STREAM.INFO.other", "$JS.API.STREAM.INFO.ORDERS"]).subject == "$JS.API.STREAM.INFO.ORDERS"
    assert v.error(["$JS.API.*.*.ORDERS"]).subject == "$JS.API.*.*.ORDERS"  # a guarded pattern names itself
    assert v.error().subject == "$JS.API.stream.info.orders"  # unknown: the prefix in capitals
    ack = Violation.parse('nats: Permissions Violation for Publish to "$js.ack.orders.shipping-m1.1.2.2.9.0"')
    assert ack.error(["$JS.ACK.ORDERS.shipping-m1.>"]).subject == "$JS.ACK.ORDERS.shipping-m1.>"
    inbox = Violation.parse('nats: permissions violation for subscription to "_inbox.abc.*"')
    e = inbox.error()
    assert (e.operation, e.subject) == ("subscribe", "_INBOX.abc.*") and "allow _INBOX.> or the inbox prefix" in str(e)
    assert Violation.parse("nats: timeout") is None and Violation.parse("authorization violation") is None


async def test_cg_worker_under_its_role_does_not_need_to_read_the_config(secured):
    """``cg ... worker`` checks that the group exists where the user may read configs; a worker's role may not
    (its refused read is no error): it runs, waiting for a dispatching member, until Ctrl-C (exit 0)."""
    from tests.helpers.cli import Proc, cg_env

    p = await Proc(
        *secured.cli("shipping-w1"),
        "static",
        "worker",
        "ORDERS",
        "shipping",
        "--name",
        "w1",
        env=cg_env(None, CG_PRETTY="1", COLUMNS="200"),
    ).start()
    try:
        await p.wait_text("[w1] no dispatching member yet", timeout=15)
        p.signal(2)  # SIGINT
        r = await p.wait(timeout=15)
    finally:
        await p.close()
    assert r.code == 0 and "error" not in r.err, r.err
