"""``cg static prompt`` / ``cg elastic prompt``: an interactive shell over the same command tree.

Every line is dispatched into the very Typer commands ``cg static ...`` / ``cg elastic ...`` run
(parsing, checks, output and errors included); the shell only adds what a shell is for:

- the prompt ``[static]> `` / ``[elastic]> ``; ``static`` / ``elastic`` switch mode, and
  ``elastic add ...`` runs one command of the other mode; ``help``/``?``, ``exit``/``quit``,
  ``processing-time [duration]`` (consume's ``--sleep`` for the session);
- every command and alias of the mode's tree (``ls``/``list``, ``rm``, ``minfo``, ``sd``, ``cm``,
  ``dm``, ``join``, ``status``/``describe``, ``create balanced|mapped`` ...), each asking for any
  missing positional argument (with completion of the asked name);
- Tab completion of command names, options and *live* stream, group and member names (JetStream
  ``STREAM.NAMES``, the library's list and config functions), cached for :data:`NAME_TTL` and never
  waiting more than :data:`LOOKUP_TIMEOUT` on the server;
- a history file, ``$XDG_STATE_HOME/cg/history`` (``~/.local/state/cg/history``), created if missing;
- Ctrl-C cancels the line being typed (and stops a running ``consume``, back to the prompt), Ctrl-D
  on an empty line leaves with status 0; any error prints ``cg: error: ...`` and the shell goes on.

One NATS connection serves the whole session: the commands run with a :class:`SessionRuntime` as
their context object (cg/runtime.py), so their coroutines run on the shell's own event loop, on
the session's connection (a command's close only flushes it), and the CLI's own questions (the
delete confirmation, elastic ``create``'s filter entry) are asked through prompt-toolkit too.

The reference's prompt quirks are not copied: ``drop`` (and the other elastic-only commands) in
static mode is an error naming the mode, not the elastic command; ``create-mapping`` applies the
mappings entered interactively; the help list is generated from the command tree itself.

When stdin is not a terminal (``printf 'ls foo\\n' | cg static prompt``), lines are read from it
plainly, without a prompt or history, and the CLI's questions read the next lines of stdin.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shlex
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer

from .errors import Canceled, fail, report, usage_message
from .runtime import Runtime, close_quietly, read_answer_async, stdin_is_terminal

T = TypeVar("T")

if TYPE_CHECKING:
    from nats.aio.client import Client

    from pcgroups.connect import ConnectionOptions
    from pcgroups.jetstream import JetStreamApi

MODES = ("static", "elastic")
NAME_TTL = 3.0  # seconds a looked-up list of names is reused by completion
LOOKUP_TIMEOUT = 1.0  # completion never waits longer than this on the server
DEFAULT_SLEEP = "20ms"  # consume's --sleep default

#: The shell's own commands (completion and help).
BUILTINS: dict[str, str] = {
    "help": "this list, or `help <command>` for a command's options",
    "?": "same as help",
    "static": "switch to static mode (`static <command> ...` runs one static command)",
    "elastic": "switch to elastic mode (`elastic <command> ...` runs one elastic command)",
    "processing-time": "show or set consume's processing time (--sleep) for this session",
    "exit": "leave the prompt (also quit, Ctrl-D)",
    "quit": "leave the prompt",
}

#: What an asked positional argument is called, by parameter name.
LABELS = {
    "stream": "stream",
    "name": "consumer group",
    "max_members": "max members",
    "member": "member",
    "members": "members (space separated)",
    "mappings": "member mappings (member:p1,p2,... or ranges such as m1:0-4, space separated)",
}

_EOF = object()
_CANCEL = object()


class _Cancel(Exception):
    """The user canceled the line (Ctrl-C or Ctrl-D while asked for an argument)."""


def history_path(env: dict[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/cg/history``, else ``~/.local/state/cg/history``."""
    env = dict(os.environ) if env is None else env
    base = env.get("XDG_STATE_HOME") or ""
    if not os.path.isabs(base):  # the XDG spec: relative values are ignored
        home = env.get("HOME") or os.path.expanduser("~")
        base = os.path.join(home, ".local", "state")
    return Path(base) / "cg" / "history"


# ---------------------------------------------------------------- the command tree


