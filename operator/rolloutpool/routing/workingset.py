"""Turn-level scheduling: each replica's working set, the turns it holds and the prefixes it lets go (pure).

A replica's *working set* is what its KV cache must hold for the sessions it serves without
re-prefill: the context of every session generating a turn (plus the turn's expected growth), and
the context of every session waiting on a tool whose prefix we *keep*. It must fit ``target`` of the
replica's KV capacity. Decisions are taken at the tool boundary, per turn:

- **serve**: a turn of a session whose prefix is kept (in the working set) is always served at
  once; so is one of a session let go while its context fits the room left;
- **hold**: a turn of a session let go that does not fit waits (is *paused*) until room frees:
  oldest first, a younger turn may pass a head that does not fit, but none passes a head that has
  waited ``fair_after_s``; after ``hold_limit_s`` a turn is served whatever the room. A turn that is
  generating is never interrupted;
- **let go**: room is made by letting go of idle sessions' prefixes, the session idle longest first
  (with a heavy-tailed tool time, the one that has waited longest has the longest expected wait
  left, and vLLM's LRU evicts in that order), but only after its lease (most tool calls return
  sooner: a quantile of its predicted tool time, capped by its break-even, the time its re-prefill
  would stall the replica's generating turns) and only when a held turn or a new session needs the
  room: keeping costs nothing while nobody waits. A session let go keeps its blocks until the
  engine's LRU needs them; when it comes back before that, its turn finds them cached.
- **move**: a turn that would be held, of a session whose prefix is not resident on its replica any
  more (it re-prefills wherever it goes), moves once to another replica whose working set has room
  for it now, instead of waiting; a session moves at most once (its next turns find their prefix there);
- **admit**: a new session is placed where its first context fits the room (with what could be let
  go); while a replica holds turns it admits none (returning turns first).

A session's context is what its last turn's usage said (prompt + output); a turn's growth (the
observation before it and its output) is measured as sessions return, an exponential mean, so the
working set of a generating session is its context plus that mean.

Nothing here knows sessions beyond ids and token counts: :class:`~rolloutpool.routing.ledger.Ledger`
drives it, for the router and the simulator alike.
"""

from __future__ import annotations

import math

from rolloutpool.routing.tooltime import ToolTimes
from rolloutpool.routing.workingset_state import Phase, ReplicaWork, Tracked, WorkingSetConfig

__all__ = ["Phase", "ReplicaWork", "Tracked", "WorkingSet", "WorkingSetConfig"]


