"""``cg``: the Partitioned Consumer Group CLI tool (Typer), also usable as a nats CLI plugin.

``main()`` order of business:

1. ``cg --fisk-introspect`` (exactly that argv, as ``nats plugins register`` runs it) prints the
   fisk model and nothing else, before any config, logging or network.
2. Root connection options (``--context``, ``--server``, ...) are hoisted from anywhere in argv to
   the front (``nats cg ...`` appends them after the command path), then Typer parses.
3. Every failure, usage errors included, is ``cg: error: <message>`` on stderr with status 1.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Annotated, Optional

import typer

from pcgroups.connect import ConnectionOptions

from .common import APP_HELP, VERSION, CLIError, setup_logging
from .elastic import ALIASES as ELASTIC_ALIASES
from .elastic import elastic_app
from .static import ALIASES as STATIC_ALIASES
from .static import static_app
from .status import ALIASES as STATUS_ALIASES
from .status import register as register_status
from .demo import register as register_demo
from .prompt import register as register_prompt
from .tools import tools_app

app = typer.Typer(
    name="cg",
    help=APP_HELP,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(static_app, name="static")
app.add_typer(elastic_app, name="elastic")
app.add_typer(tools_app, name="tools", hidden=True)  # behind scripts/*.sh; not in the fisk model

register_status(static_app, elastic_app)   # `status` (alias `describe`) for both flavours
register_demo(app)                          # `cg demo`
register_prompt(static_app, elastic_app)   # `prompt`: the interactive shell of each flavour

# Other commands plug in here, each from its own module.
# Put every option on the leaf command (nats drops non-global options of groups), don't reuse a
# root option name, and add any aliases to ALIASES below.

#: Command aliases for the fisk model (the hidden duplicate commands are what cg itself parses).
ALIASES: dict[tuple[str, ...], list[str]] = {**STATIC_ALIASES, **ELASTIC_ALIASES, **STATUS_ALIASES}


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(VERSION + "\n")
        raise typer.Exit(0)


def _fisk_introspect(value: bool) -> None:
    if value:
        print_model()
        raise typer.Exit(0)


def _timeout(value: Optional[str]) -> Optional[float]:
    if value is None:
        return None
    from pcgroups.connect import parse_duration
    from pcgroups.errors import PCGroupsError

    try:
        seconds = parse_duration(value)
    except PCGroupsError as e:
        raise CLIError(f"invalid --timeout: {e}") from None
    if seconds <= 0:
        raise CLIError(f"invalid --timeout {value!r}: must be positive")
    return seconds


def _opt(*decls: str, help: str, metavar: str | None = None):
    return typer.Option(*decls, help=help, metavar=metavar, show_default=False)


@app.callback()
def root(
    ctx: typer.Context,
    context: Annotated[Optional[str], _opt("--context", help="nats CLI context to use (name or .json file)")] = None,
    server: Annotated[Optional[str], _opt("--server", "-s", help="NATS server URL(s), comma separated",
                                          metavar="URL")] = None,
    user: Annotated[Optional[str], _opt("--user", help="username or token")] = None,
    password: Annotated[Optional[str], _opt("--password", help="password")] = None,
    token: Annotated[Optional[str], _opt("--token", help="authentication token")] = None,
    creds: Annotated[Optional[str], _opt("--creds", help="user credentials file", metavar="FILE")] = None,
    nkey: Annotated[Optional[str], _opt("--nkey", help="user NKEY seed file", metavar="FILE")] = None,
    tlscert: Annotated[Optional[str], _opt("--tlscert", help="TLS client certificate file", metavar="FILE")] = None,
    tlskey: Annotated[Optional[str], _opt("--tlskey", help="TLS client key file", metavar="FILE")] = None,
    tlsca: Annotated[Optional[str], _opt("--tlsca", help="TLS CA certificate file", metavar="FILE")] = None,
    tlsfirst: Annotated[Optional[bool], _opt("--tlsfirst/--no-tlsfirst",
                                             help="TLS handshake before the server's INFO")] = None,
    timeout: Annotated[Optional[str], _opt("--timeout", help="connect and request timeout (Go duration, "
                                                             "default 5s)", metavar="DURATION")] = None,
    js_domain: Annotated[Optional[str], _opt("--js-domain", "--domain", help="JetStream domain")] = None,
    inbox_prefix: Annotated[Optional[str], _opt("--inbox-prefix", help="custom inbox prefix")] = None,
    no_context: Annotated[bool, _opt("--no-context", help="ignore NATS contexts")] = False,
    connection_name: Annotated[Optional[str], _opt("--connection-name", help="connection name")] = None,
    version: Annotated[bool, typer.Option("--version", help="show the version and exit", is_eager=True,
                                          callback=_version)] = False,
    fisk_introspect: Annotated[bool, typer.Option("--fisk-introspect", hidden=True, is_eager=True,
                                                  callback=_fisk_introspect)] = False,
) -> None:
    """Partitioned Consumer Group CLI tool"""
    ctx.obj = ConnectionOptions(
        server=server, user=user, password=password, token=token, creds=creds, nkey=nkey,
        tlscert=tlscert, tlskey=tlskey, tlsca=tlsca, tlsfirst=tlsfirst, timeout=_timeout(timeout),
        js_domain=js_domain, inbox_prefix=inbox_prefix, context=context, no_context=no_context or None,
        connection_name=connection_name)


# ---------------------------------------------------------------- entry point


def print_model() -> None:
    from .plugin import print_fisk_model

    print_fisk_model(app, name="cg", help=APP_HELP, version=VERSION, aliases=ALIASES)


def _usage_message(e) -> str:
    import re

    name = getattr(e, "option_name", None)
    if isinstance(name, str) and re.fullmatch(r"-[0-9][0-9_.]*", name):  # a negative number read as an option
        text = f"invalid argument {name}: negative numbers are not allowed (the max number of members must be >= 1)"
    else:
        text = e.format_message().strip()
    if text.endswith("."):
        text = text[:-1]
    text = text[:1].lower() + text[1:]
    ctx = getattr(e, "ctx", None)
    if ctx is not None:  # on the same line: an error is one line
        text += f"; try '{ctx.command_path} -h' for help"
    return text


def _error(message: str) -> int:
    message = message.strip() or "unknown error"
    try:
        sys.stdout.flush()
    except Exception:  # noqa: BLE001 - a closed stdout must not hide the error
        pass
    try:
        sys.stderr.write(f"cg: error: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
    return 1


def _describe(e: BaseException) -> str:
    """One line for an exception that is not ours (nats-py errors, OS errors, ...)."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    text = str(e).strip()
    if text.startswith("nats: "):
        return text
    name = type(e).__name__
    return f"{name}: {text}" if text else name


def main(argv: Sequence[str] | None = None) -> int:
    """The ``cg`` console script. Returns the exit status (0 or 1)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--fisk-introspect"]:
        print_model()
        return 0

    from typer import Abort
    from typer._click.exceptions import ClickException

    from pcgroups.errors import PCGroupsError

    from .plugin import hoist_options, root_option_spellings

    setup_logging()
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=hoist_options(args, *root_option_spellings(command)), prog_name="cg",
                          standalone_mode=False)
    except ClickException as e:
        return _error(_usage_message(e))
    except Abort:
        return _error("operation canceled")
    except (PCGroupsError, CLIError) as e:
        return _error(str(e) or type(e).__name__)
    except KeyboardInterrupt:
        return _error("interrupted")
    except Exception as e:  # noqa: BLE001 - nats-py, OS and unexpected errors: one line, no traceback
        import os

        if os.environ.get("CG_DEBUG", "") not in ("", "0", "false"):
            import traceback

            traceback.print_exc()
        return _error(_describe(e))
    if isinstance(rv, int) and not isinstance(rv, bool):
        if rv == 130:  # Typer's KeyboardInterrupt
            return _error("interrupted")
        return 0 if rv == 0 else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
