"""``cg``: the Partitioned Consumer Group CLI tool (Typer), also usable as a nats CLI plugin.

``main()`` order of business:

1. ``cg --fisk-introspect`` (exactly that argv, as ``nats plugins register`` runs it) prints the
   fisk model and nothing else, before any config, logging or network; ``--version`` (anywhere
   before ``--``, as the reference takes it) prints the version before anything is imported.
2. Flags go where the reference's parser takes them: root connection options (``--context``,
   ``--server``, ...) are hoisted from anywhere in argv to the front (``nats cg ...`` appends them
   after the command path), ``cg static``/``cg elastic``'s ``--sleep`` from anywhere after the
   flavour to just after it; then Typer parses the tree of cg/app.py.
3. Every failure, usage errors included, is ``cg: error: <message>`` on stderr with status 1
   (cg/errors.py). Ctrl-C is not a failure: status 130, as shells expect, and no line of ours (the
   terminal shows ``^C``; a command with something to say on the way out, ``cg demo``, says it).

This module imports nothing at start-up beyond ``sys``: each path imports what it uses.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

#: The exit status after Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED = 130


def main(argv: Sequence[str] | None = None) -> int:
    """The ``cg`` console script. Returns the exit status (0, 1, or 130 after Ctrl-C)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--fisk-introspect"]:
        from .app import print_model

        print_model()
        return 0
    if "--version" in args[:args.index("--") if "--" in args else len(args)]:  # anywhere, as the reference
        from . import VERSION

        sys.stdout.write(VERSION + "\n")
        return 0
    return run(args)


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
    args = hoist_to_command(hoist_options(args, values, flags), [f.name for f in FLAVOURS], FLAVOUR_OPTIONS, values)
    try:
        rv = command.main(args=args, prog_name="cg", standalone_mode=False)
    except NoSuchOption as e:
        moved = where_option_goes(command, args, e.option_name)
        if moved is None:
            return fail(usage_message(e))
        where, fixed = moved
        return fail(f"{e.option_name} goes after {where}: {shlex.join(['cg', *fixed])}")
    except ClickException as e:
        return fail(usage_message(e))
    except Abort:
        return fail("operation canceled")
    except KeyboardInterrupt:
        return INTERRUPTED
    except Exception as e:  # noqa: BLE001 - ours, the library's, nats-py's, the OS's: one line, no traceback
        return report(e)
    if isinstance(rv, int) and not isinstance(rv, bool):
        if rv == INTERRUPTED:  # Typer's KeyboardInterrupt, or a command that said it was interrupted
            return INTERRUPTED
        return 0 if rv == 0 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
