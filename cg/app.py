"""The ``cg`` command tree: the root (connection options, ``--version``), and the top-level commands
``demo``, ``static``, ``elastic``, ``metrics`` and ``tools``, each built from its module on first use.

- The root callback stores the command's :class:`cg.runtime.Runtime` (the connection options as
  given) in ``ctx.obj``; ``--timeout`` is checked there, before the command's own arguments.
- :class:`RootGroup` builds a top-level command only when it is looked up: ``cg static ls`` builds
  the root and ``static`` (not the demo, which imports rich, nor ``elastic``); ``cg --help`` and
  the fisk model look every one up.
- :func:`build` gives the tree's plain parameters cheap coercion (cg/coercion.py).
- :data:`ALIASES`: the commands' aliases for the fisk model (the hidden duplicate commands are what
  cg itself parses), from the flavour descriptions (cg/flavour.py).

Other commands plug in through :data:`TOP_LEVEL`, each from its own module. Put every option on the
leaf command (nats drops non-global options of groups), don't reuse a root option name, and give
aliases in the command's flavour.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer
import typer.core
import typer.main

from . import coercion
from .common import APP_HELP, VERSION
from .flavour import FLAVOURS
from .help import Group as CommandGroup
from .runtime import Runtime

#: Command aliases for the fisk model, by command path.
ALIASES: dict[tuple[str, ...], list[str]] = {
    (f.name, command): list(aliases) for f in FLAVOURS for command, aliases in f.aliases.items()
}


def _demo() -> typer.Typer:
    from .demo.command import register

    app = typer.Typer(add_completion=False)
    register(app)
    return app


def _static() -> typer.Typer:
    from .static import static_app

    return static_app


def _elastic() -> typer.Typer:
    from .elastic import elastic_app

    return elastic_app


def _metrics() -> typer.Typer:
    from .metrics import register

    app = typer.Typer(add_completion=False)
    register(app)
    return app


def _tools() -> typer.Typer:
    from .tools import tools_app

    return tools_app


#: The top-level commands in their order: name -> (the module's Typer app, hidden). ``tools`` (behind
#: scripts/*.sh, and how the README makes streams without the nats CLI) is listed like the others. Each
#: app is built on its own, so none adds Typer's shell-completion options (``add_completion=False``).
TOP_LEVEL: dict[str, tuple[Callable[[], typer.Typer], bool]] = {
    "demo": (_demo, False),
    "static": (_static, False),
    "elastic": (_elastic, False),
    "metrics": (_metrics, False),
    "tools": (_tools, False),
}


HELP_OPTION_NAMES = ["-h", "--help"]


class RootGroup(CommandGroup):
    """The root command group; each top-level command is built when first looked up."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*super().list_commands(ctx), *(n for n in TOP_LEVEL if n not in self.commands)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in TOP_LEVEL:
            load, hidden = TOP_LEVEL[cmd_name]
            command = typer.main.get_command(load())
            command.name, command.hidden = cmd_name, hidden
            coercion.install(command, HELP_OPTION_NAMES)
            self.commands[cmd_name] = command
        return super().get_command(ctx, cmd_name)


app = typer.Typer(
    name="cg",
    cls=RootGroup,
    help=APP_HELP,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": HELP_OPTION_NAMES},
)


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(VERSION + "\n")
        raise typer.Exit(0)


def _fisk_introspect(value: bool) -> None:
    if value:
        print_model()
        raise typer.Exit(0)


def _timeout(value: str | None) -> float | None:
    if value is None:
        return None
    from .common import parse_duration_option

    return parse_duration_option("--timeout", value, positive=True)


def _opt(*decls: str, help: str, metavar: str | None = None) -> Any:
    return typer.Option(*decls, help=help, metavar=metavar, show_default=False)


