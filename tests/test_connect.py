"""pcgroups.connect: nats-CLI-style settings and one clear error, against real nats-servers."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pcgroups.connect import (
    DEFAULT_URL,
    ConnectionOptions,
    ResolvedConnection,
    connect,
    load_context,
    parse_duration,
    redact,
    resolve,
)
from pcgroups.errors import PCGroupsError
from pcgroups.testing._server import EmbeddedServer, free_port
from tests.helpers.support import wait_for

FAST = 3.0  # seconds: every failure must be reported within this


@pytest.fixture
def cfg(tmp_path) -> Path:
    """An empty XDG_CONFIG_HOME."""
    d = tmp_path / "xdg"
    (d / "nats" / "context").mkdir(parents=True)
    return d


def write_context(cfg: Path, name: str, select: bool = False, **fields) -> Path:
    path = cfg / "nats" / "context" / f"{name}.json"
    path.write_text(json.dumps(fields))
    if select:
        (cfg / "nats" / "context.txt").write_text(f"{name}\n")
    return path


def server_with_config(tmp_path: Path, text: str, name: str = "server.conf") -> EmbeddedServer:
    conf = tmp_path / name
    conf.write_text(text)
    return EmbeddedServer(config_file=str(conf))


async def assert_connects(options: ConnectionOptions, env: dict | None = None) -> None:
    nc = await connect(options, env={} if env is None else env)
    try:
        assert nc.is_connected
        await nc.flush(timeout=5)
    finally:
        await nc.close()


async def assert_fails(options: ConnectionOptions, expected: str, env: dict | None = None) -> str:
    start = time.monotonic()
    with pytest.raises(PCGroupsError) as e:
        nc = await connect(options, env={} if env is None else env)
        await nc.close()
    elapsed = time.monotonic() - start
    message = str(e.value)
    assert "\n" not in message
    assert message == expected or message.startswith(expected), message
    assert elapsed < FAST, f"{elapsed:.2f}s for: {message}"
    return message


# ------------------------------------------------------------------ plain, user, token


async def test_no_auth(nats_server, capfd):
    await assert_connects(ConnectionOptions(server=nats_server.url, no_context=True))
    # a URL without a scheme gets nats://
    await assert_connects(ConnectionOptions(server=f"127.0.0.1:{nats_server.port}", no_context=True))
    assert capfd.readouterr().err == ""


async def test_unreachable_server_fails_fast_with_one_line(capfd):
    port = free_port()
    await assert_fails(
        ConnectionOptions(server=f"127.0.0.1:{port}", no_context=True),
        f"can't connect to nats://127.0.0.1:{port}: connection refused",
    )
    p2 = free_port()
    msg = await assert_fails(
        ConnectionOptions(server=f"nats://127.0.0.1:{port},127.0.0.1:{p2}"),
        f"can't connect to nats://127.0.0.1:{port},nats://127.0.0.1:{p2}: ",
    )
    assert msg.endswith("connection refused")
    await assert_fails(
        ConnectionOptions(server="nats://no-such-host.invalid:4222", timeout=1),
        "can't connect to nats://no-such-host.invalid:4222: can't resolve host",
    )
    assert capfd.readouterr().err == ""


async def test_silent_server_times_out(capfd):
    """Something accepts TCP but never speaks NATS: the connect timeout bounds the wait."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        start = time.monotonic()
        await assert_fails(
            ConnectionOptions(server=f"127.0.0.1:{port}", timeout=0.5),
            f"can't connect to nats://127.0.0.1:{port}: timed out after 0.5s",
        )
        assert time.monotonic() - start < 2.0
    assert capfd.readouterr().err == ""


