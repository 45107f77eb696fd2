"""cg.plugin: the fisk model of a cg-shaped Typer app, and replaying nats' argv into it.

No ``from __future__ import annotations`` here: Typer evaluates annotations, and these apps are
built inside functions whose locals string annotations could not see.
"""

import io
import json
import random
from typing import Annotated

import pytest
import typer

from cg.plugin import fisk_model, hoist_options, print_fisk_model, root_option_spellings
from tests.helpers.fisk_sim import all_nats_argvs, check_fisk_model, nats_argv

ALIASES = {("elastic", "consume"): ["join"], ("static", "ls"): ["list"], ("elastic", "add"): ["join-members"]}


def make_app(calls: list):
    """A tiny Typer app shaped like cg; every leaf appends (command, received values) to ``calls``."""
    app = typer.Typer(help="Partitioned consumer groups", add_completion=True)
    static = typer.Typer(help="Static consumer groups")
    elastic = typer.Typer(help="Elastic consumer groups")
    create = typer.Typer(help="Create a static consumer group")
    app.add_typer(static, name="static")
    app.add_typer(elastic, name="elastic")
    static.add_typer(create, name="create")
    conn: dict = {}

    def fisk(value: bool):
        if value:
            print_fisk_model(app, aliases=ALIASES)
            raise typer.Exit(0)

    @app.callback()
    def root(
        context: Annotated[str | None, typer.Option("--context", help="NATS context")] = None,
        server: Annotated[str | None, typer.Option("--server", "-s", help="NATS server URLs")] = None,
        creds: Annotated[str | None, typer.Option("--creds", help="credentials file")] = None,
        timeout: Annotated[str | None, typer.Option("--timeout", help="connect timeout")] = None,
        tlsfirst: Annotated[bool | None, typer.Option("--tlsfirst/--no-tlsfirst", help="TLS first")] = None,
        no_context: Annotated[bool, typer.Option("--no-context", help="ignore contexts")] = False,
        js_domain: Annotated[str | None, typer.Option("--js-domain", "--domain", help="JetStream domain")] = None,
        fisk_introspect: Annotated[
            bool, typer.Option("--fisk-introspect", hidden=True, is_eager=True, callback=fisk)
        ] = False,
    ):
        conn.clear()
        conn.update(
            context=context,
            server=server,
            creds=creds,
            timeout=timeout,
            tlsfirst=tlsfirst,
            no_context=no_context,
            js_domain=js_domain,
        )

    @create.command("balanced", help="Create a balanced static group")
    def balanced(
        stream: Annotated[str, typer.Argument(help="stream name")],
        name: Annotated[str, typer.Argument(help="group name")],
        max_members: Annotated[int, typer.Argument(help="number of partitions")],
        members: Annotated[list[str], typer.Argument(help="member names")],
        filter: Annotated[list[str], typer.Option("--filter", help="subject filters")] = [],  # noqa: B006 - Typer copies it
        force: Annotated[bool, typer.Option("--force/--no-force", "-f", help="no prompt")] = False,
    ):
        calls.append(
            (
                "balanced",
                dict(
                    stream=stream,
                    name=name,
                    max_members=max_members,
                    members=members,
                    filter=filter,
                    force=force,
                    **conn,
                ),
            )
        )

    @static.command("ls", help="List static groups")
    def ls(stream: Annotated[str, typer.Argument(help="stream name")]):
        calls.append(("ls", dict(stream=stream, **conn)))

    @static.command("list", hidden=True)
    def ls_alias(stream: str):
        ls(stream)

    @elastic.command("consume", help="Join a group as a member\n\nRuns until Ctrl-C.")
    def consume(
        stream: Annotated[str, typer.Argument(help="stream name")],
        name: Annotated[str, typer.Argument(help="group name")],
        member: Annotated[str, typer.Argument(help="member name")],
        sleep: Annotated[str, typer.Option("--sleep", help="processing time", metavar="DURATION")] = "20ms",
        verbose: Annotated[int, typer.Option("--verbose", "-v", count=True, help="more output")] = 0,
        hush: Annotated[bool, typer.Option("--hush", "-h", help="short letter nats owns")] = False,
    ):
        calls.append(
            ("consume", dict(stream=stream, name=name, member=member, sleep=sleep, verbose=verbose, hush=hush, **conn))
        )

    @elastic.command("join", hidden=True)
    def join(stream: str, name: str, member: str):
        consume(stream, name, member)

    @elastic.command("add", help="Add members")
    def add(
        stream: Annotated[str, typer.Argument(help="stream name")],
        members: Annotated[list[str], typer.Argument(help="member names")],
    ):
        calls.append(("add", dict(stream=stream, members=members, **conn)))

    return app