class WorkingSet:
    """Every replica's working set; the ledger calls it at each turn boundary."""

    def __init__(self, config: WorkingSetConfig | None = None) -> None:
        self.config = config or WorkingSetConfig()
        self.replicas: dict[str, ReplicaWork] = {}
        self.sessions: dict[str, Tracked] = {}
        self.growth = float(self.config.growth)
        self.first_context = float(self.config.first_context)
        self.tool = ToolTimes(prior_s=max(self.config.keep_s, 0.01))
        """Tool times learned from the gaps between turns (the leases)."""

    # -- membership ---------------------------------------------------------------------

    def add_replica(self, name: str, *, capacity: int | None) -> None:
        """Track a replica (kept as it is when known)."""
        self.replicas.setdefault(name, ReplicaWork(name, capacity))

    def set_capacity(self, name: str, capacity: int | None) -> None:
        """A replica's reported KV capacity (tokens)."""
        work = self.replicas.get(name)
        if work is not None and capacity is not None:
            work.capacity = capacity

    def set_target(self, name: str, target: float | None) -> None:
        """The operator's target for a replica (None: back to the configured one); kept under ``limit``."""
        work = self.replicas.get(name)
        if work is not None:
            work.target = None if target is None else min(target, self.config.limit)

    def target_of(self, name: str) -> float | None:
        """The working-set target in force on a replica (the operator's, else the configured one); None: unknown."""
        work = self.replicas.get(name)
        return None if work is None else (work.target or self.config.target)

    def remove_replica(self, name: str) -> None:
        """Forget a replica; its sessions are forgotten by the ledger's releases."""
        self.replicas.pop(name, None)

    # -- sessions -----------------------------------------------------------------------

    def bound(
        self,
        sid: str,
        replica: str,
        *,
        now: float,
        first_context: int | None = None,
        group: str | None = None,
        shared: int = 0,
    ) -> None:
        """A new session placed on ``replica`` starts its first turn (counted at its expected first context).

        ``shared``: tokens its group's members share (their prompt; 0 when unknown: learned from the first turn).
        """
        self.released(sid)
        context = int(first_context) if first_context else int(self.first_context)
        tracked = Tracked(replica, 0, Phase.GENERATING, now, group=group, shared=shared)
        self.sessions[sid] = tracked
        self.replicas[replica].members += 1
        self._count(tracked, context)

    def restored(
        self, sid: str, replica: str, *, context: int, now: float, group: str | None = None, shared: int = 0
    ) -> None:
        """A session re-created from a snapshot: idle, its prefix kept (``group``, ``shared``: as :meth:`bound`'s)."""
        self.released(sid)
        tracked = Tracked(replica, context, Phase.IDLE, now, until=now + self.config.keep_s, group=group, shared=shared)
        self.sessions[sid] = tracked
        self.replicas[replica].members += 1
        self._count(tracked, context)
        self.replicas[replica].idle[sid] = None

    def released(self, sid: str) -> None:
        """The session is over (or moved): its tokens leave the working set, a held turn leaves the queue."""
        tracked = self.sessions.pop(sid, None)
        self.tool.forget(sid)
        if tracked is None:
            return
        work = self.replicas.get(tracked.replica)
        if work is None:
            return
        self._count(tracked, 0)
        work.members -= 1
        work.idle.pop(sid, None)
        work.out.discard(sid)
        if tracked.phase is Phase.HELD:
            work.held.remove(sid)

    def phase(self, sid: str) -> Phase | None:
        """The session's phase (None: not tracked)."""
        tracked = self.sessions.get(sid)
        return None if tracked is None else tracked.phase

    def lapsed(self, sid: str) -> bool:
        """Whether the session's current (or last) turn was served after its prefix had been let go."""
        tracked = self.sessions.get(sid)
        return tracked is not None and tracked.lapsed

    def renews(self, sid: str, *, resident: int | None) -> bool:
        """Whether prefix renewal should refresh the session's cached context now: only a prefix the working set keeps
        (an idle session within its count), and only while it is still cached (``resident``: its context still
        cached on its replica; None: unknown). A prefix let go is the engine's to evict, and refreshing one already
        evicted would re-prefill it now for a turn that may be far off. A session not tracked: True (renewal as
        configured, without turn scheduling)."""
        tracked = self.sessions.get(sid)
        if tracked is None:
            return True
        if tracked.phase is not Phase.IDLE:
            return False
        return resident is None or self._cached(tracked, resident)

    def _cached(self, tracked: Tracked, resident: int) -> bool:
        """Whether ``resident`` cached tokens hold the session's context (within a few blocks)."""
        return resident >= tracked.context - self.config.block_tolerance

    def need(self, sid: str, replica: str | None = None) -> int:
        """Tokens the session's next turn adds to a replica's working set (its own by default) when it is not counted:
        its context and a turn's growth, less its group's shared prompt while other members keep that there."""
        tracked = self.sessions[sid]
        work = self.replicas[replica or tracked.replica]
        kept = work.groups.get(tracked.group) if tracked.group is not None and tracked.shared else None
        return tracked.context + int(self.growth) - (kept[1] if kept else 0)

    # -- turns --------------------------------------------------------------------------

    def arrive(self, sid: str, *, now: float, resident: int | None = None) -> bool:
        """A turn of a live session arrives: True to serve it now, False when it is held (it waits for room).

        ``resident``: its context still cached on the replica (None: unknown). A session let go whose prefix is
        still resident is served at once like a kept one: it re-prefills nothing and its blocks are already in
        the cache, so the room it takes again is made by letting older idle sessions go.
        """
        tracked = self.sessions.get(sid)
        if tracked is None:
            return True  # not tracked (a replica without capacity yet): nothing to decide
        work = self.replicas[tracked.replica]
        if tracked.phase is Phase.GENERATING or tracked.phase is Phase.HELD:
            return tracked.phase is Phase.GENERATING  # a second request of a turn in flight, or still held
        if tracked.context and tracked.phase is not Phase.WITHDRAWN:  # a gap between two turns: its tool time
            self.tool.observe(sid, now - tracked.since)
        tracked.lapsed = tracked.phase is not Phase.IDLE
        if tracked.phase is Phase.IDLE:
            work.idle.pop(sid, None)
            self._generate(tracked, now)
            self.make_room(work.name, 0, now=now)  # its growth may push the set over: let older idle ones go
            return True
        cached = resident is not None and self._cached(tracked, resident)
        unknown = work.capacity is None  # an engine that reports no KV capacity: nothing to schedule by
        if cached or unknown or (not work.held and self._make_room_for(sid, work.name, now=now)):
            work.out.discard(sid)
            self._generate(tracked, now)
            if cached:
                self.make_room(work.name, 0, now=now)
            return True
        tracked.phase, tracked.since = Phase.HELD, now
        work.held.append(sid)
        work.holds += 1
        return False

    def move_target(self, sid: str, candidates: list[str], *, resident: int | None, now: float) -> str | None:
        """Where a turn just held should move instead (see the module docstring), or None to let it wait.

        ``candidates``: replicas that may take sessions now; ``resident``: its context still cached on its
        replica (None: unknown, and a prefix let go for room is presumed gone, as the engine's LRU takes it next).
        """
        tracked = self.sessions.get(sid)
        if not self.config.move or tracked is None or tracked.phase is not Phase.HELD or tracked.moved:
            return None
        if resident is not None and self._cached(tracked, resident):
            return None  # its blocks are still here: it is served here
        best, room = None, -1
        for name in candidates:
            work = self.replicas.get(name)
            free = None if work is None or name == tracked.replica or work.held else self.free(name)
            if free is None:
                continue
            spare = free + self.releasable(name, now=now) - self.need(sid, name)
            if spare > room:
                best, room = name, spare
        return best

    def move(self, sid: str, replica: str, *, now: float) -> None:
        """A held turn's session moves to ``replica`` (from :meth:`move_target`) and generates there at once."""
        tracked = self.sessions[sid]
        old = self.replicas[tracked.replica]
        if tracked.phase is Phase.HELD:
            old.held.remove(sid)
        self._count(tracked, 0)
        old.idle.pop(sid, None)
        old.out.discard(sid)
        old.members -= 1
        tracked.replica, tracked.moved, tracked.lapsed = replica, True, True
        work = self.replicas[replica]
        work.moves += 1
        work.members += 1
        self._make_room_for(sid, replica, now=now)
        self._generate(tracked, now)

    def turn_finished(
        self, sid: str, *, context: int | None, now: float, prompt: int | None = None, tool_s: float | None = None
    ) -> None:
        """A turn ended (its usage gave ``context``; None: unknown): the session waits on its tool, kept.

        ``prompt``: the turn's prompt tokens; a first turn's is what its group shares when that was not known.
        ``tool_s``: how long the tool call it starts will take, known only to a reference (the simulator's
        ``+known-tools``): its prefix is kept exactly that long when that is within its break-even, else it may
        be let go at once, in place of the learned lease.
        """
        tracked = self.sessions.get(sid)
        if tracked is None or tracked.phase is not Phase.GENERATING:
            return
        if tracked.context == 0 and not tracked.shared and prompt and tracked.group is not None:
            self._count(tracked, 0)
            tracked.shared = prompt
        if context is not None:
            if tracked.context > 0:
                self.growth += self.config.smoothing * (context - tracked.context - self.growth)
            else:
                self.first_context += self.config.smoothing * (context - self.first_context)
            tracked.context = context
        else:
            tracked.context += int(self.growth)
        tracked.phase, tracked.since = Phase.IDLE, now
        work = self.replicas[tracked.replica]
        work.idle[sid] = None
        break_even = self._break_even(tracked.context, work.generating)
        if tool_s is None:
            tracked.until = now + min(self._lease(sid), break_even)
        else:
            tracked.until = now + (tool_s if tool_s <= break_even else 0.0)
        self._count(tracked, tracked.context)

    def _lease(self, sid: str) -> float:
        quantile = self.config.keep_quantile
        return self.config.keep_s if quantile is None else self.tool.lease(sid, quantile=quantile)

    def _break_even(self, context: int, batch: int) -> float:
        """How long keeping ``context`` idle tokens pays: re-prefilling them later stalls the ``batch`` turns
        generating beside it for ``context / rate`` seconds each, while holding them keeps about one session of that
        size waiting for as long as they are held; past ``batch x context / rate`` seconds (with attention's
        quadratic share), keeping costs more (at least one turn's stall when none generates). Infinite without a
        prefill rate."""
        rate = self.config.prefill_tokens_per_s
        if rate is None:
            return math.inf
        return max(1, batch) * context / rate * (1 + context / self.config.prefill_attention_tokens)

    def _generate(self, tracked: Tracked, now: float) -> None:
        """The session generates a turn: its context and a turn's growth are counted (its group's prompt once)."""
        tracked.phase, tracked.since = Phase.GENERATING, now
        self._count(tracked, tracked.context + int(self.growth))

    def _count(self, tracked: Tracked, tokens: int) -> None:
        """Set a session's tokens in its replica's working set; its group's shared prompt is counted once."""
        work = self.replicas[tracked.replica]
        work.counted += tokens - tracked.counted
        was, tracked.counted = tracked.counted > 0, tokens
        if tracked.group is None or not tracked.shared or was == (tokens > 0):
            return
        entry = work.groups.get(tracked.group)
        if entry is None:
            entry = work.groups[tracked.group] = [0, tracked.shared]
        before = max(0, entry[0] - 1) * entry[1]
        entry[0] += 1 if tokens > 0 else -1
        work.counted -= max(0, entry[0] - 1) * entry[1] - before
        if entry[0] == 0:
            del work.groups[tracked.group]

    # -- room -----------------------------------------------------------------------------

    def free(self, name: str) -> int | None:
        """Tokens of the replica's budget not in its working set (negative when over); None: capacity unknown."""
        work = self.replicas[name]
        budget = work.budget(self.config.target)
        return None if budget is None else budget - work.counted

    def releasable(self, name: str, *, now: float) -> int:
        """Tokens of idle sessions that could be let go now (their lease ended)."""
        work, sessions, total = self.replicas[name], self.sessions, 0
        grouped: dict[str, int] = {}
        for sid in work.idle:
            tracked = sessions[sid]
            if tracked.until <= now:
                total += tracked.counted
                if tracked.group is not None and tracked.shared and tracked.counted > 0:
                    grouped[tracked.group] = grouped.get(tracked.group, 0) + 1
        for group, going in grouped.items():  # the group's prompt is freed only with its last counted member
            members, shared = work.groups[group]
            total -= min(going, members - 1) * shared
        return total

    def room_for_new(self, name: str, *, now: float) -> int | None:
        """How many new sessions of the expected first context the replica can take now (None: unknown)."""
        work = self.replicas[name]
        free = self.free(name)
        if free is None:
            return None
        if work.held:
            return 0
        releasable = self.releasable(name, now=now)
        room = int((free + releasable) // max(1.0, self.first_context))
        if work.counted - releasable <= 0:  # empty, or would be once idle sessions are let go: take one whatever
            return max(1, room)  # the estimate (a small cache under the first-context prior)
        return max(0, room)

    def make_room(self, name: str, tokens: int, *, now: float) -> bool:
        """Let go of idle sessions, idle longest first, until ``tokens`` fit the target: those whose lease ended,
        and any while the working set is over ``limit``."""
        work = self.replicas[name]
        budget = work.budget(self.config.target)
        if budget is None or work.capacity is None:
            return False
        free = budget - work.counted
        if free >= tokens:
            return True
        over = work.capacity * self.config.limit - budget  # free below -over: past the limit
        for sid in list(work.idle):
            if free >= tokens:
                break
            tracked = self.sessions[sid]
            if tracked.until > now and free >= -over:
                continue
            del work.idle[sid]
            self._count(tracked, 0)
            free = budget - work.counted
            tracked.phase = Phase.LET_GO
            tracked.let_go += 1
            work.lets_go += 1
            work.out.add(sid)
        return free >= tokens

    def _make_room_for(self, sid: str, name: str, *, now: float) -> bool:
        """:meth:`make_room` for the session's turn on ``name``; its need is taken again when letting go took the last
        member that kept its group's prompt there (then that prompt is counted with it)."""
        fits = self.make_room(name, self.need(sid, name), now=now)
        return fits and self.make_room(name, self.need(sid, name), now=now)  # at once True unless its need grew

    def resume(self, name: str, *, now: float) -> list[str]:
        """Held turns of the replica that may be served now, in the order to serve them."""
        work = self.replicas.get(name)
        if work is None or not work.held:
            return []
        out: list[str] = []
        limit, fair = self.config.hold_limit_s, self.config.fair_after_s
        for sid in list(work.held):
            tracked = self.sessions[sid]
            waited = now - tracked.since
            if waited >= limit:
                work.forced += 1
            elif not self._make_room_for(sid, name, now=now):
                if waited >= fair:
                    break  # nobody passes a head that waited long
                continue
            else:
                work.resumes += 1
            work.held.remove(sid)
            work.out.discard(sid)
            self._generate(tracked, now)
            out.append(sid)
        return out

    def unhold(self, sid: str, *, now: float) -> None:
        """A held turn was withdrawn (its client gave up), or a resumed one before its request started: the session
        waits again, its prefix let go (not rebuilt); the gap to its retry is no tool time."""
        tracked = self.sessions.get(sid)
        if tracked is None or tracked.phase not in (Phase.HELD, Phase.GENERATING):
            return
        work = self.replicas[tracked.replica]
        if tracked.phase is Phase.HELD:
            work.held.remove(sid)
        else:
            self._count(tracked, 0)
            work.out.add(sid)
        tracked.phase, tracked.since = Phase.WITHDRAWN, now

    def destination(self, sid: str) -> str | None:
        """Where a session the scheduler just served or resumed must go when not its replica (a peer that resumes a
        paused program elsewhere, routing/peers/); ours never moves a session: None."""
        return None

    def held(self, name: str) -> int:
        """Turns the replica holds now."""
        work = self.replicas.get(name)
        return 0 if work is None else len(work.held)

    def let_go(self, name: str) -> int:
        """Live sessions of the replica whose prefix is let go now (waiting on a tool, or held)."""
        work = self.replicas.get(name)
        return 0 if work is None else len(work.out)
