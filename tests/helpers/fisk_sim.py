"""What the nats CLI does with a plugin's fisk model, imitated for tests (nats itself isn't installable here).

- :func:`check_fisk_model` applies the rules nats enforces when it loads a plugin model (a broken
  model disables the plugin, some clashes break every nats command) plus the order-safety rule.
- :func:`nats_argv` builds the argv nats would run the plugin with (the nats CLI's plugin protocol): command path
  (aliases resolved), non-cumulative positionals in Go-map (random) order, leaf flags as
  ``--name=value``, proxied globals as ``--name=value``, cumulative positionals last in typed order.
  :func:`all_nats_argvs` gives every order nats could produce.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

NATS_GLOBALS = frozenset(
    {
        "server",
        "user",
        "password",
        "token",
        "connection-name",
        "creds",
        "nkey",
        "jwt",
        "seed",
        "tlscert",
        "tlskey",
        "tlsca",
        "tlsfirst",
        "tls-first",
        "timeout",
        "socks-proxy",
        "js-api-prefix",
        "js-event-prefix",
        "js-domain",
        "domain",
        "inbox-prefix",
        "colors",
        "context",
        "trace",
        "no-context",
    }
)
NATS_SHORTS = frozenset({ord("s"), ord("h")})
NATS_COMMANDS = frozenset(
    {
        "account",
        "auth",
        "bench",
        "cheat",
        "context",
        "errors",
        "events",
        "kv",
        "latency",
        "micro",
        "object",
        "pub",
        "publish",
        "request",
        "reply",
        "rtt",
        "schema",
        "server",
        "service",
        "stream",
        "consumer",
        "sub",
        "subscribe",
        "trafic",
        "traffic",
        "plugins",
        "help",
        "completion",
    }
)

Value = str | bool | Sequence[str]


def check_fisk_model(model: Mapping[str, Any]) -> None:
    """Raise AssertionError listing every way nats would reject or mishandle the model."""
    problems: list[str] = []
    if not isinstance(model.get("name"), str) or not model["name"]:
        problems.append("root: no name")
    elif model["name"] in NATS_COMMANDS:
        problems.append(f"root: name {model['name']!r} is a nats command")
    if not isinstance(model.get("help"), str) or not model["help"].strip():
        problems.append("root: empty help (nats skips the plugin)")
    if model.get("commands") in (None, []):
        problems.append("root: no commands")

    def check_flags(flags: Any, where: str, longs: set[str], shorts: set[int], leaf: bool) -> None:
        if flags is None:
            return
        if not isinstance(flags, list):
            problems.append(f"{where}: flags is not a list")
            return
        for f in flags:
            name = f.get("name")
            if not isinstance(name, str) or not name:
                problems.append(f"{where}: flag without a name")
                continue
            for key in ("boolean", "negatable", "cumulative", "required", "hidden"):
                if key in f and not isinstance(f[key], bool):
                    problems.append(f"{where}: --{name}: {key} must be a bool")
            if "default" in f and not (
                isinstance(f["default"], list) and all(isinstance(v, str) for v in f["default"])
            ):
                problems.append(f"{where}: --{name}: default must be a list of strings")
            if f.get("negatable") and not f.get("boolean"):
                problems.append(f"{where}: --{name}: negatable but not boolean")
            if "short" in f:
                s = f["short"]
                if not isinstance(s, int) or isinstance(s, bool):
                    problems.append(f"{where}: --{name}: short must be an int code point")
                elif s in NATS_SHORTS:
                    problems.append(f"{where}: --{name}: short -{chr(s)} is taken by nats")
                elif s in shorts:
                    problems.append(f"{where}: --{name}: duplicate short flag -{chr(s)}")
                else:
                    shorts.add(s)
            if name in NATS_GLOBALS:
                if leaf:
                    problems.append(f"{where}: --{name} on a leaf is proxied from nats, not the plugin's")
                continue  # proxied, not declared again by nats
            if name in longs:
                problems.append(f"{where}: duplicate long flag --{name}")
            longs.add(name)
            if not leaf and not f.get("hidden"):
                problems.append(f"{where}: --{name} on a non-leaf command is dropped by nats")

    def check_args(args: Any, where: str) -> None:
        if not args:
            return
        plain = [a for a in args if not a.get("cumulative")]
        cumulative = [a for a in args if a.get("cumulative")]
        if len(plain) > 1:
            problems.append(f"{where}: {len(plain)} non-cumulative args: nats shuffles them")
        if len(cumulative) > 1:
            problems.append(f"{where}: more than one cumulative arg")
        if cumulative and args[-1] is not cumulative[0]:
            problems.append(f"{where}: the cumulative arg must be last")
        for a in args:
            if "default" in a or "envar" in a:
                problems.append(f"{where}: arg {a.get('name')!r} has a default/envar (nats forwards it)")

    def walk(cmds: Any, path: str, longs: set[str], shorts: set[int]) -> None:
        names: set[str] = set()
        for c in cmds or []:
            name = c.get("name")
            where = f"{path} {name}".strip()
            if c.get("default"):
                problems.append(f"{where}: default command breaks plugins")
            for n in [name, *c.get("aliases", [])]:
                if n in names:
                    problems.append(f"{where}: duplicate command name or alias {n!r}")
                names.add(n)
            sub = c.get("commands") or []
            leaf = not sub
            l2, s2 = set(longs), set(shorts)
            check_flags(c.get("flags"), where, l2, s2, leaf)
            if leaf:
                check_args(c.get("args"), where)
            elif c.get("args"):
                problems.append(f"{where}: args on a command group")
            walk(sub, where, l2, s2)

    longs: set[str] = set()
    shorts: set[int] = set()
    check_flags(model.get("flags"), "root", longs, shorts, leaf=False)
    walk(model.get("commands"), "", longs, shorts)
    if problems:
        raise AssertionError("fisk model problems:\n  " + "\n  ".join(problems))


def _resolve_path(model: Mapping[str, Any], command_path: Sequence[str]) -> tuple[list[str], list[dict]]:
    """Real names along the typed path (aliases resolved) and the models along it."""
    names: list[str] = []
    chain: list[dict] = [dict(model)]
    cmds = model.get("commands") or []
    for typed in command_path:
        for c in cmds:
            if c["name"] == typed or typed in c.get("aliases", []):
                names.append(c["name"])
                chain.append(c)
                cmds = c.get("commands") or []
                break
        else:
            raise ValueError(f"nats: error: unknown command {typed!r}")
    if cmds:
        raise ValueError(f"nats: error: {' '.join(command_path)!r} is not a leaf command")
    return names, chain


def _flag_tokens(flag: Mapping[str, Any], value: Value) -> list[str]:
    name = flag["name"]
    if flag.get("boolean"):
        if value is True:
            return [f"--{name}"]
        if value is False:
            return [f"--no-{name}"] if flag.get("negatable") else []
        raise ValueError(f"boolean flag --{name} takes True/False")
    if flag.get("cumulative"):
        values = [value] if isinstance(value, str) else list(value)  # type: ignore[arg-type]
        return [f"--{name}={v}" for v in values]
    if not isinstance(value, str):
        raise ValueError(f"flag --{name} takes one string")
    return [f"--{name}={value}"]


def _global_token(name: str, value: Value) -> str:
    if isinstance(value, bool):
        return f"--{name}={'true' if value else 'false'}"
    return f"--{name}={value}"


def _parts(
    model: Mapping[str, Any],
    command_path: Sequence[str],
    positionals: Sequence[str],
    flags: Mapping[str, Value] | None,
    globals: Mapping[str, Value] | None,
):
    names, chain = _resolve_path(model, command_path)
    leaf = chain[-1]
    args = leaf.get("args") or []
    values = list(positionals)
    plain: list[str] = []
    cumulative: list[str] = []
    for a in args:
        if a.get("cumulative"):
            cumulative = values
            values = []
            if a.get("required") and not cumulative:
                raise ValueError(f"nats: error: required argument '{a['name']}' not provided")
        elif values:
            plain.append(values.pop(0))
        elif a.get("required"):
            raise ValueError(f"nats: error: required argument '{a['name']}' not provided")
    if values:
        raise ValueError(f"nats: error: unexpected {values[0]!r}")
    plain = [v for v in plain if v != ""]  # nats drops empty strings
    cumulative = [v for v in cumulative if v != ""]

    leaf_flags = {f["name"]: f for f in leaf.get("flags") or [] if f["name"] not in NATS_GLOBALS}
    for f in leaf_flags.values():
        if f.get("required") and f["name"] not in (flags or {}):
            raise ValueError(f"nats: error: required flag --{f['name']} not provided")
    flag_tokens: list[list[str]] = []
    for name, value in (flags or {}).items():
        if name not in leaf_flags:
            raise ValueError(f"nats: error: unknown long flag '--{name}' (or it isn't on the leaf)")
        flag_tokens.append(_flag_tokens(leaf_flags[name], value))

    declared = {f["name"] for c in chain for f in c.get("flags") or [] if f["name"] in NATS_GLOBALS}
    global_tokens = [
        _global_token(n, v) for n, v in (globals or {}).items() if n in declared
    ]  # undeclared globals are lost
    return names, plain, flag_tokens, global_tokens, cumulative


def nats_argv(
    model: Mapping[str, Any],
    command_path: Sequence[str],
    positionals: Sequence[str] = (),
    flags: Mapping[str, Value] | None = None,
    globals: Mapping[str, Value] | None = None,
    *,
    rng: random.Random | None = None,
) -> list[str]:
    """The argv ``nats <name> <command_path> <positionals> <flags> <globals>`` runs the plugin with.

    ``flags`` are leaf flags as typed (bool for booleans, list for cumulative ones); ``globals``
    are nats global flags given to nats (bool for booleans). Non-cumulative positionals and flags
    come in a random order, as Go map iteration gives them.
    """
    rng = rng or random.Random()
    names, plain, flag_tokens, global_tokens, cumulative = _parts(model, command_path, positionals, flags, globals)
    rng.shuffle(plain)
    rng.shuffle(flag_tokens)
    rng.shuffle(global_tokens)
    return [*names, *plain, *itertools.chain.from_iterable(flag_tokens), *global_tokens, *cumulative]


def all_nats_argvs(
    model: Mapping[str, Any],
    command_path: Sequence[str],
    positionals: Sequence[str] = (),
    flags: Mapping[str, Value] | None = None,
    globals: Mapping[str, Value] | None = None,
) -> Iterator[list[str]]:
    """Every argv nats could build (all orders of the plain positionals; flags in typed order)."""
    names, plain, flag_tokens, global_tokens, cumulative = _parts(model, command_path, positionals, flags, globals)
    seen: set[tuple[str, ...]] = set()
    for perm in itertools.permutations(plain):
        argv = [*names, *perm, *itertools.chain.from_iterable(flag_tokens), *global_tokens, *cumulative]
        if tuple(argv) not in seen:
            seen.add(tuple(argv))
            yield argv
