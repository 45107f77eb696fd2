"""Bad input: malformed ``cg`` invocations and corrupted KV values, on a real server.

The table: every row runs the real ``cg`` (in-process through ``cg.main.main``, or as a subprocess where
the process matters: connection failures, contexts, and a sample of the others) and must give exit
status 1, exactly one stderr line ``cg: error: ...`` naming what is wrong and what is allowed, nothing
on stdout but a confirmation prompt, no traceback, and no change at all to the groups' KV entries
(values and revisions), to the streams or to their consumers (no lost or half-written state).

Corrupted KV values written under running instances. Decisions (docs/DESIGN.md, *Behaviour beyond the reference*: "an instance that gets a
fatal error (... config invalid) ends with that error on done(), never idles as a zombie"; as in the reference,
validation runs on every config read and every watched update):

* every instance of the corrupted group ends, and ``done()`` returns a ``ConfigError`` naming the
  group, its stream and what is wrong; it does not keep running on the last good config (a group
  whose stored config nobody can read has no agreed membership, so consuming on would risk two
  owners for a partition). A ``cg ... consume`` instance exits 1 with one ``cg: error:`` line.
* the process does not crash, and other groups (same stream, same process, same connection) keep
  consuming.
* ``cg ... info`` (and the other commands that need the config) fail with one clear ``cg: error:``
  line saying the group has an invalid config and what to do; ``cg ... ls`` lists group *names* from
  the bucket's keys without reading values, so it still lists every group, the bad one included, and
  exits 0 (its output stays the reference's format; ``info`` is where the problem is reported).
* ``cg ... delete`` works on a corrupted group (it is the way out), ``create`` over one refuses and
  says to delete it first.
* writing a valid config back makes the group usable again: ``info`` works and new instances consume.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from dataclasses import dataclass, field

import nats
import nats.js.errors
import pytest
from nats.js.api import StreamConfig, SubjectTransform

from pcgroups import ConsumerConfig, PartitioningFilter
from pcgroups.errors import ConfigError
from pcgroups.jetstream import _store as store
from pcgroups.jetstream._api import JetStreamApi
from tests.helpers.cli import Result, acg, cg_env, closed_port_url, procs, run_cg
from tests.helpers.support import wait_for

STATIC_BUCKET = "static-consumer-groups"
ELASTIC_BUCKET = "elastic-consumer-groups"


# ====================================================================== the table


@dataclass
class World:
    url: str
    S: str  # static stream: subjects S.*, partition transform into 4 partitions
    E: str  # elastic origin stream: subjects E.*
    names: dict = field(default_factory=dict)


async def _setup(url: str, w: World) -> None:
    from pcgroups import MemberMapping, add_members, create_elastic, create_static, set_member_mappings, static_consume

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(
            StreamConfig(
                name=w.S,
                subjects=[f"{w.S}.*"],
                subject_transform=SubjectTransform(
                    src=f"{w.S}.*", dest=f"{{{{partition(4,1)}}}}.{w.S}.{{{{wildcard(1)}}}}"
                ),
            )
        )
        await js.add_stream(StreamConfig(name=w.E, subjects=[f"{w.E}.*"]))
        await create_static(nc, w.S, "sg", 4, members=["m1", "m2"])
        await create_static(
            nc, w.S, "sm", 4, member_mappings=[MemberMapping("m1", [0, 1]), MemberMapping("m2", [2, 3])]
        )
        await create_elastic(nc, w.E, "eg", 4, partitioning_filters=[PartitioningFilter(f"{w.E}.*", [1])])
        await add_members(nc, w.E, "eg", ["a", "b"])
        await create_elastic(nc, w.E, "em", 4)
        await create_elastic(nc, w.E, "big", 20001)  # no member yet: one would own more than a consumer can filter
        await set_member_mappings(nc, w.E, "em", [MemberMapping("x", [0, 1]), MemberMapping("y", [2, 3])])
        # a durable member consumer that must survive every failed command (static consumers outlive instances)
        inst = await static_consume(nc, w.S, "sg", "m1", lambda msg: None, config=ConsumerConfig(ack_wait=1.0))
        await inst.wait_for_consuming(10)
        assert await inst.stop() is None
    finally:
        await nc.close()


@pytest.fixture(scope="module")
def world(nats_server) -> World:
    tag = uuid.uuid4().hex[:6]
    w = World(url=nats_server.url, S=f"bis{tag}", E=f"bie{tag}")
    asyncio.run(_setup(nats_server.url, w))
    return w


async def snapshot(nc, w: World) -> dict:
    """Everything a failed command must leave alone: our KV entries (value and revision), streams and consumers."""
    js = nc.jetstream()
    state: dict = {}
    for bucket in (STATIC_BUCKET, ELASTIC_BUCKET):
        for entry in await store.snapshot(JetStreamApi(nc), bucket):
            if entry.key.split(".")[0] in (w.S, w.E):
                state[(bucket, entry.key)] = (entry.revision, entry.value)
    streams = sorted(s.config.name for s in await js.streams_info() if s.config.name.startswith((w.S, w.E)))
    state["streams"] = streams
    for s in streams:
        state[("consumers", s)] = sorted(c.name for c in await js.consumers_info(s))
    return state


@dataclass
class Row:
    id: str
    args: list[str]
    wants: list[str]  # substrings of the error line: what is wrong, what is allowed
    proc: bool = False  # run the real executable as a subprocess
    input: str = ""
    env: dict | None = None


R = Row
BAD = closed_port_url()

ROWS = [
    # ---- names
    R(
        "static-group-dot",
        ["static", "create", "balanced", "{S}", "g.x", "2", "m1"],
        ['invalid group name "g.x"', "only letters, digits, '-' and '_'"],
    ),
    R(
        "static-group-star",
        ["static", "create", "balanced", "{S}", "g*", "2", "m1"],
        ['invalid group name "g*"', "only letters, digits, '-' and '_'"],
        proc=True,
    ),
    R(
        "static-group-gt",
        ["static", "create", "mapped", "{S}", "g>", "2", "m1:0,1"],
        ['invalid group name "g>"', "only letters, digits"],
    ),
    R("static-group-space", ["static", "info", "{S}", "my group"], ['invalid group name "my group"', "only letters"]),
    R(
        "static-group-empty",
        ["static", "create", "balanced", "{S}", "", "2", "m1"],
        ['invalid group name ""', "must not be empty"],
    ),
    R(
        "static-member-star",
        ["static", "create", "balanced", "{S}", "g", "2", "m1", "m*"],
        ['invalid member name "m*"', "only letters"],
    ),
    R("static-stream-dot", ["static", "ls", "a.b"], ['invalid stream name "a.b"', "may not contain '.'"]),
    R("elastic-stream-gt", ["elastic", "info", "a>", "eg"], ['invalid stream name "a>"', "'>'"], proc=True),
    R(
        "elastic-member-space",
        ["elastic", "add", "{E}", "eg", "new member"],
        ['invalid member name "new member"', "only letters"],
    ),
    R("elastic-member-empty", ["elastic", "drop", "{E}", "eg", ""], ['invalid member name ""', "must not be empty"]),
    R(
        "elastic-mapping-member-dot",
        ["elastic", "create-mapping", "{E}", "eg", "a.b:0,1,2,3"],
        ['invalid member name "a.b"', "only letters"],
    ),
    # ---- max_members
    R(
        "static-max-zero",
        ["static", "create", "balanced", "{S}", "g", "0", "m1"],
        ["the max number of members must be at least 1, got 0"],
    ),
    R(
        "static-max-negative",
        ["static", "create", "balanced", "{S}", "g", "-1", "m1"],
        ["invalid argument -1", "negative numbers are not allowed", "must be at least 1"],
    ),
    R(
        "static-max-huge",
        ["static", "create", "balanced", "{S}", "g", "99999999999999999999999", "m1"],
        ["the max number of members must be between 1 and 2147483647", "got 99999999999999999999999"],
        proc=True,
    ),
    R(
        "static-max-not-integer",
        ["static", "create", "mapped", "{S}", "g", "2.5", "m1:0"],
        ["invalid MAX-MEMBERS: '2.5' is not a whole number"],
    ),
    R(
        "elastic-max-zero",
        ["elastic", "create", "{E}", "g", "0"],
        ["the max number of members must be at least 1, got 0"],
    ),
    R(
        "elastic-max-too-many-partitions",
        ["elastic", "create", "{E}", "g", "2147483648"],
        ["between 1 and 2147483647", "partition transform", "got 2147483648"],
    ),
    R(
        "elastic-max-not-integer",
        ["elastic", "create", "{E}", "g", "ten"],
        ["invalid MAX-MEMBERS: 'ten' is not a whole number"],
    ),
    # ---- mappings
    R(
        "static-mapping-overlap",
        ["static", "create", "mapped", "{S}", "g", "4", "m1:0,1", "m2:1,2,3"],
        ["partition numbers must be used only once", "partition 1 is mapped more than once"],
    ),
    R(
        "static-mapping-missing-partitions",
        ["static", "create", "mapped", "{S}", "g", "4", "m1:0", "m2:1"],
        ["every partition must be assigned", "partitions 2, 3 are not"],
    ),
    R(
        "static-mapping-out-of-range",
        ["static", "create", "mapped", "{S}", "g", "4", "m1:0,1,2,3,4"],
        ["partition 4 is out of range", "between 0 and 3"],
    ),
    R(
        "static-mapping-negative",
        ["static", "create", "mapped", "{S}", "g", "2", "m1:0", "m2:-1"],
        ['invalid member mapping "m2:-1"', "partitions are numbered from 0"],
    ),
    R(
        "static-mapping-syntax",
        ["static", "create", "mapped", "{S}", "g", "2", "m1=0,1"],
        ["missing ':'", "member:p1,p2,..."],
    ),
    R(
        "static-mapping-same-member",
        ["static", "create", "mapped", "{S}", "g", "2", "m1:0", "m1:1"],
        ["member names must be unique", '"m1"'],
    ),
    R(
        "elastic-mapping-overlap",
        ["elastic", "create-mapping", "{E}", "eg", "a:0,1", "b:1,2,3"],
        ["partition numbers must be used only once", "partition 1"],
        proc=True,
    ),
    R(
        "elastic-mapping-out-of-range",
        ["elastic", "cm", "{E}", "eg", "a:0,1", "b:2,3,7"],
        ["partition 7 is out of range", "between 0 and 3"],
    ),
    R(
        "elastic-mapping-missing",
        ["elastic", "create-mapping", "{E}", "em", "x:0", "y:1"],
        ["every partition must be assigned", "partitions 2, 3 are not"],
    ),
    R(
        "elastic-mapping-not-integer",
        ["elastic", "create-mapping", "{E}", "eg", "a:0,one"],
        ['partition "one" is not an integer', "member:p1,p2,..."],
    ),
    # ---- elastic filters
    R(
        "elastic-filter-no-wildcard",
        ["elastic", "create", "{E}", "g", "2", "--filter", "{E}.x"],
        ["at least one * wildcard or end with > wildcard"],
    ),
    R(
        "elastic-filter-not-matching-stream",
        ["elastic", "create", "{E}", "g", "2", "--filter", "other.*"],
        ["partitioning filter other.* matches none of the subjects of stream {E} ({E}.*)"],
    ),
    R(
        "elastic-filters-overlap",
        ["elastic", "create", "{E}", "g", "2", "--filter", "{E}.*", "--filter", "{E}.>"],
        ["can't create the elastic consumer group's stream", "source filters can not overlap"],
        proc=True,
    ),
    R(
        "elastic-wildcard-out-of-range",
        ["elastic", "create", "{E}", "g", "2", "--filter", "{E}.*", "--wildcards", "2"],
        ["2 is out of range 1..1", "{E}.*"],
    ),
    R(
        "elastic-wildcards-unpaired",
        ["elastic", "create", "{E}", "g", "2", "--filter", "{E}.*", "--wildcards", "1", "--wildcards", "1"],
        ["2 --wildcards given for 1 --filter", "each --wildcards pairs with one --filter"],
    ),
    R(
        "elastic-buffer-too-large",
        ["elastic", "create", "{E}", "g", "2", "--max-buffered-msgs", "99999999999999999999"],
        ["the max number of buffered messages must be a 64-bit integer", "got 99999999999999999999"],
    ),
    R(
        "elastic-buffer-not-integer",
        ["elastic", "create", "{E}", "g", "2", "--max-buffered-msgs", "1e3"],
        ["invalid --max-buffered-msgs: '1e3' is not a whole number"],
    ),
    R(
        "elastic-buffer-negative",
        ["elastic", "create", "{E}", "g", "2", "--max-buffered-msgs", "-5"],
        ["invalid --max-buffered-msgs -5: give a limit, or 0 for none"],
    ),
    R(
        "elastic-buffer-bytes-negative",
        ["elastic", "create", "{E}", "g", "2", "--max-buffered-bytes", "-2"],
        ["invalid --max-buffered-bytes -2: give a limit, or 0 for none"],
    ),
    R(
        "elastic-consume-create-buffer-negative",
        ["elastic", "consume", "{E}", "g", "--auto", "--create", "2", "--max-buffered-msgs", "-5"],
        ["invalid --max-buffered-msgs -5"],
        proc=True,
    ),  # a subprocess: taken, it would consume on
    # ---- missing streams and groups
    R(
        "static-create-missing-stream",
        ["static", "create", "balanced", "no{S}", "g", "2", "m1"],
        ["the static consumer group's stream does not exist: no{S}"],
    ),
    R(
        "elastic-create-missing-stream",
        ["elastic", "create", "no{E}", "g", "2"],
        ["the elastic consumer group's origin stream does not exist: no{E}"],
    ),
    R("static-consume-missing-stream", ["static", "consume", "no{S}", "sg", "m1"], ["stream does not exist: no{S}"]),
    R(
        "elastic-delete-mapping-missing-group",
        ["elastic", "delete-mapping", "{E}", "nope"],
        ["elastic consumer group nope on stream {E} not found"],
    ),
    R(
        "elastic-delete-mapping-of-added-members",
        ["elastic", "delete-mapping", "{E}", "eg"],
        ["has no member mappings to delete: its members were given with add (a b)", "cg elastic drop {E} eg a b"],
    ),
    R(
        "elastic-skip-stuck-missing-group",
        ["elastic", "skip-stuck", "{E}", "nope"],
        ["elastic consumer group nope on stream {E} not found"],
    ),
    R(
        "elastic-skip-stuck-on-static",
        ["elastic", "skip-stuck", "{S}", "sg"],
        ["elastic consumer group sg on stream {S} not found (sg is a static consumer group)"],
    ),
    R("elastic-skip-stuck-bad-wait", ["elastic", "skip-stuck", "{E}", "eg", "--wait", "soon"], ["--wait"]),
    R(
        "static-create-consumers-missing-group",
        ["static", "create-consumers", "{S}", "nope"],
        ["static consumer group nope on stream {S} not found"],
    ),
    R(
        "static-create-consumers-other-settings",
        ["static", "create-consumers", "{S}", "sg", "--concurrency", "2"],
        [
            "member m1's consumer sg-m1 exists with other settings (ack_wait 1s there, 2s asked, max_ack_pending 1000 "
            "there, 16384 asked)"
        ],
    ),
    R(
        "static-create-consumers-bad-window",
        ["static", "create-consumers", "{S}", "sg", "--concurrency", "0"],
        ["invalid --concurrency 0"],
    ),
    R(
        "static-delete-missing-group",
        ["static", "rm", "{S}", "nope", "-f"],
        ["static consumer group nope on stream {S} not found"],
    ),
    # ---- existing groups: changes that are not allowed
    R(
        "static-create-different",
        ["static", "create", "balanced", "{S}", "sg", "4", "m1", "m3"],
        ["the existing static consumer group config doesn't match ours"],
    ),
    R(
        "elastic-create-different",
        ["elastic", "create", "{E}", "eg", "5"],
        ["can not be updated to the requested one", "delete the existing elastic consumer group"],
    ),
    R(
        "elastic-add-to-mapped",
        ["elastic", "add", "{E}", "em", "z"],
        ["can't add members to an elastic consumer group that uses member mappings", "--sticky"],
    ),
    # ---- configs no member could consume under: refused before anything is written
    R(
        "static-create-member-over-filters",
        ["static", "create", "balanced", "{S}", "bigX", "20001", "m1"],
        [
            "member m1 would own 20001 of the group's 20001 partitions",
            "at most 20000 filter subjects",
            "use fewer partitions",
        ],
    ),
    R(
        "static-create-mapping-over-filters",
        ["static", "create", "mapped", "{S}", "bigM", "20001", "m1:0-20000"],
        ["member m1 would own 20001 of the group's 20001 partitions", "at most 20000 filter subjects"],
    ),
    R(
        "elastic-add-member-over-filters",
        ["elastic", "add", "{E}", "big", "a"],
        ["member a would own 20001 of the group's 20001 partitions", "at most 20000 filter subjects"],
    ),
    R(
        "elastic-mapping-over-filters",
        ["elastic", "create-mapping", "{E}", "big", "a:0-20000"],
        ["member a would own 20001 of the group's 20001 partitions", "at most 20000 filter subjects"],
    ),
    # ---- wrong flavour
    R(
        "static-info-on-elastic",
        ["static", "info", "{E}", "eg"],
        ["static consumer group eg on stream {E} not found", "(eg is an elastic consumer group)"],
    ),
    R(
        "static-delete-on-elastic",
        ["static", "delete", "{E}", "eg", "--force"],
        ["(eg is an elastic consumer group)"],
        proc=True,
    ),
    R("static-step-down-on-elastic", ["static", "step-down", "{E}", "em", "x"], ["(em is an elastic consumer group)"]),
    R(
        "elastic-consume-on-static",
        ["elastic", "consume", "{S}", "sg", "m1"],
        ["(sg is a static consumer group)"],
        proc=True,
    ),
    R(
        "elastic-member-info-on-static",
        ["elastic", "member-info", "{S}", "sm", "m1"],
        ["elastic consumer group sm on stream {S} not found", "(sm is a static consumer group)"],
    ),
    R("elastic-delete-on-static", ["elastic", "rm", "{S}", "sg", "-f"], ["(sg is a static consumer group)"]),
    # ---- members, consume options
    R(
        "static-member-info-bad-member",
        ["static", "minfo", "{S}", "sg", "m 1"],
        ['invalid member name "m 1"', "only letters"],
    ),
    R(
        "static-step-down-non-member",
        ["static", "step-down", "{S}", "sg", "m9"],
        ["member m9 is not part of static consumer group sg"],
    ),
    R(
        "elastic-step-down-non-member",
        ["elastic", "sd", "{E}", "eg", "zz"],
        ["member zz is not part of elastic consumer group eg"],
    ),
    R(
        "static-consume-non-member",
        ["static", "consume", "{S}", "sg", "m9"],
        ["m9 is not a member of static consumer group sg (members: "],
        proc=True,
    ),
    R(
        "static-consume-bad-sleep",
        ["static", "join", "{S}", "sg", "m1", "--sleep", "-5ms"],
        ["invalid --sleep '-5ms'", "must not be negative"],
    ),
    R(
        "elastic-consume-sleep-out-of-range",
        ["elastic", "consume", "{E}", "eg", "a", "--sleep", "99999999999h"],
        ['invalid --sleep: duration "99999999999h" is out of range', "at most 2562047h47m16.854775807s"],
    ),
    R(
        "static-consume-empty-metrics-listen",
        ["static", "consume", "{S}", "sg", "m1", "--metrics-listen", ""],
        ["invalid --metrics-listen ''", "give HOST:PORT with a port from 1 to 65535"],
    ),
    R("elastic-consume-no-member", ["elastic", "consume", "{E}", "eg"], ["a member name is required", "--auto"]),
    R(
        "elastic-consume-lease-ttl-without-auto",
        ["elastic", "consume", "{E}", "eg", "a", "--lease-ttl", "10s"],
        ["--lease-ttl is the lease of an --auto instance", "add --auto, or leave --lease-ttl out"],
        proc=True,
    ),
    R(
        "tools-partitions-without-static",
        ["tools", "stream-setup", "--stream", "{S}x", "--partitions", "4"],
        ["--partitions is the partition count of --static's subject transform", "add --static"],
    ),
    # ---- delete confirmation
    R("static-delete-answer-no", ["static", "delete", "{S}", "sg"], ["operation canceled"], input="n\n"),
    R(
        "elastic-delete-no-answer",
        ["elastic", "delete", "{E}", "eg"],
        ["operation canceled: no answer (stdin ended); -f deletes without asking"],
        proc=True,
    ),
    # ---- connection, contexts, usage
    R(
        "unreachable-server",
        ["-s", BAD, "elastic", "ls", "{E}"],
        ["can't connect to " + BAD, "connection refused"],
        proc=True,
    ),
    R(
        "unreachable-server-env",
        ["static", "info", "{S}", "sg"],
        ["can't connect to " + BAD],
        proc=True,
        env={"NATS_URL": BAD},
    ),
    R(
        "server-url-http",
        ["-s", "http://127.0.0.1:4222", "static", "ls", "{S}"],
        ['invalid server URL "http://127.0.0.1:4222"', "the scheme http:// is not NATS's", "nats://"],
        proc=True,
    ),
    R(
        "server-url-no-scheme-colon",
        ["static", "info", "{S}", "sg"],
        ['invalid server URL "nats//127.0.0.1:4222"', "write it nats://HOST:PORT"],
        proc=True,
        env={"NATS_URL": "nats//127.0.0.1:4222"},
    ),
    R(
        "server-url-port-alone",
        ["static", "info", "{S}", "sg"],
        ['invalid server URL "4501": 4501 is a port number, not a host', "nats://HOST:4501"],
        proc=True,
        env={"NATS_URL": "4501"},
    ),
    R(
        "server-url-port",
        ["--server", "nats://127.0.0.1:99999", "elastic", "ls", "{E}"],
        ['invalid server URL "nats://127.0.0.1:99999"', "the port must be a number from 1 to 65535"],
        proc=True,
    ),
    R(
        "server-url-unclosed-ipv6",
        ["-s", "nats://[::1", "static", "ls", "{S}"],
        ['invalid server URL "nats://[::1"', "it is malformed", "nats://HOST:PORT", "nats://[::1]:4222"],
        proc=True,
    ),
    R(
        "server-url-unclosed-ipv6-secret",
        ["-s", "nats://alice:s3cret@[::1", "elastic", "ls", "{E}"],
        ['invalid server URL "nats://***@[::1"', "it is malformed"],
        proc=True,
    ),
    R(
        "unknown-context-option",
        ["--context", "nosuchctx", "static", "ls", "{S}"],
        ['unknown context "nosuchctx" (--context)', "nosuchctx.json"],
        proc=True,
    ),
    R(
        "unknown-context-env",
        ["elastic", "ls", "{E}"],
        ['unknown context "envctx" (NATS_CONTEXT)'],
        proc=True,
        env={"NATS_CONTEXT": "envctx"},
    ),
    R("bad-timeout", ["--timeout", "soon", "static", "ls", "{S}"], ["invalid --timeout", "use e.g. 5s"]),
    R("zero-timeout", ["static", "ls", "{S}", "--timeout", "0s"], ["invalid --timeout '0s': must be positive"]),
    # ---- dead letters: the commands, and the failing handler of consume and worker
    R(
        "dead-letters-ls-no-group",
        ["static", "dead-letters", "ls", "{S}", "nog"],
        ["static consumer group nog on stream {S} does not exist, and has no dead letters", "cg static ls {S}"],
    ),
    R(
        "dead-letters-show-not-a-number",
        ["static", "dead-letters", "show", "{S}", "sg", "first"],
        ["invalid SEQ 'first'", "a whole number from 1"],
        proc=True,
    ),
    R("dead-letters-show-zero", ["elastic", "dead-letters", "show", "{E}", "eg", "0"], ["invalid SEQ '0'"]),
    R(
        "dead-letters-show-none",
        ["elastic", "dead-letters", "show", "{E}", "eg", "7"],
        ["no dead letter 7 in elastic consumer group eg on stream {E}"],
    ),
    R(
        "dead-letters-replay-nothing-chosen",
        ["static", "dead-letters", "replay", "{S}", "sg"],
        ["say which dead letters to replay: --all, --key KEY or --seq N", "dead-letters ls {S} sg"],
    ),
    R(
        "dead-letters-replay-all-and-key",
        ["static", "dead-letters", "replay", "{S}", "sg", "--all", "--key", "k1", "--execute"],
        ["--all and --key/--seq can't be combined"],
    ),
    R(
        "dead-letters-replay-seq-not-a-number",
        ["elastic", "dead-letters", "replay", "{E}", "eg", "--seq", "x1", "--execute"],
        ["invalid --seq 'x1'", "a whole number from 1"],
    ),
    R(
        "dead-letters-replay-no-group",
        ["elastic", "dead-letters", "replay", "{E}", "nog", "--all", "--execute"],
        ["elastic consumer group nog on stream {E} not found"],
    ),
    R(
        "dead-letters-replay-unknown-key",
        ["static", "dead-letters", "replay", "{S}", "sg", "--key", "nokey", "--execute"],
        ["no dead letter to replay of key 'nokey' in static consumer group sg on stream {S}"],
    ),
    R(
        "dead-letters-purge-unknown-seq",
        ["static", "dead-letters", "purge", "{S}", "sm", "--seq", "99", "--execute"],
        ["no dead letter 99 in static consumer group sm on stream {S}"],
        proc=True,
    ),
    R(
        "consume-fail-pattern-gt-inside",
        ["static", "consume", "{S}", "sg", "m1", "--fail", "{S}.>.x"],
        ["invalid --fail '{S}.>.x'", "a NATS subject pattern", "'>' for the rest"],
    ),
    R(
        "consume-fail-empty-token",
        ["elastic", "consume", "{E}", "eg", "a", "--fail", "{E}..x"],
        ["invalid --fail '{E}..x'", "tokens separated by '.'"],
    ),
    R(
        "consume-fail-with-dispatch",
        ["static", "consume", "{S}", "sg", "m1", "--dispatch", "--fail", "{S}.7"],
        ["--fail needs a handler: with --dispatch the workers run it", "cg static worker STREAM GROUP --fail"],
    ),
    R(
        "consume-max-deliver-negative",
        ["elastic", "consume", "{E}", "eg", "a", "--max-deliver", "-2"],
        ["invalid --max-deliver -2", "0 to retry for ever"],
        proc=True,
    ),
    R("worker-fail-partial-wildcard", ["elastic", "worker", "{E}", "eg", "--fail", "*x"], ["invalid --fail '*x'"]),
    R(
        "delete-with-dead-letters-no-group",
        ["static", "delete", "{S}", "nog", "-f", "--with-dead-letters"],
        ["static consumer group nog on stream {S} not found"],
    ),
    R("unknown-command", ["elastic", "shrink", "{E}", "eg"], ["no such command 'shrink'", "cg elastic -h"]),
    R("unknown-option", ["static", "info", "{S}", "sg", "--verbose"], ["no such option: --verbose"]),
    R("missing-argument", ["elastic", "add", "{E}", "eg"], ["missing argument 'MEMBER'", "cg elastic add -h"]),
]


def _fmt(text: str, w: World) -> str:
    return text.replace("{S}", w.S).replace("{E}", w.E)


async def _run(row: Row, w: World) -> Result:
    args = [_fmt(a, w) for a in row.args]
    if row.proc or row.env:
        env = cg_env(w.url, **{k: _fmt(v, w) for k, v in (row.env or {}).items()})
        return await acg(*args, env=env, input=row.input)
    return await run_cg(*args, url=w.url, input=row.input)


def test_the_table_is_large_and_covers_every_command_family():
    assert len(ROWS) >= 40 and len({r.id for r in ROWS}) == len(ROWS)
    aliases = {"rm": "delete", "cm": "create-mapping", "sd": "step-down", "join": "consume", "minfo": "member-info"}
    covered = {
        (r.args[i], aliases.get(r.args[i + 1], r.args[i + 1]))
        for r in ROWS
        for i in range(len(r.args) - 1)
        if r.args[i] in ("static", "elastic")
    }
    common = {"create", "delete", "member-info", "step-down", "info", "consume", "ls"}
    wanted = {("static", c) for c in common} | {
        ("elastic", c) for c in common | {"add", "drop", "create-mapping", "delete-mapping"}
    }
    assert wanted <= covered, wanted - covered
    assert sum(r.proc or bool(r.env) for r in ROWS) >= 10


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
async def test_bad_invocation(row: Row, world: World, nc):
    before = await snapshot(nc, world)
    r = await _run(row, world)
    where = f"cg {' '.join(_fmt(a, world) for a in row.args)}\nexit {r.code}\nstdout: {r.out!r}\nstderr: {r.err!r}"
    assert r.code == 1, where
    assert "Traceback" not in r.err and "Traceback" not in r.out, where
    lines = r.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cg: error: "), where
    for want in row.wants:
        assert _fmt(want, world) in lines[0], f"{want!r} missing\n{where}"
    assert r.out in (
        "",
        "WARNING: this operation will cause all existing consumer members to terminate consuming are you sure? (y/n): ",
    ), where
    assert await snapshot(nc, world) == before, f"state changed\n{where}"


# ====================================================================== corrupted KV values under running instances


MAPPINGS_OVERLAP = (
    b'{"max_members":4,"member_mappings":[{"member":"m1","partitions":[0,1]},{"member":"m2","partitions":[1,2,3]}]}'
)
CORRUPTIONS = [
    ("garbage-bytes", b"\xff\xfe\x00{garbage", "not valid JSON"),
    (
        "wrong-types",
        b'{"max_members":"4","members":"m1"}',
        'max_members must be a non-negative integer, got the string "4"',
    ),
    (
        "negative-number",
        b'{"max_members":-4,"members":["m1","m2"]}',
        "max_members must be a non-negative integer, got -4",
    ),
    ("missing-fields", b'{"members":["m1","m2"]}', "the max number of members must be at least 1, got 0"),
    ("valid-json-invalid-config", MAPPINGS_OVERLAP, "partition numbers must be used only once"),
    ("wrong-nested-type", b'{"max_members":4,"members":["m1",2]}', "members[1] must be a string, got 2"),
]


async def _two_groups(nc, js, kind: str, stream: str) -> None:
    """Group T (members m1, m2) and group O (member m1, owning every partition) on one stream."""
    from pcgroups import add_members, create_elastic, create_static

    if kind == "static":
        await js.add_stream(
            StreamConfig(
                name=stream,
                subjects=[f"{stream}.*"],
                subject_transform=SubjectTransform(
                    src=f"{stream}.*", dest=f"{{{{partition(4,1)}}}}.{stream}.{{{{wildcard(1)}}}}"
                ),
            )
        )
        await create_static(nc, stream, "T", 4, members=["m1", "m2"])
        await create_static(nc, stream, "O", 4, members=["m1"])
    else:
        await js.add_stream(StreamConfig(name=stream, subjects=[f"{stream}.*"]))
        for group, members in (("T", ["m1", "m2"]), ("O", ["m1"])):
            await create_elastic(nc, stream, group, 4)
            await add_members(nc, stream, group, members)


def _one_error_line(r: Result, *wants: str) -> str:
    where = f"exit {r.code}\nstdout: {r.out!r}\nstderr: {r.err!r}"
    assert r.code == 1 and "Traceback" not in r.err + r.out, where
    lines = r.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("cg: error: "), where
    for want in wants:
        assert want in lines[0], f"{want!r} missing\n{where}"
    return lines[0]


@pytest.mark.parametrize("kind", ["static", "elastic"])
@pytest.mark.parametrize("bad,want", [c[1:] for c in CORRUPTIONS], ids=[c[0] for c in CORRUPTIONS])
async def test_corrupted_config_ends_that_groups_instances_only(kind, bad, want, nats_server, nc, js, uniq, caplog):
    """A corrupted value under running instances of group T (two members, in this process, plus a
    ``cg consume`` subprocess for garbage bytes): T's instances end with a ConfigError naming the
    group and the problem; O, on the same stream and connection, keeps consuming; ``info`` on T is one
    ``cg: error:`` line, ``ls`` still lists both; ``create`` over it refuses; a good value written back
    makes T work again for new instances."""
    from pcgroups import elastic_consume, static_consume

    caplog.set_level(logging.WARNING, logger="pcgroups")
    url, stream = nats_server.url, uniq
    consume = static_consume if kind == "static" else elastic_consume
    bucket = STATIC_BUCKET if kind == "static" else ELASTIC_BUCKET
    await _two_groups(nc, js, kind, stream)
    got: dict[str, set[str]] = {"T": set(), "O": set()}

    def handler(label: str):
        async def h(msg) -> None:
            got[label].add(msg.subject)
            await msg.ack_sync()

        return h

    async def publish(prefix: str) -> set[str]:
        subjects = {f"{stream}.{prefix}{i}" for i in range(8)}
        for s in sorted(subjects):
            await js.publish(s, b"x")
        return subjects

    from cg.consume import consumer_template

    template = consumer_template()  # the same consumer as `cg consume`'s, so both kinds of instance share it
    instances = []

    async def start(group: str, member: str):
        inst = await consume(nc, stream, group, member, handler(group), config=template)
        instances.append(inst)
        await inst.wait_for_consuming(10)
        return inst

    try:
        t1, t2, o1 = await start("T", "m1"), await start("T", "m2"), await start("O", "m1")
        async with procs() as run:
            cg_proc = None
            if bad == CORRUPTIONS[0][1]:
                cg_proc = await run(kind, "consume", stream, "T", "m1", url=url)
                await cg_proc.wait_text("consuming...")
            sent = await publish("a")
            await wait_for(lambda: sent <= got["T"] and sent <= got["O"], 15, what="both groups consuming")

            kv = await js.key_value(bucket)
            good = (await kv.get(f"{stream}.T")).value
            await kv.put(f"{stream}.T", bad)
            for inst in (t1, t2):
                err = await asyncio.wait_for(inst.done(), 10)
                assert isinstance(err, ConfigError), repr(err)
                assert f"{kind} consumer group T on stream {stream} is no longer valid" in str(err), str(err)
                assert want in str(err), str(err)
            if cg_proc is not None:
                _one_error_line(await cg_proc.wait(15), "cg: error: the config of", "is no longer valid", want)

            sent = await publish("b")
            await wait_for(lambda: sent <= got["O"], 15, what="group O still consuming")
            assert o1.consuming and not o1._done.done()

            _one_error_line(
                await run_cg(kind, "info", stream, "T", url=url),
                f"{kind} consumer group T on stream {stream} has an invalid config",
                want,
                "write a valid config or delete the group",
            )
            _one_error_line(await run_cg(kind, "member-info", stream, "T", "m1", url=url), "has an invalid config")
            create = (
                ["create", "balanced", stream, "T", "4", "m1", "m2"]
                if kind == "static"
                else ["create", stream, "T", "4"]
            )
            _one_error_line(
                await run_cg(kind, *create, url=url), "already exists with an invalid config", "delete it first"
            )
            r = (await run_cg(kind, "ls", stream, "--json", url=url)).ok()
            assert sorted(json.loads(r.out)["groups"]) == ["O", "T"]
            assert (await kv.get(f"{stream}.T")).value == bad  # nothing above rewrote it

            await kv.put(f"{stream}.T", good)
            r = (await run_cg(kind, "info", stream, "T", "--json", url=url)).ok()
            assert json.loads(r.out)["config"]["members"] == ["m1", "m2"]
            await start("T", "m1"), await start("T", "m2")
            sent = await publish("c")
            await wait_for(lambda: sent <= got["T"] and sent <= got["O"], 15, what="group T consuming again")
    finally:
        for inst in instances:
            await asyncio.wait_for(inst.stop(), 10)
    assert o1._done.result() is None
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not failures, [r.getMessage() for r in failures]


@pytest.mark.parametrize("kind", ["static", "elastic"])
async def test_delete_removes_a_corrupted_group(kind, nats_server, nc, js, uniq):
    """The way out of a corrupted config: ``cg ... delete -f`` succeeds (exit 0) and removes the
    key (and an elastic group's work-queue stream); the other group stays."""
    url, stream = nats_server.url, uniq
    await _two_groups(nc, js, kind, stream)
    kv = await js.key_value(STATIC_BUCKET if kind == "static" else ELASTIC_BUCKET)
    await kv.put(f"{stream}.T", b"\x00not json")
    r = await run_cg(kind, "delete", stream, "T", "-f", url=url)
    assert r.code == 0 and "Traceback" not in r.err, r
    # what the library says on the way reads as cg's own notes (no Go log timestamps)
    assert all(line.startswith("cg: warning: ") for line in r.err.splitlines()), r.err
    if kind == "static":
        assert f"cg: warning: static consumer group T on stream {stream} has an invalid config" in r.err, r.err
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await kv.get(f"{stream}.T")
    r = (await run_cg(kind, "ls", stream, url=url)).ok()
    assert r.out == f"{kind} consumer groups: [O]\n"
    if kind == "elastic":
        names = {s.config.name for s in await js.streams_info()}
        assert f"{stream}-T" not in names and f"{stream}-O" in names
