"""Secrets are never printed: passwords, tokens, nkey seeds and creds contents appear in no error, log line,
``--json`` output or status, whichever way they were given (options, environment, a context file, a URL).

Two servers that authenticate (users with passwords and an nkey user; a token) and a run of ``cg`` commands
that succeed and fail with each kind of secret, with ``CG_DEBUG=1`` (debug logs and tracebacks on). Every byte
they print is searched for every secret; the library's own log records and error texts too.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import secrets
import signal

import nkeys
import pytest

from pcgroups import ConsumerConfig, create_static, static_consume
from pcgroups.connect import ConnectionOptions, connect, redact, resolve
from pcgroups.errors import PCGroupsError
from pcgroups.spark import _nats as spark_nats
from pcgroups.spark._options import SourceOptions
from pcgroups.testing._server import EmbeddedServer, free_port
from tests.helpers.cli import cg, cg_argv, cg_env, cg_inproc

from .helpers.support import wait_for

PASSWORD = "pw-" + secrets.token_hex(8)
TOKEN = "tok-" + secrets.token_hex(8)
SEED = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode()
PUBLIC = nkeys.from_seed(SEED.encode()).public_key.decode()
CREDS_SEED = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode()
CREDS_JWT = (
    "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ." + secrets.token_urlsafe(24) + "." + secrets.token_urlsafe(16)
)
CREDS = (
    f"-----BEGIN NATS USER JWT-----\n{CREDS_JWT}\n------END NATS USER JWT------\n\n"
    f"-----BEGIN USER NKEY SEED-----\n{CREDS_SEED}\n------END USER NKEY SEED------\n"
)
SECRETS = {"password": PASSWORD, "token": TOKEN, "nkey seed": SEED, "creds seed": CREDS_SEED, "creds jwt": CREDS_JWT}


def leaks(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if value in text]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("secrets")
    users = d / "users.conf"
    users.write_text(
        f'authorization {{ users = [ {{ user: alice, password: "{PASSWORD}" }}, {{ nkey: {PUBLIC} }} ] }}\n'
    )
    token = d / "token.conf"
    token.write_text(f'authorization {{ token: "{TOKEN}" }}\n')
    (d / "user.nk").write_text(SEED + "\n")
    (d / "user.creds").write_text(CREDS)
    (d / "ctx.json").write_text(json.dumps({"user": "alice", "password": PASSWORD}))
    with EmbeddedServer(config_file=str(users)) as a, EmbeddedServer(config_file=str(token)) as b:
        yield a, b, d


def run(*args: str, **env: str):
    """cg with debug logs on: in this process (faster) unless environment variables are part of the test."""
    r = cg(*args, env=cg_env(CG_DEBUG="1", **env)) if env else cg_inproc(*args)
    return r, r.out + r.err


def test_no_cli_output_shows_a_secret(servers, monkeypatch):
    monkeypatch.setenv("CG_DEBUG", "1")
    a, b, d = servers
    s = f"S{secrets.token_hex(3)}"
    down = f"127.0.0.1:{free_port()}"
    expect_ok = [
        (
            "--server",
            a.url,
            "--user",
            "alice",
            "--password",
            PASSWORD,
            "tools",
            "stream-setup",
            "--static",
            "--stream",
            s,
            "--partitions",
            "2",
        ),
        (
            "--server",
            a.url,
            "--user",
            "alice",
            "--password",
            PASSWORD,
            "static",
            "create",
            "balanced",
            s,
            "g",
            "2",
            "m1",
        ),
        ("--server", f"nats://alice:{PASSWORD}@127.0.0.1:{a.port}", "static", "ls", s, "--json"),
        ("--context", str(d / "ctx.json"), "--server", a.url, "static", "info", s, "g", "--json"),
        ("--server", a.url, "--nkey", str(d / "user.nk"), "static", "status", s, "g", "--json"),
        ("--server", a.url, "--nkey", str(d / "user.nk"), "static", "status", s, "g"),
    ]
    expect_error = [
        # server b has no stream s: an error that names what was asked, through a token given both ways
        ("--server", b.url, "--token", TOKEN, "elastic", "ls", s),
        ("--server", f"nats://{TOKEN}@127.0.0.1:{b.port}", "elastic", "ls", s, "--json"),
        ("--server", a.url, "--user", "alice", "--password", PASSWORD + "x", "static", "ls", s),
        ("--server", f"nats://alice:{PASSWORD}@{down}", "static", "ls", s),
        ("--server", f"nats://{TOKEN}@{down}", "static", "ls", s),
        ("--server", b.url, "--token", TOKEN + "x", "static", "ls", s),
        ("--server", a.url, "--creds", str(d / "user.creds"), "static", "ls", s),
        ("--server", a.url, "--user", "alice", "--password", PASSWORD, "static", "info", s, "nope", "--json"),
    ]
    printed = []
    for args in expect_ok:
        r, text = run(*args)
        assert r.code == 0, (args, text)
        printed.append(text)
    for args in expect_error:
        r, text = run(*args)
        assert r.code == 1 and "cg: error: " in r.err, (args, text)
        printed.append(text)
    for env in (
        {"NATS_URL": a.url, "NATS_USER": "alice", "NATS_PASSWORD": PASSWORD},
        {"NATS_URL": b.url, "NATS_TOKEN": TOKEN},
        {"NATS_URL": a.url, "NATS_NKEY": str(d / "user.nk")},
    ):
        r, text = run("static", "ls", s, "--json", **env)
        assert r.code == (0 if env["NATS_URL"] == a.url else 1), text  # server b has no stream s
        printed.append(text)
    r, text = run(
        "static", "ls", s, NATS_URL=a.url, NATS_CREDS="data:;base64," + base64.b64encode(CREDS.encode()).decode()
    )
    assert r.code == 1, text
    printed.append(text)
    assert f"nats://alice:***@{down}" in "".join(printed) and f"nats://***@{down}" in "".join(printed)
    assert sum("Using selector" in t for t in printed) == len(printed)  # every run logged at debug level
    for text in printed:
        assert not leaks(text), (leaks(text), text)


async def test_consume_logs_and_library_errors_show_no_secret(servers, caplog):
    a, _, d = servers
    s = f"C{secrets.token_hex(3)}"
    caplog.set_level(logging.DEBUG)
    nc = await connect(ConnectionOptions(server=a.url, user="alice", password=PASSWORD, no_context=True))
    try:
        js = nc.jetstream()
        await js.add_stream(
            name=s,
            subjects=[f"{s}.*"],
            subject_transform={"src": f"{s}.*", "dest": f"{{{{partition(2,1)}}}}.{s}.{{{{wildcard(1)}}}}"},
        )
        await create_static(nc, s, "g", 2, members=["m1", "m2"])
        # a cg consume with debug logs (its stderr to a file: they are long), messages, then SIGTERM
        with open(d / f"{s}.err", "w+") as err:
            proc = await asyncio.create_subprocess_exec(
                *cg_argv("--server", f"nats://alice:{PASSWORD}@127.0.0.1:{a.port}", "static", "consume", s, "g", "m1"),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env=cg_env(CG_DEBUG="1"),
            )
            try:
                assert await asyncio.wait_for(proc.stdout.readline(), 15) == b"consuming...\n"
                for i in range(4):
                    await js.publish(f"{s}.k{i}", b"x")
                out = b""
                while b"acked" not in out:  # m1 owns one of the two partitions
                    out += await asyncio.wait_for(proc.stdout.readline(), 15)
                proc.send_signal(signal.SIGTERM)
                out += await asyncio.wait_for(proc.stdout.read(), 15)
                assert await asyncio.wait_for(proc.wait(), 15) == 0
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            err.seek(0)
            logged = err.read()
        assert "DEBUG" in logged or "pulled" in logged or "nats:" in logged, logged[:500]  # the debug log was on
        assert not leaks(out.decode() + logged), leaks(out.decode() + logged)
        # the library: an instance's debug log, reprs, and connection errors
        got: list[str] = []

        async def handler(msg) -> None:
            got.append(msg.subject)
            await msg.ack()

        inst = await static_consume(nc, s, "g", "m2", handler, config=ConsumerConfig(ack_wait=1))
        for i in range(4):
            await js.publish(f"{s}.k{i}", b"x")
        await wait_for(lambda: got, 10, what="a message")
        await inst.stop()
    finally:
        await nc.close()
    texts = [r.getMessage() for r in caplog.records]
    opts = ConnectionOptions(server=a.url, user="alice", password=PASSWORD, token=TOKEN)
    texts += [
        repr(opts),
        repr(resolve(opts, env={})),
        repr(
            SourceOptions.parse(
                {"servers": a.url, "stream": s, "partitionCount": "2", "password": PASSWORD, "token": TOKEN}
            )
        ),
    ]
    for bad in (
        ConnectionOptions(server=f"nats://alice:{PASSWORD}@127.0.0.1:{free_port()}", no_context=True, timeout=1),
        ConnectionOptions(server=f"nats://{TOKEN}@127.0.0.1:{free_port()}", no_context=True, timeout=1),
        ConnectionOptions(server=a.url, creds=str(d / "user.creds"), no_context=True, timeout=2),
        ConnectionOptions(
            server=a.url, nkey=str(d / "user.nk"), user="bob", password="x" + PASSWORD, no_context=True, timeout=2
        ),
    ):
        with pytest.raises(PCGroupsError) as info:
            await connect(bad)
        texts.append(str(info.value))
    spark = SourceOptions.parse(
        {"servers": f"nats://alice:{PASSWORD}@127.0.0.1:{free_port()}", "stream": s, "partitionCount": "2"}
    )
    with pytest.raises(PCGroupsError) as info:
        await spark_nats.connect(spark.conn, reconnect=False)
    texts.append(str(info.value))
    assert any("alice:***@" in t for t in texts)
    for text in texts:
        assert not leaks(text), (leaks(text), text)


def test_urls_are_shown_without_their_secret():
    assert redact("nats://alice:pw@h:4222") == "nats://alice:***@h:4222"
    assert redact("tls://tok@h:4222") == "tls://***@h:4222"
    assert redact("nats://h:4222") == "nats://h:4222"
    rc = resolve(ConnectionOptions(server=f"nats://a:{PASSWORD}@h:1,nats://{TOKEN}@g:2"), env={})
    assert rc.display_servers == "nats://a:***@h:1,nats://***@g:2"