async def test_user_and_password(tmp_path, capfd):
    with EmbeddedServer(extra_args=["--user", "alice", "--pass", "s3cret"]) as s:
        await assert_connects(ConnectionOptions(server=s.url, user="alice", password="s3cret"))
        await assert_connects(ConnectionOptions(server=s.url), env={"NATS_USER": "alice", "NATS_PASSWORD": "s3cret"})
        bad = f"can't connect to {s.url}: authorization violation"
        await assert_fails(ConnectionOptions(server=s.url, user="alice", password="wrong"), bad)
        await assert_fails(ConnectionOptions(server=s.url), bad)
        # credentials in the URL work, and the password never shows in a message
        port = s.port
        await assert_connects(ConnectionOptions(server=f"nats://alice:s3cret@127.0.0.1:{port}"))
        msg = await assert_fails(
            ConnectionOptions(server=f"nats://alice:nope@127.0.0.1:{port}"),
            f"can't connect to nats://alice:***@127.0.0.1:{port}: authorization",
        )
        assert "nope" not in msg
    assert capfd.readouterr().err == ""


async def test_token(capfd):
    with EmbeddedServer(extra_args=["--auth", "tok3n"]) as s:
        await assert_connects(ConnectionOptions(server=s.url, token="tok3n"))
        await assert_connects(ConnectionOptions(server=s.url), env={"NATS_TOKEN": "tok3n"})
        # as nats: --user without a password is a token
        await assert_connects(ConnectionOptions(server=s.url, user="tok3n"))
        await assert_connects(ConnectionOptions(server=s.url, token="env://MY_TOKEN"), env={"MY_TOKEN": "tok3n"})
        await assert_fails(
            ConnectionOptions(server=s.url, token="nope"), f"can't connect to {s.url}: authorization violation"
        )
    assert capfd.readouterr().err == ""


async def test_context_file_end_to_end(cfg):
    with EmbeddedServer(extra_args=["--user", "bob", "--pass", "pw"]) as s:
        write_context(cfg, "dev", select=True, url=f"127.0.0.1:{s.port}", user="bob", password="pw")
        await assert_connects(ConnectionOptions(), env={"XDG_CONFIG_HOME": str(cfg)})
        await assert_fails(
            ConnectionOptions(password="bad"),
            f"can't connect to {s.url}: authorization violation",
            env={"XDG_CONFIG_HOME": str(cfg)},
        )


# ------------------------------------------------------------------ nkeys and creds

try:
    import nkeys
except ImportError:  # nats-py's optional extra: nkey and creds auth need it
    nkeys = None
needs_nkeys = pytest.mark.skipif(nkeys is None, reason="nkey/creds auth needs nkeys (nats-py[nkeys])")


def new_key(prefix: int):
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    kp = nkeys.from_seed(bytearray(seed))
    return kp, seed.decode(), kp.public_key.decode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def make_jwt(signer, issuer: str, subject: str, name: str, claims: dict) -> str:
    """A NATS JWT (v2) signed with ed25519, as nsc would make it."""
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = {"jti": "", "iat": int(time.time()), "iss": issuer, "name": name, "sub": subject, "nats": claims}
    digest = hashlib.new("sha512_256", json.dumps(body).encode()).digest()
    body["jti"] = base64.b32encode(digest).rstrip(b"=").decode()
    payload = _b64(json.dumps(body).encode())
    signature = signer.sign(f"{header}.{payload}".encode())
    return f"{header}.{payload}.{_b64(signature)}"


UNLIMITED = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
}


