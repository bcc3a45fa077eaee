"""The session ledger's semantics: release, reuse, one-turn sessions, FIFO admission, caps (pure, no I/O)."""

from __future__ import annotations

import pytest

from rolloutpool.routing.caps import CapRule, effective_cap
from rolloutpool.routing.discovery import OperatorLimit
from rolloutpool.routing.events import Admitted, Bound, CapChanged, Placed, Queued, Rejected, Released, Withdrawn
from rolloutpool.routing.ledger import Ledger, LedgerConfig, Usage
from rolloutpool.routing.policies import Placement, SessionAware
from rolloutpool.routing.quarantine import QuarantineConfig
from rolloutpool.routing.table import Session
from rolloutpool.routing.workingset import WorkingSetConfig


def _ledger(names: tuple[str, ...] = ("a", "b"), *, cap: int | None = 1, queue_max: int | None = None) -> Ledger:
    ledger = Ledger(LedgerConfig(caps=CapRule(fixed=cap), queue_max=queue_max), policy=SessionAware())
    for name in names:
        ledger.add_replica(name, now=0.0)
    return ledger


def _bound(ledger: Ledger, sid: str, *, now: float = 0.0, one_turn: bool = False) -> Session:
    decision = ledger.arrive(Placement(sid), now=now, one_turn=one_turn)
    assert isinstance(decision, Bound), decision
    return decision.session


def test_release_is_idempotent_works_for_unknown_ids_and_never_goes_negative() -> None:
    ledger = _ledger()
    session = _bound(ledger, "s")
    ledger.take_events()
    assert ledger.release("s", how="finish", now=1.0) is session
    assert [type(e) for e in ledger.take_events()] == [Released]
    assert ledger.release("s", how="finish", now=1.0) is None  # repeated
    assert ledger.release("never-seen", how="finish", now=1.0) is None  # unknown
    assert ledger.take_events() == []
    assert all(r.live == 0 for r in ledger.table.replicas.values())
    assert ledger.table.sessions == {}


def test_a_release_during_a_turn_waits_for_the_turn_to_end_without_blocking() -> None:
    ledger = _ledger(("a",))
    session = _bound(ledger, "s")
    ledger.turn_started(session)
    queued = ledger.arrive(Placement("next"), now=0.5)
    assert isinstance(queued, Queued)  # the cap of 1 is held by s
    assert ledger.release("s", how="finish_session", now=1.0) is session  # answered at once
    assert ledger.release("s", how="finish_session", now=1.0) is None  # already asked
    assert ledger.lookup("s") is None  # no longer live for lookups ...
    assert ledger.table.replicas["a"].live == 1  # ... but its slot is held until its turn ends
    ledger.take_events()
    ledger.turn_ended(session, now=2.0)
    events = ledger.take_events()
    assert isinstance(events[0], Released)
    assert events[0].how == "finish_session"
    admitted = [e for e in events if isinstance(e, Admitted)]
    assert [e.ticket for e in admitted] == [queued.ticket]
    assert admitted[0].session.session_id == "next"
    assert ledger.table.replicas["a"].live == 1
    assert ledger.table.replicas["a"].inflight == 0


def test_an_id_reused_after_its_release_is_a_new_session() -> None:
    ledger = _ledger(("a", "b"), cap=None)
    first = _bound(ledger, "s")
    first.context_tokens = 500
    ledger.release("s", how="finish_session", now=1.0)
    ledger.take_events()
    again = ledger.arrive(Placement("s"), now=2.0)
    assert isinstance(again, Bound)
    assert again.created
    assert again.session is not first
    assert again.session.context_tokens == 0
    assert [type(e) for e in ledger.take_events()] == [Placed]


def test_an_id_seen_again_while_its_released_turn_still_runs_is_a_new_session() -> None:
    ledger = _ledger(("a",), cap=1)
    old = _bound(ledger, "s")
    ledger.turn_started(old)
    ledger.release("s", how="finish_session", now=1.0)
    ledger.take_events()
    new = _bound(ledger, "s", now=2.0)  # the old binding is released now, freeing the slot
    assert new is not old
    assert [type(e) for e in ledger.take_events()] == [Released, Placed]
    ledger.turn_ended(old, now=3.0)  # the old turn's end touches neither the new session nor the counts
    assert ledger.lookup("s") is new
    assert ledger.table.replicas["a"].live == 1
    assert ledger.table.replicas["a"].inflight == 0