def run(app, argv: list[str]) -> None:
    """What cg's main() does: hoist the root options, then let Typer parse."""
    app(args=hoist_options(argv, *root_option_spellings(app)), standalone_mode=False)


@pytest.fixture
def calls():
    return []


@pytest.fixture
def app(calls):
    return make_app(calls)


@pytest.fixture
def model(app):
    return fisk_model(app, aliases=ALIASES, version="1.2.3")


def find(model, *path):
    node = model
    for name in path:
        node = next(c for c in node["commands"] if c["name"] == name)
    return node


# ------------------------------------------------------------------ the model


def test_model_passes_the_fisk_rules(model):
    check_fisk_model(model)
    assert model["name"] == "cg" and model["help"] == "Partitioned consumer groups"
    assert model["version"] == "1.2.3"
    json.dumps(model)  # plain JSON types only


def test_root_declares_connection_options_by_nats_global_names_without_shorts(model):
    root = {f["name"]: f for f in model["flags"]}
    assert set(root) == {"context", "server", "creds", "timeout", "tlsfirst", "no-context", "js-domain", "domain"}
    assert all("short" not in f for f in root.values())
    assert root["tlsfirst"]["boolean"] is True and root["context"]["boolean"] is False
    names = json.dumps(model)
    for gone in ("help", "install-completion", "show-completion", "fisk-introspect"):
        assert f'"name":"{gone}"' not in names.replace(" ", "")


def test_commands_aliases_and_hidden_duplicates(model):
    assert [c["name"] for c in model["commands"]] == ["static", "elastic"]
    assert sorted(c["name"] for c in find(model, "static")["commands"]) == ["create", "ls"]
    assert find(model, "static", "ls")["aliases"] == ["list"]
    assert sorted(c["name"] for c in find(model, "elastic")["commands"]) == ["add", "consume"]
    consume = find(model, "elastic", "consume")
    assert consume["aliases"] == ["join"]
    assert consume["help"] == "Join a group as a member"
    assert consume["help_long"] == "Join a group as a member\n\nRuns until Ctrl-C."

    def commands(node):
        for c in node.get("commands", []):
            yield c
            yield from commands(c)

    assert all("default" not in c and "hidden" not in c for c in commands(model))


def test_leaf_flags(model):
    flags = {f["name"]: f for f in find(model, "elastic", "consume")["flags"]}
    assert flags["sleep"] == {
        "name": "sleep",
        "help": "processing time",
        "default": ["20ms"],
        "place_holder": "DURATION",
        "boolean": False,
        "cumulative": False,
    }
    assert flags["verbose"]["short"] == ord("v") and flags["verbose"]["boolean"] is True
    assert "short" not in flags["hush"]  # -h belongs to nats
    bal = {f["name"]: f for f in find(model, "static", "create", "balanced")["flags"]}
    assert bal["force"] == {
        "name": "force",
        "help": "no prompt",
        "short": ord("f"),
        "boolean": True,
        "negatable": True,
        "cumulative": False,
    }
    assert bal["filter"]["cumulative"] is True and "default" not in bal["filter"]
    assert isinstance(bal["force"]["short"], int)


def test_positional_args_are_order_safe(model):
    balanced = find(model, "static", "create", "balanced")["args"]
    assert balanced == [
        {
            "name": "args",
            "required": True,
            "cumulative": True,
            "place_holder": "<stream> <name> <max-members> <members>...",
            "help": "<stream>: stream name; <name>: group name; "
            "<max-members>: number of partitions; <members>...: member names",
        }
    ]
    consume = find(model, "elastic", "consume")["args"]
    assert len(consume) == 1 and consume[0]["cumulative"] and consume[0]["place_holder"] == "<stream> <name> <member>"
    # one single arg followed by one cumulative arg is kept as is
    assert find(model, "elastic", "add")["args"] == [
        {"name": "stream", "help": "stream name", "required": True, "cumulative": False},
        {"name": "members", "help": "member names", "required": True, "cumulative": True},
    ]
    assert find(model, "static", "ls")["args"] == [
        {"name": "stream", "help": "stream name", "required": True, "cumulative": False}
    ]


