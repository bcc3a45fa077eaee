"""Held turns at the edges: a second request of a held turn, a placement call, idle expiry, shutdown, and the room
that letting a GRPO group's members go frees (pure). Each test fails on the code before its fix (found by an
independent review's pressure fuzzer)."""

from __future__ import annotations

from rolloutpool.routing.events import Bound, Event, Held, Rejected, Released, Resumed, Withdrawn
from rolloutpool.routing.ledger import Ledger
from rolloutpool.routing.policies import Placement
from rolloutpool.routing.workingset import Phase, WorkingSet
from test_workingset import CONFIG, _ledger, _turn


def _held_a() -> tuple[Ledger, Held]:
    """``a`` let go to place ``c``, then ``a``'s turn returns and is held (budget 5,000 of 10,000)."""
    ledger = _ledger()
    _turn(ledger, "a", now=0.0, context=3000)
    _turn(ledger, "c", now=21.0, context=4900)
    first = ledger.arrive(Placement("a"), now=22.0)
    assert isinstance(first, Held)
    ledger.take_events()
    return ledger, first


def _answers(events: list[Event], ticket: int) -> list[Event]:
    return [e for e in events if isinstance(e, Resumed | Withdrawn) and e.ticket == ticket]


def test_every_request_of_a_held_turn_is_answered_once() -> None:
    ledger, first = _held_a()
    second = ledger.arrive(Placement("a"), now=23.0)  # another request of the same turn
    assert isinstance(second, Held)
    assert ledger.held == {"a": [first.ticket, second.ticket]}
    ledger.release("c", how="finish_session", now=24.0)  # room frees: the turn resumes, both requests with it
    events = ledger.take_events()
    assert len(_answers(events, first.ticket)) == 1
    assert len(_answers(events, second.ticket)) == 1
    assert ledger.held == {}


def test_a_second_request_of_a_held_turn_waits_with_it_and_does_not_move_the_session() -> None:
    ledger, _ = _held_a()
    ledger.add_replica("s", now=22.5, capacity_tokens=10_000)  # room elsewhere now
    ledger.take_events()
    second = ledger.arrive(Placement("a"), now=23.0)
    assert isinstance(second, Held)
    assert ledger.work is not None
    assert ledger.work.phase("a") is Phase.HELD
    assert ledger.work.sessions["a"].replica == "r"


def test_one_client_giving_up_leaves_the_other_request_of_the_turn_waiting() -> None:
    ledger, first = _held_a()
    second = ledger.arrive(Placement("a"), now=23.0)
    assert isinstance(second, Held)
    assert ledger.cancel_held("a", now=24.0, ticket=first.ticket)
    assert ledger.held == {"a": [second.ticket]}
    assert ledger.work is not None
    assert ledger.work.phase("a") is Phase.HELD  # still waits for room
    ledger.tick(now=500.0)  # past hold_limit_s: it is served
    assert len(_answers(ledger.take_events(), second.ticket)) == 1
    assert not ledger.cancel_held("a", now=501.0, ticket=first.ticket)  # answered already


def test_a_placement_call_on_a_live_session_is_not_a_turn() -> None:
    ledger = _ledger()
    _turn(ledger, "a", now=0.0, context=3000)
    assert ledger.work is not None
    counted = ledger.work.replicas["r"].counted
    placed = ledger.arrive(Placement("a", turns=False), now=1.0)  # POST /v1/sessions: no request follows
    assert isinstance(placed, Bound)
    assert ledger.work.phase("a") is Phase.IDLE
    assert ledger.work.replicas["r"].counted == counted
    _turn(ledger, "c", now=21.0, context=4900)  # a let go
    assert not isinstance(ledger.arrive(Placement("a", turns=False), now=22.0), Held)  # never blocks


def test_idle_expiry_leaves_a_session_whose_turn_is_held() -> None:
    ledger, held = _held_a()
    stale = ledger.expire(now=60.0, idle_timeout=30.0)  # c idle since 21 goes; a's request waits (38 s < 100 s)
    assert [s.session_id for s in stale] == ["c"]
    events = ledger.take_events()
    assert _answers(events, held.ticket) == [e for e in events if isinstance(e, Resumed)]  # a resumed, once
    assert "a" not in {e.session.session_id for e in events if isinstance(e, Released)}


def test_after_shutdown_a_turn_that_would_wait_is_refused_not_held() -> None:
    ledger = _ledger()
    _turn(ledger, "a", now=0.0, context=3000)
    _turn(ledger, "c", now=21.0, context=4900)  # a let go
    ledger.close()
    assert ledger.arrive(Placement("a"), now=22.0) == Rejected("shutting_down")
    assert ledger.held == {}
    assert ledger.work is not None
    assert ledger.work.phase("a") is Phase.WITHDRAWN


def test_what_letting_go_frees_counts_a_groups_shared_prompt_once() -> None:
    ws = WorkingSet(CONFIG)
    ws.add_replica("r", capacity=10_000)  # budget 5,000
    for sid in ("a", "b", "c"):
        ws.bound(sid, "r", now=0.0, first_context=1200, group="g", shared=1000)
        ws.turn_finished(sid, context=1200, now=0.0)
    work = ws.replicas["r"]
    assert work.counted == 1000 + 3 * 200  # the shared prompt once
    releasable = ws.releasable("r", now=20.0)  # every lease ended
    ws.make_room("r", 10**9, now=20.0)  # let go of all that may go
    assert releasable == 1600 - work.counted == 1600


