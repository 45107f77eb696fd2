"""The nats CLI plugin side of ``cg``: the fisk introspection model and argv hoisting.

``nats plugins register cg <path>`` runs ``cg --fisk-introspect`` and stores the JSON that
:func:`print_fisk_model` writes; ``nats cg ...`` then runs ``cg`` with an argv in which the
proxied nats globals (``--context=x``) come after the command path, so ``main()`` passes argv
through :func:`hoist_options` before Typer parses it.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

import typer

__all__ = [
    "NATS_GLOBAL_FLAGS",
    "NATS_RESERVED_SHORTS",
    "fisk_model",
    "hoist_options",
    "hoist_to_command",
    "print_fisk_model",
    "root_option_spellings",
]

#: Long names of the nats CLI's global flags: a plugin flag with one of these names is proxied
#: (nats forwards its own parsed value as ``--name=value``), not declared again.
NATS_GLOBAL_FLAGS = frozenset(
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

#: Short letters nats itself uses (``-s`` server, ``-h`` help): a plugin that declares one breaks nats.
NATS_RESERVED_SHORTS = frozenset({"s", "h"})

_SKIP_OPTIONS = frozenset({"help", "version", "install-completion", "show-completion"})
_SKIP_PREFIXES = ("help-", "completion-", "fisk-")

CommandPath = tuple[str, ...]


def _typer_command(app: Any) -> Any:
    """The click command object behind a Typer app (or the object itself if already one)."""
    if isinstance(app, typer.Typer):
        return typer.main.get_command(app)
    return app


def _subcommands(cmd: Any) -> dict[str, Any]:
    """A group's subcommands in its order, looked up as click does (a group may build them lazily)."""
    if not isinstance(getattr(cmd, "commands", None), Mapping):
        return {}
    ctx = cmd.context_class(cmd, info_name=cmd.name)
    return {name: cmd.get_command(ctx, name) for name in cmd.list_commands(ctx)}


def _clean_help(text: str | None) -> tuple[str, str]:
    """(first paragraph on one line, full text) of a help string."""
    if not text:
        return "", ""
    lines = [ln for ln in inspect.cleandoc(text).splitlines() if ln.strip() != "\b"]
    full = "\n".join(lines).strip()
    first = full.split("\n\n", 1)[0]
    return " ".join(first.split()), full


def _long_names(param: Any) -> list[str]:
    return [o[2:] for o in param.opts if o.startswith("--")]


def _short_names(param: Any) -> list[str]:
    return [o[1:] for o in param.opts if o.startswith("-") and not o.startswith("--") and len(o) == 2]


def _skip_option(param: Any) -> bool:
    longs = _long_names(param)
    if not longs:
        return True  # short-only options can't be named in a fisk model
    name = longs[0]
    return name in _SKIP_OPTIONS or name.startswith(_SKIP_PREFIXES)


def _default_list(param: Any) -> list[str]:
    default = param.default
    if default is None or default is False or callable(default):
        return []
    if getattr(param, "count", False) or getattr(param, "is_flag", False):
        return []
    values = list(default) if isinstance(default, (list, tuple)) else [default]
    out = []
    for v in values:
        v = getattr(v, "value", v)  # enums
        if v is None or v == "":
            continue
        out.append(str(v))
    return out


def _flag_models(param: Any, *, leaf: bool) -> list[dict[str, Any]]:
    """The fisk flag(s) for one click option (more than one only for nats-global aliases)."""
    longs = _long_names(param)
    globals_ = [n for n in longs if n in NATS_GLOBAL_FLAGS]
    help_text = _clean_help(getattr(param, "help", None))[0]
    is_bool = bool(getattr(param, "is_flag", False) or getattr(param, "count", False))
    if globals_:
        if leaf:
            raise ValueError(
                f"option --{globals_[0]} on a leaf command has the name of a nats "
                "global flag: declare connection options on the root only"
            )
        # proxied by nats: declared without short letters, defaults or env vars
        return [{"name": n, "help": help_text, "boolean": is_bool, "cumulative": False} for n in globals_]
    if not leaf:
        return []  # nats drops root and intermediate flags that aren't nats globals
    flag: dict[str, Any] = {"name": longs[0], "help": help_text}
    shorts = [s for s in _short_names(param) if s not in NATS_RESERVED_SHORTS]
    if shorts:
        flag["short"] = ord(shorts[0])
    default = _default_list(param)
    if default:
        flag["default"] = default
    envvar = getattr(param, "envvar", None)
    if isinstance(envvar, str) and envvar:
        flag["envar"] = envvar
    metavar = getattr(param, "metavar", None)
    if metavar:
        flag["place_holder"] = metavar
    flag["boolean"] = is_bool
    if is_bool and getattr(param, "secondary_opts", None):
        flag["negatable"] = True
    flag["cumulative"] = bool(getattr(param, "multiple", False)) and not is_bool
    if getattr(param, "required", False):
        flag["required"] = True
    if getattr(param, "hidden", False):
        flag["hidden"] = True
    return [flag]


