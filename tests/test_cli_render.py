"""What ``cg`` draws in an 80-column terminal (rich ``Console(width=80)``): ``status``, ``info``, ``ls``, the
membership-change summary and the demo's summary keep every digit of every number and every verdict,
and no line is wider than the terminal. Pure rendering: the inputs are built here, no server."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime, timedelta

import pytest
from rich.console import Console

WIDTH = 80
NOW = datetime(2026, 11, 25, 12, 0, 0, tzinfo=UTC)


def _render(*renderables, width: int = WIDTH) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None, highlight=False)
    for r in renderables:
        console.print(r)
    return buf.getvalue()


def _assert_fits_and_keeps(text: str, numbers: list[int | str], width: int = WIDTH) -> None:
    too_wide = [line for line in text.splitlines() if len(line) > width]
    assert not too_wide, "\n".join(too_wide)
    tokens = set(re.findall(r"[0-9]+(?:[.-][0-9]+)?", text))
    missing = [n for n in numbers if str(n) not in tokens]
    assert not missing, f"numbers cut or missing: {missing}\n{text}"


def _status(flavour: str = "static", *, members: int = 3, leases: bool = False, exact: bool = False):
    from pcgroups.elastic._membership import Lease
    from pcgroups.ops._status import GroupStatus, MemberStatus, PartitionStatus

    ms, rows = [], []
    per = 4
    for i in range(members):
        name = f"member-with-a-long-name-{i}"
        ms.append(
            MemberStatus(
                member=name,
                consumer=name,
                partitions=list(range(i * per, i * per + per)),
                exists=True,
                active=True,
                waiting=1,
                pinned_id=f"PINIDxxxxxxxxxxxxxx{i:03d}",
                pinned_since=NOW - timedelta(seconds=37 + i),
                pending=1234567 + i,
                ack_pending=98765 + i,
                redelivered=43210 + i,
                ack_floor=9876543210 + i,
            )
        )
        for p in range(i * per, i * per + per):
            rows.append(PartitionStatus(partition=p, member=name, active=True, pending=100000 + p, pending_exact=exact))
    rows.append(PartitionStatus(partition=members * per, pending=55555))
    lease_rows = (
        [
            Lease(
                m.member, f"{i:08x}", 4.2, 5.0, "a-rather-long-host-name.example.com", 123456 + i, pin=m.pinned_id or ""
            )
            for i, m in enumerate(ms)
        ]
        if leases
        else []
    )
    return GroupStatus(
        flavour=flavour,
        stream="ORDERS",
        group="billing",
        consumer_stream="ORDERS-billing",
        max_members=members * per + 1,
        mode="mapped",
        filters=[],
        members=ms,
        partitions=rows,
        last_seq=9876543299,
        messages=123456789,
        source_lag=7654321 if flavour == "elastic" else None,
        leases=lease_rows,
        taken_at=NOW,
    )


@pytest.mark.parametrize(
    "flavour,leases,exact", [("static", False, False), ("static", False, True), ("elastic", True, True)]
)
def test_status_at_80_columns_keeps_every_number(flavour, leases, exact):
    from cg.status import status_table

    st = _status(flavour, leases=leases, exact=exact)
    text = _render(status_table(st, now=NOW, width=WIDTH))
    numbers: list[int | str] = [st.messages, st.last_seq, st.max_members]
    for m in st.members:
        numbers += [m.pending]
        assert m.pinned_id in text and m.member in text
        assert "37.0s" in text  # pinned for: an age, not a time
    if exact:
        numbers += [p.pending for p in st.partitions]  # pending by partition
    numbers += [55555]  # the unassigned partition's messages
    if leases:
        numbers += [x.pid for x in st.leases]
        for x in st.leases:  # a lease row and the pin it holds match
            assert any(x.instance in line and x.pin in line for line in text.splitlines()), x
    _assert_fits_and_keeps(text, numbers)
    # columns that are not shown are the least important ones, never a cut number
    assert "…" not in text


def test_status_at_80_columns_drops_columns_before_cutting_numbers():
    from cg.status import status_table

    st = _status()
    wide = _render(status_table(st, now=NOW, width=200), width=200)
    narrow = _render(status_table(st, now=NOW, width=WIDTH))
    assert "redelivered" in wide and "acked to seq" in wide and "43210" in wide
    header = next(line for line in narrow.splitlines() if line.startswith("member "))
    assert header.split()[:3] == ["member", "partitions", "pinned"]
    assert "acked to seq" not in header and "9876543210" not in narrow  # dropped, not folded
    left_out = narrow.split("left out to fit 80 columns: ", 1)[1]
    assert left_out.startswith("acked to seq"), narrow  # and the footer says so
    assert "redelivered" in wide.split("\n", 2)[1] and "left out" not in wide


def test_status_keeps_redelivered_when_only_acked_to_seq_does_not_fit():
    """Automatic members' generated names (auto-<8 hex>) widen the table: the widest, least telling
    column goes first, redelivered stays; one member is '1 member'."""
    from dataclasses import replace

    from cg.status import status_table

    st = _status("elastic", members=1)
    st = replace(st, members=[replace(m, member="auto-1a2b3c4d-long") for m in st.members])
    text = _render(status_table(st, now=NOW, width=WIDTH))
    header = next(line for line in text.splitlines() if line.startswith("member "))
    assert "redelivered" in header and "acked to seq" not in header, text
    assert "1 member (mapped)" in " ".join(text.split()), text


def test_status_plain_lines_show_totals_once_per_member():
    from cg.status import plain_lines

    st = _status("elastic", leases=True, exact=True)
    lines = plain_lines(st, now=NOW)
    member_rows = [line for line in lines if line.startswith("member-with-a-long-name-")]
    assert len(member_rows) == 3 + 3  # the member table and the lease table
    assert sum("1234567" in line.split() for line in lines) == 1  # a member's total, once
    assert lines[1].split()[:4] == ["MEMBER", "PARTITIONS", "PINNED-FOR", "PENDING"]
    assert "0-3" in lines[2] and "37.0s" in lines[2]


def test_info_and_ls_at_80_columns():
    from cg import output
    from pcgroups.config import ElasticConfig, MemberMapping, PartitioningFilter

    cfg = ElasticConfig(
        max_members=1000,
        partitioning_filters=[PartitioningFilter("orders.*.*", [1, 2])],
        max_buffered_msgs=123456789,
        max_buffered_bytes=1073741824,
        member_mappings=[
            MemberMapping("member-with-a-long-name-1", [*list(range(0, 700)), 999]),
            MemberMapping("m2", list(range(700, 999))),
        ],
    )
    text = _render(*output._pretty_info("elastic", "ORDERS", "billing", cfg, ["m2"], None))
    _assert_fits_and_keeps(text, [1000, 123456789, 1073741824, "0-699", 999, "700-998"])
    assert "member-with-a-long-name-1" in text


def test_table_titles_stay_on_one_line_above_narrow_tables():
    """``ls`` of one short group, ``info`` of a small group: the title is one line, not a word a line."""
    from cg import output
    from pcgroups.config import ElasticConfig, StaticConfig

    for kind in ("static", "elastic"):
        text = _render(output.groups_table(kind, "foo", ["cg"]))
        assert text.splitlines()[0].strip() == f"{kind} consumer groups on stream foo", text
        _assert_fits_and_keeps(text, [])
    static = StaticConfig(max_members=2, members=["a"])
    elastic = ElasticConfig(max_members=2, members=["a"], partitioning_filters=[])
    for kind, cfg in (("static", static), ("elastic", elastic)):
        lines = _render(*output._pretty_info(kind, "foo", "g", cfg, [], None)).splitlines()
        assert lines[0].strip() == f"{kind} consumer group g on stream foo", lines
        assert any(line.strip() == "members (balanced)" for line in lines), lines


def test_a_membership_change_at_80_columns():
    from cg.changes import change_summary
    from pcgroups.config import ElasticConfig

    before = ElasticConfig(max_members=1000, members=[f"member-with-a-long-name-{i}" for i in range(3)])
    after = ElasticConfig(max_members=1000, members=[*before.members, "m4"])
    text = _render(*change_summary("elastic", "ORDERS", "billing", "added m4", before, after))
    _assert_fits_and_keeps(text, [1000, "0-249", "333-499", "666-749", 999, 502])
    flat = " ".join(text.split())
    assert "member-with-a-long-name-2 -> member-with-a-long-name-0" in flat and flat.count("m4") >= 2


def test_demo_summary_at_80_columns_keeps_the_verdicts_and_numbers():
    from cg.demo.script import DemoResult, Move, Takeover
    from cg.demo.summary import summary
    from pcgroups.testing._checker import Report

    reports = {
        "static": Report(calls=123457, processed=123456, expected=123456, redelivered=1, redelivery_bound=1),
        "elastic": Report(calls=123460, processed=123456, expected=123456, redelivered=4, redelivery_bound=3),
    }
    takeovers = [
        Takeover("static m1", 0, victim="m1-a", by="m1-b", after=1.04, partitions=[0, 1]),
        Takeover(
            "add e3",
            0,
            victim="e3",
            by="e2-b e3-a",
            after=0.42,
            moves=[
                Move(2, "e1", "e2", 0.13, "e2-b"),
                Move(4, "e2", "e3", 0.12, "e3-a"),
                Move(5, "e2", "e3", 0.42, "e3-a"),
            ],
        ),
    ]
    result = DemoResult(
        exit_code=1,
        reports=reports,
        published={"static": 123456, "elastic": 123456},
        takeovers=takeovers,
        failures=["elastic: 4 redeliveries, more than the bound of 3"],
        elapsed=36.2,
    )
    text = _render(*summary(result, 2.0))
    _assert_fits_and_keeps(text, [123456, 123457, 123460, 1.04, 0.13, 0.42, 36.2, "4-5"])
    assert "PASS" in text and "FAIL" in text  # each group's verdict, whole
    assert "handler calls = processed + redelivered" in text
    rows = [line.split() for line in text.splitlines()]
    assert ["add", "e3", "2", "e1", "e2-b", "0.13s"] in rows and ["add", "e3", "4-5", "e2", "e3-a", "0.42s"] in rows


def test_the_demo_view_shows_no_rate_where_no_instance_runs():
    """Acks of the last two seconds count in msg/s only where a pinned instance runs: once every instance
    stopped (the last frame) each partition's rate is 0."""
    import time

    from cg.demo.run import Demo
    from cg.demo.view import View

    d = Demo(
        duration=12, console=Console(file=io.StringIO(), width=WIDTH), rate=100, ack_wait=None, work=0.0, live=False
    )
    view = View(d)
    now = time.time()
    for i in range(40):
        d.recorders["static"].record("m1", "m1-a", 0, i, now - 1.0, now - 0.5)
    assert view.rates("static")[0] == 20  # what the view had while m1-a ran
    text = _render(view._group_table("static"))
    row = next(line.split() for line in text.splitlines() if line.split()[:2] == ["0", "m1"])
    assert row[2:5] == ["no", "instance", "0"], text
    header = _render(view.render()).splitlines()[0]
    assert "(ends by 12s)" in header and " / " not in header, header  # the planned bound, said as one


