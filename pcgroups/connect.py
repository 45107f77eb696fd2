"""Connection settings the way the ``nats`` CLI takes them: options, ``NATS_*`` env vars, contexts.

Precedence, field by field: explicit option > env var > NATS context > ``nats://127.0.0.1:4222``.
The context is chosen by ``--context`` > ``NATS_CONTEXT`` > ``<config>/nats/context.txt``
(``<config>`` = ``$XDG_CONFIG_HOME`` or ``~/.config``); ``--no-context`` skips contexts.

:func:`connect` makes the first connection fail fast with one clear :class:`PCGroupsError`
(nats-py would otherwise retry an unreachable server for minutes) and then lets the connected
client reconnect forever, as a long-running consumer wants; it binds the JetStream domain (or API
prefix) to the client, so that every pcgroups call on it without ``api=`` uses that JetStream.
:class:`ConnectionWatch` tells any number of listeners (running instances) when a client loses and
regains its server.

The JetStream domain or API prefix is taken as a whole from the options (not both), else from the
context (its domain before its API prefix).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import os
import re
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from .errors import PCGroupsError
from .jetstream._api import JetStreamApi
from .jetstream._compat import tolerate_undecodable
from .jetstream._connection import prefix_of

if TYPE_CHECKING:
    from nats.aio.client import Client

__all__ = [
    "DEFAULT_TIMEOUT",
    "DEFAULT_URL",
    "ConnectionOptions",
    "NatsContext",
    "ResolvedConnection",
    "ServerUnreachableError",
    "config_dir",
    "connect",
    "enable_reconnect",
    "load_context",
    "parse_duration",
    "redact",
    "resolve",
]

log = logging.getLogger(__name__)

DEFAULT_URL = "nats://127.0.0.1:4222"
DEFAULT_TIMEOUT = 5.0  # seconds, as the nats CLI's --timeout
RECONNECT_TIME_WAIT = 2.0  # seconds between reconnect rounds once connected
# connection failures that mean nothing answers (yet) at the address: not a wrong setting of the client's
_UNREACHABLE = (
    "connection refused",
    "timed out",
    "connection reset by server",
    "network is unreachable",
    "no route to host",
)


class ServerUnreachableError(PCGroupsError):
    """:func:`connect` found no server answering (refused, timed out, unreachable): one may answer later. Wrong
    credentials, TLS settings or host names raise the plain :class:`PCGroupsError`."""


@dataclass
class ConnectionOptions:
    """Connection values a user gave on the command line (None = not given)."""

    server: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    creds: str | None = None
    nkey: str | None = None
    tlscert: str | None = None
    tlskey: str | None = None
    tlsca: str | None = None
    tlsfirst: bool | None = None
    timeout: float | None = None
    js_domain: str | None = None
    js_api_prefix: str | None = None
    inbox_prefix: str | None = None
    context: str | None = None
    no_context: bool | None = None
    connection_name: str | None = None


@dataclass
class NatsContext:
    """One NATS context file (ADR-21 field names); ``name`` and ``path`` say where it came from."""

    name: str = ""
    path: str = ""
    description: str | None = None
    url: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    creds: str | None = None
    nkey: str | None = None
    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    nsc: str | None = None
    jetstream_domain: str | None = None
    jetstream_api_prefix: str | None = None
    jetstream_event_prefix: str | None = None
    inbox_prefix: str | None = None
    user_jwt: str | None = field(default=None, repr=False)
    user_seed: str | None = field(default=None, repr=False)
    socks_proxy: str | None = None
    color_scheme: str | None = None
    tls_first: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_CONTEXT_STR_FIELDS = tuple(f.name for f in fields(NatsContext) if f.name not in ("name", "path", "tls_first", "extra"))


# ---------------------------------------------------------------- helpers


def _home(env: Mapping[str, str]) -> str:
    return env.get("HOME") or str(Path.home())


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CONFIG_HOME`` or ``~/.config``: the parent of the ``nats`` folder."""
    env = os.environ if env is None else env
    xdg = env.get("XDG_CONFIG_HOME")
    return Path(xdg) if xdg else Path(_home(env)) / ".config"