@app.callback()
def root(
    ctx: typer.Context,
    context: Annotated[
        str | None, _opt("--context", help="nats CLI context to use (name or .json file)", metavar="NAME")
    ] = None,
    server: Annotated[
        str | None, _opt("--server", "-s", help="NATS server URL(s), comma separated", metavar="URL")
    ] = None,
    user: Annotated[str | None, _opt("--user", help="username or token", metavar="USER")] = None,
    password: Annotated[str | None, _opt("--password", help="password", metavar="PASSWORD")] = None,
    token: Annotated[str | None, _opt("--token", help="authentication token", metavar="TOKEN")] = None,
    creds: Annotated[str | None, _opt("--creds", help="user credentials file", metavar="FILE")] = None,
    nkey: Annotated[str | None, _opt("--nkey", help="user NKEY seed file", metavar="FILE")] = None,
    tlscert: Annotated[str | None, _opt("--tlscert", help="TLS client certificate file", metavar="FILE")] = None,
    tlskey: Annotated[str | None, _opt("--tlskey", help="TLS client key file", metavar="FILE")] = None,
    tlsca: Annotated[str | None, _opt("--tlsca", help="TLS CA certificate file", metavar="FILE")] = None,
    tlsfirst: Annotated[
        bool | None, _opt("--tlsfirst/--no-tlsfirst", help="TLS handshake before the server's INFO")
    ] = None,
    timeout: Annotated[
        str | None,
        _opt("--timeout", help="connect and request timeout (Go duration, default 5s)", metavar="DURATION"),
    ] = None,
    js_domain: Annotated[str | None, _opt("--js-domain", "--domain", help="JetStream domain", metavar="DOMAIN")] = None,
    js_api_prefix: Annotated[
        str | None, _opt("--js-api-prefix", help="JetStream API prefix (instead of a domain)", metavar="PREFIX")
    ] = None,
    inbox_prefix: Annotated[str | None, _opt("--inbox-prefix", help="custom inbox prefix", metavar="PREFIX")] = None,
    no_context: Annotated[bool, _opt("--no-context", help="ignore NATS contexts")] = False,
    connection_name: Annotated[str | None, _opt("--connection-name", help="connection name", metavar="NAME")] = None,
    version: Annotated[
        bool, typer.Option("--version", help="show the version and exit", is_eager=True, callback=_version)
    ] = False,
    fisk_introspect: Annotated[
        bool, typer.Option("--fisk-introspect", hidden=True, is_eager=True, callback=_fisk_introspect)
    ] = False,
) -> None:
    """Partitioned Consumer Group CLI tool"""
    ctx.obj = Runtime(
        server=server,
        user=user,
        password=password,
        token=token,
        creds=creds,
        nkey=nkey,
        tlscert=tlscert,
        tlskey=tlskey,
        tlsca=tlsca,
        tlsfirst=tlsfirst,
        timeout=_timeout(timeout),
        js_domain=js_domain,
        js_api_prefix=js_api_prefix,
        inbox_prefix=inbox_prefix,
        context=context,
        no_context=no_context or None,
        connection_name=connection_name,
    )


def build() -> RootGroup:
    """The root click command of ``cg`` (top-level commands built on first lookup)."""
    command = typer.main.get_command(app)
    assert isinstance(command, RootGroup)
    coercion.install(command, HELP_OPTION_NAMES)
    return command


def where_option_goes(root: RootGroup, args: list[str], option: str) -> tuple[str, list[str]] | None:
    """For ``option`` given to a command that does not take it (``cg --sleep 200ms static consume ...``): the
    first command of the user's path below it that does (``cg static``) and the arguments with the option (and
    its value) moved there (after a group's name, at the end of a command's arguments); None if none does."""
    from typer._click import Context

    ctx = Context(root)
    at = [i for i, a in enumerate(args) if a == option or a.startswith(option + "=")]
    if not at:
        return None
    command: Any = root
    path: list[str] = []
    for i, token in enumerate(args):
        sub = command.get_command(ctx, token) if hasattr(command, "get_command") else None
        if sub is None:
            continue
        command, path = sub, [*path, token]
        param = next((p for p in command.params if option in p.opts), None)
        if param is None or i < at[0]:
            continue
        moved = args[at[0] : at[0] + (1 if "=" in args[at[0]] or param.is_flag else 2)]
        rest = args[: at[0]] + args[at[0] + len(moved) :]
        where = rest.index(token, at[0]) + 1 if hasattr(command, "get_command") else len(rest)
        return " ".join(["cg", *path]), rest[:where] + moved + rest[where:]
    return None


def print_model() -> None:
    """``cg --fisk-introspect``: the fisk model of the whole tree, as ``nats plugins register`` reads it."""
    from .plugin import print_fisk_model

    print_fisk_model(build(), name="cg", help=APP_HELP, version=VERSION, aliases=ALIASES)


__all__ = ["ALIASES", "TOP_LEVEL", "RootGroup", "app", "build", "print_model", "where_option_goes"]
