"""The chaos scenarios of tests/chaos.py at their CI size, asserted on the checker's invariants.

Each scenario runs its own nats-server and member processes (all stopped afterwards) and is bounded
in time; ``scripts/chaos --long`` runs the long size and prints the table of docs/RELIABILITY.md.
"""

from __future__ import annotations

import pytest

from pcgroups.consume._session import pinned_ttl

from .chaos import ACK_WAIT, SIZES, Result, percentile, run_scenario, table

TTL = pinned_ttl(ACK_WAIT)
pytestmark = pytest.mark.slow  # run by ./scripts/test like every test; -m "not slow" leaves them out


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
    assert r.order_violations == 0, r.examples  # a larger window too: the take-over hands out in stream order
    assert max(r.takeover) < 3 * TTL, r.takeover


@pytest.mark.timeout(90)
async def test_nats_server_restart_mid_run():
    """The server (file storage) stopped and started again under traffic: instances reconnect and go on."""
    rows = await _run("server-restart")
    assert {r.scenario for r in rows} == {"server-restart-static", "server-restart-elastic"}
    for r in rows:
        _check_common(r)
        assert r.overlaps == 0 and r.order_violations == 0
        assert r.extra["reconnects"] >= 3  # every instance reconnected
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
        assert r.extra["pins"] >= 2  # the pin did move between instances
        assert max(r.takeover) < 3 * TTL, r.takeover  # a step-down moves the pin at once (p99 0.1 s)


@pytest.mark.timeout(90)
async def test_handler_slower_than_ack_wait():
    """With in_progress() (or pcgroups' automatic +WPI) a handler 1.6 x AckWait long is never redelivered;
    with neither, the server redelivers while it runs, but no message is handled twice."""
    rows = {r.scenario: r for r in await _run("slow-handler")}
    for r in rows.values():
        _check_common(r)
        assert r.overlaps == 0 and r.order_violations == 0
        assert r.redelivered == 0  # no handler call for a message twice
    assert rows["slow-in-progress"].extra["server_redeliveries"] == 0
    assert rows["slow-auto-progress"].extra["server_redeliveries"] == 0
    # without +WPI the server redelivers while the handler runs; the copy is dropped once the original is acked
    assert rows["slow-no-progress"].extra["server_redeliveries"] > 0


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", ["partition-static", "partition-elastic"])
async def test_pinned_instance_cut_off_mid_handler_then_healed(name):
    """The pinned instance's link blackholed 0.1 s into a 1.5 s call: the standby takes over, the cut-off call
    learns it was superseded within PinnedTTL and does not ack; once healed the instance starts nothing (a
    standby); nothing lost, nothing handled twice but that call."""
    [r] = await _run(name)
    _check_common(r)
    assert r.overlaps == 0 and r.order_violations == 0, r.examples
    assert r.extra["inflight_calls"] == r.runs and r.extra["inflight_acked"] == 0
    assert max(r.extra["superseded_after_s"]) < TTL + 0.5, r.extra
    assert r.extra["starts_after_heal"] == 0
    assert r.redelivered <= r.runs
    assert max(r.takeover) < 3 * TTL, r.takeover


@pytest.mark.timeout(90)
async def test_slow_link_keeps_the_pin():
    """200 ms more each way under the pinned instance: it keeps the pin (no flapping), no call is superseded."""
    [r] = await _run("slow-link")
    _check_common(r)
    assert r.extra["pin_moves"] == 0 and r.extra["superseded_calls"] == 0
    assert min(r.extra["calls_on_slow_link"]) > 0  # it went on handling m1's messages over the slow link
    assert r.overlaps == 0 and r.order_violations == 0 and r.redelivered == 0


@pytest.mark.timeout(90)
async def test_connections_closed_every_few_seconds():
    rows = await _run("server-closes")
    for r in rows:
        _check_common(r)
        assert r.overlaps == 0 and r.order_violations == 0
        assert r.extra["reconnects"] >= 3 * r.runs  # every instance reconnected after every close
        assert max(r.takeover) < 3 * TTL, r.takeover