def _arguments(cmd: Any) -> list[Any]:
    return [p for p in cmd.params if p.param_type_name == "argument"]


def _options(cmd: Any) -> dict[str, Any]:
    """Every spelling of the command's options (and --help/-h) -> the option (None for help)."""
    spellings: dict[str, Any] = {"--help": None, "-h": None}
    for p in cmd.params:
        if p.param_type_name == "option":
            for o in [*p.opts, *p.secondary_opts]:
                spellings[o] = p
    return spellings


def _is_group(cmd: Any) -> bool:
    return hasattr(cmd, "commands")


def scan(cmd: Any, tokens: list[str]) -> tuple[list[str], set[str], bool]:
    """Positional tokens, names of the options given, and whether the last token is an option
    still waiting for its value (so the next word is that value, not an argument)."""
    spellings = _options(cmd)
    positional: list[str] = []
    seen: set[str] = set()
    waiting = False
    only_positional = False
    for tok in tokens:
        if waiting:
            waiting = False
            continue
        if only_positional or tok == "-" or not tok.startswith("-"):
            positional.append(tok)
            continue
        if tok == "--":
            only_positional = True
            continue
        name, eq, _ = tok.partition("=")
        opt = spellings.get(name)
        seen.add(opt.name if opt is not None else name)
        if opt is not None and not opt.is_flag and not eq:
            waiting = True
    return positional, seen, waiting


def command_entries(group: Any) -> list[tuple[list[str], Any]]:
    """The group's commands as ([name, *aliases], command), in order, without ``prompt``."""
    by_key: dict[int, list[tuple[str, Any]]] = {}
    for name, cmd in group.commands.items():
        if name == "prompt":
            continue
        callback = getattr(cmd, "callback", None)
        # an alias is the same function registered again (Typer wraps each registration)
        key = id(getattr(callback, "__wrapped__", callback)) if callback is not None else id(cmd)
        by_key.setdefault(key, []).append((name, cmd))
    entries = []
    for names in by_key.values():
        primary = next(((n, c) for n, c in names if not c.hidden), names[0])
        entries.append(([primary[0], *(n for n, _ in names if n != primary[0])], primary[1]))
    return entries


def _usage(cmd: Any) -> str:
    from .help import argument_name

    return " ".join(argument_name(p) + ("..." if p.nargs == -1 else "") for p in _arguments(cmd))


def _short_help(cmd: Any) -> str:
    try:
        return cmd.get_short_help_str(limit=200)
    except Exception:
        return ""


def _help_width() -> int:
    """The terminal's width (80 when stdout is not a terminal), at which ``help`` wraps its lines."""
    import shutil

    try:
        tty = sys.stdout.isatty()
    except (ValueError, OSError):
        tty = False
    return shutil.get_terminal_size((80, 24)).columns if tty else 80


