"""What the program schedulers of the peers share: programs, their state, pause and resume (pure).

ThunderAgent and vllm-router's Progress-TTL both see a session as a *program* that alternates between
generating a turn (REASONING, ACTIVE) and waiting on a tool (ACTING); an ACTING program is kept (its
tokens count in its replica's budget) until the scheduler *pauses* it (its tokens leave the budget and
the engine may evict its KV); the next turn of a paused program waits until the scheduler *resumes* it,
on its replica or, when a peer allows it, on another one. They differ in when they pause, whom they
resume first and where, which their subclasses decide.

The state lives in :class:`~rolloutpool.routing.workingset.WorkingSet`'s records so that the ledger,
the router's metrics and the simulator read a peer exactly as they read ours:

============================  ===========================
program                       :class:`Phase`
============================  ===========================
REASONING, ACTIVE             ``GENERATING``
ACTING, ACTIVE                ``IDLE`` (kept, counted)
ACTING, PAUSED                ``LET_GO`` (not counted; ``WITHDRAWN`` after a held turn's client gave up)
PAUSED, next turn retained    ``HELD``
============================  ===========================
"""

from __future__ import annotations

from rolloutpool.routing.workingset import Phase, ReplicaWork, Tracked, WorkingSet, WorkingSetConfig

__all__ = ["ProgramScheduler"]


class ProgramScheduler(WorkingSet):
    """The shared mechanics; a subclass sets :meth:`tick`, :meth:`paused_arrival`, :meth:`room_for_new`, ``_lease``."""

    name = "programs"
    interval_s = 0.0
    """The scheduler's own control period (its :meth:`tick` runs at most this often per replica)."""

    def __init__(self) -> None:
        # our working set's bookkeeping with its own decisions off: no hold limit, no lease, no learned growth prior
        super().__init__(
            WorkingSetConfig(
                target=1.0, limit=1.0, keep_quantile=None, prefill_tokens_per_s=None, hold_limit_s=1e12, move=False
            )
        )  # a peer moves sessions by its own rules (destination), never by ours
        self._moves: dict[str, str] = {}
        self._ticked: dict[str, float] = {}
        self.pauses = 0
        self.moved = 0

    # -- what a subclass decides --------------------------------------------------------

    def tick(self, name: str, *, now: float) -> list[str]:
        """The control loop on one replica: pause, then the held turns to serve now (in order)."""
        raise NotImplementedError

    def paused_arrival(self, tracked: Tracked, sid: str, *, now: float) -> bool:
        """The next turn of a paused program arrives: True to serve it now (resumed), False to hold it."""
        return False

    # -- the ledger's calls ----------------------------------------------------------------

    def arrive(self, sid: str, *, now: float, resident: int | None = None) -> bool:
        tracked = self.sessions.get(sid)
        if tracked is None:
            return True
        work = self.replicas[tracked.replica]
        if tracked.phase is Phase.GENERATING or tracked.phase is Phase.HELD:
            return tracked.phase is Phase.GENERATING
        if tracked.context and tracked.phase is not Phase.WITHDRAWN:  # a retry after a give-up is no tool time
            self.tool.observe(sid, now - tracked.since)
            self.observe_return(now - tracked.since)
        tracked.lapsed = tracked.phase is not Phase.IDLE
        if tracked.phase is Phase.IDLE:  # ACTIVE: served at once
            work.idle.pop(sid, None)
            self._generate(tracked, now)
            return True
        if work.capacity is None or self.paused_arrival(tracked, sid, now=now):
            return True
        tracked.phase, tracked.since = Phase.HELD, now
        work.held.append(sid)
        work.holds += 1
        return False

    def observe_return(self, seconds: float) -> None:
        """A program came back from its tool after ``seconds`` (a subclass may learn from it)."""

    def make_room(self, name: str, tokens: int, *, now: float) -> bool:
        """Whether ``tokens`` fit the replica's budget; a peer pauses only in its own loop, never on demand."""
        free = self.free(name)
        return free is None or free >= tokens

    def resume(self, name: str, *, now: float) -> list[str]:
        """The ledger's round (every release, turn end and router tick): the peer's loop at its own period."""
        work = self.replicas.get(name)
        if work is None or work.capacity is None:
            return []
        last = self._ticked.get(name)
        if last is not None and now - last < self.interval_s:
            return []
        self._ticked[name] = now
        return self.tick(name, now=now)

    def destination(self, sid: str) -> str | None:
        return self._moves.pop(sid, None)

    def released(self, sid: str) -> None:
        self._moves.pop(sid, None)
        super().released(sid)

    # -- helpers for the subclasses ---------------------------------------------------------

    def used(self, name: str) -> float:
        """The replica's working set as a share of its KV capacity (0 when unknown)."""
        work = self.replicas[name]
        return work.counted / work.capacity if work.capacity else 0.0

    def size(self, sid: str) -> int:
        """A program's tokens (its context)."""
        return self.sessions[sid].context

    def pause(self, sid: str) -> None:
        """Pause an ACTING, ACTIVE program: its tokens leave the budget (the engine may evict its KV)."""
        tracked = self.sessions[sid]
        work = self.replicas[tracked.replica]
        del work.idle[sid]
        self._count(tracked, 0)
        tracked.phase = Phase.LET_GO
        tracked.let_go += 1
        work.lets_go += 1
        work.out.add(sid)
        self.pauses += 1

    def reactivate(self, sid: str, *, now: float) -> None:
        """Resume a paused program still in its tool: ACTIVE again, its tokens counted, its KV kept from now."""
        tracked = self.sessions[sid]
        work = self.replicas[tracked.replica]
        work.out.discard(sid)
        tracked.phase, tracked.until = Phase.IDLE, now + self._lease(sid)
        self._count(tracked, tracked.context)
        work.idle[sid] = None
        work.resumes += 1

    def serve_held(self, sid: str, *, now: float, to: str | None = None, forced: bool = False) -> None:
        """Resume a program whose turn waits: it generates, on its replica or on ``to`` (the ledger moves it)."""
        tracked = self.sessions[sid]
        work = self.replicas[tracked.replica]
        work.held.remove(sid)
        work.out.discard(sid)
        if forced:
            work.forced += 1
        else:
            work.resumes += 1
        if to is not None and to != tracked.replica:
            self._count(tracked, 0)
            tracked.replica = to
            self._moves[sid] = to
            self.moved += 1
        self._generate(tracked, now)

    def serve_paused(self, sid: str, *, now: float, to: str | None = None) -> None:
        """Serve the arriving turn of a paused program at once, on its replica or on ``to`` (the ledger moves it)."""
        tracked = self.sessions[sid]
        self.replicas[tracked.replica].out.discard(sid)
        self.replicas[tracked.replica].resumes += 1
        if to is not None and to != tracked.replica:
            tracked.replica = to
            self._moves[sid] = to
            self.moved += 1
        self._generate(tracked, now)

    def fits(self, name: str, tokens: int, share: float) -> bool:
        """Whether ``tokens`` more keep the replica's working set at most ``share`` of its capacity."""
        work = self.replicas[name]
        return work.capacity is not None and work.counted + tokens <= share * work.capacity

    def others(self, name: str) -> list[ReplicaWork]:
        """The other replicas with a known capacity, least loaded (working set share) first."""
        works = [w for n, w in self.replicas.items() if n != name and w.capacity]
        return sorted(works, key=lambda w: (w.counted / (w.capacity or 1), w.name))