def test_room_for_new_sessions_stays_within_the_budget_with_a_group_idle() -> None:
    ws = WorkingSet(CONFIG)
    ws.add_replica("r", capacity=10_000)
    for i in range(8):
        ws.bound(f"m{i}", "r", now=0.0, first_context=2000, group="g", shared=1900)
        ws.turn_finished(f"m{i}", context=2000, now=0.0)
    assert ws.releasable("r", now=20.0) == 1900 + 8 * 100  # not 8 x 2,000
    room = ws.room_for_new("r", now=20.0)
    budget = ws.replicas["r"].budget(CONFIG.target)
    assert room is not None
    assert budget is not None
    assert room * ws.first_context <= budget


# -- a second review: held turns of an unready replica, restored groups, a group's shared prompt, retries --------


def test_a_held_turn_of_a_replica_gone_unready_waits_or_moves_and_is_never_resumed_there() -> None:
    ledger, held = _held_a()
    ledger.set_ready("r", False, now=22.5)
    ledger.release("c", how="finish_session", now=23.0)  # room frees on r, but r serves nothing now
    ledger.tick(now=500.0)  # past hold_limit_s: still not forced onto r
    assert _answers(ledger.take_events(), held.ticket) == []
    assert ledger.held == {"a": [held.ticket]}
    ledger.add_replica("s", now=501.0, capacity_tokens=10_000)  # a ready replica with room
    ledger.tick(now=502.0)
    events = ledger.take_events()
    resumed = [e for e in _answers(events, held.ticket) if isinstance(e, Resumed)]
    assert [e.session.replica for e in resumed] == ["s"]
    assert ledger.work is not None
    assert ledger.work.sessions["a"].replica == "s"
    assert ledger.work.phase("a") is Phase.GENERATING
    assert ledger.table.sessions["a"].replica == "s"
    assert ledger.held == {}


def test_a_held_turn_waits_while_its_replica_is_unready_and_resumes_there_when_it_is_ready_again() -> None:
    ledger, held = _held_a()
    ledger.set_ready("r", False, now=22.5)
    ledger.tick(now=500.0)
    assert _answers(ledger.take_events(), held.ticket) == []
    ledger.set_ready("r", True, now=501.0)
    ledger.tick(now=502.0)  # ready again: served there (past hold_limit_s)
    resumed = [e for e in _answers(ledger.take_events(), held.ticket) if isinstance(e, Resumed)]
    assert [e.session.replica for e in resumed] == ["r"]


def test_a_held_turn_of_a_removed_replica_is_withdrawn_not_resumed() -> None:
    ledger, held = _held_a()
    ledger.remove_replica("r")
    ledger.tick(now=500.0)
    answers = _answers(ledger.take_events(), held.ticket)
    assert answers == [Withdrawn(held.ticket, "a", "released")]


def test_restored_group_members_count_their_shared_prompt_once() -> None:
    ledger = _ledger()
    for sid in ("a", "b", "c"):
        ledger.restore(sid, "r", group="g", last_seen=0.0, context=1200, prompt=1000)
    assert ledger.work is not None
    assert ledger.work.replicas["r"].counted == 1000 + 3 * 200
    assert ledger.table.sessions["a"].prompt_tokens == 1000


def test_a_group_members_turn_needs_no_room_for_the_prompt_its_group_keeps_on_the_replica() -> None:
    ws = WorkingSet(CONFIG)
    ws.add_replica("r", capacity=10_000)  # budget 5,000
    ws.bound("b", "r", now=0.0, first_context=1200, group="g", shared=1000)
    ws.turn_finished("b", context=1200, now=0.0)  # lease until 10
    ws.bound("a", "r", now=15.0, first_context=1200, group="g", shared=1000)
    ws.turn_finished("a", context=1200, now=15.0)  # lease until 25
    ws.make_room("r", 5000, now=20.0)  # b let go, a kept (the group's prompt with it)
    assert ws.phase("b") is Phase.LET_GO
    ws.bound("f", "r", now=20.0, first_context=3400)
    work = ws.replicas["r"]
    assert work.counted == 1200 + 3400
    assert ws.need("b") == 1200 + 100 - 1000  # what counting it adds: its own tokens and a turn's growth
    assert ws.arrive("b", now=21.0)  # 300 fit the 400 left: served, not held
    assert work.counted == 4900


def test_a_turn_that_lets_go_the_last_member_keeping_its_groups_prompt_needs_room_for_that_prompt_too() -> None:
    ws = WorkingSet(CONFIG)
    ws.add_replica("r", capacity=10_000)  # budget 5,000
    ws.bound("b", "r", now=0.0, first_context=1200, group="g", shared=1000)
    ws.turn_finished("b", context=1200, now=0.0)
    ws.make_room("r", 5000, now=20.0)  # b let go
    ws.bound("a", "r", now=0.0, first_context=1200, group="g", shared=1000)
    ws.turn_finished("a", context=1200, now=0.0)  # idle past its lease at 21: a keeps the group's prompt
    assert (ws.phase("b"), ws.phase("a")) == (Phase.LET_GO, Phase.IDLE)
    ws.bound("f", "r", now=20.0, first_context=3800)  # 5,000 counted: a's room is the only room
    assert not ws.arrive("b", now=21.0)  # letting a go frees 1,200 but b then needs 1,300: held, not over the budget
    assert ws.replicas["r"].counted <= 5000


def test_a_retry_after_a_withdrawn_turn_is_not_taken_for_a_tool_time() -> None:
    ledger, held = _held_a()  # a's gap (22 s) was observed when its turn arrived
    assert ledger.work is not None
    tool = ledger.work.tool
    gaps = tool.sessions["a"].n, tool.count
    assert ledger.cancel_held("a", now=30.0, ticket=held.ticket)  # its client gave up
    ledger.arrive(Placement("a"), now=31.0)  # and retries the same turn
    assert (tool.sessions["a"].n, tool.count) == gaps