def _arg_name(param: Any) -> str:
    return (param.name or "arg").replace("_", "-")


def _arg_placeholder(param: Any) -> str:
    mv = getattr(param, "metavar", None)
    name = mv if mv else f"<{_arg_name(param)}>"
    return f"{name}..." if param.nargs == -1 else name


def _arg_models(params: Sequence[Any]) -> list[dict[str, Any]]:
    """Order-safe fisk args: one arg, one cumulative arg, one arg + one cumulative arg, or else
    every positional folded into a single cumulative ``args`` (nats shuffles two or more plain args).
    """
    args = [p for p in params if not getattr(p, "hidden", False)]
    if not args:
        return []

    def one(p: Any, cumulative: bool) -> dict[str, Any]:
        d: dict[str, Any] = {"name": _arg_name(p), "help": _clean_help(getattr(p, "help", None))[0]}
        if getattr(p, "metavar", None):
            d["place_holder"] = _arg_placeholder(p)
        if p.required:
            d["required"] = True
        d["cumulative"] = cumulative
        return d

    variadic = [p.nargs == -1 for p in args]
    if len(args) == 1:
        return [one(args[0], variadic[0])]
    if len(args) == 2 and variadic == [False, True]:
        return [one(args[0], False), one(args[1], True)]
    helps = []
    for p in args:
        h = _clean_help(getattr(p, "help", None))[0]
        helps.append(f"{_arg_placeholder(p)}: {h}" if h else _arg_placeholder(p))
    folded: dict[str, Any] = {
        "name": "args",
        "help": "; ".join(helps),
        "place_holder": " ".join(_arg_placeholder(p) for p in args),
    }
    if any(p.required for p in args):
        folded["required"] = True
    folded["cumulative"] = True
    return [folded]


class _PathNames:
    """Long and short flag names already used on the current root-to-leaf path."""

    def __init__(self, longs: frozenset[str] = frozenset(), shorts: frozenset[int] = frozenset()):
        self.longs, self.shorts = longs, shorts

    def extend(self, flags: Iterable[dict[str, Any]], where: str) -> _PathNames:
        longs, shorts = set(self.longs), set(self.shorts)
        for f in flags:
            if f["name"] in longs:
                raise ValueError(f"flag --{f['name']} repeats on the path to {where!r}")
            longs.add(f["name"])
            if "short" in f:
                if f["short"] in shorts:
                    raise ValueError(f"short flag -{chr(f['short'])} repeats on the path to {where!r}")
                shorts.add(f["short"])
        return _PathNames(frozenset(longs), frozenset(shorts))