def test_every_table_has_the_one_style():
    """``ls``, ``info``, ``reset``'s plan, a membership change, ``status`` and the demo's summary: no box, a rule
    under the header, as ``status`` always drew them (no heavy or boxed tables beside them)."""
    from cg import output
    from cg.changes import change_summary
    from cg.demo.script import DemoResult
    from cg.demo.summary import summary
    from cg.offsets import plan_table
    from cg.status import status_table
    from pcgroups.config import ElasticConfig, StaticConfig
    from pcgroups.ops._offsets import MemberMove, ResetPlan
    from pcgroups.testing._checker import Report

    plan = ResetPlan("static", "foo", "cg", "earliest", members=[MemberMove("m1", [0, 1], now=5, after=1, replay=4)])
    result = DemoResult(
        exit_code=0,
        reports={"static": Report(calls=3, processed=3, expected=3)},
        published={"static": 3},
        takeovers=[],
        failures=[],
        elapsed=12.0,
    )
    renderables = [
        output.groups_table("static", "foo", ["cg", "kc"]),
        *output._pretty_info("static", "foo", "cg", StaticConfig(max_members=4, members=["a", "b"]), ["a"]),
        plan_table(plan),
        *change_summary(
            "elastic",
            "bar",
            "cg",
            "added m2",
            ElasticConfig(max_members=4, members=["m1"]),
            ElasticConfig(max_members=4, members=["m1", "m2"]),
        ),
        status_table(_status(), now=NOW, width=WIDTH),
        *summary(result, 2.0),
    ]
    text = _render(*renderables)
    boxed = [line for line in text.splitlines() if set(line) & set("┏┃┡━│┌└┬┼╇┳")]
    assert not boxed, "\n".join(boxed)
    rules = [line.strip() for line in text.splitlines() if line.strip() and set(line.strip()) == {"─"}]
    assert len(rules) >= 5, text  # members, plan, moves, status' members and pins, the demo's