_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _expand(value: str, env: Mapping[str, str]) -> str:
    """Expand ``$VAR``/``${VAR}`` (unknown → empty, as Go's ExpandEnv) and a leading ``~``."""
    value = _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), ""), value)
    if value == "~" or value.startswith("~/"):
        value = _home(env) + value[1:]
    return value


def _reference(value: str, env: Mapping[str, str], what: str) -> str | None:
    """The content of an ``env://VAR`` or ``data:;base64,...`` reference; None for a plain value."""
    if value.startswith("env://"):
        var = value[len("env://") :]
        content = env.get(var)
        if not content:
            raise PCGroupsError(f"{what}: environment variable {var} is not set")
        return content
    if value.startswith("data:"):
        meta, sep, payload = value[len("data:") :].partition(",")
        if not sep:
            raise PCGroupsError(f"{what}: malformed data: reference")
        if meta.endswith(";base64"):
            try:
                return base64.b64decode(payload, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError) as e:
                raise PCGroupsError(f"{what}: bad base64 in data: reference ({e})") from None
        return payload
    return None


def _secret(value: str | None, env: Mapping[str, str], what: str) -> str | None:
    """A literal secret, or the content of its ``env://``/``data:`` reference."""
    if not value:
        return None
    ref = _reference(value, env, what)
    return value if ref is None else ref


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
#: Go's longest duration (an int64 of nanoseconds), in seconds: ``2562047h47m16.854775807s``, about 292 years.
MAX_DURATION = (2**63 - 1) / 1e9
_NUMBER = re.compile(r"\d+(?:\.\d*)?|\.\d+")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """Seconds from a Go duration (``1m30s``, ``500ms``, ``0``), read as Go's ``time.ParseDuration`` reads
    it: a number without a unit is an error (``missing unit in duration "200" (e.g. 200ms or 200s)``)."""
    s = text.strip()
    sign = 1.0
    if s[:1] in "+-" and s:
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    pos, total = 0, 0.0
    while pos < len(s):
        m = _DURATION_PART.match(s, pos)
        if not m:
            if _NUMBER.fullmatch(s, pos):
                example = f"{s}ms or {s}s" if pos == 0 else f"{text.strip()}s"
                raise PCGroupsError(f'missing unit in duration "{text.strip()}" (e.g. {example})')
            raise PCGroupsError(f"invalid duration {text!r}: use e.g. 5s, 1m30s, 500ms")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not s:
        raise PCGroupsError(f"invalid duration {text!r}: use e.g. 5s, 1m30s, 500ms")
    if total > MAX_DURATION:
        raise PCGroupsError(
            f'duration "{text.strip()}" is out of range: at most 2562047h47m16.854775807s (about 292 years), as in Go'
        )
    return sign * total


#: The schemes of a NATS server URL (nats-py's): plain, TLS, websocket.
URL_SCHEMES = ("nats", "tls", "ws", "wss")