def _command_model(
    cmd: Any,
    path: CommandPath,
    aliases: Mapping[CommandPath, list[str]],
    used: _PathNames,
    seen_alias_keys: set[CommandPath],
    reserved: frozenset[str],
) -> dict[str, Any]:
    subs = {n: c for n, c in _subcommands(cmd).items() if not getattr(c, "hidden", False)}
    leaf = not _subcommands(cmd)
    where = " ".join(path)
    short, full = _clean_help(getattr(cmd, "help", None) or getattr(cmd, "short_help", None))
    model: dict[str, Any] = {"name": path[-1], "help": short}
    if full and full != short:
        model["help_long"] = full
    if path in aliases:
        seen_alias_keys.add(path)
        if aliases[path]:
            model["aliases"] = list(aliases[path])
    flags: list[dict[str, Any]] = []
    for p in cmd.params:
        if p.param_type_name == "option" and not _skip_option(p):
            flags.extend(_flag_models(p, leaf=leaf))
            for spelling in [*p.opts, *(getattr(p, "secondary_opts", None) or [])]:
                if spelling in reserved:
                    raise ValueError(
                        f"{spelling} is a root option: {where!r} can't reuse it "
                        "(root options are hoisted from anywhere in argv)"
                    )
    used = used.extend(flags, where)
    if flags:
        model["flags"] = flags
    if leaf:
        args = _arg_models([p for p in cmd.params if p.param_type_name == "argument"])
        if args:
            model["args"] = args
    else:
        if any(p.param_type_name == "argument" for p in cmd.params):
            raise ValueError(f"command group {where!r} takes positional arguments: nats drops them")
        model["commands"] = _commands_model(subs, path, aliases, used, seen_alias_keys, reserved)
    return model


def _commands_model(
    subs: Mapping[str, Any],
    path: CommandPath,
    aliases: Mapping[CommandPath, list[str]],
    used: _PathNames,
    seen_alias_keys: set[CommandPath],
    reserved: frozenset[str],
) -> list[dict[str, Any]]:
    out = [_command_model(c, (*path, n), aliases, used, seen_alias_keys, reserved) for n, c in subs.items()]
    taken: dict[str, str] = {}
    for m in out:
        for n in [m["name"], *m.get("aliases", [])]:
            if n in taken:
                raise ValueError(
                    f"command name or alias {n!r} under {' '.join(path) or 'the root'!r} "
                    f"is used by both {taken[n]!r} and {m['name']!r}"
                )
            taken[n] = m["name"]
    return out