@pytest.mark.parametrize("passed", [True, False])
def test_the_demo_ends_with_its_verdict_and_figures_on_a_24_row_screen(passed):
    """A run's summary at 80 columns (its kills and membership changes, a failure when it fails): the last
    24 lines, the screen the demo ends with, hold every count of both groups and the verdict, last."""
    from cg.demo.script import DemoResult, Move, Takeover
    from cg.demo.summary import summary
    from pcgroups.testing._checker import Report

    redelivered = 2 if passed else 4
    reports = {
        "static": Report(calls=2684, processed=2683, expected=2683, redelivered=1, redelivery_bound=2),
        "elastic": Report(
            calls=2683 + redelivered, processed=2683, expected=2683, redelivered=redelivered, redelivery_bound=3
        ),
    }
    takeovers = [
        Takeover("static m1", 0, victim="m1-a", by="m1-b", after=1.04, partitions=[0, 1]),
        Takeover("elastic e2", 0, victim="e2-a", by="e2-b", after=1.21, partitions=[2, 3]),
        Takeover(
            "add e3",
            0,
            victim="e3",
            by="e2-b e3-a",
            after=0.42,
            moves=[
                Move(2, "e1", "e2", 0.13, "e2-b"),
                Move(4, "e2", "e3", 0.12, "e3-a"),
                Move(5, "e2", "e3", 0.42, "e3-a"),
            ],
        ),
        Takeover(
            "drop e1",
            0,
            victim="e1",
            by="e2-b e3-a",
            after=0.31,
            moves=[
                Move(0, "e1", "e2", 0.2, "e2-b"),
                Move(1, "e1", "e2", 0.31, "e2-b"),
                Move(3, "e2", "e3", 0.11, "e3-a"),
            ],
        ),
    ]
    failures = [] if passed else ["elastic: 4 redeliveries, more than the bound of 3"]
    result = DemoResult(
        exit_code=0 if passed else 1,
        reports=reports,
        published={"static": 2683, "elastic": 2683},
        takeovers=takeovers,
        failures=failures,
        elapsed=31.2,
    )
    screen = _render(*summary(result, 2.0)).rstrip("\n").splitlines()[-24:]
    assert screen[-1] == ("PASS: every check passed (31.2s)" if passed else "FAIL: some checks failed (31.2s)")
    rows = {line.split("  ")[0]: line.split() for line in screen if line and not line.startswith(" ")}
    for name in (
        "published",
        "processed (acked)",
        "handler calls",
        "redelivered (allowed)",
        "lost",
        "overlapping calls",
        "out of order",
        "result",
    ):
        assert name in rows, "\n".join(screen)
    assert rows["published"][-2:] == ["2683", "2683"] and rows["lost"][-2:] == ["0", "0"]
    assert any("no loss" in line and "exclusivity" in line for line in screen)  # the checks, one line
