"""Property tests: the session ledger through random event sequences keeps its invariants (pure).

Events: new sessions (with and without an id), turns started and ended, releases (known,
repeated, unknown, during a turn), replicas added, removed, made unready, drained,
quarantined by the operator or by pressure, operator and capacity cap changes, queue timeouts,
idle expiry. After every step: live counts equal the sessions held, a session is on exactly one
replica, nothing is negative, no placement lands on a replica at or over its effective cap,
admission is FIFO, every replica's cap is what :func:`effective_cap` gives for its limits, and
the table's index of eligible replicas names the replica a full scan would. With turn scheduling
on, every held turn is of a live session and is resumed or withdrawn exactly once.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from rolloutpool.routing.caps import CapRule, effective_cap
from rolloutpool.routing.discovery import OperatorLimit
from rolloutpool.routing.events import Admitted, Bound, Held, Placed, Queued, Rejected, Released, Resumed, Withdrawn
from rolloutpool.routing.ledger import Ledger, LedgerConfig, Usage
from rolloutpool.routing.policies import Placement, SessionAware
from rolloutpool.routing.quarantine import QuarantineConfig
from rolloutpool.routing.table import Session
from rolloutpool.routing.workingset import Phase, WorkingSetConfig

_NAMES = ("r0", "r1", "r2", "r3")
_IDS = st.sampled_from([f"s{i}" for i in range(12)])
_TARGETS = st.one_of(st.none(), st.floats(min_value=0.5, max_value=1.0))


class LedgerMachine(RuleBasedStateMachine):
    """Random operations on one ledger, checked against a small model of what it must do."""

    working_set: WorkingSetConfig | None = None

    def __init__(self) -> None:
        super().__init__()
        self.rule_ = CapRule(ceiling=3)
        config = LedgerConfig(
            caps=self.rule_,
            quarantine=QuarantineConfig(min_evicted_tokens=16, evicted_fraction=0.1),
            queue_max=6,
            working_set=self.working_set,
        )
        self.ledger = Ledger(config, policy=SessionAware(balance_slack=1))
        self.now = 0.0
        self.turns: list[Session] = []
        """Turns in flight (the binding each was started on)."""
        self.queued: list[int] = []
        """The model's admission queue: tickets, oldest first."""
        self.held: dict[int, str] = {}
        """Held turns: ticket -> session id."""
        self.preemptions = dict.fromkeys(_NAMES, 0.0)
        self.oneshots = 0
        for name in _NAMES[:2]:
            self.ledger.add_replica(name, now=self.now, capacity_tokens=4096)
        self._check_events()

    # -- helpers ----------------------------------------------------------------------------

    def _tick(self) -> float:
        self.now += 1.0
        return self.now

    def _check_events(self, before: dict[str, int] | None = None) -> None:
        for event in self.ledger.take_events():
            if isinstance(event, Admitted):
                assert self.queued, "admitted with nothing queued"
                assert event.ticket == self.queued[0], f"FIFO: admitted {event.ticket}, head {self.queued[0]}"
                self.queued.pop(0)
            elif isinstance(event, Withdrawn):
                if event.ticket in self.held:
                    assert self.held.pop(event.ticket) == event.session_id
                else:
                    assert event.ticket in self.queued
                    self.queued.remove(event.ticket)
            elif isinstance(event, Resumed):
                assert self.held.pop(event.ticket) == event.session.session_id, "resumed a turn not held"
                assert self.ledger.is_current(event.session)
            elif isinstance(event, Placed):
                replica = self.ledger.table.replicas[event.session.replica]
                assert replica.accepts_new() or replica.cap is None or replica.live <= replica.cap
        if before is not None:  # a replica that gained sessions is within its cap
            for name, replica in self.ledger.table.replicas.items():
                if replica.live > before.get(name, 0) and replica.cap is not None:
                    assert replica.live <= replica.cap, f"{name}: {replica.live} live over cap {replica.cap}"

    def _live(self) -> dict[str, int]:
        return {name: r.live for name, r in self.ledger.table.replicas.items()}

    def _arrive(self, sid: str, *, one_turn: bool) -> None:
        before = self._live()
        group = "g" if sid < "s5" else None
        decision = self.ledger.arrive(Placement(sid, group=group), now=self._tick(), one_turn=one_turn)
        self._check_events(before)
        if isinstance(decision, Bound) and decision.created:
            assert not self.queued, "a new session overtook the queue"
        if isinstance(decision, Queued):
            assert decision.ticket not in self.queued
            self.queued.append(decision.ticket)
        if isinstance(decision, Held):
            assert self.working_set is not None, "a turn held without turn scheduling"
            assert self.ledger.lookup(sid) is not None, "a held turn of no live session"
            assert decision.ticket not in self.held
            self.held[decision.ticket] = sid
        if isinstance(decision, Rejected):
            assert decision.reason == "queue_full"
            assert len(self.ledger.queue) == 6
        if isinstance(decision, Bound) and one_turn:  # a request without an id: one turn, then gone
            session = decision.session
            self.ledger.turn_started(session)
            self.ledger.turn_ended(session, now=self._tick())
            assert not self.ledger.is_current(session)
            self._check_events()

    # -- rules ------------------------------------------------------------------------------

    @rule(sid=_IDS)
    def turn_arrives(self, sid: str) -> None:
        self._arrive(sid, one_turn=False)

    @rule()
    def request_without_session_id(self) -> None:
        self.oneshots += 1
        self._arrive(f"oneshot-{self.oneshots}", one_turn=True)

    @rule(sid=_IDS)
    def turn_starts(self, sid: str) -> None:
        session = self.ledger.lookup(sid)
        if session is not None and sid not in self.held.values():  # a held request starts only once resumed
            self.ledger.turn_started(session)
            self.turns.append(session)

    @precondition(lambda self: bool(self.turns))
    @rule(data=st.data(), cached=st.integers(min_value=0, max_value=600))
    def turn_ends(self, data: st.DataObject, cached: int) -> None:
        session = self.turns.pop(data.draw(st.integers(min_value=0, max_value=len(self.turns) - 1)))
        before = self._live()
        self.ledger.finish_turn(session, now=self._tick(), usage=Usage(session.context_tokens + 200, 50, cached))
        self.ledger.turn_ended(session, now=self.now)
        self._check_events(before)

    @rule(sid=_IDS)
    def release(self, sid: str) -> None:
        before = self._live()
        live = self.ledger.lookup(sid)
        released = self.ledger.release(sid, how="finish_session", now=self._tick())
        assert (released is not None) == (live is not None)
        assert self.ledger.release(sid, how="finish_session", now=self.now) is None  # idempotent
        assert self.ledger.lookup(sid) is None
        self._check_events(before)

    @rule()
    def ticked(self) -> None:
        before = self._live()
        self.ledger.tick(now=self._tick())
        self._check_events(before)
        for name, replica in self.ledger.table.replicas.items():  # a tick brings every cap up to date
            assert replica.cap == self._expected_cap(name), name

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def held_turn_gives_up(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(sorted(self.held)))
        sid = self.held.pop(ticket)
        before = self._live()
        assert self.ledger.cancel_held(sid, now=self._tick(), ticket=ticket)
        assert self.ledger.lookup(sid) is not None  # the session stays; only its turn left
        self._check_events(before)

    @rule()
    def release_unknown(self) -> None:
        before = self._live()
        assert self.ledger.release("never-placed", how="finish_session", now=self._tick()) is None
        assert self._live() == before

    @rule(name=st.sampled_from(_NAMES))
    def replica_added(self, name: str) -> None:
        before = self._live()
        self.ledger.add_replica(name, now=self._tick(), capacity_tokens=4096)
        self._check_events(before)

    @rule(name=st.sampled_from(_NAMES))
    def replica_removed(self, name: str) -> None:
        held = set(self.ledger.table.replicas[name].sessions) if name in self.ledger.table.replicas else set()
        lost = self.ledger.remove_replica(name)
        assert {s.session_id for s in lost} == held
        for event in self.ledger.take_events():
            if isinstance(event, Withdrawn):  # a held turn of a session lost with its replica
                assert self.held.pop(event.ticket) == event.session_id
                continue
            assert isinstance(event, Released)
            assert event.how == "replica_lost"

    @rule(name=st.sampled_from(_NAMES), ready=st.booleans())
    def replica_ready(self, name: str, ready: bool) -> None:
        before = self._live()
        self.ledger.set_ready(name, ready, now=self._tick())
        self._check_events(before)

    @rule(name=st.sampled_from(_NAMES), draining=st.booleans())
    def replica_draining(self, name: str, draining: bool) -> None:
        if name in self.ledger.table.replicas:
            before = self._live()
            self.ledger.set_draining(name, draining, now=self._tick())
            self._check_events(before)

    @rule(name=st.sampled_from(_NAMES), share=_TARGETS, quarantined=st.booleans())
    def operator_limit(self, name: str, share: float | None, quarantined: bool) -> None:
        before = self._live()
        self.ledger.set_operator_limit(name, OperatorLimit(share, quarantined, None), now=self._tick())
        self._check_events(before)

    @rule(shares=st.dictionaries(st.sampled_from(_NAMES), st.tuples(_TARGETS, st.booleans()), max_size=4))
    def operator_status(self, shares: dict[str, tuple[float | None, bool]]) -> None:
        before = self._live()
        status = {name: OperatorLimit(t, quarantined, None) for name, (t, quarantined) in shares.items()}
        self.ledger.set_operator_limits(status, now=self._tick())
        self._check_events(before)
        for name, limits in self.ledger.limits.items():  # a replica the status leaves out has no operator limit
            assert limits.operator == status.get(name)

    @rule(name=st.sampled_from(_NAMES), capacity=st.one_of(st.none(), st.integers(min_value=0, max_value=8192)))
    def capacity_reported(self, name: str, capacity: int | None) -> None:
        if name in self.ledger.limits:
            before = self._live()
            self.ledger.set_capacity(name, capacity_tokens=capacity, block_size=16, now=self._tick())
            self._check_events(before)

    @rule(name=st.sampled_from(_NAMES), preempted=st.booleans(), waiting=st.integers(min_value=0, max_value=2))
    def scraped(self, name: str, preempted: bool, waiting: int) -> None:
        if name in self.ledger.limits:
            before = self._live()
            self.preemptions[name] += preempted
            self.ledger.observe_scrape(
                name, now=self._tick(), preemptions_total=self.preemptions[name], waiting=waiting
            )
            self._check_events(before)

    @precondition(lambda self: bool(self.queued))
    @rule(data=st.data())
    def queue_timeout(self, data: st.DataObject) -> None:
        ticket = data.draw(st.sampled_from(self.queued))
        before = self._live()
        assert self.ledger.cancel(ticket, now=self._tick())
        self.queued.remove(ticket)
        self._check_events(before)

    @rule(idle=st.floats(min_value=0.5, max_value=30.0))
    def idle_expiry(self, idle: float) -> None:
        before = self._live()
        busy = {s.session_id for s in self.turns if self.ledger.is_current(s)}
        stale = self.ledger.expire(now=self._tick(), idle_timeout=idle)
        assert not busy & {s.session_id for s in stale}, "a session with a turn in flight expired"
        self._check_events(before)

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def counts_are_exact(self) -> None:
        table = self.ledger.table
        held = dict.fromkeys(table.replicas, 0)
        for sid, session in table.sessions.items():
            assert session.session_id == sid
            homes = [name for name, r in table.replicas.items() if sid in r.sessions]
            assert homes == [session.replica], f"{sid} on {homes}, bound to {session.replica}"
            held[session.replica] += 1
            assert session.inflight >= 0
        assert {name: r.live for name, r in table.replicas.items()} == held
        assert sum(r.live for r in table.replicas.values()) == len(table.sessions)
        for name, replica in table.replicas.items():
            assert replica.inflight >= 0
            started = sum(1 for s in self.turns if s.replica == name)
            assert replica.inflight <= started, f"{name}: {replica.inflight} in flight, {started} started"

    @invariant()
    def caps_come_from_the_one_function(self) -> None:
        # leases end as time passes without an event, so the room grows between the router's ticks: a cap may lag
        # below the function's value (a new session waits for the next tick), never above it
        for name, replica in self.ledger.table.replicas.items():
            expected = self._expected_cap(name)
            if expected is not None:
                assert replica.cap is not None, f"{name}: no cap, expected {expected}"
                assert replica.cap <= expected, f"{name}: cap {replica.cap} over {expected}"

    def _expected_cap(self, name: str) -> int | None:
        limits = self.ledger.limits[name]
        work = self.ledger.work
        room = None
        if work is not None and name in work.replicas:
            room = work.room_for_new(name, now=self.ledger.now)  # as of the ledger's last event
        live = self.ledger.table.replicas[name].live
        return effective_cap(self.rule_, replica_cap=limits.fixed_cap, live=live, room=room)

    @invariant()
    def the_index_agrees_with_a_scan(self) -> None:
        eligible = [r for r in self.ledger.table.replicas.values() if r.accepts_new()]
        scanned = min(eligible, key=lambda r: r.live) if eligible else None
        assert self.ledger.table.least_eligible() is scanned

    @invariant()
    def queue_matches_the_model(self) -> None:
        assert [w.ticket for w in self.ledger.queue] == self.queued
        if self.ledger.queue:  # a head that could be placed would have been admitted
            assert not any(r.accepts_new() for r in self.ledger.table.replicas.values())

    @invariant()
    def held_turns_match_the_model(self) -> None:
        assert set(self.ledger.held) == set(self.held.values())
        for ticket, sid in self.held.items():
            assert ticket in self.ledger.held[sid], f"ticket {ticket} of {sid} is no longer held"
            assert self.ledger.lookup(sid) is not None

    @invariant()
    def working_sets_add_up(self) -> None:
        """Each replica's working set is its sessions' tokens (a group's shared prompt once), and the phases, the
        replica's sets and the ledger's held turns agree."""
        work = self.ledger.work
        if work is None:
            return
        table = self.ledger.table
        assert set(work.replicas) == set(table.replicas)
        for sid, tracked in work.sessions.items():
            session = table.sessions.get(sid)
            assert session is not None, f"{sid} in a working set, not live"
            assert session.replica == tracked.replica, (
                f"{sid}: bound on {session.replica}, counted on {tracked.replica}"
            )
            assert tracked.counted >= 0
            if tracked.phase in (Phase.LET_GO, Phase.WITHDRAWN, Phase.HELD):
                assert tracked.counted == 0, sid
        for name, replica in work.replicas.items():
            mine = {sid: t for sid, t in work.sessions.items() if t.replica == name}
            groups: dict[str, int] = {}
            for t in mine.values():
                if t.group is not None and t.shared and t.counted > 0:
                    groups[t.group] = groups.get(t.group, 0) + 1
            assert {g: entry[0] for g, entry in replica.groups.items()} == groups, name
            shared = sum((n - 1) * replica.groups[g][1] for g, n in groups.items())
            assert replica.counted == sum(t.counted for t in mine.values()) - shared, name
            assert replica.members == len(mine), name
            assert set(replica.idle) == {sid for sid, t in mine.items() if t.phase is Phase.IDLE}, name
            assert set(replica.held) == {sid for sid, t in mine.items() if t.phase is Phase.HELD}, name
            let_go = (Phase.LET_GO, Phase.WITHDRAWN, Phase.HELD)
            assert replica.out == {sid for sid, t in mine.items() if t.phase in let_go}, name
            assert work.releasable(name, now=self.ledger.now) <= replica.counted, name  # what letting go frees
            if replica.held:  # a replica holding turns takes no new session
                assert not table.replicas[name].accepts_new(), name
        assert set(self.ledger.held) == {sid for sid, t in work.sessions.items() if t.phase is Phase.HELD}


