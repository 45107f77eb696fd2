"""``cg``: the Partitioned Consumer Group CLI tool (Typer), also usable as a nats CLI plugin.

``main()`` order of business:

1. ``--version`` (anywhere before ``--``, as the reference takes it) prints the version before
   anything is imported. Without the ``cli`` extra (Typer, rich, prompt-toolkit: ``pip install
   'pcgroups[cli]'``) everything else is one error line saying what to install. ``cg
   --fisk-introspect`` (exactly that argv, as ``nats plugins register`` runs it) prints the fisk
   model and nothing else, before any config, logging or network.
2. Flags go where the reference's parser takes them: root connection options (``--context``,
   ``--server``, ...) are hoisted from anywhere in argv to the front (``nats cg ...`` appends them
   after the command path), ``cg static``/``cg elastic``'s ``--sleep`` from anywhere after the
   flavour to just after it; then Typer parses the tree of cg/app.py.
3. Every failure, usage errors included, is ``cg: error: <message>`` on stderr with status 1
   (cg/errors.py); a root or flavour option at the end of the line, or followed by a command name where
   the line then fails to parse, was given without its value and is said so. Ctrl-C is not a failure,
   whenever it comes (while Python imports what the command needs too): status 130, as shells expect,
   and no line of ours (the terminal shows ``^C``; a command with something to say on the way out,
   ``cg demo``, or ``consume`` waiting for its handler, says it).
4. Run as a nats CLI plugin (the console script's parent process is ``nats``), cg ends when that
   ``nats`` is gone, as on SIGTERM (``consume`` lets its handler in flight finish and exits 0): a
   supervisor's SIGTERM reaches only the ``nats`` it started, and a ``consume`` left behind would
   reconnect to a server that may be gone for good. Only then: a cg started from a shell and left
   running in the background (``nohup cg ... &``) outlives the shell, as any program does. The
   parent's end is seen by a poll of ``getppid()`` (every half second, in a daemon thread): it
   changes only when the parent process is gone, and it works wherever Python does. Linux's
   ``PR_SET_PDEATHSIG`` would be quicker, but it fires when the parent *thread* that started cg ends,
   and nats is a Go program whose threads are the Go runtime's to start and end.

This module imports nothing at start-up beyond ``os`` and ``sys`` (both loaded by the interpreter
already): each path imports what it uses.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

TYPE_CHECKING = False  # as typing.TYPE_CHECKING, without importing typing: a Ctrl-C before main() runs is Python's
if TYPE_CHECKING:
    from typing import Any

#: The exit status after Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED = 130

#: The packages of the ``cli`` extra that cg imports (pyproject.toml); pcgroups alone needs none of them.
CLI_PACKAGES = ("typer", "rich", "prompt_toolkit")


def main(argv: Sequence[str] | None = None) -> int:
    """The ``cg`` console script. Returns the exit status (0, 1, or 130 after Ctrl-C, whenever it comes: while
    Python imports what a command needs too)."""
    try:
        return _main(argv)
    except KeyboardInterrupt:
        return INTERRUPTED


def _main(argv: Sequence[str] | None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--version" in args[: args.index("--") if "--" in args else len(args)]:  # anywhere, as the reference
        from . import VERSION

        sys.stdout.write(VERSION + "\n")
        return 0
    missing = missing_packages(CLI_PACKAGES)
    if missing:
        from .errors import fail

        return fail(
            f"the cg command needs the cli extra, which is not installed (no {', '.join(missing)}): "
            "pip install 'pcgroups[cli]'"
        )
    if args == ["--fisk-introspect"]:
        from .app import print_model

        print_model()
        return 0
    if argv is None:  # the console script (a call from Python runs in its caller's process)
        end_with_nats_parent()
    return run(args)


#: The name of the nats CLI's process: a plugin is its child, and nothing else tells a plugin so.
NATS_CLI = "nats"
PARENT_POLL = 0.5  # seconds between two looks at the parent process


def end_with_nats_parent() -> None:
    """Run as a nats CLI plugin: SIGTERM ourselves once the ``nats`` process that started us is gone
    (item 4 of the module docs)."""
    parent = os.getppid()
    if process_name(parent) != NATS_CLI:
        return
    import signal
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="cg-parent-watch", daemon=True).start()


def process_name(pid: int) -> str:
    """The executable name of process ``pid`` ("" when it cannot be told)."""
    try:
        with open(f"/proc/{pid}/comm") as f:  # Linux
            return f.read().strip()
    except OSError:
        pass
    import subprocess

    try:
        out = subprocess.run(["ps", "-o", "comm=", "-p", str(pid)], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return os.path.basename(out.stdout.strip())


def missing_packages(names: Sequence[str]) -> list[str]:
    """The packages of ``names`` that cannot be imported here (found without importing them)."""
    from importlib.util import find_spec

    return [name for name in names if name not in sys.modules and find_spec(name) is None]


def run(args: list[str]) -> int:
    """Parse ``args`` with the command tree and run the command; every error is one line."""
    import shlex

    from typer import Abort
    from typer._click.exceptions import ClickException, NoSuchOption

    from .app import build, where_option_goes
    from .common import setup_logging
    from .errors import fail, report, usage_message
    from .flavour import FLAVOUR_OPTIONS, FLAVOURS
    from .plugin import hoist_options, hoist_to_command, root_option_spellings

    setup_logging()
    command = build()
    values, flags = root_option_spellings(command)
    trailing = option_without_value(args, {*values, *FLAVOUR_OPTIONS})
    if trailing:
        return fail(f"option '{trailing}' needs a value")
    args = hoist_to_command(hoist_options(args, values, flags), [f.name for f in FLAVOURS], FLAVOUR_OPTIONS, values)
    try:
        rv = command.main(args=args, prog_name="cg", standalone_mode=False)
    except NoSuchOption as e:
        moved = where_option_goes(command, args, e.option_name)
        if moved is None:
            return fail(usage_message(e, suggest_options(command, args, e.option_name)))
        where, fixed = moved
        return fail(f"{e.option_name} goes after {where}: {shlex.join(['cg', *fixed])}")
    except ClickException as e:
        took = option_took_a_command(command, args, values)
        return fail(f"option '{took}' needs a value" if took else usage_message(e))
    except Abort:
        return fail("operation canceled")
    except KeyboardInterrupt:
        return INTERRUPTED
    except Exception as e:
        return report(e)
    if isinstance(rv, int) and not isinstance(rv, bool):
        if rv == INTERRUPTED:  # Typer's KeyboardInterrupt, or a command that said it was interrupted
            return INTERRUPTED
        return 0 if rv == 0 else 1
    return 0


def option_without_value(args: list[str], options: set[str]) -> str | None:
    """The root or flavour option (``options``, spelled as typed) that ends the command line, before any
    ``--``: it has no value (the hoisting would otherwise take the next word for it)."""
    end = args.index("--") if "--" in args else len(args)
    return args[end - 1] if end and args[end - 1] in options else None


def option_took_a_command(root: Any, args: list[str], values: set[str]) -> str | None:
    """After a parsing error: a root or flavour option whose value was taken from a command name (``cg static
    --sleep consume foo cg m1``, ``cg -s static ls foo``) while the word after it names none: the option was
    given without its value."""
    from typer._click import Context

    from .flavour import FLAVOUR_OPTIONS

    ctx = Context(root)
    top = set(root.list_commands(ctx))
    for i, token in enumerate(args[:-1]):
        if token == "--":
            break
        if token in FLAVOUR_OPTIONS and i > 0 and args[i - 1] in top:
            group = root.get_command(ctx, args[i - 1])
            names = set(group.list_commands(Context(group, parent=ctx)))
        elif token in values:
            names = top
        else:
            continue
        if args[i + 1] in names and (i + 2 == len(args) or args[i + 2] not in names):
            return token
    return None


def suggest_options(root: Any, args: list[str], option: str) -> list[str]:
    """What a mistyped option was likely meant to be: a close spelling among the options of the command it was
    given to and the root's (which go anywhere)."""
    from typer._click import Context

    from .errors import close_options

    ctx = Context(root)
    command, spellings = root, set()
    for token in args:
        sub = command.get_command(ctx, token) if hasattr(command, "get_command") else None
        if sub is not None:
            command = sub
            ctx = Context(command, parent=ctx)
            spellings |= {o for p in command.params for o in p.opts if o.startswith("--")}
    spellings |= {o for p in root.params for o in p.opts if o.startswith("--") and not getattr(p, "hidden", False)}
    return close_options(option, spellings)


if __name__ == "__main__":
    sys.exit(main())