@pytest.mark.timeout(150)
async def test_cluster_node_cut_off_from_the_other_two():
    """n3's routes blackholed (process alive): the groups go on on n1 and n2, the instances connected to n3 move
    there, nothing is lost or overlaps; then the partition heals."""
    rows = await _run("cluster-partition")
    for r in rows:
        _check_common(r)
        assert r.overlaps == 0 and r.order_violations == 0
        assert r.extra["not_moved"] == 0 and len(r.extra["moved_after_s"]) >= 4
        assert max(r.takeover) < 30, r.takeover


def test_percentile_nearest_rank():
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert percentile(list(map(float, range(1, 101))), 99) == 99.0
    assert percentile([1.0, 2.0], 99) == 2.0


@pytest.mark.timeout(90)
async def test_stepdown_with_key_concurrency_never_runs_a_key_on_two_instances():
    """Single step-downs of a member whose instances run 4 keys at once (0.2 s calls): the new pin holder starts
    no key while the old one still runs a call (the old calls finish and ack), and each key keeps its order."""
    rows = await _run("stepdown-keyed")
    assert {r.scenario for r in rows} == {"stepdown-keyed-static", "stepdown-keyed-elastic"}
    for r in rows:
        _check_common(r)
        assert r.overlaps == 0 and r.order_violations == 0 and r.duplicates == 0, r.examples
        assert r.extra["pins"] == 2 and len(r.takeover) == r.runs and max(r.takeover) < 3 * TTL, r.takeover


@pytest.mark.timeout(90)
async def test_a_killed_pool_workers_message_runs_elsewhere_within_the_bound():
    """SIGKILL of a pool worker mid-call: its message runs on another worker within 3 s (REVOKE_AFTER 2 s plus a
    heartbeat), nothing lost, each key in order, no key on two workers at once."""
    [r] = await _run("pool-sigkill-worker")
    _check_common(r)
    assert r.overlaps == 0 and r.order_violations == 0, r.examples
    assert len(r.takeover) == r.runs and max(r.takeover) < 3.0, r.takeover


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flavour", ["static", "elastic"])
async def test_the_dispatchers_standby_takes_over_with_the_same_workers(flavour):
    """SIGKILL of the pinned dispatching instance: its standby takes over and the workers, not restarted, serve it;
    nothing lost, no key on two workers at once, each key in order."""
    [r] = await _run(f"pool-sigkill-dispatcher-{flavour}")
    _check_common(r)
    assert r.overlaps == 0 and r.order_violations == 0, r.examples
    assert r.extra["worker_names"] == ["w0", "w1", "w2"]
    assert max(r.takeover) < 3 * TTL + 3.0, r.takeover  # PinnedTTL, then the dead one's calls and AckWait


@pytest.mark.timeout(90)
async def test_workers_started_and_stopped_at_will_lose_and_repeat_nothing():
    """Workers started and SIGTERMed under traffic: each stopped one finishes its calls and exits 0, a new one gets
    work at once, nothing is lost or handled twice."""
    [r] = await _run("pool-churn")
    _check_common(r)
    assert r.overlaps == 0 and r.order_violations == 0 and r.redelivered == 0, r.examples
    assert r.extra["calls_left_open"] == 0
    assert max(r.takeover) < 1.0, r.takeover


@pytest.mark.timeout(120)
async def test_a_server_restart_takes_no_message_back_from_a_worker_going_on_with_it():
    """The server stopped longer than REVOKE_AFTER while workers run 3 s calls that look at msg.superseded only at
    their end (as cg's do): the dispatcher declares nobody gone for the outage, so no key runs twice at once."""
    [r] = await _run("pool-server-restart")
    _check_common(r)
    assert r.overlaps == 0 and r.order_violations == 0, r.examples