def test_print_fisk_model_writes_one_json_document(app, capsys):
    print_fisk_model(app, aliases=ALIASES)
    out, err = capsys.readouterr()
    assert err == "" and out.endswith("}\n") and out.count("\n") == 1
    assert json.loads(out) == fisk_model(app, aliases=ALIASES)


def test_fisk_introspect_through_the_app(app, capsys, calls):
    app(args=["--fisk-introspect"], standalone_mode=False)
    out, err = capsys.readouterr()
    assert calls == []
    assert err == ""
    check_fisk_model(json.loads(out))


def test_print_to_a_file(app):
    buf = io.StringIO()
    print_fisk_model(app, aliases=ALIASES, file=buf)
    assert json.loads(buf.getvalue())["commands"]


# ------------------------------------------------------------------ refused models


def _tiny(root_opt=None, group_opt=None, leaf_opts=()):
    """root → g → leaf, with the given extra options (click Option objects added by name)."""
    app = typer.Typer(help="x")
    grp = typer.Typer(help="g")
    app.add_typer(grp, name="g")

    @app.callback()
    def root(ctx: typer.Context, context: Annotated[str | None, typer.Option("--context", "-c")] = None):
        pass

    @grp.callback()
    def group(server: Annotated[str | None, typer.Option(group_opt or "--gopt")] = None):
        pass

    @grp.command("leaf")
    def leaf(
        a: Annotated[bool, typer.Option(*(leaf_opts[0] if leaf_opts else ("--alpha", "-a")))] = False,
        b: Annotated[bool, typer.Option(*(leaf_opts[1] if leaf_opts else ("--beta", "-b")))] = False,
    ):
        pass

    return app


def test_refused_flag_names():
    check_fisk_model(fisk_model(_tiny()))
    with pytest.raises(ValueError, match="--context on a leaf command has the name of a nats global"):
        fisk_model(_tiny(leaf_opts=[("--context",), ("--beta",)]))
    with pytest.raises(ValueError, match="--context is a root option: 'g' can't reuse it"):
        fisk_model(_tiny(group_opt="--context"))
    with pytest.raises(ValueError, match="short flag -a repeats"):
        fisk_model(_tiny(leaf_opts=[("--alpha", "-a"), ("--beta", "-a")]))
    with pytest.raises(ValueError, match="-c is a root option"):
        fisk_model(_tiny(leaf_opts=[("--alpha", "-c"), ("--beta",)]))


def test_empty_root_help_unknown_alias_and_alias_clash_are_refused(app):
    with pytest.raises(ValueError, match="non-empty help"):
        fisk_model(app, help="")
    with pytest.raises(ValueError, match="unknown commands: elastic nope"):
        fisk_model(app, aliases={("elastic", "nope"): ["x"]})
    with pytest.raises(ValueError, match="'add'"):
        fisk_model(app, aliases={("elastic", "consume"): ["add"]})


def test_checker_catches_what_nats_rejects(model):
    bad = json.loads(json.dumps(model))
    consume = find(bad, "elastic", "consume")
    consume["flags"].append({"name": "server2", "short": "x"})
    consume["flags"].append({"name": "hush2", "short": ord("h")})
    consume["args"] = [{"name": "stream", "required": True}, {"name": "name", "required": True}]
    bad["help"] = ""
    with pytest.raises(AssertionError) as e:
        check_fisk_model(bad)
    text = str(e.value)
    for expected in ("empty help", "short must be an int", "short -h is taken", "2 non-cumulative args"):
        assert expected in text


# ------------------------------------------------------------------ argv from nats