def test_a_one_turn_session_holds_no_slot_after_its_turn() -> None:
    ledger = _ledger(("a",), cap=1)
    session = _bound(ledger, "oneshot-1", one_turn=True)
    ledger.turn_started(session)
    assert ledger.table.replicas["a"].live == 1
    ledger.turn_ended(session, now=1.0)
    assert ledger.table.replicas["a"].live == 0
    assert ledger.table.sessions == {}
    assert ledger.release("oneshot-1", how="request", now=1.0) is None  # the caller's own release is a no-op


def test_admission_is_fifo_and_nobody_overtakes_the_queue() -> None:
    ledger = _ledger(("a",), cap=1)
    _bound(ledger, "s0")
    tickets = []
    for i in range(3):
        decision = ledger.arrive(Placement(f"q{i}"), now=float(i))
        assert isinstance(decision, Queued)
        tickets.append(decision.ticket)
    ledger.set_operator_limit("a", OperatorLimit(target=None, quarantined=False, reason=None), now=5.0)
    assert ledger.table.replicas["a"].cap == 1  # a fixed cap is a hard limit: nothing the operator says raises it
    ledger.take_events()
    ledger.release("s0", how="finish", now=6.0)
    admitted = [e.ticket for e in ledger.take_events() if isinstance(e, Admitted)]
    assert admitted == tickets[:1]
    late = ledger.arrive(Placement("late"), now=7.0)
    assert isinstance(late, Queued)
    assert late.ticket > tickets[-1]


def test_queue_bound_cancel_and_close() -> None:
    ledger = _ledger(("a",), cap=0, queue_max=2)
    first = ledger.arrive(Placement("x"), now=0.0)
    second = ledger.arrive(Placement("y"), now=0.0)
    assert isinstance(first, Queued)
    assert isinstance(second, Queued)
    assert ledger.arrive(Placement("z"), now=0.0) == Rejected("queue_full")
    assert ledger.cancel(first.ticket, now=1.0)  # a timeout
    assert not ledger.cancel(first.ticket, now=1.0)
    ledger.release("y", how="finish_session", now=1.0)  # released while queued: withdrawn, never placed
    assert [e for e in ledger.take_events() if isinstance(e, Withdrawn)] == [Withdrawn(second.ticket, "y", "released")]
    assert not ledger.queue
    ledger.arrive(Placement("w"), now=2.0)
    ledger.close()
    assert isinstance(ledger.take_events()[-1], Withdrawn)
    assert ledger.arrive(Placement("v"), now=3.0) == Rejected("shutting_down")


def test_an_unready_replica_loses_its_sessions_on_their_next_turn() -> None:
    ledger = _ledger(("a", "b"), cap=None)
    session = _bound(ledger, "s")
    other = "b" if session.replica == "a" else "a"
    ledger.set_ready(session.replica, False, now=1.0)
    ledger.take_events()
    moved = _bound(ledger, "s", now=2.0)
    assert moved.replica == other
    released = [e for e in ledger.take_events() if isinstance(e, Released)]
    assert [e.how for e in released] == ["replaced"]


def test_fast_quarantine_from_a_shortfall_uses_the_replicas_block_size() -> None:
    quarantine = QuarantineConfig(min_evicted_tokens=1, evicted_fraction=0.0, min_window_tokens=1)
    config = LedgerConfig(caps=CapRule(), quarantine=quarantine)
    ledger = Ledger(config, policy=SessionAware())
    ledger.add_replica("a", now=0.0)
    ledger.set_capacity("a", capacity_tokens=None, block_size=128, now=0.0)
    session = _bound(ledger, "s")
    ledger.finish_turn(session, now=1.0, usage=Usage(prompt_tokens=300, completion_tokens=100, cached_tokens=0))
    # previous context 399 tokens, prompt 500: whole 128-token blocks of 399 = 384 expected
    assert ledger.finish_turn(session, now=2.0, usage=Usage(500, 10, 384)) == (384, 0)
    assert not ledger.table.replicas["a"].quarantined
    assert ledger.finish_turn(session, now=3.0, usage=Usage(600, 10, 0)) == (384, 384)
    assert ledger.table.replicas["a"].quarantined
    ledger.release("s", how="finish", now=4.0)  # one of its sessions finished: lifted
    assert not ledger.table.replicas["a"].quarantined