def help_lines(title: str, rows: list[tuple[str, str]], width: int) -> list[str]:
    """``help``'s list within ``width`` columns, wrapped between words: each command with its arguments, and
    its help beside them when a column of at least 45 is left for it, else under them, indented."""
    from functools import partial
    from textwrap import wrap

    wrap = partial(wrap, break_on_hyphens=False)
    lines = wrap(title, width)
    head = max(len(command) for command, _ in rows)
    beside = width - head - 4 >= 45
    for command, text in rows:
        if beside:
            wrapped = wrap(text, width - head - 4) or [""]
            lines.append(f"  {command.ljust(head)}  {wrapped[0]}".rstrip())
            lines += [" " * (head + 4) + more for more in wrapped[1:]]
        else:
            lines.append(f"  {command}")
            lines += wrap(text, width - 6, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return lines


# ---------------------------------------------------------------- the commands' runtime in the shell


class SessionRuntime(Runtime):
    """The runtime of the commands the shell runs: the session's event loop and connection (a
    command's close only flushes it), and questions through the shell's prompt when interactive."""

    def __init__(self, repl: Repl) -> None:
        super().__init__(options=repl.opts)
        self.repl = repl

    def run(self, coro_fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
        """On the session's event loop (Ctrl-C cancels the command, not the shell)."""
        return self.repl.run_on_loop(coro_fn(*args, **kwargs))

    run_member = run  # the shell's loop, whatever it is

    async def connect(self, *, reconnect: bool = False) -> tuple[Client, JetStreamApi]:
        return self.repl.connection()

    async def close(self, nc: Client) -> None:
        try:
            await asyncio.wait_for(nc.flush(), 2.0)
        except Exception:
            pass

    def stdin_is_terminal(self) -> bool:
        return self.repl.interactive or super().stdin_is_terminal()

    def ask(self, prompt: str) -> str | None:
        """Elastic ``create``'s filter entry: through prompt-toolkit; Ctrl-C cancels the command."""
        if not self.repl.interactive:
            return super().ask(prompt)
        try:
            return self.run(self.repl.ask, prompt)
        except _Cancel:
            raise Canceled() from None

    async def ask_async(self, prompt: str) -> str | None:
        """The delete confirmation: through prompt-toolkit; Ctrl-C cancels the command."""
        try:
            return await self.repl.ask(prompt)
        except _Cancel:
            raise Canceled() from None


# ---------------------------------------------------------------- live names for completion


class Names:
    """Stream, group and member names from the server, cached briefly; failures give no names."""

    def __init__(self, repl: Repl) -> None:
        self.repl = repl
        self._cache: dict[tuple, tuple[float, list[str]]] = {}
        self._pending: dict[tuple, asyncio.Future] = {}

    def clear(self) -> None:
        self._cache.clear()

    async def _get(self, key: tuple, fetch: Callable[[], Awaitable[list[str]]]) -> list[str]:
        hit = self._cache.get(key)
        if hit is not None and time.monotonic() - hit[0] < NAME_TTL:
            return hit[1]
        task = self._pending.get(key)
        if task is None:
            task = asyncio.ensure_future(fetch())
            self._pending[key] = task
            task.add_done_callback(functools.partial(self._settle, key))
        try:
            return list(await asyncio.wait_for(asyncio.shield(task), LOOKUP_TIMEOUT))
        except asyncio.CancelledError:
            raise
        except Exception:
            return hit[1] if hit is not None else []

    def _settle(self, key: tuple, task: asyncio.Future) -> None:
        self._pending.pop(key, None)
        if task.cancelled():
            return
        exc = task.exception()
        self._cache[key] = (time.monotonic(), [] if exc is not None else list(task.result()))

    async def streams(self) -> list[str]:
        async def fetch() -> list[str]:
            _, api = self.repl.connection()
            names: list[str] = []
            while True:
                page = await api.request("STREAM.NAMES", {"offset": len(names)}, timeout=LOOKUP_TIMEOUT)
                batch = page.get("streams") or []
                names.extend(batch)
                if not batch or len(names) >= page.get("total", 0):
                    break
            # the groups' own KV buckets are streams too; nobody partitions those
            return sorted(n for n in names if not n.startswith(("KV_", "OBJ_")))

        return await self._get(("streams",), fetch)

    async def groups(self, mode: str, stream: str) -> list[str]:
        async def fetch() -> list[str]:
            if mode == "static":
                from pcgroups.static import list_static_groups as list_groups
            else:
                from pcgroups.elastic import list_elastic_groups as list_groups
            nc, api = self.repl.connection()
            return sorted(await list_groups(nc, stream, api=api))

        return await self._get(("groups", mode, stream), fetch)

    async def members(self, mode: str, stream: str, group: str) -> list[str]:
        async def fetch() -> list[str]:
            from pcgroups.flavour import ELASTIC, STATIC, Flavour, get_config

            flavour: Flavour[Any] = STATIC if mode == "static" else ELASTIC
            nc, api = self.repl.connection()
            cfg = await get_config(flavour, nc, stream, group, api=api)
            return cfg.membership()

        return await self._get(("members", mode, stream, group), fetch)


def _name_kind(mode: str, cmd_name: str, param: Any) -> str | None:
    """What to complete for a positional parameter: stream, group, member, mapping or nothing."""
    name = param.name
    if name == "stream":
        return "stream"
    if name == "name":
        return None if cmd_name in ("balanced", "mapped", "create") else "group"
    if name == "member":
        return "member"
    if name == "members" and cmd_name == "drop":
        return "member"
    if name == "mappings" and mode == "elastic":
        return "mapping"
    return None


# ---------------------------------------------------------------- prompt-toolkit completers


@functools.cache
def _completion_class():
    from prompt_toolkit.completion import Completer, Completion

    class LineCompleter(Completer):
        """Completes the shell's command line (commands, options, live names)."""

        def __init__(self, repl: Repl) -> None:
            self.repl = repl

        def get_completions(self, document, complete_event):  # pragma: no cover - the async path is used
            return iter(())

        async def get_completions_async(self, document, complete_event):
            text = document.text_before_cursor
            words = text.split()
            if not text or text[-1].isspace():
                words.append("")
            current = words[-1]
            for value, meta in await self.repl.candidates(words[:-1], current):
                if value.startswith(current):
                    yield Completion(value, start_position=-len(current), display_meta=meta)

    class ValueCompleter(Completer):
        """Completes one asked value (a name) from a coroutine giving the candidates."""

        def __init__(self, source: Callable[[], Awaitable[list[str]]]) -> None:
            self.source = source

        def get_completions(self, document, complete_event):  # pragma: no cover
            return iter(())

        async def get_completions_async(self, document, complete_event):
            text = document.text_before_cursor
            current = "" if not text or text[-1].isspace() else text.split()[-1]
            for value in await self.source():
                if value.startswith(current):
                    yield Completion(value, start_position=-len(current))

    return LineCompleter, ValueCompleter, Completion


# ---------------------------------------------------------------- the shell


class Repl:
    """One interactive session: a mode, a connection, a prompt, the command tree.

    ``input``/``output`` are prompt-toolkit ones (tests pass a pipe input and ``DummyOutput``);
    without them a terminal stdin gets prompt-toolkit and anything else plain line reading.
    """

    def __init__(
        self,
        mode: str,
        opts: ConnectionOptions,
        root: Any,
        *,
        input: Any = None,
        output: Any = None,
        history_file: Path | str | None = None,
        sleep: str | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
        self.mode = mode
        self.opts = opts
        self.root = root
        self.root_ctx = root.context_class(root, info_name="cg", obj=SessionRuntime(self), **root.context_settings)
        self.sleep: str | None = sleep  # consume's --sleep for the session (``cg static --sleep 50ms prompt``)
        self.names = Names(self)
        self.runner: asyncio.Runner | None = None
        self.nc: Client | None = None
        self.api: JetStreamApi | None = None
        self._input = input
        self._output = output
        self._history_file = Path(history_file) if history_file is not None else None
        self.interactive = input is not None or stdin_is_terminal()
        self._main_session: Any = None
        self._ask_session: Any = None

    # -------------------------------------------------------- lifecycle

    def run(self) -> int:
        """The whole session: connect, read and run lines until exit/quit/Ctrl-D. Returns 0."""
        self.start()
        try:
            while True:
                try:
                    line = self.read_line()
                    if line is _EOF:
                        break
                    if line is _CANCEL:
                        continue
                    if not self.execute(line):
                        break
                except KeyboardInterrupt:  # between two reads: the line is canceled, the shell goes on
                    self._newline()
        finally:
            self.stop()
        return 0

    def start(self) -> None:
        """Connect (one clear error if that fails): the connection of every command of the session."""
        from pcgroups.connect import connect, resolve
        from pcgroups.jetstream import JetStreamApi

        rc = resolve(self.opts)
        self.runner = asyncio.Runner()
        try:
            self.nc = self.runner.run(connect(rc, reconnect=True))
        except BaseException:
            self.runner.close()
            self.runner = None
            raise
        self.api = JetStreamApi(self.nc, domain=rc.js_domain, api_prefix=rc.js_api_prefix, timeout=rc.timeout)

    def connection(self) -> tuple[Client, JetStreamApi]:
        """The session's connection, which :meth:`start` made."""
        if self.nc is None or self.api is None:
            raise RuntimeError("the session is not started")
        return self.nc, self.api

    def stop(self) -> None:
        if self.runner is None:
            return
        try:
            if self.nc is not None:
                self.runner.run(close_quietly(self.nc))
        finally:
            self.runner.close()
            self.runner = None

    @contextmanager
    def bound(self) -> Iterator[Repl]:
        """``start()`` ... ``stop()`` as a context manager (tests drive :meth:`execute` in it)."""
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def group(self, mode: str) -> Any:
        """The command group of a mode (``cg static`` / ``cg elastic``)."""
        return self.root.get_command(self.root_ctx, mode)

    # -------------------------------------------------------- reading

    @property
    def prompt_text(self) -> str:
        return f"[{self.mode}]> "

    def _sessions(self) -> tuple[Any, Any]:
        if self._main_session is None:
            from prompt_toolkit import PromptSession
            from prompt_toolkit.auto_suggest import AutoSuggestFromHistory
            from prompt_toolkit.history import FileHistory, InMemoryHistory

            LineCompleter, _, _ = _completion_class()
            history: Any
            path = self._history_file or history_path()
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch(exist_ok=True)
                history = FileHistory(str(path))
            except OSError as e:
                sys.stderr.write(f"cg: warning: no history file ({path}: {e.strerror or e})\n")
                history = InMemoryHistory()
            io = {"input": self._input, "output": self._output}
            self._main_session = PromptSession(
                history=history,
                completer=LineCompleter(self),
                complete_while_typing=False,
                auto_suggest=AutoSuggestFromHistory(),
                **io,
            )
            self._ask_session = PromptSession(history=InMemoryHistory(), complete_while_typing=False, **io)
        return self._main_session, self._ask_session

    def run_on_loop(self, aw: Awaitable[T]) -> T:
        """``aw`` run to its end on the session's event loop (between start and close)."""
        if self.runner is None:
            raise RuntimeError("the session's event loop is not running (start() first)")

        async def wait() -> T:
            return await aw

        return self.runner.run(wait())

    def read_line(self) -> Any:
        """The next line, ``_CANCEL`` (Ctrl-C) or ``_EOF`` (Ctrl-D, end of input)."""
        return self.run_on_loop(self._read_line())

    async def _read_line(self) -> Any:
        if not self.interactive:
            line = await read_answer_async("")
            return _EOF if line is None else line
        main, _ = self._sessions()
        try:
            return await main.prompt_async(self.prompt_text)
        except KeyboardInterrupt:
            return _CANCEL
        except EOFError:
            return _EOF

    async def ask(self, question: str, source: Callable[[], Awaitable[list[str]]] | None = None) -> str | None:
        """Ask one value; None at end of input; Ctrl-C raises :class:`_Cancel`."""
        if not self.interactive:
            return await read_answer_async(question)
        _, session = self._sessions()
        completer = None
        if source is not None:
            _, ValueCompleter, _ = _completion_class()
            completer = ValueCompleter(source)
        try:
            return await session.prompt_async(question, completer=completer)
        except KeyboardInterrupt:
            raise _Cancel() from None
        except EOFError:
            return None

    # -------------------------------------------------------- running a line

    def execute(self, line: str) -> bool:
        """Run one line; False when the shell should end. Errors are printed, never raised."""
        try:
            return self._execute(line)
        except _Cancel:
            return True
        except KeyboardInterrupt:
            self._newline()
            return True
        except Exception as e:
            self._error(e)
            return True
        finally:
            self._flush()

    def _execute(self, line: str) -> bool:
        try:
            tokens = shlex.split(line)
        except ValueError as e:
            self._fail(f"can't parse the line: {str(e).lower()}")
            return True
        if not tokens:
            return True
        head, rest = tokens[0], tokens[1:]
        if head in ("exit", "quit"):
            return False
        if head in ("help", "?"):
            self.help(rest)
            return True
        mode = self.mode
        if head in MODES:
            if not rest:
                self.mode = head
                return True
            mode, head, rest = head, rest[0], rest[1:]
            if head in ("help", "?"):
                self.help([mode, *rest] if rest else [], mode=mode)
                return True
        if head == "processing-time":
            self.processing_time(rest)
            return True
        if head == "prompt":
            self._fail(f"already in the prompt (type {'elastic' if mode == 'static' else 'static'} to switch modes)")
            return True
        group = self.group(mode)
        if head not in group.commands:
            self._unknown(mode, head)
            return True
        args = self.run_on_loop(self.complete_arguments(mode, [head, *rest]))
        self.invoke(mode, args)
        return True

    def _unknown(self, mode: str, name: str) -> None:
        other = "elastic" if mode == "static" else "static"
        if name in self.group(other).commands and name != "prompt":
            self._fail(
                f"{name} is an {other} command, not a {mode} one: type `{other}` to switch modes, "
                f"or `{other} {name} ...`"
            )
        else:
            from .help import close_names

            names = [n for n in [*self.group(mode).commands, *BUILTINS] if n != "prompt"]
            likely = close_names(name, names)
            meant = f"did you mean {' or '.join(likely)}? " if likely else ""
            self._fail(f"unknown command: {name} ({meant}type help for the list)")

    async def complete_arguments(self, mode: str, tokens: list[str]) -> list[str]:
        """The line's tokens plus an answer for each missing positional argument, in order."""
        group = self.group(mode)
        cmd = group.commands[tokens[0]]
        path, rest = [tokens[0]], tokens[1:]
        if any(t in ("--help", "-h") for t in rest):
            return tokens
        if _is_group(cmd):  # static `create balanced|mapped`
            if rest and not rest[0].startswith("-"):
                sub, rest = rest[0], rest[1:]
            else:
                choices = list(cmd.commands)

                async def source() -> list[str]:
                    return choices

                sub = await self._required(f"{tokens[0]} {' or '.join(choices)}: ", source, "kind of group")
            path.append(sub)
            if sub not in cmd.commands:
                return [*path, *rest]  # the command tree's own error
            cmd = cmd.commands[sub]
        positional, seen, _ = scan(cmd, rest)
        known = list(positional)
        asked: list[str] = []
        for i, param in enumerate(_arguments(cmd)):
            if i < len(known):
                continue
            if param.nargs == -1 and (not param.required or len(known) > i):
                continue
            label = LABELS.get(param.name, param.name.replace("_", " "))
            answer = await self._required(
                f"{label}: ", self._source(mode, path[-1], param, known), label.split(" (")[0]
            )
            if param.nargs == -1:
                values = shlex.split(answer)
                asked.extend(values)
                known.extend(values)
            else:
                asked.append(answer)
                known.append(answer)
        extra: list[str] = []
        if self.sleep is not None and "sleep" not in seen and "sleep" in {p.name for p in cmd.params}:
            extra = ["--sleep", self.sleep]
        if asked and "--" not in rest:
            asked = ["--", *asked] if any(a.startswith("-") and a != "-" for a in asked) else asked
        return [*path, *rest, *extra, *asked]

    async def _required(self, question: str, source: Callable[[], Awaitable[list[str]]] | None, label: str) -> str:
        answer = await self.ask(question, source)
        if answer is None or not answer.strip():
            self._fail(f"no {label} given")
            raise _Cancel()
        return answer.strip()

    def _source(
        self, mode: str, cmd_name: str, param: Any, known: list[str]
    ) -> Callable[[], Awaitable[list[str]]] | None:
        kind = _name_kind(mode, cmd_name, param)
        if kind == "stream":
            return self.names.streams
        if kind == "group" and known:
            return lambda: self.names.groups(mode, known[0])
        if kind in ("member", "mapping") and len(known) >= 2:
            suffix = ":" if kind == "mapping" else ""

            async def members() -> list[str]:
                return [m + suffix for m in await self.names.members(mode, known[0], known[1])]

            return members
        return None

    def invoke(self, mode: str, args: list[str]) -> None:
        """Run ``cg <mode> <args>`` through the command tree, as the CLI would."""
        from typer._click.exceptions import ClickException

        group = self.group(mode)
        try:
            with group.make_context(mode, list(args), parent=self.root_ctx) as ctx:
                group.invoke(ctx)
        except typer.Exit:
            pass
        except typer.Abort:
            self._fail("operation canceled")
        except ClickException as e:
            self._fail(usage_message(e))
        finally:
            self.names.clear()  # a command may have changed groups or members

    # -------------------------------------------------------- shell commands

    def help(self, rest: list[str], mode: str | None = None) -> None:
        from .output import out

        if rest:
            mode, names = self.mode, list(rest)
            if names[0] in MODES and len(names) > 1:
                mode, names = names[0], names[1:]
            if names[0] in BUILTINS:
                out.line(f"{names[0]}: {BUILTINS[names[0]]}")
                return
            if names[0] not in self.group(mode).commands:
                self._unknown(mode, names[0])
                return
            self.invoke(mode, [*names, "--help"])
            return
        rows: list[tuple[str, str]] = []
        mode = mode or self.mode
        for names, cmd in command_entries(self.group(mode)):
            if _is_group(cmd):
                for sub_names, sub in command_entries(cmd):
                    rows.append((f"{names[0]} {sub_names[0]} {_usage(sub)}", _short_help(sub)))
            else:
                also = f" (also {', '.join(names[1:])})" if names[1:] else ""
                rows.append((f"{names[0]} {_usage(cmd)}", _short_help(cmd) + also))
        rows += [
            ("static|elastic [COMMAND ...]", "switch mode, or run one command of that mode"),
            ("processing-time [DURATION]", f"consume's --sleep for this session (now {self.sleep or DEFAULT_SLEEP})"),
            ("help [COMMAND]", "this list, or a command's arguments and options (also ?)"),
            ("exit", "leave (also quit, Ctrl-D)"),
        ]
        for line in help_lines(
            f"{mode} mode commands (a missing argument is asked for; Tab completes commands, "
            "streams, groups and members; Ctrl-C cancels the line):",
            rows,
            _help_width(),
        ):
            out.line(line)

    def processing_time(self, rest: list[str]) -> None:
        from .common import parse_sleep
        from .output import out

        if not rest:
            out.line(f"processing time: {self.sleep or DEFAULT_SLEEP}")
            return
        if len(rest) > 1:
            self._fail("processing-time takes one duration, e.g. 50ms")
            return
        parse_sleep(rest[0])  # a bad value is an error now, not at the next consume
        self.sleep = rest[0]

    # -------------------------------------------------------- completion

    async def candidates(self, before: list[str], current: str) -> list[tuple[str, str]]:
        """(value, description) pairs for the word being typed after the words ``before``."""
        mode = self.mode
        if before and before[0] in MODES:
            mode, before = before[0], before[1:]
        group = self.group(mode)
        if not before:
            cmds = [(n, _short_help(c)) for n, c in group.commands.items() if n != "prompt"]
            if mode == self.mode:
                cmds += list(BUILTINS.items())
            return cmds
        head = before[0]
        if head in ("help", "?"):
            return [(n, _short_help(c)) for n, c in group.commands.items() if n != "prompt"] if len(before) == 1 else []
        cmd = group.commands.get(head)
        if cmd is None:
            return []
        name, rest = head, before[1:]
        if _is_group(cmd):
            if not rest:
                return [(n, _short_help(c)) for n, c in cmd.commands.items()]
            name, cmd, rest = rest[0], cmd.commands.get(rest[0]), rest[1:]
            if cmd is None:
                return []
        if current.startswith("-"):
            return [
                (o, (p.help or "") if p is not None else "show the command's help")
                for o, p in _options(cmd).items()
                if o.startswith("--")
            ]
        positional, _, waiting = scan(cmd, rest)
        if waiting:
            return []
        params = _arguments(cmd)
        if not params:
            return []
        idx = len(positional)
        if idx >= len(params):
            if params[-1].nargs != -1:
                return []
            idx = len(params) - 1
        source = self._source(mode, name, params[idx], positional)
        if source is None:
            return []
        meta = {"stream": "stream", "name": f"{mode} group"}.get(params[idx].name, "member")
        return [(v, meta) for v in await source() if v not in positional[len(params) - 1 :]]

    async def completions(self, text: str) -> list[str]:
        """The completions prompt-toolkit would offer at the end of ``text`` (for tests)."""
        from prompt_toolkit.completion import CompleteEvent
        from prompt_toolkit.document import Document

        LineCompleter, _, _ = _completion_class()
        completer = LineCompleter(self)
        return [c.text async for c in completer.get_completions_async(Document(text), CompleteEvent())]

    # -------------------------------------------------------- output

    def _fail(self, message: str) -> None:
        fail(message)

    def _error(self, e: BaseException) -> None:
        report(e)

    def _newline(self) -> None:
        if self.interactive:
            try:
                sys.stdout.write("\n")
            except Exception:
                pass

    @staticmethod
    def _flush() -> None:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass


__all__ = ["Repl", "SessionRuntime", "history_path"]
