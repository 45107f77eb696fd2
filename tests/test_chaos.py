"""The chaos scenarios of tests/chaos.py at their CI size, asserted on the checker's invariants.

Each scenario runs its own nats-server and member processes (all stopped afterwards) and is bounded
in time; ``scripts/chaos --long`` runs the long size and prints the table of docs/RELIABILITY.md.
"""

from __future__ import annotations

import pytest

from pcgroups.session import pinned_ttl

from .chaos import ACK_WAIT, SIZES, Result, percentile, run_scenario, table

TTL = pinned_ttl(ACK_WAIT)
pytestmark = pytest.mark.slow   # run by ./scripts/test like every test; -m "not slow" leaves them out


def _check_common(r: Result) -> None:
    assert r.messages > 0, r
    assert r.lost == 0, (r.failures, r.examples)
    assert r.redelivery_bound is None or r.redelivered <= r.redelivery_bound, (r.failures, r.examples)
    assert r.ok, (r.failures, r.examples)


async def _run(name: str) -> list[Result]:
    rows = await run_scenario(name, SIZES[name][0])
    print("\n" + table(rows))
    for r in rows:
        print(r.scenario, r.extra)
    return rows


@pytest.mark.timeout(90)
@pytest.mark.parametrize("flavour", ["static", "elastic"])
async def test_sigkill_of_the_pinned_instance_repeated(flavour):
    """SIGKILL m1's pinned instance under traffic (a new one started each time): nothing lost, no overlap,
    order kept, at most the killed call redelivered, a standby takes over within about PinnedTTL."""
    [r] = await _run(f"sigkill-{flavour}")
    _check_common(r)
    assert r.overlaps == 0 and r.order_violations == 0
    assert len(r.takeover) == r.runs and max(r.takeover) < 3 * TTL, r.takeover


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", ["sigstop-static", "sigstop-elastic", "sigstop-buffered", "sigstop-keyed"])
async def test_sigstop_longer_than_pinned_ttl_then_sigcont(name):
    """A paused pinned instance loses its pin; once resumed it starts nothing, drops what it buffered, and
    its handler in flight learns it was superseded (it does not ack). The only overlap is that frozen call."""
    [r] = await _run(name)
    _check_common(r)
    assert r.extra["starts_after_resume"] == 0
    assert r.extra["paused_inflight_acked"] == 0
    assert r.extra["other_overlaps"] == 0, r.examples
    assert r.overlaps == 0 or r.extra["paused_inflight_calls"] >= 1
    if r.extra["window"] == 1:
        assert r.order_violations == 0, r.examples
    assert max(r.takeover) < 3 * TTL, r.takeover


@pytest.mark.timeout(90)
async def test_nats_server_restart_mid_run():
    """The server (file storage) stopped and started again under traffic: instances reconnect and go on."""
    rows = await _run("server-restart")
    assert {r.scenario for r in rows} == {"server-restart-static", "server-restart-elastic"}
    for r in rows:
        _check_common(r)
        assert r.overlaps == 0 and r.order_violations == 0
        assert r.extra["reconnects"] >= 3   # every instance reconnected
        assert max(r.takeover) < 10, r.takeover


@pytest.mark.timeout(120)
async def test_membership_changes_under_traffic():
    """Adds, drops and mapping changes of an elastic group under traffic: no loss, no overlap, order kept."""
    [r] = await _run("membership")
    _check_common(r)
    assert r.overlaps == 0 and r.order_violations == 0
    assert len(r.takeover) == r.runs and max(r.takeover) < 10, r.takeover


@pytest.mark.timeout(90)
async def test_step_down_storm():
    rows = await _run("stepdown-storm")
    for r in rows:
        _check_common(r)
        assert r.overlaps == 0 and r.order_violations == 0
        assert r.extra["pins"] >= 2                   # the pin did move between instances
        assert max(r.takeover) < 3 * TTL, r.takeover  # a step-down moves the pin at once (p99 0.1 s)


@pytest.mark.timeout(90)
async def test_handler_slower_than_ack_wait():
    """With in_progress() (or pcgroups' automatic +WPI) a handler 1.6 x AckWait long is never redelivered;
    with neither, the server redelivers while it runs, but no message is handled twice."""
    rows = {r.scenario: r for r in await _run("slow-handler")}
    for r in rows.values():
        _check_common(r)
        assert r.overlaps == 0 and r.order_violations == 0
        assert r.redelivered == 0   # no handler call for a message twice
    assert rows["slow-in-progress"].extra["server_redeliveries"] == 0
    assert rows["slow-auto-progress"].extra["server_redeliveries"] == 0
    # without +WPI the server redelivers while the handler runs; the copy is dropped once the original is acked
    assert rows["slow-no-progress"].extra["server_redeliveries"] > 0


def test_percentile_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert percentile(list(map(float, range(1, 101))), 99) == 99.0
    assert percentile([1.0, 2.0], 99) == 2.0