CASES = [
    # (typed command path, positionals, leaf flags, nats globals, expected command, expected values)
    (
        ["static", "create", "balanced"],
        ["ORDERS", "grp", "4", "m1", "m2", "m3"],
        {"filter": ["orders.*", "x.>"], "force": True},
        {"context": "prod"},
        "balanced",
        dict(
            stream="ORDERS",
            name="grp",
            max_members=4,
            members=["m1", "m2", "m3"],
            filter=["orders.*", "x.>"],
            force=True,
            context="prod",
        ),
    ),
    (
        ["elastic", "join"],
        ["ORDERS", "grp", "m1"],
        {"sleep": "1s", "verbose": True},
        {
            "context": "p",
            "server": "nats://a:1,nats://b:2",
            "timeout": "1m30s",
            "tlsfirst": True,
            "trace": True,
        },  # trace isn't declared by the app: lost, as with nats
        "consume",
        dict(
            stream="ORDERS",
            name="grp",
            member="m1",
            sleep="1s",
            verbose=1,
            context="p",
            server="nats://a:1,nats://b:2",
            timeout="1m30s",
            tlsfirst=True,
        ),
    ),
    (
        ["elastic", "consume"],
        ["S", "G", "M"],
        {"hush": True},
        {"tlsfirst": False, "no-context": True, "domain": "hub"},
        "consume",
        dict(
            stream="S", name="G", member="M", hush=True, tlsfirst=False, no_context=True, js_domain="hub", sleep="20ms"
        ),
    ),
    (
        ["elastic", "add"],
        ["ORDERS", "m1", "m2"],
        {},
        {"creds": "/tmp/u.creds"},
        "add",
        dict(stream="ORDERS", members=["m1", "m2"], creds="/tmp/u.creds"),
    ),
    (["static", "list"], ["ORDERS"], {}, {"js-domain": "leaf"}, "ls", dict(stream="ORDERS", js_domain="leaf")),
]


