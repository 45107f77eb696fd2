"""How ``cg`` fails: one line ``cg: error: <message>`` on stderr, exit status 1, never a traceback.

- :class:`CLIError`: a mistake the CLI itself finds (an argument, an answer); :class:`Canceled`: the
  user said no. Both are reported by their message alone, as the library's ``PCGroupsError`` is.
- :func:`message_of`: the one line for any exception (ours, the library's, nats-py's, the OS's).
- :func:`usage_message`: the one line for a command-line parsing error (Typer's, i.e. click's).
- :func:`fail` writes the line; :func:`report` writes the line of an exception (with its traceback
  first when ``CG_DEBUG`` is set and the error is not one of the expected kinds); :func:`warn` writes
  ``cg: warning: <message>`` for a likely mistake the command goes on with.

``cg`` (cg/main.py) and the interactive shell (cg/prompt.py) report through these, so a command fails
the same way in both. Imports nothing but the standard library.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any


class CLIError(Exception):
    """An error the CLI reports as ``cg: error: <message>`` (exit status 1)."""


class Canceled(CLIError):
    """The user answered anything but ``y`` to a confirmation (``why``: what else to say)."""

    def __init__(self, why: str = "") -> None:
        super().__init__(f"operation canceled: {why}" if why else "operation canceled")


def debugging() -> bool:
    """``CG_DEBUG`` set to anything but empty, ``0`` or ``false``."""
    return os.environ.get("CG_DEBUG", "") not in ("", "0", "false")


def expected(e: BaseException) -> bool:
    """Ours or the library's: the message says it all, a traceback would add nothing."""
    if isinstance(e, CLIError):
        return True
    errors = sys.modules.get("pcgroups.errors")  # not loaded: nothing raised can be one of its errors
    return errors is not None and isinstance(e, errors.PCGroupsError)


def describe(e: BaseException) -> str:
    """One line for an exception that is not ours (nats-py errors, OS errors, ...)."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    text = str(e).strip()
    if text.startswith("nats: "):
        return text
    name = type(e).__name__
    return f"{name}: {text}" if text else name


def message_of(e: BaseException) -> str:
    """The message of the one error line for ``e``."""
    if expected(e):
        return str(e) or type(e).__name__
    return describe(e)


def usage_message(e: Any, suggestions: list[str] | None = None) -> str:
    """One line for a parsing error (a click ``UsageError``/``BadParameter``), with where to get help;
    ``suggestions``: what a mistyped option was likely meant to be (instead of click's)."""
    name = getattr(e, "option_name", None)
    if isinstance(name, str) and re.fullmatch(r"-[0-9][0-9_.]*", name):  # a negative number read as an option
        text = (
            f"invalid argument {name}: negative numbers are not allowed (the max number of members must be at least 1)"
        )
    elif suggestions is not None or getattr(e, "possibilities", None):
        if suggestions is None:
            suggestions = close_options(name or "", e.possibilities)
        text = e.message + (f" (did you mean {' or '.join(suggestions)}?)" if suggestions else "")
    else:
        text = e.format_message().strip()
        text = re.sub(r"^Option ('[^']+') requires (an argument|\d+ arguments)\.$", r"option \1 needs a value", text)
        value = re.fullmatch(r"Invalid value for '([^']+)'(?: / '[^']+')*: (.*)", text, re.S)
        if value:  # "invalid MAX-MEMBERS: '2.5' is not a whole number"
            text = f"invalid {value[1]}: {value[2]}"
    if text.endswith("."):
        text = text[:-1]
    suggested = re.fullmatch(r"(.*)\. Did you mean (.*)\?", text, re.S)
    if suggested:  # Typer's "No such command 'statik'. Did you mean 'static'?", as one clause
        names = suggested[2].replace("'", "").split(", ")
        text = f"{suggested[1]} (did you mean {' or '.join(names)}?)"
    text = text[:1].lower() + text[1:]
    ctx = getattr(e, "ctx", None)
    if ctx is not None:  # on the same line: an error is one line
        text += f"; try '{ctx.command_path} -h' for help"
    return text


def close_options(typed: str, spellings: Any) -> list[str]:
    """The option spellings (``--server``) ``typed`` is likely a typo of, compared without their dashes (with
    them, ``--bogus`` is as close to ``--user`` as a typo)."""
    from difflib import get_close_matches

    bare = {s.lstrip("-"): s for s in spellings}
    return [bare[m] for m in get_close_matches(typed.lstrip("-"), list(bare), n=3, cutoff=0.75)]


def fail(message: str) -> int:
    """Write ``cg: error: <message>`` (after whatever stdout holds); returns the exit status, 1."""
    message = message.strip() or "unknown error"
    try:
        sys.stdout.flush()
    except Exception:
        pass
    try:
        sys.stderr.write(f"cg: error: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass
    return 1


def warn(message: str) -> None:
    """Write ``cg: warning: <message>`` on stderr: a likely mistake that is not an error (the command
    goes on, stdout keeps its lines)."""
    try:
        sys.stdout.flush()
        sys.stderr.write(f"cg: warning: {message.strip()}\n")
        sys.stderr.flush()
    except Exception:
        pass


def report(e: BaseException) -> int:
    """:func:`fail` with the message of ``e``; an unexpected error's traceback first when debugging."""
    if debugging() and not expected(e):
        import traceback

        traceback.print_exception(e)
    return fail(message_of(e))


__all__ = ["CLIError", "Canceled", "debugging", "describe", "fail", "message_of", "report", "usage_message", "warn"]