@pytest.fixture(scope="module")
def operator_server(tmp_path_factory):
    """A server in operator (JWT) mode with one JetStream account; yields (server, user jwt, seed)."""
    if nkeys is None:
        pytest.skip("needs nkeys")
    tmp = tmp_path_factory.mktemp("operator")
    okp, _, opub = new_key(nkeys.PREFIX_BYTE_OPERATOR)
    akp, _, apub = new_key(nkeys.PREFIX_BYTE_ACCOUNT)
    _skp, _, spub = new_key(nkeys.PREFIX_BYTE_ACCOUNT)
    _, useed, upub = new_key(nkeys.PREFIX_BYTE_USER)
    ojwt = make_jwt(okp, opub, opub, "op", {"type": "operator", "version": 2})
    ajwt = make_jwt(
        okp,
        opub,
        apub,
        "app",
        {
            "limits": {**UNLIMITED, "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1},
            "type": "account",
            "version": 2,
        },
    )
    sjwt = make_jwt(okp, opub, spub, "SYS", {"limits": UNLIMITED, "type": "account", "version": 2})
    ujwt = make_jwt(
        akp,
        apub,
        upub,
        "u",
        {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2},
    )
    server = server_with_config(
        tmp,
        f"operator: {ojwt}\nsystem_account: {spub}\n"
        f"resolver: MEMORY\nresolver_preload: {{ {apub}: {ajwt}, {spub}: {sjwt} }}\n",
    )
    with server:
        yield server, ujwt, useed


def creds_text(jwt: str, seed: str) -> str:
    return (
        f"-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n\n"
        f"-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
    )


@needs_nkeys
async def test_nkey(tmp_path, capfd):
    _, seed, pub = new_key(nkeys.PREFIX_BYTE_USER)
    _, other_seed, _ = new_key(nkeys.PREFIX_BYTE_USER)
    seed_file = tmp_path / "user.nk"
    seed_file.write_text(seed + "\n")
    other = tmp_path / "other.nk"
    other.write_text(other_seed)
    with server_with_config(tmp_path, f"authorization {{ users = [ {{ nkey: {pub} }} ] }}\n") as s:
        await assert_connects(ConnectionOptions(server=s.url, nkey=str(seed_file)))
        await assert_connects(ConnectionOptions(server=s.url), env={"NATS_NKEY": str(seed_file)})
        await assert_connects(ConnectionOptions(server=s.url, nkey="~/user.nk"), env={"HOME": str(tmp_path)})
        inline = "data:;base64," + base64.b64encode(seed.encode()).decode()
        await assert_connects(ConnectionOptions(server=s.url, nkey=inline))
        await assert_fails(
            ConnectionOptions(server=s.url, nkey=str(other)), f"can't connect to {s.url}: authorization violation"
        )
        await assert_fails(
            ConnectionOptions(server=s.url, nkey=str(tmp_path / "missing.nk")),
            f"can't connect to {s.url}: nkey file {tmp_path / 'missing.nk'} not found",
        )
        junk = tmp_path / "junk.nk"
        junk.write_text("hello\n")
        await assert_fails(
            ConnectionOptions(server=s.url, nkey=str(junk)),
            f"can't connect to {s.url}: nkey file {junk} holds no nkey seed",
        )
    assert capfd.readouterr().err == ""


async def test_nkey_without_the_nkeys_package(nats_server, tmp_path, monkeypatch):
    seed_file = tmp_path / "u.nk"
    seed_file.write_text("SUAM" + "A" * 54 + "\n")
    monkeypatch.setitem(sys.modules, "nkeys", None)  # as if nats-py[nkeys] weren't installed
    await assert_fails(
        ConnectionOptions(server=nats_server.url, nkey=str(seed_file)),
        f"can't connect to {nats_server.url}: nkey and creds authentication need the nkeys package",
    )


@needs_nkeys
async def test_creds(tmp_path, operator_server, capfd):
    server, ujwt, useed = operator_server
    creds = tmp_path / "user.creds"
    creds.write_text(creds_text(ujwt, useed))
    nc = await connect(ConnectionOptions(server=server.url, creds=str(creds)), env={})
    try:
        info = await nc.jetstream().account_info()  # JetStream works for the JWT account
        assert info.limits.max_streams == -1
    finally:
        await nc.close()
    await assert_connects(ConnectionOptions(server=server.url), env={"NATS_CREDS": str(creds)})
    await assert_connects(
        ConnectionOptions(server=server.url, creds="env://USER_CREDS"), env={"USER_CREDS": creds.read_text()}
    )
    # user_jwt + user_seed (context fields / NATS_JWT + NATS_SEED)
    await assert_connects(ConnectionOptions(server=server.url), env={"NATS_JWT": ujwt, "NATS_SEED": useed})
    await assert_fails(
        ConnectionOptions(server=server.url, creds=str(tmp_path / "nope.creds")),
        f"can't connect to {server.url}: creds file {tmp_path / 'nope.creds'} not found",
    )
    await assert_fails(ConnectionOptions(server=server.url), f"can't connect to {server.url}: authorization violation")
    # a user the account never signed
    akp, _, apub = new_key(nkeys.PREFIX_BYTE_ACCOUNT)
    _, s2, u2 = new_key(nkeys.PREFIX_BYTE_USER)
    stranger = tmp_path / "stranger.creds"
    stranger.write_text(creds_text(make_jwt(akp, apub, u2, "x", {"type": "user", "version": 2}), s2))
    await assert_fails(
        ConnectionOptions(server=server.url, creds=str(stranger)),
        f"can't connect to {server.url}: authorization violation",
    )
    assert capfd.readouterr().err == ""


# ------------------------------------------------------------------ TLS

OPENSSL = shutil.which("openssl")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A throwaway CA, a server certificate for 127.0.0.1/localhost and a client certificate."""
    if not OPENSSL:
        pytest.skip("openssl binary not found")
    d = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=pcgroups test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ):
        (d / f"{name}.ext").write_text(ext)
        _openssl(
            "req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=pcgroups test {name}", cwd=d
        )
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            cwd=d,
        )
    # a second CA that signed nothing here
    _openssl(
        "req", "-x509", *ec, "-keyout", "other.key", "-out", "other.pem", "-days", "2", "-subj", "/CN=other CA", cwd=d
    )
    return d


def tls_block(pki: Path, extra: str = "") -> str:
    return (
        f'tls {{\n  cert_file: "{pki / "server.pem"}"\n  key_file: "{pki / "server.key"}"\n'
        f'  ca_file: "{pki / "ca.pem"}"\n  {extra}\n}}\n'
    )


async def test_tls(tmp_path, pki, capfd):
    with server_with_config(tmp_path, tls_block(pki)) as s:
        await assert_connects(ConnectionOptions(server=s.url, tlsca=str(pki / "ca.pem")))
        await assert_connects(
            ConnectionOptions(server=f"tls://127.0.0.1:{s.port}"), env={"NATS_CA": str(pki / "ca.pem")}
        )
        # without our CA the server's certificate is not trusted
        await assert_fails(
            ConnectionOptions(server=s.url), f"can't connect to {s.url}: TLS certificate verification failed"
        )
        await assert_fails(
            ConnectionOptions(server=s.url, tlsca=str(pki / "other.pem")),
            f"can't connect to {s.url}: TLS certificate verification failed",
        )
        await assert_fails(
            ConnectionOptions(server=s.url, tlsca=str(tmp_path / "none.pem")),
            f"can't connect to {s.url}: TLS CA file {tmp_path / 'none.pem'} not found",
        )
        await assert_fails(
            ConnectionOptions(server=s.url, tlsca=str(pki / "ca.pem"), tlscert=str(pki / "client.pem")),
            f"can't connect to {s.url}: a TLS client certificate needs both",
        )
    assert capfd.readouterr().err == ""


async def test_mutual_tls(tmp_path, pki, capfd):
    with server_with_config(tmp_path, tls_block(pki, "verify: true")) as s:
        await assert_connects(
            ConnectionOptions(
                server=s.url, tlsca=str(pki / "ca.pem"), tlscert=str(pki / "client.pem"), tlskey=str(pki / "client.key")
            )
        )
        await assert_connects(
            ConnectionOptions(server=s.url),
            env={
                "NATS_CA": str(pki / "ca.pem"),
                "NATS_CERT": str(pki / "client.pem"),
                "NATS_KEY": str(pki / "client.key"),
            },
        )
        # the server refuses a client without a certificate: one line, whatever the TLS layer says
        msg = await assert_fails(
            ConnectionOptions(server=s.url, tlsca=str(pki / "ca.pem")), f"can't connect to {s.url}: "
        )
        assert "client certificate" in msg or "certificate required" in msg, msg
    assert capfd.readouterr().err == ""


async def test_tls_first(tmp_path, pki):
    # a duration lets plain clients (EmbeddedServer's readiness probe) fall back after 50ms
    with server_with_config(tmp_path, tls_block(pki, 'handshake_first: "50ms"')) as s:
        await assert_connects(ConnectionOptions(server=s.url, tlsca=str(pki / "ca.pem"), tlsfirst=True))


async def test_tls_requested_but_server_is_plain(nats_server, pki):
    await assert_fails(
        ConnectionOptions(server=nats_server.url, tlsca=str(pki / "ca.pem")),
        f"can't connect to {nats_server.url}: TLS was requested but the server does not",
    )


# ------------------------------------------------------------------ precedence (no network)


def test_default_is_localhost(cfg):
    rc = resolve(ConnectionOptions(), env={"XDG_CONFIG_HOME": str(cfg)})
    assert rc.servers == [DEFAULT_URL] and rc.context is None and rc.timeout == 5.0
    assert rc.auth_method == "none"


def test_server_urls_that_can_not_be_natss_say_what_is_wrong(cfg):
    def servers(url: str) -> list[str]:
        return resolve(ConnectionOptions(server=url), {"XDG_CONFIG_HOME": str(cfg)}).servers

    assert servers("127.0.0.1") == ["nats://127.0.0.1:4222"]
    assert servers("tls://h,ws://h:8080/nats, nats://u:p@h:1") == ["tls://h:4222", "ws://h:8080/nats", "nats://u:p@h:1"]
    for url, why in (
        ("http://127.0.0.1:4222", "the scheme http:// is not NATS's; use nats://, tls://, ws://, wss://"),
        ("nats//127.0.0.1:4222", "write it nats://HOST:PORT"),
        ("nats:/h:4222", "write it nats://HOST:PORT"),
        ("nats://", "write it nats://HOST:PORT"),
        ("nats://h:4222,https://x", "the scheme https:// is not NATS's"),
        ("nats://u:secret@h:99999", "the port must be a number from 1 to 65535"),
        ("4501", "4501 is a port number, not a host: write nats://HOST:4501 (e.g. nats://127.0.0.1:4501)"),
        ("nats://4222:4222", "4222 is a port number, not a host"),
    ):
        with pytest.raises(PCGroupsError) as e:
            servers(url)
        assert f'invalid server URL "{redact(url.split(",")[-1])}": {why}' in str(e.value), str(e.value)
        assert "secret" not in str(e.value)


def test_option_beats_env_beats_context_beats_default(cfg):
    write_context(
        cfg,
        "ctx",
        select=True,
        url="ctx-host:1",
        user="cu",
        password="cp",
        jetstream_domain="ctxdom",
        inbox_prefix="_CTX",
    )
    env = {"XDG_CONFIG_HOME": str(cfg)}
    rc = resolve(ConnectionOptions(), env=env)
    assert rc.servers == ["nats://ctx-host:1"] and (rc.user, rc.password) == ("cu", "cp")
    assert rc.js_domain == "ctxdom" and rc.inbox_prefix == "_CTX" and rc.context.name == "ctx"
    env |= {"NATS_URL": "env-host:2", "NATS_USER": "eu"}
    rc = resolve(ConnectionOptions(), env=env)
    assert rc.servers == ["nats://env-host:2"] and (rc.user, rc.password) == ("eu", "cp")
    rc = resolve(ConnectionOptions(server="opt-host:3,nats://opt2:4", user="ou", js_domain="od"), env=env)
    assert rc.servers == ["nats://opt-host:3", "nats://opt2:4"] and rc.user == "ou"
    assert rc.js_domain == "od"
    rc = resolve(ConnectionOptions(no_context=True), env=env)
    assert rc.context is None and rc.password is None and rc.servers == ["nats://env-host:2"]
    assert rc.token == "eu"  # a user without a password is a token


def test_context_selection(cfg, tmp_path, monkeypatch):
    write_context(cfg, "a", select=True, url="a-host")
    write_context(cfg, "b", url="b-host")
    env = {"XDG_CONFIG_HOME": str(cfg)}
    assert load_context(None, env).name == "a"
    assert load_context(None, env | {"NATS_CONTEXT": "b"}).url == "b-host"
    assert load_context("a", env | {"NATS_CONTEXT": "b"}).url == "a-host"
    assert resolve(ConnectionOptions(context="b"), env).servers == ["nats://b-host:4222"]
    # a path to a .json file, relative or absolute
    (tmp_path / "mine.json").write_text(json.dumps({"url": "file-host:7"}))
    monkeypatch.chdir(tmp_path)
    assert load_context("mine.json", env).url == "file-host:7"
    assert load_context("./mine.json", env).name == "mine"
    assert resolve(ConnectionOptions(context=str(tmp_path / "mine.json")), env).servers == ["nats://file-host:7"]
    assert load_context(None, env | {"NATS_CONTEXT": "mine.json"}).url == "file-host:7"
    # nothing selected: no context, not an error
    (cfg / "nats" / "context.txt").write_text("  \n")
    assert load_context(None, env) is None
    # the default config dir is ~/.config
    home = tmp_path / "home"
    write_context(_mk(home / ".config"), "h", select=True, url="home-host")
    assert load_context(None, {"HOME": str(home)}).url == "home-host"


def _mk(d: Path) -> Path:
    (d / "nats" / "context").mkdir(parents=True)
    return d


def test_unknown_context_is_a_clear_error(cfg):
    env = {"XDG_CONFIG_HOME": str(cfg)}
    with pytest.raises(PCGroupsError, match=r'unknown context "nope" \(--context\): no file .*nope\.json'):
        resolve(ConnectionOptions(context="nope"), env)
    with pytest.raises(PCGroupsError, match=r'unknown context "gone" \(NATS_CONTEXT\)'):
        load_context(None, env | {"NATS_CONTEXT": "gone"})
    with pytest.raises(PCGroupsError, match=r'unknown context "./missing.json"'):
        load_context("./missing.json", env)
    (cfg / "nats" / "context.txt").write_text("deleted")
    with pytest.raises(PCGroupsError, match=r'unknown context "deleted" \(.*context.txt\)'):
        load_context(None, env)
    assert resolve(ConnectionOptions(no_context=True), env).context is None
    (cfg / "nats" / "context" / "bad.json").write_text("{not json")
    with pytest.raises(PCGroupsError, match=r"invalid context file .*bad\.json"):
        load_context("bad", env)
    (cfg / "nats" / "context" / "typed.json").write_text('{"url": 5}')
    with pytest.raises(PCGroupsError, match="url must be a string"):
        load_context("typed", env)


def test_paths_are_expanded(cfg, tmp_path):
    write_context(
        cfg,
        "p",
        select=True,
        creds="~/keys/u.creds",
        nkey="$KEYS/u.nk",
        cert="${KEYS}/c.pem",
        key="~/k.pem",
        ca="/abs/ca.pem",
        tls_first=True,
    )
    env = {"XDG_CONFIG_HOME": str(cfg), "HOME": "/home/me", "KEYS": "/srv/keys"}
    rc = resolve(ConnectionOptions(), env)
    assert rc.creds == "/home/me/keys/u.creds" and rc.nkey == "/srv/keys/u.nk"
    assert (rc.tls_cert, rc.tls_key, rc.tls_ca) == ("/srv/keys/c.pem", "/home/me/k.pem", "/abs/ca.pem")
    assert rc.tls_first is True
    assert resolve(ConnectionOptions(tlsfirst=False), env).tls_first is False
    assert resolve(ConnectionOptions(creds="~/x.creds"), env).creds == "/home/me/x.creds"
    assert rc.auth_method == "creds"


def test_timeouts_and_durations(cfg):
    env = {"XDG_CONFIG_HOME": str(cfg)}
    assert resolve(ConnectionOptions(), env | {"NATS_TIMEOUT": "1m30s"}).timeout == 90.0
    assert resolve(ConnectionOptions(timeout=2.5), env | {"NATS_TIMEOUT": "9s"}).timeout == 2.5
    assert parse_duration("500ms") == 0.5 and parse_duration("0") == 0.0 and parse_duration("-0") == 0.0
    assert parse_duration("1h2m3.5s") == 3723.5 and parse_duration("1.5s") == 1.5
    for bad in ("", "5x", "s", "1m-"):
        with pytest.raises(PCGroupsError, match="invalid duration"):
            parse_duration(bad)
    # as Go's time.ParseDuration: a number without a unit is an error, not seconds
    for bare, example in (("2", "2ms or 2s"), ("200", "200ms or 200s"), ("2.5", "2.5ms or 2.5s"), ("1m5", "1m5s")):
        with pytest.raises(PCGroupsError) as e:
            parse_duration(bare)
        assert str(e.value) == f'missing unit in duration "{bare}" (e.g. {example})'
    with pytest.raises(PCGroupsError, match="missing unit"):
        resolve(ConnectionOptions(), env | {"NATS_TIMEOUT": "5"})
    with pytest.raises(PCGroupsError, match="invalid timeout"):
        resolve(ConnectionOptions(timeout=0), env)


def test_connect_kwargs_shape(cfg):
    rc = resolve(
        ConnectionOptions(
            server="h1,h2:5", user="u", password="p", token="t", inbox_prefix="_I", connection_name="cg", timeout=3
        ),
        {"XDG_CONFIG_HOME": str(cfg)},
    )
    kw = rc.connect_kwargs()
    assert kw["servers"] == ["nats://h1:4222", "nats://h2:5"]
    assert (kw["user"], kw["password"], kw["token"]) == ("u", "p", "t")
    assert (kw["inbox_prefix"], kw["name"], kw["connect_timeout"]) == ("_I", "cg", 3.0)
    assert kw["max_reconnect_attempts"] == 1 and kw["reconnect_time_wait"] == 0  # fail fast first
    assert "tls" not in kw and rc.auth_method == "user+token"
    assert isinstance(rc, ResolvedConnection)


async def test_connected_client_reconnects_forever(fresh_server):
    nc = await connect(ConnectionOptions(server=fresh_server.url), env={})
    try:
        assert nc.options["allow_reconnect"] is True and nc.options["max_reconnect_attempts"] == -1
        fresh_server.stop()
        await wait_for(lambda: not nc.is_connected, what="the client to see the server go")
        await asyncio.sleep(2.5)  # longer than a fail-fast first connect would keep trying
        fresh_server.start()
        await wait_for(lambda: nc.is_connected and nc.stats["reconnects"] >= 1, timeout=15, what="a reconnect")
        await nc.flush(timeout=5)
    finally:
        await nc.close()


async def test_no_log_noise_even_with_logging_configured(caplog):
    port = free_port()
    with caplog.at_level(logging.WARNING), pytest.raises(PCGroupsError):
        await connect(ConnectionOptions(server=f"127.0.0.1:{port}"), env={})
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_what_pcgroups_wraps_on_a_nats_py_client_is_still_there():
    """pcgroups wraps these private attributes of nats-py's Client (jetstream/_compat.py): an upgrade of nats-py
    that renames or reshapes one fails here, not in production."""
    import inspect

    from nats.aio.client import Client

    from pcgroups.jetstream._compat import PATCHED

    nc = Client()
    assert [name for name in PATCHED if not hasattr(nc, name)] == []
    assert list(inspect.signature(nc._build_message).parameters) == ["sid", "subject", "reply", "data", "headers"]
    assert inspect.iscoroutinefunction(nc._error_cb)


async def test_one_connection_object_owns_the_client_and_the_users_callbacks_still_run(fresh_server):
    import nats

    from pcgroups.jetstream import Connection, JetStreamApi

    said: list[str] = []

    async def disconnected() -> None:
        said.append("user: disconnected")

    async def reconnected() -> None:
        said.append("user: reconnected")

    nc = await nats.connect(
        fresh_server.url,
        disconnected_cb=disconnected,
        reconnected_cb=reconnected,
        reconnect_time_wait=0.2,
        max_reconnect_attempts=-1,
    )
    try:
        connection = Connection.of(nc)
        assert Connection.of(nc) is connection and JetStreamApi(nc).permissions is connection.permissions
        stop = connection.watch.listen(lambda kind, url: said.append(f"pcgroups: {kind}"))
        assert JetStreamApi(nc).prefix == "$JS.API"
        connection.bind(domain="hub")
        assert JetStreamApi(nc).prefix == "$JS.hub.API" and connection.domain == "hub"
        connection.bind()
        fresh_server.restart()
        await wait_for(lambda: "user: reconnected" in said, timeout=15, what="the reconnect")
        assert said == ["pcgroups: disconnected", "user: disconnected", "pcgroups: reconnected", "user: reconnected"]
        stop()
    finally:
        await nc.close()