def _normalize_url(url: str) -> str:
    """Add ``nats://`` to a URL without a scheme and ``:4222`` to one without a port; a URL that can not be
    a NATS server's (another scheme, no host, a path, a bad port) is an error saying what is wrong."""
    given = url.strip()
    url = given if "://" in given else "nats://" + given

    def bad(why: str) -> PCGroupsError:
        return PCGroupsError(f'invalid server URL "{redact(given)}": {why}')

    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed [ (Invalid IPv6 URL), ...
        raise bad(
            "it is malformed; write it nats://HOST:PORT (e.g. nats://127.0.0.1:4222, nats://[::1]:4222)"
        ) from None

    if parts.scheme not in URL_SCHEMES:
        schemes = ", ".join(f"{s}://" for s in URL_SCHEMES)
        raise bad(f"the scheme {parts.scheme}:// is not NATS's; use {schemes} (e.g. nats://127.0.0.1:4222)")
    if not parts.hostname or (parts.path not in ("", "/") and parts.scheme not in ("ws", "wss")):
        raise bad("write it nats://HOST:PORT (e.g. nats://127.0.0.1:4222)")
    if parts.hostname.isdigit():  # taken for a host (an IPv4 address as one number), it waits for a timeout
        raise bad(
            f"{parts.hostname} is a port number, not a host: write nats://HOST:{parts.hostname} (e.g. "
            f"nats://127.0.0.1:{parts.hostname})"
        )
    try:
        port = parts.port
    except ValueError:
        raise bad("the port must be a number from 1 to 65535") from None
    if port is None and parts.scheme in ("nats", "tls"):
        url = parts._replace(netloc=parts.netloc.rstrip(":") + ":4222").geturl()
    return url


def redact(url: str) -> str:
    """The URL with its secret replaced by ``***``: the password of ``user:password@``, or the whole user
    part when there is no password (``token@``, as nats URLs carry a token); a malformed URL keeps only what
    follows its last ``@``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        scheme, sep, rest = url.rpartition("://")
        return f"{scheme}{sep}***@{rest.rpartition('@')[2]}" if "@" in rest else url
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = "***" if parts.password is None else f"{parts.username or ''}:***"
    return parts._replace(netloc=f"{user}@{host}").geturl()


def _split_servers(url: str) -> list[str]:
    return [_normalize_url(u) for u in url.split(",") if u.strip()]


# ---------------------------------------------------------------- contexts


def _context_error(selection: str, source: str, path: Path | str) -> PCGroupsError:
    return PCGroupsError(f'unknown context "{selection}" ({source}): no file {path}')


def load_context(name_or_path: str | None = None, env: Mapping[str, str] | None = None) -> NatsContext | None:
    """The context chosen by ``name_or_path`` > ``NATS_CONTEXT`` > ``context.txt``; None if none is.

    A value naming an existing ``*.json`` file loads that file; otherwise it is a context name
    under ``<config>/nats/context/``. A chosen context that does not exist is an error.
    """
    env = os.environ if env is None else env
    base = config_dir(env) / "nats"
    if name_or_path:
        selection, source = name_or_path, "--context"
    elif env.get("NATS_CONTEXT"):
        selection, source = env["NATS_CONTEXT"], "NATS_CONTEXT"
    else:
        try:
            selection = (base / "context.txt").read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise PCGroupsError(f"can't read {base / 'context.txt'}: {e.strerror or e}") from None
        if not selection:
            return None
        source = str(base / "context.txt")

    as_path = Path(_expand(selection, env))
    if selection.endswith(".json") and as_path.is_file():
        path, name = as_path, as_path.stem
    elif selection.endswith(".json") or "/" in selection or "\\" in selection or ".." in selection:
        raise _context_error(selection, source, as_path)
    else:
        path, name = base / "context" / f"{selection}.json", selection
        if not path.is_file():
            raise _context_error(selection, source, path)
    return _read_context(path, name)


def _read_context(path: Path, name: str) -> NatsContext:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PCGroupsError(f"can't read context file {path}: {e.strerror or e}") from None
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as e:
        raise PCGroupsError(f"invalid context file {path}: {e.msg} at line {e.lineno}") from None
    if not isinstance(data, dict):
        raise PCGroupsError(f"invalid context file {path}: not a JSON object")
    ctx = NatsContext(name=name, path=str(path))
    for key, value in data.items():
        if key in _CONTEXT_STR_FIELDS:
            if value is not None and not isinstance(value, str):
                raise PCGroupsError(f"invalid context file {path}: {key} must be a string")
            setattr(ctx, key, value or None)
        elif key == "tls_first":
            if value is not None and not isinstance(value, bool):
                raise PCGroupsError(f"invalid context file {path}: tls_first must be true or false")
            ctx.tls_first = value
        elif key != "name":
            ctx.extra[key] = value
    return ctx


# ---------------------------------------------------------------- resolution


@dataclass
class ResolvedConnection:
    """Final connection settings, after options, env vars, context and defaults are merged."""

    servers: list[str] = field(default_factory=lambda: [DEFAULT_URL])
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    creds: str | None = field(default=None, repr=False)  # path, or the text when ``creds_is_data``
    creds_is_data: bool = False
    nkey: str | None = field(default=None, repr=False)  # path, or the seed when ``nkey_is_data``
    nkey_is_data: bool = False
    user_jwt: str | None = field(default=None, repr=False)
    user_seed: str | None = field(default=None, repr=False)
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_first: bool = False
    timeout: float = DEFAULT_TIMEOUT
    js_domain: str | None = None
    js_api_prefix: str | None = None
    inbox_prefix: str | None = None
    name: str | None = None
    context: NatsContext | None = field(default=None, repr=False)

    @property
    def display_servers(self) -> str:
        """The server URLs for messages, passwords redacted."""
        return ",".join(redact(u) for u in self.servers)

    @property
    def auth_method(self) -> str:
        """Which credentials are used, by the nats precedence: user+password > creds > nkey > jwt."""
        if self.user and self.password:
            method = "user"
        elif self.creds:
            method = "creds"
        elif self.nkey:
            method = "nkey"
        elif self.user_jwt and self.user_seed:
            method = "jwt"
        else:
            method = "none"
        if self.token:
            method = "token" if method == "none" else f"{method}+token"
        return method

    @property
    def uses_tls(self) -> bool:
        """True when the user asked for TLS (certs, CA, TLS first, or a ``tls://`` URL)."""
        return bool(
            self.tls_cert
            or self.tls_key
            or self.tls_ca
            or self.tls_first
            or any(u.startswith(("tls://", "wss://")) for u in self.servers)
        )

    def error(self, detail: str) -> PCGroupsError:
        """The one-line connection error: ``can't connect to <servers>: <detail>``."""
        return PCGroupsError(f"can't connect to {self.display_servers}: {detail}")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context (CA and client certificate), or None when TLS isn't asked for."""
        if not self.uses_tls:
            return None
        if bool(self.tls_cert) != bool(self.tls_key):
            raise self.error("a TLS client certificate needs both --tlscert and --tlskey")
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if self.tls_ca:
            _need_file(self, self.tls_ca, "TLS CA file")
            try:
                ctx.load_verify_locations(cafile=self.tls_ca)
            except (ssl.SSLError, OSError, ValueError) as e:
                raise self.error(f"can't load TLS CA {self.tls_ca}: {_ssl_reason(e)}") from None
        if self.tls_cert and self.tls_key:
            _need_file(self, self.tls_cert, "TLS certificate")
            _need_file(self, self.tls_key, "TLS key")
            try:
                ctx.load_cert_chain(self.tls_cert, self.tls_key)
            except (ssl.SSLError, OSError, ValueError) as e:
                raise self.error(f"can't load TLS certificate {self.tls_cert}: {_ssl_reason(e)}") from None
        return ctx

    @property
    def api_prefix(self) -> str:
        """The JetStream API prefix: the domain's (``$JS.<domain>.API``), else the API prefix, else ``$JS.API``."""
        return prefix_of(self.js_domain, self.js_api_prefix)

    def jetstream_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``nc.jetstream()``: the API prefix."""
        return {"prefix": self.api_prefix}

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``, set for a fail-fast first connection.

        Each server is tried at most twice, without waiting; :func:`connect` switches the client to
        unlimited reconnects once connected (see :func:`enable_reconnect`).
        """
        kw: dict[str, Any] = {
            "servers": list(self.servers),
            "connect_timeout": self.timeout,
            "allow_reconnect": False,
            "max_reconnect_attempts": 1,
            "reconnect_time_wait": 0,
            "error_cb": _log_error,
            "disconnected_cb": _log_disconnected,
            "reconnected_cb": _log_reconnected,
            "closed_cb": _log_closed,
        }
        if self.name:
            kw["name"] = self.name
        if self.inbox_prefix:
            kw["inbox_prefix"] = self.inbox_prefix
        if self.user and self.password:
            kw["user"], kw["password"] = self.user, self.password
        elif self.creds:
            if self.creds_is_data:
                from nats.aio.client import RawCredentials

                kw["user_credentials"] = RawCredentials(self.creds)
            else:
                _need_file(self, self.creds, "creds file")
                kw["user_credentials"] = self.creds
        elif self.nkey:
            if self.nkey_is_data:
                kw["nkeys_seed_str"] = self.nkey
            else:
                _need_file(self, self.nkey, "nkey file")
                kw["nkeys_seed_str"] = _read_seed(self, self.nkey)
        elif self.user_jwt and self.user_seed:
            kw["user_jwt_cb"], kw["signature_cb"] = _jwt_callbacks(self, self.user_jwt, self.user_seed)
        if self.token:
            kw["token"] = self.token
        tls = self.ssl_context()
        if tls is not None:
            kw["tls"] = tls
        if self.tls_first:
            kw["tls_handshake_first"] = True
        return kw


def _need_file(rc: ResolvedConnection, path: str, what: str) -> None:
    if not os.path.isfile(path):
        raise rc.error(f"{what} {path} not found")
    if not os.access(path, os.R_OK):
        raise rc.error(f"{what} {path} is not readable")


def _read_seed(rc: ResolvedConnection, path: str) -> str:
    """The nkey seed in a seed file: the first line that looks like ``S...``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise rc.error(f"can't read nkey file {path}: {getattr(e, 'strerror', None) or e}") from None
    for line in text.splitlines():
        line = line.strip()
        if len(line) > 2 and line[0] == "S" and line[1] in "UAONC":
            return line
    raise rc.error(f"nkey file {path} holds no nkey seed")


def _jwt_callbacks(
    rc: ResolvedConnection, user_jwt: str, user_seed: str
) -> tuple[Callable[[], bytes], Callable[[str], bytes]]:
    try:
        import nkeys
    except ImportError:
        raise rc.error(_NKEYS_MISSING) from None
    try:
        nkeys.from_seed(bytearray(user_seed.strip().encode())).wipe()
    except Exception:
        raise rc.error("invalid user seed") from None

    def user_jwt_cb() -> bytes:
        return user_jwt.strip().encode()

    def signature_cb(nonce: str) -> bytes:
        kp = nkeys.from_seed(bytearray(user_seed.strip().encode()))
        try:
            return base64.b64encode(kp.sign(nonce.encode()))
        finally:
            kp.wipe()

    return user_jwt_cb, signature_cb


_NKEYS_MISSING = "nkey and creds authentication need the nkeys package (pip install 'nats-py[nkeys]')"


def _pick(*values: str | None) -> str | None:
    """The first non-empty value."""
    for v in values:
        if v:
            return v
    return None


def resolve(options: ConnectionOptions | None = None, env: Mapping[str, str] | None = None) -> ResolvedConnection:
    """Merge options > env vars > context > defaults into final settings (no network)."""
    o = options or ConnectionOptions()
    env = os.environ if env is None else env
    ctx = None if o.no_context else load_context(o.context, env)
    c = ctx or NatsContext()

    url = _pick(o.server, env.get("NATS_URL"), c.url) or DEFAULT_URL
    servers = _split_servers(url)
    if not servers:
        raise PCGroupsError(f"no server URL in {url!r}")

    user = _pick(o.user, env.get("NATS_USER"), c.user)
    password = _secret(_pick(o.password, env.get("NATS_PASSWORD"), c.password), env, "password")
    token = _secret(_pick(o.token, env.get("NATS_TOKEN"), c.token), env, "token")
    if user and not password:
        # as the nats CLI: a user without a password is a token
        token, user = token or user, None

    rc = ResolvedConnection(servers=servers, user=user, password=password, token=token, context=ctx)

    creds = _pick(o.creds, env.get("NATS_CREDS"), c.creds)
    if creds:
        data = _reference(creds, env, "creds")
        if data is not None:
            rc.creds, rc.creds_is_data = data, True
        else:
            rc.creds = _expand(creds.removeprefix("file://"), env)
    nkey = _pick(o.nkey, env.get("NATS_NKEY"), c.nkey)
    if nkey:
        data = _reference(nkey, env, "nkey")
        if data is not None:
            rc.nkey, rc.nkey_is_data = data.strip(), True
        else:
            rc.nkey = _expand(nkey.removeprefix("file://"), env)
    rc.user_jwt = _secret(_pick(env.get("NATS_JWT"), c.user_jwt), env, "user_jwt")
    rc.user_seed = _secret(_pick(env.get("NATS_SEED"), c.user_seed), env, "user_seed")

    for attr, opt, var, ctx_value in (
        ("tls_cert", o.tlscert, "NATS_CERT", c.cert),
        ("tls_key", o.tlskey, "NATS_KEY", c.key),
        ("tls_ca", o.tlsca, "NATS_CA", c.ca),
    ):
        value = _pick(opt, env.get(var), ctx_value)
        setattr(rc, attr, _expand(value, env) if value else None)
    rc.tls_first = bool(o.tlsfirst if o.tlsfirst is not None else c.tls_first)

    if o.timeout is not None:
        rc.timeout = float(o.timeout)
    elif env.get("NATS_TIMEOUT"):
        rc.timeout = parse_duration(env["NATS_TIMEOUT"])
    if rc.timeout <= 0:
        raise PCGroupsError(f"invalid timeout {rc.timeout:g}s: must be positive")

    _resolve_jetstream(rc, o, c)
    rc.inbox_prefix = _pick(o.inbox_prefix, c.inbox_prefix)
    rc.name = o.connection_name
    return rc


def _resolve_jetstream(rc: ResolvedConnection, o: ConnectionOptions, c: NatsContext) -> None:
    """The JetStream domain or API prefix: the options' (not both), else the context's (its domain first)."""
    if o.js_domain and o.js_api_prefix:
        raise PCGroupsError("--js-domain and --js-api-prefix exclude each other: give one of them")
    if o.js_domain or o.js_api_prefix:
        rc.js_domain, rc.js_api_prefix = o.js_domain or None, o.js_api_prefix or None
    else:
        rc.js_domain = c.jetstream_domain
        rc.js_api_prefix = None if c.jetstream_domain else c.jetstream_api_prefix
    prefix_of(rc.js_domain, rc.js_api_prefix)  # one the server would not take is an error now, not at a request


# ---------------------------------------------------------------- connecting


async def _log_error(e: Exception) -> None:
    log.debug("nats: %s", _describe(e))


async def _log_disconnected() -> None:
    log.info("nats: disconnected")


async def _log_reconnected() -> None:
    log.info("nats: reconnected")


async def _log_closed() -> None:
    log.debug("nats: connection closed")


def _ssl_reason(e: BaseException) -> str:
    if isinstance(e, ssl.SSLCertVerificationError):
        return e.verify_message or e.reason or str(e)
    if isinstance(e, ssl.SSLError):
        return (e.reason or str(e)).replace("_", " ").lower()
    if isinstance(e, OSError):
        return e.strerror or str(e)
    return str(e)


def _describe(e: BaseException) -> str:
    """One short lower-case line for a connection failure."""
    from nats import errors as nerr

    if isinstance(e, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed: {_ssl_reason(e)}"
    if isinstance(e, ssl.SSLError):
        return f"TLS error: {_ssl_reason(e)}"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, ConnectionResetError):
        return "connection reset by server"
    if isinstance(e, socket.gaierror):
        return f"can't resolve host: {e.strerror or e}"
    if isinstance(e, (asyncio.TimeoutError, TimeoutError, nerr.TimeoutError)):
        return "timed out"
    if isinstance(e, nerr.AuthorizationError):
        return "authorization violation"
    if isinstance(e, nerr.NoServersError):
        return "no servers available"
    if isinstance(e, nerr.Error):
        text = str(e).strip()
        text = text.removeprefix("nats: ").strip().strip("'").strip()
        low = text.lower()
        if "authorization violation" in low:
            return "authorization violation"
        if "authentication" in low or "authorization" in low:
            return low
        return text or type(e).__name__
    if isinstance(e, OSError):
        return (e.strerror or str(e) or type(e).__name__).lower()
    if isinstance(e, ModuleNotFoundError) and e.name == "nkeys":
        return _NKEYS_MISSING
    text = str(e).strip()
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def enable_reconnect(nc: Client, *, time_wait: float = RECONNECT_TIME_WAIT) -> None:
    """Let a connected client reconnect without limit (for long-running consumers)."""
    nc.options["allow_reconnect"] = True
    nc.options["max_reconnect_attempts"] = -1
    nc.options["reconnect_time_wait"] = time_wait


async def connect(
    options: ConnectionOptions | ResolvedConnection | None = None,
    *,
    env: Mapping[str, str] | None = None,
    reconnect: bool = True,
    **nats_kwargs: Any,
) -> Client:
    """A connected ``nats.aio.client.Client``, or one :class:`PCGroupsError` naming the server.

    ``nats_kwargs`` override the computed ``nats.connect`` arguments (e.g. ``reconnected_cb``).
    With ``reconnect`` the client then reconnects forever after losing its server.
    """
    from nats.aio.client import Client

    rc = options if isinstance(options, ResolvedConnection) else resolve(options, env)
    kwargs = rc.connect_kwargs()
    _silence_ssl_eof_warning()  # a server may require TLS even when we didn't ask for it
    kwargs.update(nats_kwargs)
    failures: list[str] = []
    connecting = True
    user_error_cb = kwargs.get("error_cb", _log_error)

    async def error_cb(e: Exception) -> None:
        if connecting:
            failures.append(_describe(e))
        await user_error_cb(e)

    kwargs["error_cb"] = error_cb
    nc = Client()
    tolerate_undecodable(nc)
    # one bound for the whole attempt, in case nats-py keeps trying
    budget = rc.timeout * (2 * len(rc.servers) + 2) + 1.0
    try:
        await asyncio.wait_for(nc.connect(**kwargs), budget)
    except asyncio.CancelledError:
        await _quiet_close(nc)
        raise
    except Exception as e:
        await _quiet_close(nc)
        detail = _describe(e)
        if detail in ("no servers available", "timed out") and failures:
            detail = "; ".join(dict.fromkeys(failures))
        if detail == "timed out":
            detail = f"timed out after {rc.timeout:g}s"
        unreachable = all(part.startswith(_UNREACHABLE) for part in detail.split("; "))
        if rc.uses_tls and not rc.tls_cert and any(w in detail for w in ("reset", "empty response", "broken pipe")):
            detail += " (does the server want a client certificate? see --tlscert/--tlskey)"
            unreachable = False
        if unreachable:
            raise ServerUnreachableError(str(rc.error(detail))) from None
        raise rc.error(detail) from None
    connecting = False
    if rc.uses_tls and not (rc.tls_first or _server_info(nc).get("tls_required")):
        await _quiet_close(nc)
        raise rc.error(
            "TLS was requested but the server does not require TLS (nats-py only upgrades when the server requires it)"
        )
    if reconnect:
        enable_reconnect(nc)
    if rc.js_domain or rc.js_api_prefix:
        JetStreamApi.bind(nc, domain=rc.js_domain, api_prefix=rc.js_api_prefix)
    return nc


def _server_info(nc: Client) -> dict[str, Any]:
    info = getattr(nc, "_server_info", None)
    return info if isinstance(info, dict) else {}


async def _quiet_close(nc: Client) -> None:
    """Close a client whose first connection failed.

    Bounded: after a failed TLS upgrade nats-py waits forever for the plain stream to close
    (asyncio never tells its protocol); the socket itself is closed before that wait.
    """
    try:
        await asyncio.wait_for(nc.close(), 0.25)
    except TimeoutError:
        log.debug("closing a failed connection timed out")
    except Exception as e:
        log.debug("closing a failed connection: %s", e)


class _SSLEOFNoise(logging.Filter):
    """Drops asyncio's harmless warning, logged each time a TLS peer closes a nats-py stream."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect when using ssl" not in record.getMessage()


_ssl_noise_filter: _SSLEOFNoise | None = None


def _silence_ssl_eof_warning() -> None:
    global _ssl_noise_filter
    if _ssl_noise_filter is None:
        _ssl_noise_filter = _SSLEOFNoise()
        logging.getLogger("asyncio").addFilter(_ssl_noise_filter)