def fisk_model(
    app: Any,
    *,
    name: str = "cg",
    help: str | None = None,
    version: str | None = None,
    aliases: Mapping[CommandPath, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """The fisk ``ApplicationModel`` of a Typer app (or click group), for ``--fisk-introspect``.

    ``aliases`` maps a command path below the root (``("elastic", "consume")``) to its aliases;
    hidden commands (alias duplicates) are left out. Raises ValueError when the app can't be a
    safe nats plugin (empty help, repeated flag names on a path, unknown alias paths...).
    """
    root = _typer_command(app)
    if not _subcommands(root):
        raise ValueError("a nats plugin needs subcommands: nats runs only its leaf commands")
    root_help = _clean_help(help if help is not None else getattr(root, "help", None))[0]
    if not root_help:
        raise ValueError("the plugin needs a non-empty help text: nats skips a plugin without one")
    alias_map = {tuple(k): list(v) for k, v in (aliases or {}).items()}
    model: dict[str, Any] = {"name": name, "help": root_help}
    if version:
        model["version"] = version
    flags: list[dict[str, Any]] = []
    for p in root.params:
        if p.param_type_name == "option" and not _skip_option(p):
            flags.extend(_flag_models(p, leaf=False))
    used = _PathNames().extend(flags, name)
    if flags:
        model["flags"] = flags
    seen: set[CommandPath] = set()
    subs = {n: c for n, c in _subcommands(root).items() if not getattr(c, "hidden", False)}
    names, bools = root_option_spellings(root)
    model["commands"] = _commands_model(subs, (), alias_map, used, seen, frozenset(names | bools))
    unknown = sorted(set(alias_map) - seen)
    if unknown:
        raise ValueError(f"aliases given for unknown commands: {', '.join(' '.join(k) for k in unknown)}")
    return model


def print_fisk_model(
    app: Any,
    *,
    name: str = "cg",
    help: str | None = None,
    version: str | None = None,
    aliases: Mapping[CommandPath, Sequence[str]] | None = None,
    file: TextIO | None = None,
) -> None:
    """Write the model as exactly one JSON document and a newline (stdout by default)."""
    text = json.dumps(
        fisk_model(app, name=name, help=help, version=version, aliases=aliases),
        separators=(",", ":"),
        ensure_ascii=False,
    )
    out = sys.stdout if file is None else file
    out.write(text + "\n")
    out.flush()


# ---------------------------------------------------------------- argv


def root_option_spellings(app: Any) -> tuple[set[str], set[str]]:
    """(value options, boolean flags) of the root command as typed (``--context``, ``-s``,
    ``--tlsfirst``, ``--no-tlsfirst``): what :func:`hoist_options` should move. Eager options
    (``--help``, ``--version``, completion) are left where they are.
    """
    root = _typer_command(app)
    names: set[str] = set()
    flags: set[str] = set()
    for p in root.params:
        if p.param_type_name != "option" or getattr(p, "is_eager", False) or _skip_option(p):
            continue
        spellings = list(p.opts) + list(getattr(p, "secondary_opts", []) or [])
        if getattr(p, "is_flag", False) or getattr(p, "count", False):
            flags.update(spellings)
        else:
            names.update(spellings)
    return names, flags


_TRUE = frozenset({"true", "t", "1", "yes", "y", "on"})
_FALSE = frozenset({"false", "f", "0", "no", "n", "off", ""})


def _spelling(name: str) -> str:
    if name.startswith("-"):
        return name
    return f"-{name}" if len(name) == 1 else f"--{name}"


def hoist_options(argv: Sequence[str], names: Iterable[str], flags: Iterable[str] = ()) -> list[str]:
    """Move the given root options from anywhere in argv to its front (order kept); stop at ``--``.

    ``names`` take a value (``--context x``, ``--context=x``, ``-s url``, ``-surl``); ``flags``
    are booleans (``--tlsfirst``). A boolean sent as ``--x=true`` (as nats proxies it) becomes
    ``--x``; ``--x=false`` becomes ``--no-x`` when that spelling is in ``flags``, else is dropped.
    Bare names (``context``, ``s``) are accepted too.
    """
    value_opts = {_spelling(n) for n in names}
    bool_opts = {_spelling(n) for n in flags}
    front: list[str] = []
    rest: list[str] = []
    i = 0
    args = list(argv)
    while i < len(args):
        tok = args[i]
        if tok == "--":
            rest.extend(args[i:])
            break
        if tok.startswith("--") and "=" in tok:
            opt, _, value = tok.partition("=")
            if opt in value_opts:
                front.append(tok)
            elif opt in bool_opts:
                v = value.strip().lower()
                if v in _TRUE:
                    front.append(opt)
                elif v in _FALSE:
                    negated = "--no-" + opt[2:]
                    if negated in bool_opts:
                        front.append(negated)
                else:
                    front.append(tok)  # let the parser report the odd value
            else:
                rest.append(tok)
        elif tok in value_opts:
            front.append(tok)
            if i + 1 < len(args):
                front.append(args[i + 1])
                i += 1
        elif tok in bool_opts:
            front.append(tok)
        elif len(tok) > 2 and tok[0] == "-" and tok[1] != "-" and tok[:2] in value_opts:
            front.append(tok)  # -surl
        else:
            rest.append(tok)
        i += 1
    return front + rest


def hoist_to_command(
    argv: Sequence[str], commands: Iterable[str], names: Iterable[str], skip: Iterable[str] = ()
) -> list[str]:
    """Move the value options ``names`` found after the first of ``commands`` in argv (stopping at
    ``--``) to just after it, order kept: a command group's options, which the reference's parser
    takes anywhere after the group (``cg static consume foo cg m1 --sleep 1s`` is
    ``cg static --sleep 1s consume foo cg m1``). ``skip``: value options before the command (the
    root's, already hoisted to the front), whose values are not commands."""
    spellings, skipped, wanted = set(names), set(skip), set(commands)
    args = list(argv)
    i = 0
    while i < len(args) and args[i] not in wanted:
        if args[i] == "--":
            return args
        i += 2 if args[i] in skipped else 1
    if i >= len(args):
        return args
    moved: list[str] = []
    rest: list[str] = []
    j = i + 1
    while j < len(args):
        tok = args[j]
        if tok == "--":
            rest.extend(args[j:])
            break
        if tok in spellings:
            moved.extend(args[j : j + 2])
            j += 2
            continue
        if tok.startswith("--") and tok.partition("=")[0] in spellings:
            moved.append(tok)
        else:
            rest.append(tok)
        j += 1
    return [*args[: i + 1], *moved, *rest]