@pytest.mark.parametrize(
    ("rule", "replica_cap", "live", "room", "expected"),
    [
        (CapRule(), None, 0, None, None),
        (CapRule(ceiling=9), None, 0, None, 9),
        (CapRule(fixed=5), None, 0, None, 5),
        (CapRule(fixed=5), 2, 0, None, 2),  # the replica's own cap wins over the router's
        (CapRule(fixed=5, ceiling=3), None, 0, None, 3),  # the tightest
        (CapRule(), None, 4, 0, 4),  # the working set has no room: no new session
        (CapRule(), None, 4, 3, 7),
        (CapRule(ceiling=6), None, 4, 3, 6),  # the ceiling over the working set
    ],
)
def test_effective_cap(
    rule: CapRule, replica_cap: int | None, live: int, room: int | None, expected: int | None
) -> None:
    assert effective_cap(rule, replica_cap=replica_cap, live=live, room=room) == expected


def test_unknown_capacity_limits_nothing_and_a_reported_one_sets_the_cap() -> None:
    ledger = Ledger(LedgerConfig(working_set=WorkingSetConfig()), policy=SessionAware())
    ledger.add_replica("a", now=0.0)
    assert isinstance(ledger.arrive(Placement("s"), now=0.0), Bound)  # no working set to measure yet: served
    assert ledger.table.replicas["a"].cap is None
    ledger.set_capacity("a", capacity_tokens=20480, block_size=16, now=1.0)
    events = ledger.take_events()
    # 18,432 tokens of target: s's expected 2,048 and room for 8 more sessions of 2,048
    assert [e for e in events if isinstance(e, CapChanged)] == [CapChanged("a", 9, 20480)]


def test_fifo_holds_when_the_policy_sizes_by_request() -> None:
    """A head that does not fit blocks a smaller session behind it (nobody overtakes), until it leaves."""
    from rolloutpool.routing.policies import Clairvoyant  # noqa: PLC0415

    ledger = Ledger(LedgerConfig(quarantine=None), policy=Clairvoyant(headroom=0.0))
    ledger.add_replica("a", now=0.0, capacity_tokens=1000)
    assert isinstance(ledger.arrive(Placement("held", projected_tokens=1000, prompt_tokens=600), now=0.0), Bound)
    big = ledger.arrive(Placement("big", projected_tokens=800, prompt_tokens=800), now=1.0)  # needs 800, 200 free
    small = ledger.arrive(Placement("small", projected_tokens=100, prompt_tokens=100), now=2.0)  # would fit
    assert isinstance(big, Queued)
    assert isinstance(small, Queued)
    ledger.take_events()
    assert ledger.cancel(big.ticket, now=3.0)  # the head times out: the one behind it is admitted
    assert [e.ticket for e in ledger.take_events() if isinstance(e, Admitted)] == [small.ticket]


def test_replicas_ready_together_share_the_queue_and_one_at_a_time_take_it_all() -> None:
    for together in (True, False):
        ledger = _ledger(("a", "b"), cap=None)
        for name in ("a", "b"):
            ledger.set_ready(name, False, now=0.0)
        for i in range(16):
            assert isinstance(ledger.arrive(Placement(session_id=f"s{i}"), now=1.0), Queued)
        if together:
            assert ledger.set_ready_together(["a", "b", "a"], now=2.0) == ["a", "b"]
            assert ledger.set_ready_together(["a", "b"], now=2.0) == []  # already ready: nothing changes
        else:
            ledger.set_ready("a", True, now=2.0)
            ledger.set_ready("b", True, now=2.0)
        live = sorted(r.live for r in ledger.table.replicas.values())
        assert not ledger.queue
        assert live == ([8, 8] if together else [0, 16])
