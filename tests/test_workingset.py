"""The turn scheduler's working sets (routing/workingset.py) and the ledger's held turns (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rolloutpool.routing.caps import CapRule
from rolloutpool.routing.events import Bound, Held, Placed, Resumed, Withdrawn
from rolloutpool.routing.ledger import Ledger, LedgerConfig, Usage
from rolloutpool.routing.policies import Placement, SessionAware
from rolloutpool.routing.workingset import Phase, WorkingSet, WorkingSetConfig

CONFIG = WorkingSetConfig(
    target=0.5,
    limit=1.0,
    keep_s=10.0,
    keep_quantile=None,
    prefill_tokens_per_s=None,
    hold_limit_s=100.0,
    fair_after_s=30.0,
    growth=100,
)


def _set(capacity: int = 10_000) -> WorkingSet:
    ws = WorkingSet(CONFIG)
    ws.add_replica("r", capacity=capacity)
    return ws


def _idle(ws: WorkingSet, sid: str, context: int, *, now: float) -> None:
    ws.bound(sid, "r", now=now, first_context=context)
    ws.turn_finished(sid, context=context, now=now)


def test_a_kept_session_is_served_and_an_old_idle_one_is_let_go_for_a_returning_turn() -> None:
    ws = _set()  # budget 5,000 tokens
    _idle(ws, "a", 2000, now=0.0)
    _idle(ws, "b", 2000, now=5.0)
    assert ws.free("r") == 1000
    assert ws.arrive("b", now=6.0)  # kept: served at once, with its turn's growth counted
    assert ws.phase("b") is Phase.GENERATING
    assert ws.free("r") == 900
    ws.turn_finished("b", context=2200, now=7.0)
    _idle(ws, "c", 2500, now=8.0)  # over the target now: a and b are younger than keep_s, kept
    assert ws.free("r") == -1700
    assert ws.make_room("r", 0, now=11.0)  # a idle 11 s: let go, the oldest first
    assert ws.phase("a") is Phase.LET_GO
    assert ws.free("r") == 300


def test_a_let_go_turn_that_does_not_fit_is_held_then_resumed_when_room_frees() -> None:
    ws = _set()
    _idle(ws, "a", 3000, now=0.0)
    ws.make_room("r", 5000, now=20.0)  # a is let go
    assert ws.phase("a") is Phase.LET_GO
    _idle(ws, "b", 4500, now=21.0)
    assert not ws.arrive("a", now=22.0)  # needs 3,100, 500 free and b is too young to let go
    assert ws.phase("a") is Phase.HELD
    assert ws.held("r") == 1
    assert ws.resume("r", now=25.0) == []
    assert ws.resume("r", now=31.0) == ["a"]  # b idle 10 s: let go, a fits
    assert ws.phase("a") is Phase.GENERATING
    assert ws.phase("b") is Phase.LET_GO
    assert ws.replicas["r"].resumes == 1


def test_a_held_turn_goes_at_the_hold_limit_whatever_the_room() -> None:
    ws = _set()
    _idle(ws, "a", 3000, now=0.0)
    ws.make_room("r", 5000, now=20.0)
    ws.bound("b", "r", now=21.0, first_context=4900)  # generating: never let go
    assert not ws.arrive("a", now=22.0)
    assert ws.resume("r", now=121.0) == []
    assert ws.resume("r", now=122.0) == ["a"]  # waited hold_limit_s
    assert ws.replicas["r"].forced == 1


def test_over_the_limit_idle_sessions_are_let_go_however_young() -> None:
    ws = _set()
    for i in range(5):
        _idle(ws, f"s{i}", 2400, now=float(i))
    assert ws.free("r") == -7000
    assert ws.arrive("s4", now=5.0)  # 12,100 past the limit (10,000): s0 goes, young as it is, and that suffices
    assert [ws.phase(f"s{i}") for i in range(5)] == [Phase.LET_GO] + [Phase.IDLE] * 3 + [Phase.GENERATING]
    assert ws.replicas["r"].counted == 9_700


def test_fairness_no_younger_turn_passes_a_head_that_waited_long() -> None:
    ws = _set()
    _idle(ws, "big", 4000, now=0.0)
    _idle(ws, "small", 500, now=0.0)
    ws.make_room("r", 5000, now=20.0)  # both let go
    ws.bound("g", "r", now=20.0, first_context=4000)  # generating: 1,000 free
    assert not ws.arrive("big", now=21.0)
    assert not ws.arrive("small", now=22.0)  # a turn is held behind held turns
    assert ws.resume("r", now=23.0) == ["small"]  # the head does not fit, and has not waited long: passed
    ws.turn_finished("small", context=600, now=24.0)
    ws.make_room("r", 5000, now=40.0)
    assert not ws.arrive("small", now=60.0)
    assert ws.resume("r", now=61.0) == []  # big waited 40 s (fair_after_s 30): nobody passes it


def test_room_for_new_sessions_counts_what_could_be_let_go_and_none_while_turns_are_held() -> None:
    ws = _set()
    _idle(ws, "a", 2000, now=0.0)
    assert ws.room_for_new("r", now=1.0) == 1  # 3,000 free over a first context of 2,048: one
    assert ws.room_for_new("r", now=11.0) == 2  # a may be let go: 5,000
    ws.make_room("r", 5000, now=11.0)
    ws.bound("b", "r", now=12.0, first_context=4950)
    assert not ws.arrive("a", now=13.0)
    assert ws.room_for_new("r", now=13.0) == 0


def test_capacity_unknown_admits_nothing() -> None:
    ws = WorkingSet(CONFIG)
    ws.add_replica("r", capacity=None)
    assert ws.free("r") is None
    assert ws.room_for_new("r", now=0.0) is None
    ws.set_capacity("r", 1000)
    assert ws.free("r") == 500


def test_bad_targets_are_refused() -> None:
    with pytest.raises(ValueError, match="target <= limit"):
        WorkingSetConfig(target=1.2, limit=1.0)
    with pytest.raises(ValueError, match="keep_s"):
        WorkingSetConfig(keep_s=-1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["arrive", "finish", "release", "resume", "room"]), st.integers(0, 7), st.integers(1, 4000)
        ),
        max_size=80,
    )
)
def test_the_working_set_is_always_the_sum_of_what_its_sessions_count(ops: list[tuple[str, int, int]]) -> None:
    ws = _set(8000)
    now = 0.0
    for op, i, tokens in ops:
        now += 1.5
        sid = f"s{i}"
        phase = ws.phase(sid)
        if op == "arrive":
            if phase is None:
                ws.bound(sid, "r", now=now, first_context=tokens)
            else:
                ws.arrive(sid, now=now)
        elif op == "finish" and phase is Phase.GENERATING:
            ws.turn_finished(sid, context=tokens, now=now)
        elif op == "release":
            ws.released(sid)
        elif op == "resume":
            ws.resume("r", now=now)
        else:
            ws.make_room("r", tokens, now=now)
        work = ws.replicas["r"]
        assert work.counted == sum(t.counted for t in ws.sessions.values())
        assert list(work.held) == [s for s, t in ws.sessions.items() if t.phase is Phase.HELD] or set(work.held) == {
            s for s, t in ws.sessions.items() if t.phase is Phase.HELD
        }
        assert set(work.idle) == {s for s, t in ws.sessions.items() if t.phase is Phase.IDLE}
        assert work.out == {s for s, t in ws.sessions.items() if t.phase in (Phase.LET_GO, Phase.HELD)}
        assert work.members == len(ws.sessions)
        assert work.generating == sum(t.phase is Phase.GENERATING for t in ws.sessions.values())
        for t in ws.sessions.values():
            assert (t.counted == 0) == (t.phase in (Phase.LET_GO, Phase.HELD)) or t.phase is Phase.GENERATING


# -- the ledger: held turns as arrivals and events ----------------------------------------------------------


def _ledger(working_set: WorkingSetConfig = CONFIG) -> Ledger:
    config = LedgerConfig(caps=CapRule(), quarantine=None, working_set=working_set)
    ledger = Ledger(config, policy=SessionAware())
    ledger.add_replica("r", now=0.0, capacity_tokens=10_000)
    return ledger


def _turn(ledger: Ledger, sid: str, *, now: float, context: int) -> None:
    ledger.tick(now=now)  # the router's scrape round before it: caps follow the clock
    arrival = ledger.arrive(Placement(sid), now=now)
    assert isinstance(arrival, Bound), arrival
    ledger.turn_started(arrival.session)
    ledger.finish_turn(arrival.session, now=now, usage=Usage(context - 10, 10, 0))
    ledger.turn_ended(arrival.session, now=now)


def test_the_ledger_holds_a_turn_and_resumes_it_with_an_event_when_a_session_ends() -> None:
    ledger = _ledger()
    _turn(ledger, "a", now=0.0, context=3000)
    _turn(ledger, "b", now=11.0, context=1900)  # placing b lets a go (idle 11 s): the room b's first context needs
    assert ledger.work is not None
    assert ledger.work.phase("a") is Phase.LET_GO
    _turn(ledger, "c", now=21.0, context=4000)
    held = ledger.arrive(Placement("a"), now=22.0)  # b let go too, and still no room for a's 3,100 tokens
    assert isinstance(held, Held)
    assert ledger.work.phase("b") is Phase.LET_GO
    ledger.take_events()
    ledger.release("c", how="finish_session", now=23.0)
    resumed = [e for e in ledger.take_events() if isinstance(e, Resumed)]
    assert [(e.ticket, e.session.session_id) for e in resumed] == [(held.ticket, "a")]
    assert ledger.work.phase("a") is Phase.GENERATING


def test_a_held_turn_is_withdrawn_when_its_session_is_released_and_left_when_its_client_gives_up() -> None:
    ledger = _ledger()
    _turn(ledger, "a", now=0.0, context=3000)
    assert ledger.work is not None
    _turn(ledger, "c", now=21.0, context=4900)  # a let go to place c
    held = ledger.arrive(Placement("a"), now=22.0)
    assert isinstance(held, Held)
    assert ledger.cancel_held("a", now=23.0)
    assert ledger.work.phase("a") is Phase.WITHDRAWN  # let go, waiting for its retry
    held = ledger.arrive(Placement("a"), now=24.0)
    assert isinstance(held, Held)
    ledger.take_events()
    ledger.release("a", how="finish_session", now=25.0)
    assert Withdrawn(held.ticket, "a", "released") in ledger.take_events()
    assert "a" not in ledger.held
    assert ledger.work.phase("a") is None


def test_leases_follow_the_tool_times_learned_from_the_gaps() -> None:
    ws = WorkingSet(replace(CONFIG, keep_quantile=0.9))
    ws.add_replica("r", capacity=100_000)
    now = 0.0
    for i in range(40):  # fast tools for everyone: ~1 s
        _idle(ws, f"f{i}", 1000, now=now)
        now += 1.0
        assert ws.arrive(f"f{i}", now=now)
        ws.turn_finished(f"f{i}", context=1100, now=now)
    last = ws.sessions["f39"]
    fast = last.until - last.since
    assert 0.5 < fast < 3.0  # the prior was keep_s (10 s); the gaps say ~1 s
    _idle(ws, "slow", 1000, now=now)
    for _ in range(6):  # one session's own tool is slow: ~60 s
        now += 60.0
        assert ws.arrive("slow", now=now)
        ws.turn_finished("slow", context=1100, now=now)
    slow = ws.sessions["slow"]
    assert slow.until - slow.since > 20.0
    ws.released("slow")
    assert "slow" not in ws.tool.sessions


def test_a_prefix_is_kept_no_longer_than_its_re_prefill_would_stall_the_batch() -> None:
    # tools take ~30 s (the lease's 0.9 quantile is longer); 4,000 tokens re-prefill in 0.1 s at 40,000 tok/s
    ws = WorkingSet(replace(CONFIG, keep_s=30.0, keep_quantile=0.9, prefill_tokens_per_s=40_000.0))
    ws.add_replica("r", capacity=1_000_000)
    for i in range(8):
        ws.bound(f"g{i}", "r", now=0.0, first_context=4000)
    ws.turn_finished("g0", context=4000, now=1.0)  # 7 others generate beside it
    g0 = ws.sessions["g0"]
    assert g0.until - g0.since == pytest.approx(7 * 4000 / 40_000 * (1 + 4000 / 45_000))  # attention's share
    for i in range(1, 8):
        ws.turn_finished(f"g{i}", context=4000, now=1.0)
    g7 = ws.sessions["g7"]
    assert g7.until - g7.since == pytest.approx(4000 / 40_000 * (1 + 4000 / 45_000))  # alone: one turn's stall
    big = WorkingSet(replace(CONFIG, keep_s=30.0, keep_quantile=0.9, prefill_tokens_per_s=40_000.0))
    big.add_replica("r", capacity=10_000_000)
    for i in range(8):
        big.bound(f"g{i}", "r", now=0.0, first_context=400_000)
    big.turn_finished("g0", context=400_000, now=1.0)  # 7 x 10 s x 9.9 (attention): past the lease, which bounds it
    b0 = big.sessions["g0"]
    assert b0.until - b0.since == pytest.approx(big.tool.lease("g0", quantile=0.9))
    assert 30.0 < b0.until - b0.since < 70.0
    off = WorkingSet(replace(CONFIG, keep_s=30.0, keep_quantile=None, prefill_tokens_per_s=None))
    off.add_replica("r", capacity=1_000_000)
    _idle(off, "a", 4000, now=0.0)
    assert off.sessions["a"].until == 30.0  # no rate: the lease alone


def test_a_reference_told_the_tool_time_keeps_a_prefix_exactly_that_long_or_lets_it_go_at_once() -> None:
    # 4,000 tokens alone on the replica re-prefill in 0.1 s x (1 + 4000/45000): that is the break-even
    ws = WorkingSet(replace(CONFIG, keep_s=30.0, keep_quantile=0.9, prefill_tokens_per_s=40_000.0))
    ws.add_replica("r", capacity=1_000_000)
    ws.bound("short", "r", now=0.0, first_context=4000)
    ws.bound("long", "r", now=0.0, first_context=4000)
    ws.turn_finished("short", context=4000, now=1.0, tool_s=0.05)  # back before its re-prefill would pay
    assert ws.sessions["short"].until == pytest.approx(1.05)
    ws.turn_finished("long", context=4000, now=1.0, tool_s=5.0)  # past the break-even: may go at once
    assert ws.sessions["long"].until == 1.0
    assert ws.make_room("r", 1_000_000 // 2 - 4000 - 100, now=1.0)  # room for all but "short": only "long" goes
    assert (ws.phase("short"), ws.phase("long")) == (Phase.IDLE, Phase.LET_GO)


def test_renewal_refreshes_only_a_kept_prefix_that_is_still_cached() -> None:
    ws = _set()
    _idle(ws, "kept", 1000, now=0.0)
    ws.bound("busy", "r", now=0.0, first_context=1000)
    assert ws.renews("kept", resident=None)  # no KV events: presumed cached
    assert ws.renews("kept", resident=1000)
    assert not ws.renews("kept", resident=1000 - CONFIG.block_tolerance - 16)  # evicted: renewing would re-prefill
    assert not ws.renews("busy", resident=None)  # generating: its turn refreshes it
    assert ws.renews("unknown", resident=None)  # not scheduled: renewal as configured
    ws.turn_finished("busy", context=1000, now=1.0)
    assert ws.make_room("r", 5000 - 1000 - 100 + 1, now=100.0)  # the working set needs room: "kept" goes first
    assert (ws.phase("kept"), ws.phase("busy")) == (Phase.LET_GO, Phase.IDLE)
    assert not ws.renews("kept", resident=1000)  # let go: the engine's to evict


# -- moving once, instead of waiting -------------------------------------------------------------------------


def test_a_turn_that_would_wait_moves_once_to_a_replica_with_room() -> None:
    ledger = _ledger()
    _turn(ledger, "a", now=0.0, context=3000)
    _turn(ledger, "c", now=21.0, context=4900)  # a let go to place c: r's 5,000-token target is full
    ledger.add_replica("s", now=21.5, capacity_tokens=10_000)
    ledger.take_events()
    moved = ledger.arrive(Placement("a"), now=22.0)  # a's prefix is not known to be resident on r
    assert isinstance(moved, Bound)
    assert moved.session.replica == "s"
    assert moved.session.context_tokens == 3000  # what it knew of its context goes with it
    assert [(e.kind, e.session.replica) for e in ledger.take_events() if isinstance(e, Placed)] == [("moved", "s")]
    work = ledger.work
    assert work is not None
    assert work.phase("a") is Phase.GENERATING
    assert work.replicas["s"].moves == 1
    assert work.replicas["s"].counted == 3000 + 100  # its context and a turn's growth, on its new replica
    assert "a" not in work.replicas["r"].out
    assert ledger.table.replicas["r"].live == 1  # c
    assert work.sessions["a"].moved
    assert work.move_target("a", ["r", "s"], resident=None, now=23.0) is None  # it is generating, and moved once


def test_no_move_when_the_prefix_is_resident_or_moving_is_off_or_nowhere_has_room() -> None:
    off = _ledger(replace(CONFIG, move=False))
    _turn(off, "a", now=0.0, context=3000)
    _turn(off, "c", now=21.0, context=4900)
    off.add_replica("s", now=21.5, capacity_tokens=10_000)
    assert isinstance(off.arrive(Placement("a"), now=22.0), Held)

    full = _ledger()
    _turn(full, "a", now=0.0, context=3000)
    _turn(full, "c", now=21.0, context=4900)
    full.add_replica("s", now=21.5, capacity_tokens=4_000)  # a target of 2,000 tokens: a's 3,100 do not fit
    assert isinstance(full.arrive(Placement("a"), now=22.0), Held)

    ws = WorkingSet(CONFIG)
    for name in ("r", "s"):
        ws.add_replica(name, capacity=10_000)
    ws.bound("a", "r", now=0.0, first_context=3000)
    ws.turn_finished("a", context=3000, now=0.0)
    ws.bound("c", "r", now=11.0, first_context=1000)
    ws.make_room("r", 5000, now=11.0)  # a let go
    ws.bound("d", "r", now=11.0, first_context=4500)
    assert not ws.arrive("a", now=12.0)  # held
    assert ws.move_target("a", ["r", "s"], resident=2990, now=12.0) is None  # its blocks are still on r
    assert ws.move_target("a", ["r", "s"], resident=0, now=12.0) == "s"
    assert ws.move_target("a", ["r"], resident=None, now=12.0) is None  # s may not take sessions


def test_an_empty_replica_takes_a_session_however_small_its_cache_against_the_estimate() -> None:
    ws = WorkingSet(WorkingSetConfig(prefill_tokens_per_s=None))  # a first context of 2,048 tokens until measured
    ws.add_replica("small", capacity=1536)  # a target of 1,382 tokens: no room for one by the estimate
    assert ws.room_for_new("small", now=0.0) == 1  # never 0 on an empty replica: that would never admit anyone
    ws.bound("a", "small", now=0.0)
    assert ws.room_for_new("small", now=0.0) == 0
    ws.turn_finished("a", context=900, now=1.0)  # a waits on its tool, its prefix kept for its lease (20 s)
    assert ws.room_for_new("small", now=2.0) == 0
    assert ws.room_for_new("small", now=30.0) == 1  # its lease ended: letting it go would empty the replica


def test_a_session_replaced_off_an_unready_replica_joins_no_group() -> None:
    """Its next usage is its whole context, not its group's opening prompt: learned as the group's shared size, it
    would discount every other member on the new replica by far more than they share."""
    config = LedgerConfig(caps=CapRule(), quarantine=None, working_set=CONFIG)
    ledger = Ledger(config, policy=SessionAware())
    for name in ("r", "s"):
        ledger.add_replica(name, now=0.0, capacity_tokens=10_000)
    first = ledger.arrive(Placement("a", group="G"), now=0.0)
    assert isinstance(first, Bound)
    ledger.turn_started(first.session)
    ledger.finish_turn(first.session, now=1.0, usage=Usage(500, 100, 0))
    ledger.turn_ended(first.session, now=1.0)
    assert ledger.work is not None
    assert ledger.work.replicas[first.session.replica].groups["G"] == [1, 500]  # the opening prompt, once
    ledger.set_ready(first.session.replica, False, now=2.0)
    again = ledger.arrive(Placement("a", group="G"), now=3.0)
    assert isinstance(again, Bound)
    assert again.session.replica != first.session.replica
    assert again.session.group is None
    ledger.turn_started(again.session)
    ledger.finish_turn(again.session, now=4.0, usage=Usage(1200, 100, 0))
    ledger.turn_ended(again.session, now=4.0)
    assert not ledger.work.replicas[again.session.replica].groups
