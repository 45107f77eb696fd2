"""Cheap argument coercion for the ``cg`` command tree, so a command does not pay for pydantic.

Typer (>= 0.29) converts every parameter value through a pydantic ``TypeAdapter``, built on the
parameter's first use. Building the first one imports pydantic and its core schema machinery:
about 120 ms of a ``cg static ls`` whose whole floor (Python, nats-py, a connection, a request) is
about 110 ms. ``cg`` declares only ``str``, ``int``, ``bool`` and ``list[str]`` parameters (and the
demo's ``float``), whose command-line values need no schema: :func:`install` gives each such
parameter of a built tree a :class:`PlainCoercion` before Typer builds its adapter.

:class:`PlainCoercion` returns exactly what Typer's adapter returns for the values it takes (a
``str``; an ``int`` from ``[+-]?[0-9]+`` or an ``int``; a ``float`` from a decimal number; a
``bool``; a ``list`` of ``str`` from a tuple or list of them) and hands any other value to Typer's
own coercion; a number neither can read is an error in the user's words (``'2.5' is not a whole
number``, where Typer says "Input should be a valid integer, unable to parse string as an integer").
tests/test_cli_structure.py compares both on a table of values.

This uses Typer's lazily set ``_TyperParameter._runtime_param`` and its ``RuntimeParam`` base class.
When a Typer release no longer has them, :func:`install` does nothing and Typer coerces as usual:
slower, and with Typer's error messages (:func:`installed` tells which; a test checks it still works).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, get_args, get_origin

try:
    from typer._click.exceptions import BadParameter
    from typer._coercion import RuntimeParam, build_runtime_param
except ImportError:  # pragma: no cover - a Typer without the hook: nothing to install
    RuntimeParam = None  # type: ignore[assignment,misc]

_INT = re.compile(r"[+-]?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_NOT_A = {int: "a whole number", float: "a number"}
_PLAIN = object()  # "not one of the plain values: ask Typer"


def _plain(annotation: Any, value: Any) -> Any:
    """The coerced value when it needs no schema, else :data:`_PLAIN`."""
    if annotation is str:
        return value if isinstance(value, str) else _PLAIN
    if annotation is bool:
        return value if isinstance(value, bool) else _PLAIN
    if annotation is int:
        if type(value) is int:
            return value
        return int(value) if isinstance(value, str) and _INT.fullmatch(value) else _PLAIN
    if annotation is float:
        if type(value) is float:
            return value
        return float(value) if isinstance(value, str) and _FLOAT.fullmatch(value) else _PLAIN
    if get_origin(annotation) is list and get_args(annotation) == (str,):
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        return list(value) if ok else _PLAIN
    return _PLAIN


def _coercible(descriptor: Any) -> bool:
    """A plain annotation without a parser, range, choice, path or file behind it."""
    annotation = descriptor.annotation
    if not (
        annotation in (str, bool, int, float) or (get_origin(annotation) is list and get_args(annotation) == (str,))
    ):
        return False
    info = descriptor.parameter_info
    special = [getattr(info, "parser", None), getattr(info, "click_type", None), descriptor.file_annotation]
    flags = [getattr(descriptor, name, True) for name in ("is_path", "is_choice", "is_ranged")]
    return not any(x is not None for x in special) and not any(flags)


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class PlainCoercion(RuntimeParam):
        """Typer's runtime coercion of one parameter, without pydantic for plain values."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            result = _plain(self.annotation, value)
            if result is not _PLAIN:
                return result
            typers = build_runtime_param(param.type_descriptor)
            if self.annotation not in _NOT_A or not isinstance(value, str):
                return typers._coerce_value(value, param=param, ctx=ctx)
            try:
                return typers._coerce_value(value, param=param, ctx=ctx)
            except BadParameter:
                raise BadParameter(f"{value!r} is not {_NOT_A[self.annotation]}", ctx=ctx, param=param) from None


def _params(command: Any, help_option_names: list[str]) -> Iterator[Any]:
    """The command's parameters and its ``--help`` option, then those of the commands below it.

    click makes a command's help option on first use and keeps it: made here, it gets the cheap
    coercion too (Typer would build an adapter just to see that ``--help`` was not given).
    """
    yield from command.params
    help_option = command.get_help_option(command.context_class(command, help_option_names=help_option_names))
    if help_option is not None:
        yield help_option
    for sub in (getattr(command, "commands", None) or {}).values():
        yield from _params(sub, help_option_names)


def install(command: Any, help_option_names: list[str]) -> None:
    """Give every plain parameter of ``command`` (and of the commands below it) cheap coercion;
    ``help_option_names`` are the root context's (its ``context_settings``)."""
    if RuntimeParam is None:
        return
    for param in _params(command, help_option_names):
        descriptor = getattr(param, "type_descriptor", None)
        if descriptor is None or getattr(param, "_runtime_param", 0) is not None:
            continue  # not a Typer parameter, or Typer already built its coercion
        if _coercible(descriptor):
            param._runtime_param = PlainCoercion(
                parameter_info=descriptor.parameter_info, annotation=descriptor.annotation
            )


def installed(command: Any) -> bool:
    """Whether :func:`install` gave ``command``'s parameters the cheap coercion."""
    return any(type(getattr(p, "_runtime_param", None)).__name__ == "PlainCoercion" for p in command.params)


__all__ = ["install", "installed"]