class TurnLedgerMachine(LedgerMachine):
    """The same, with the working set scheduling turns (holds, resumes, let-go prefixes)."""

    working_set = WorkingSetConfig()


class PressuredTurnLedgerMachine(TurnLedgerMachine):
    """The same under KV pressure: small targets, short leases and contexts that grow fast, so turns are held,
    resumed (and forced past the hold limit), idle prefixes let go and sessions moved (the defaults on 4,096-token
    replicas hold nothing)."""

    working_set = WorkingSetConfig(
        target=0.6,
        limit=0.9,
        keep_s=3.0,
        keep_quantile=None,
        prefill_tokens_per_s=None,
        hold_limit_s=25.0,
        fair_after_s=6.0,
        first_context=512,
        growth=256,
    )

    @precondition(lambda self: bool(self.turns))
    @rule(data=st.data(), grow=st.integers(min_value=0, max_value=2500), cached=st.integers(min_value=0, max_value=600))
    def turn_grows(self, data: st.DataObject, grow: int, cached: int) -> None:
        session = self.turns.pop(data.draw(st.integers(min_value=0, max_value=len(self.turns) - 1)))
        before = self._live()
        self.ledger.finish_turn(session, now=self._tick(), usage=Usage(session.context_tokens + grow, 50, cached))
        self.ledger.turn_ended(session, now=self.now)
        self._check_events(before)

    @rule(
        turns=st.lists(
            st.tuples(_IDS, st.integers(min_value=0, max_value=2500), st.floats(min_value=0.0, max_value=8.0)),
            min_size=1,
            max_size=8,
        )
    )
    def whole_turns(self, turns: list[tuple[str, int, float]]) -> None:
        """Turns arrive one after another and, when served, run to their end at once, tool gaps between them (the
        cycle that builds working sets up and makes the scheduler hold, let go and move)."""
        for sid, grow, gap in turns:
            self.now += gap
            self._arrive(sid, one_turn=False)
            session = self.ledger.lookup(sid)
            work = self.ledger.work
            if session is None or work is None or sid in self.held.values() or work.phase(sid) is not Phase.GENERATING:
                continue
            before = self._live()
            prompt = session.context_tokens + grow if session.context_tokens else 600  # a GRPO group shares its prompt
            self.ledger.turn_started(session)
            self.ledger.finish_turn(session, now=self._tick(), usage=Usage(prompt, 50, 0))
            self.ledger.turn_ended(session, now=self.now)
            self._check_events(before)

    @rule(seconds=st.floats(min_value=0.0, max_value=30.0))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds
        before = self._live()
        self.ledger.tick(now=self._tick())
        self._check_events(before)