@pytest.mark.timeout(90)
async def test_a_frozen_worker_does_not_ack_what_ran_elsewhere():
    """A worker frozen (SIGSTOP) 3 s mid-call: its message runs elsewhere after REVOKE_AFTER; resumed, its call
    learns it was superseded and does not ack. The only overlap is that frozen call."""
    [r] = await _run("pool-sigstop-worker")
    _check_common(r)
    assert r.extra["frozen_acked"] == 0 and r.extra["frozen_outcomes"] == ["superseded"] * r.runs
    assert r.order_violations == 0, r.examples


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "name",
    [
        "pool-sigstop-dispatcher-key-static",
        "pool-sigstop-dispatcher-key-elastic",
        "pool-sigstop-dispatcher-burst-static",
        "pool-sigstop-dispatcher-burst-elastic",
    ],
)
async def test_a_dispatcher_paused_past_its_pin_offers_nothing_again(name):
    """SIGSTOP of the pinned dispatching instance for longer than PinnedTTL (one key, or mid-burst): the standby
    adopts the calls the workers run, the resumed one offers nothing again: no message acked twice, no key on two
    workers, order kept, nothing run again."""
    [r] = await _run(name)
    _check_common(r)
    assert r.duplicates == 0 and r.overlaps == 0 and r.order_violations == 0 and r.redelivered == 0, r.examples


@pytest.mark.timeout(120)
async def test_a_server_restart_under_two_dispatchers_acks_nothing_twice():
    """The server restarted under two dispatching instances and 3 s calls: whichever holds the pin afterwards adopts
    the calls in flight, the other offers nothing again."""
    [r] = await _run("pool-server-restart-2d")
    _check_common(r)
    assert r.duplicates == 0 and r.overlaps == 0 and r.order_violations == 0, r.examples


@pytest.mark.timeout(120)
async def test_calls_running_when_their_dispatcher_dies_ack_through_its_successor():
    """SIGKILL of the pinned dispatching instance under 2.5 s calls: the calls go on and ack (through the standby,
    which adopts them); none runs again."""
    [r] = await _run("pool-sigkill-dispatcher-long")
    _check_common(r)
    assert r.extra["inflight"] == r.extra["inflight_acked"] > 0 and r.extra["run_again"] == 0, r.failures
    assert r.duplicates == 0 and r.overlaps == 0 and r.order_violations == 0, r.examples


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flavour", ["static", "elastic"])
async def test_a_poison_message_survives_the_pinned_instance_killed_while_it_retries_and_dead_letters(flavour):
    """A message that always fails (strict path, park_keys): SIGKILL of the pinned instance while it retries it, then of
    the next one between a parked key's dead letter and its +TERM: every other message acked once, in order; the
    failing message and its key's later ones in the dead-letter stream once each (the killed holder's dead letter,
    published again by the next one, is one entry), in order; none of them ran."""
    [r] = await _run(f"poison-{flavour}")
    _check_common(r)
    assert r.duplicates == 0 and r.order_violations == 0 and r.overlaps == 0, r.examples
    assert r.extra["dead_letters"] == 3 * r.runs and r.extra["stored_again"] >= r.runs, r.extra


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flavour", ["static", "elastic"])
async def test_a_key_dead_lettered_and_parked_across_kills_is_replayed_in_order(flavour):
    """One key always fails while its owner's pinned instance is SIGKILLed (the first kill at its first failure):
    the other messages are handled as usual; the key's first message is dead-lettered once, the later ones follow
    it, unrun, in order; replayed after the fix, they run once each, in order, and the dead-letter stream empties."""
    [r] = await _run(f"replay-{flavour}")
    _check_common(r)
    assert r.overlaps == 0 and r.order_violations == 0, r.examples
    assert r.extra["dead_lettered"] >= 2 and r.extra["replayed"] >= r.extra["dead_lettered"], r.extra
