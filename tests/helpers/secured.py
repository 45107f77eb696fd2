"""The authorizing nats-server of docs/SECURITY.md: its ``conf`` block verbatim, each role's password, the test's own users
(root; two broken on purpose), and the streams and groups the roles work on (tests/conftest.py: ``secured``)."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
from nats.js.api import StreamConfig, SubjectTransform

from pcgroups import PartitioningFilter, add_members, create_elastic, create_static
from pcgroups.connect import ConnectionOptions, connect
from pcgroups.testing import EmbeddedServer
from tests.helpers.cli import run_cg

SECURITY = Path(__file__).resolve().parents[2] / "docs" / "SECURITY.md"


TIMEOUT = 20.0  # request timeout: a refusal must come long before it


FAST = 5.0  # how long a refusal may take (it takes milliseconds; the machine may be loaded)


ROLES = (
    "admin",
    "shipping-m1",
    "shipping-m2",
    "shipping-dispatcher",
    "shipping-worker",
    "shipping-w1",
    "billing-member",
    "audit-member",
    "observer",
    "spark-reader",
    "spark-writer",
)


# the workers' own inbox prefixes (their roles may not read _INBOX.>: the dispatcher's pulled messages come there)
INBOXES = {"shipping-worker": "_INBOX_shipping_worker", "shipping-w1": "_INBOX_shipping_w1"}


# the test's own users: root sets up streams and traffic; the broken ones show what a missing permission does;
# audit-dispatcher is audit-member with its pool's subjects (an automatic member that dispatches)
EXTRA_USERS = """
    { user: root, password: $ROOT_PASSWORD }
    { user: shipping-noack, password: $SHIPPING_NOACK_PASSWORD, permissions: {
        publish: { allow: %s }
        subscribe: { allow: %s } } }
    { user: no-inbox, password: $NO_INBOX_PASSWORD, permissions: {
        publish: { allow: ["$JS.API.>"] }
        subscribe: { allow: ["nothing.here"] } } }
    { user: audit-dispatcher, password: $AUDIT_DISPATCHER_PASSWORD, permissions: {
        publish: { allow: %s }
        subscribe: { allow: %s } } }
"""


AUDIT_POOL = "$PCG.POOL.elastic.EVENTS.audit"


PARTITIONS = 4


def documented_config() -> str:
    """The ``conf`` block of docs/SECURITY.md."""
    m = re.search(r"```conf\n(.*?)```", SECURITY.read_text(encoding="utf-8"), re.S)
    assert m, "docs/SECURITY.md has no conf block"
    return m.group(1)


def documented_allow(user: str, operation: str = "publish") -> list[str]:
    """A documented user's ``publish`` (or ``subscribe``) allow list (quoted subjects, in order)."""
    block = documented_config()
    start = block.index(f"{{ user: {user},")
    start = block.index(f"{operation}:", start)
    body = block[start : block.index("]", block.index("allow: [", start))]
    return re.findall(r'"([^"]+)"', body)


def extra_users() -> str:
    """EXTRA_USERS with their lists."""

    def quoted(subjects: list[str]) -> str:
        return "[" + ", ".join(f'"{s}"' for s in subjects) + "]"

    noack = [s for s in documented_allow("shipping-m1") if not s.startswith("$JS.ACK.")]
    p = AUDIT_POOL
    audit = [*documented_allow("audit-member"), f"{p}.HELLO", f"{p}.W.*.*.work", f"{p}.W.*.*.hb", "_INBOX.>"]
    audit_sub = [
        *documented_allow("audit-member", "subscribe"),
        f"{p}.HB",
        f"{p}.LEAVE",
        f"{p}.D.*.R.*",
        f"{p}.STATUS",
        "$PCG.POOL.STATUS",
    ]
    noack_sub = documented_allow("shipping-m1", "subscribe")
    return EXTRA_USERS % (quoted(noack), quoted(noack_sub), quoted(audit), quoted(audit_sub))


def env_name(user: str) -> str:
    return user.upper().replace("-", "_") + "_PASSWORD"


class Secured:
    """The authorizing server and every user's password."""

    def __init__(self, server: EmbeddedServer, passwords: dict[str, str]):
        self.server, self.passwords = server, passwords

    @property
    def url(self) -> str:
        return self.server.url

    async def connect(self, user: str):
        return await connect(
            ConnectionOptions(
                server=self.url,
                user=user,
                password=self.passwords[user],
                timeout=TIMEOUT,
                no_context=True,
                inbox_prefix=INBOXES.get(user),
            )
        )

    def cli(self, user: str) -> list[str]:
        inbox = ["--inbox-prefix", INBOXES[user]] if user in INBOXES else []
        return [
            "--server",
            self.url,
            "--user",
            user,
            "--password",
            self.passwords[user],
            "--timeout",
            f"{TIMEOUT:g}s",
            *inbox,
        ]


async def set_up(s: Secured) -> None:
    """root makes the streams; admin makes the groups (the admin role's create, tested here)."""
    root = await nats.connect(s.url, user="root", password=s.passwords["root"])
    js = root.jetstream()
    await js.add_stream(
        StreamConfig(
            name="ORDERS",
            subjects=["orders.*"],
            allow_direct=True,
            subject_transform=SubjectTransform(
                src="orders.*", dest=f"{{{{partition({PARTITIONS},1)}}}}.orders.{{{{wildcard(1)}}}}"
            ),
        )
    )
    await js.add_stream(StreamConfig(name="EVENTS", subjects=["events.*"]))
    await root.close()
    nc = await s.connect("admin")
    try:
        await create_static(nc, "ORDERS", "shipping", PARTITIONS, members=["m1", "m2"])
        for group in ("billing", "audit"):
            await create_elastic(
                nc, "EVENTS", group, PARTITIONS, partitioning_filters=[PartitioningFilter("events.*", [1])]
            )
        await add_members(nc, "EVENTS", "billing", ["m1", "m2"])
    finally:
        await nc.close()
    # the members' consumers, as cg static consume makes them (shipping-m2 may not create its own)
    (await run_cg(*s.cli("admin"), "static", "create-consumers", "ORDERS", "shipping")).ok()


def secured_server(tmp_path_factory: Any) -> Iterator[Secured]:
    """The server running with every role's password, its streams and groups made; stopped after."""
    users = [*ROLES, "root", "shipping-noack", "no-inbox", "audit-dispatcher"]
    passwords = {u: secrets.token_urlsafe(12) for u in users}
    config = documented_config().replace("users = [", "users = [" + extra_users(), 1)
    variables = "".join(f'{env_name(u)}: "{p}"\n' for u, p in passwords.items())
    path = tmp_path_factory.mktemp("secured") / "server.conf"
    path.write_text(variables + config, encoding="utf-8")
    with EmbeddedServer(config_file=str(path)) as server:
        s = Secured(server, passwords)
        asyncio.run(set_up(s))
        yield s