TestLedgerProperties = LedgerMachine.TestCase
TestLedgerProperties.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestTurnLedgerProperties = TurnLedgerMachine.TestCase
TestTurnLedgerProperties.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestPressuredTurnLedgerProperties = PressuredTurnLedgerMachine.TestCase
TestPressuredTurnLedgerProperties.settings = settings(max_examples=200, stateful_step_count=80, deadline=None)


def test_a_returning_turn_lowers_a_cap_raised_by_the_operator() -> None:
    """Found by the machine above: the operator raised a replica's target (its cap rose to 3), then an idle
    session's turn returned and took room; the cap stayed at 3 over the 2 its new room gives, so a new session
    could have been placed over it until the next tick."""
    machine = TurnLedgerMachine()
    machine.replica_added("r2")
    machine.replica_removed("r1")
    machine.replica_draining("r0", True)
    machine.turn_arrives("s0")
    machine.turn_starts("s0")
    session = machine.turns.pop()
    machine.ledger.finish_turn(session, now=machine._tick(), usage=Usage(session.context_tokens + 200, 50, 0))
    machine.ledger.turn_ended(session, now=machine.now)
    machine.request_without_session_id()
    machine.operator_status({"r0": (None, False), "r1": (None, False), "r2": (1.0, False)})
    raised = machine.ledger.table.replicas["r2"].cap
    machine.turn_arrives("s0")
    after = machine.ledger.table.replicas["r2"].cap
    assert raised is not None
    assert after is not None
    assert after < raised
    machine.caps_come_from_the_one_function()