@pytest.mark.parametrize("case", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_nats_argv_reaches_the_right_command_in_order(app, model, calls, case):
    path, positionals, flags, globals_, command, expected = case
    argvs = list(all_nats_argvs(model, path, positionals, flags, globals_))
    for seed in range(5):  # plus random flag/global orders
        argvs.append(nats_argv(model, path, positionals, flags, globals_, rng=random.Random(seed)))
    for argv in argvs:
        calls.clear()
        run(app, argv)
        assert len(calls) == 1, argv
        got_cmd, got = calls[0]
        assert got_cmd == command, argv
        for key, value in expected.items():
            assert got[key] == value, (argv, key)


def test_the_argv_really_has_nats_shape(model):
    argv = nats_argv(
        model,
        ["elastic", "join"],
        ["ORDERS", "grp", "m1"],
        {"sleep": "1s"},
        {"context": "p", "trace": True},
        rng=random.Random(1),
    )
    assert argv == ["elastic", "consume", "--sleep=1s", "--context=p", "ORDERS", "grp", "m1"]
    argv = nats_argv(model, ["elastic", "add"], ["S", "m1", "m2"], {}, {"server": "nats://x:1"})
    assert argv == ["elastic", "add", "S", "--server=nats://x:1", "m1", "m2"]


def test_a_naive_model_gets_its_arguments_shuffled(app, calls):
    """What the order-safe args avoid: one arg per positional, as fisk itself would declare them."""
    naive = fisk_model(app, aliases=ALIASES)
    find(naive, "elastic", "consume")["args"] = [
        {"name": n, "required": True, "cumulative": False} for n in ("stream", "name", "member")
    ]
    with pytest.raises(AssertionError, match="nats shuffles"):
        check_fisk_model(naive)
    seen = set()
    for argv in all_nats_argvs(naive, ["elastic", "consume"], ["ORDERS", "grp", "m1"]):
        calls.clear()
        run(app, argv)
        seen.add(calls[0][1]["stream"])
    assert seen == {"ORDERS", "grp", "m1"}


def test_typed_by_a_user_with_options_anywhere(app, calls):
    run(
        app,
        [
            "static",
            "create",
            "balanced",
            "-s",
            "nats://h:4222",
            "ORDERS",
            "grp",
            "2",
            "--context",
            "dev",
            "a",
            "b",
            "-f",
        ],
    )
    got = calls[-1][1]
    assert (got["server"], got["context"], got["members"], got["force"]) == ("nats://h:4222", "dev", ["a", "b"], True)


# ------------------------------------------------------------------ hoist_options


def test_hoist_options_forms():
    names = {"--context", "--server", "-s"}
    flags = {"--tlsfirst", "--no-tlsfirst", "--no-context"}
    assert hoist_options(["a", "b", "--context=x", "c"], names, flags) == ["--context=x", "a", "b", "c"]
    assert hoist_options(["a", "--context", "x", "c"], names, flags) == ["--context", "x", "a", "c"]
    assert hoist_options(["a", "-s", "u", "-surl2"], names, flags) == ["-s", "u", "-surl2", "a"]
    assert hoist_options(["a", "--server=u1,u2"], names, flags) == ["--server=u1,u2", "a"]
    assert hoist_options(["a", "--tlsfirst"], names, flags) == ["--tlsfirst", "a"]
    assert hoist_options(["a", "--tlsfirst=true"], names, flags) == ["--tlsfirst", "a"]
    assert hoist_options(["a", "--tlsfirst=false"], names, flags) == ["--no-tlsfirst", "a"]
    assert hoist_options(["a", "--no-context=true"], names, flags) == ["--no-context", "a"]
    assert hoist_options(["a", "--no-context=false"], names, flags) == ["a"]
    assert hoist_options(["a", "--", "--context", "x"], names, flags) == ["a", "--", "--context", "x"]
    assert hoist_options(["a", "--sleep=1s", "--contextual"], names, flags) == ["a", "--sleep=1s", "--contextual"]
    assert hoist_options(["a", "--context"], names, flags) == ["--context", "a"]
    assert hoist_options(["x", "context"], {"context", "s"}, {"tlsfirst"}) == ["x", "context"]
    assert hoist_options(["x", "--context=1", "-s", "2", "--tlsfirst"], {"context", "s"}, {"tlsfirst"}) == [
        "--context=1",
        "-s",
        "2",
        "--tlsfirst",
        "x",
    ]


def test_root_option_spellings(app):
    names, flags = root_option_spellings(app)
    assert {"--context", "--server", "-s", "--creds", "--timeout", "--js-domain", "--domain"} <= names
    assert {"--tlsfirst", "--no-tlsfirst", "--no-context"} <= flags
    assert "--help" not in names | flags and "--fisk-introspect" not in names | flags
    assert "--install-completion" not in names | flags


# ------------------------------------------------------------------ cg's own tree: consume's concurrency flags


@pytest.fixture(scope="module")
def cg_model():
    from cg.app import ALIASES as CG_ALIASES
    from cg.app import build

    model = fisk_model(build(), name="cg", help="Partitioned Consumer Group CLI tool", aliases=CG_ALIASES)
    check_fisk_model(model)
    return model


@pytest.mark.parametrize("flavour", ["static", "elastic"])
def test_cg_consume_declares_the_concurrency_flags(cg_model, flavour):
    flags = {f["name"]: f for f in find(cg_model, flavour, "consume")["flags"]}
    assert flags["concurrency"]["place_holder"] == "K" and flags["dispatch"]["boolean"]
    assert flags["key-header"]["place_holder"] == "HEADER" and flags["key-tokens"]["place_holder"] == "POSITIONS"
    assert flags["max-ack-pending"]["place_holder"] == "N"
    for name in ("concurrency", "key-header", "key-tokens", "max-ack-pending"):
        f = flags[name]
        assert f["help"] and not f["boolean"] and not f["cumulative"] and "short" not in f, f
    for name in ("concurrency", "key-header", "key-tokens", "max-ack-pending"):
        assert "default" not in flags[name]  # unset unless given: the defaults depend on --concurrency, --dispatch
    assert "counted from 1" in flags["key-tokens"]["help"]
    assert "at least K" in flags["max-ack-pending"]["help"]


@pytest.mark.parametrize("flavour", ["static", "elastic"])
@pytest.mark.parametrize(
    "flags, error",
    [
        (
            {"concurrency": "4", "key-header": "Order", "max-ack-pending": "2"},
            "--max-ack-pending 2 is less than --concurrency 4",
        ),
        ({"concurrency": "3", "key-tokens": "2,1", "key-header": "Order"}, "--key-header and --key-tokens can't be"),
        ({"key-tokens": "2"}, "--key-tokens needs --concurrency greater than 1"),
    ],
)
def test_nats_argvs_carry_the_concurrency_flags_to_cg(cg_model, flavour, flags, error):
    """Every argv nats could run for ``nats cg <flavour> join S G m1 --concurrency=...`` reaches consume's checks
    with the values given (they fail before connecting: no server needed)."""
    from tests.helpers.cli import assert_cli_error, cg_inproc

    argvs = list(all_nats_argvs(cg_model, [flavour, "join"], ["S", "G", "m1"], flags, {"timeout": "1s"}))
    assert argvs
    for argv in argvs:
        r = cg_inproc(*argv)
        assert_cli_error(r, error)
