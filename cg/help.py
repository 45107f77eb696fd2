"""``cg``'s help pages: plain text, arguments written as the user types them (``STREAM GROUP MEMBER``).

Typer's own pages show required arguments as ``{stream}`` and every value's Python type (``<str>``,
``<bool>``), and draw them with rich. :class:`Command` and :class:`Group` (the ``cls`` of every ``cg``
command and command group) write instead::

    Usage: cg static consume [OPTIONS] STREAM GROUP MEMBER

      join a static partitioned consumer group

    Arguments:
      STREAM  stream name
      ...
    Options:
      --sleep DURATION  sleep to simulate processing time (default: 20ms)

An argument is shown by its metavar (cg/flavour.py declares ``STREAM``, ``GROUP``, ...), else its name
in capitals; ``[X]`` when optional, ``X...`` when repeatable. An option's value is its metavar, else
``N`` (integer), ``NUMBER`` (float) or ``TEXT``. Nothing here imports rich.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, get_args, get_origin

import typer.core


def argument_name(param: Any) -> str:
    """How an argument is written in usage lines and errors: its metavar, else its name in capitals."""
    return param.metavar or (param.name or "arg").upper().replace("_", "-")


def _argument_piece(param: Any) -> str:
    name = argument_name(param)
    if param.nargs == -1:
        name += "..."
    return name if param.required else f"[{name}]"


def _value_name(param: Any) -> str:
    if param.metavar:
        return str(param.metavar)
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", str)
    if get_origin(annotation) is list:
        annotation = (get_args(annotation) or (str,))[0]
    return {int: "N", float: "NUMBER"}.get(annotation, "TEXT")


def _default_text(param: Any) -> str:
    default = param.default
    if param.show_default is False or default is None or default is False or callable(default):
        return ""
    if isinstance(default, (list, tuple)):
        return " ".join(map(str, default))
    return str(default)


def option_record(param: Any) -> tuple[str, str]:
    """(``-f, --force / --no-force`` or ``--sleep DURATION``, help with its default) of an option."""
    shorts = [o for o in param.opts if not o.startswith("--")]
    longs = [o for o in param.opts if o.startswith("--")]
    names = ", ".join([*shorts, *longs])
    if param.secondary_opts:
        names += " / " + ", ".join(param.secondary_opts)
    if not (param.is_flag or param.count):
        names += f" {_value_name(param)}"
    help = (param.help or "").strip()
    default = _default_text(param) if not param.is_flag else ""
    if default:
        help += f" (default: {default})"
    return names, help


def _write_params(command: Any, ctx: Any, formatter: Any) -> None:
    arguments, options = [], []
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        if param.param_type_name == "argument":
            arguments.append(
                (
                    argument_name(param) + ("..." if param.nargs == -1 else ""),
                    (getattr(param, "help", None) or "").strip(),
                )
            )
        elif param.param_type_name == "option":
            options.append(option_record(param))
    for title, rows in (("Arguments", arguments), ("Options", options)):
        if rows:
            with formatter.section(title):
                formatter.write_dl(rows)


def _write_page(command: Any, ctx: Any, formatter: Any) -> None:
    command.format_usage(ctx, formatter)
    command.format_help_text(ctx, formatter)
    _write_params(command, ctx, formatter)


class Command(typer.core.TyperCommand):
    """A ``cg`` command with the plain help page of this module."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        return pieces + [
            _argument_piece(p)
            for p in self.get_params(ctx)
            if p.param_type_name == "argument" and not getattr(p, "hidden", False)
        ]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _write_page(self, ctx, formatter)


def close_names(typed: str, names: Iterable[str]) -> list[str]:
    """The names a typo was likely meant to be (``statik`` -> ``static``)."""
    from difflib import get_close_matches

    return get_close_matches(typed, list(names))


#: A group with at most this many commands names them when the word after it is none of them.
FEW_COMMANDS = 3


class Group(typer.core.TyperGroup):
    """A ``cg`` command group with the plain help page of this module (its commands listed last), and a
    "did you mean" for a mistyped command (Typer's looks only at the commands built so far: none at the root,
    whose commands are built when first looked up)."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        from typer._click.exceptions import UsageError

        try:
            return super().resolve_command(ctx, args)
        except UsageError as e:
            if args and "Did you mean" not in e.message:
                matches = close_names(args[0], self.list_commands(ctx))
                shown = [n for n in self.list_commands(ctx) if not getattr(self.get_command(ctx, n), "hidden", False)]
                if matches:
                    e.message = f"{e.message.rstrip('.')}. Did you mean {', '.join(map(repr, matches))}?"
                elif 1 < len(shown) <= FEW_COMMANDS:  # cg static create foo ...: balanced or mapped forgotten
                    import shlex

                    path = ctx.command_path
                    e.message = (
                        f"{path} takes {', '.join(shown[:-1])} or {shown[-1]} first: "
                        f"{path} {'|'.join(shown)} {shlex.join(args)}"
                    )
                    e.ctx = None  # the line is the usage: no "try -h" after it
            raise

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _write_page(self, ctx, formatter)
        rows = []
        for name in self.list_commands(ctx):
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit=200)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


__all__ = ["Command", "Group", "argument_name", "close_names", "option_record"]
