"""ThunderAgent's program scheduler, as ported into NVIDIA Dynamo (pure).

Sources: Kang et al., *ThunderAgent* (arXiv 2602.13692) and Dynamo's port (``dynamo.thunderagent_router``;
docs ``agents/thunder-agent-program-scheduler`` and ``components/thunder-agent-scheduler``). Its defaults
are the port's published ones. Every tick (5 s) on each worker, with the programs' working set (the tokens
of its ACTIVE programs) as a share of the worker's KV pool:

- above ``pause_threshold`` (0.95): pause ACTING programs, smallest first, until the share is at most
  ``pause_target`` (0.80); a REASONING program is never interrupted (the pause is logical);
- below ``pause_threshold - resume_hysteresis`` (0.85): resume paused programs, smallest first, packing
  each where it fits under that level: its own worker, else the least loaded worker where it fits (a
  program whose turn waits moves there; one still in its tool is resumed only at home); a program paused
  longer than ``resume_timeout_s`` (1,800 s) is resumed whatever the room.

New programs go to the worker with the smallest working set (the port routes by KV overlap and load; a
new GRPO program overlaps its group's prompt only) while it stays under ``pause_threshold`` with the
expected first context and no paused turn waits there. Not modelled: the soft-demote band (0.80-0.95
lowers programs' engine priority; our engine model has no priorities) and the resumed programs' priority
boost, for the same reason. See ``docs/peers.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rolloutpool.routing.peers.programs import ProgramScheduler
from rolloutpool.routing.policies import Placement
from rolloutpool.routing.table import SessionTable
from rolloutpool.routing.workingset import Phase

__all__ = ["LeastWorkingSet", "ThunderAgent", "ThunderAgentConfig"]


@dataclass(frozen=True)
class ThunderAgentConfig:
    """The Dynamo port's control-loop defaults."""

    pause_threshold: float = 0.95
    pause_target: float = 0.80
    resume_hysteresis: float = 0.10
    resume_timeout_s: float = 1800.0
    interval_s: float = 5.0

    def __post_init__(self) -> None:
        if not 0 < self.pause_target <= self.pause_threshold:
            raise ValueError("need 0 < pause_target <= pause_threshold")
        if not 0 <= self.resume_hysteresis < self.pause_threshold:
            raise ValueError("need 0 <= resume_hysteresis < pause_threshold")
        if self.interval_s < 0 or self.resume_timeout_s < 0:
            raise ValueError("interval_s and resume_timeout_s must be >= 0")


class ThunderAgent(ProgramScheduler):
    """Pause ACTING programs past a working-set threshold, resume them smallest first under a hysteresis."""

    name = "thunderagent"

    def __init__(self, config: ThunderAgentConfig | None = None) -> None:
        super().__init__()
        self.ta = config or ThunderAgentConfig()
        self.interval_s = self.ta.interval_s

    def _lease(self, sid: str) -> float:
        return float("inf")

    def room_for_new(self, name: str, *, now: float) -> int | None:
        work = self.replicas[name]
        if work.capacity is None:
            return None
        if work.held:
            return 0
        free = self.ta.pause_threshold * work.capacity - work.counted
        return max(0, int(free // max(1.0, self.first_context)))

    def tick(self, name: str, *, now: float) -> list[str]:
        """One control step, in the source's order: resume greedily while under the hysteresis, then pause."""
        out = self._resume_some(name, now=now)
        work = self.replicas[name]
        if self.used(name) > self.ta.pause_threshold:
            for sid in sorted(work.idle, key=lambda s: (self.size(s), s)):  # smallest ACTING first
                if self.used(name) <= self.ta.pause_target:
                    break
                self.pause(sid)
        return out

    def _resume_some(self, name: str, *, now: float) -> list[str]:
        work, ta = self.replicas[name], self.ta
        level = ta.pause_threshold - ta.resume_hysteresis
        out: list[str] = []
        for sid in sorted(work.out, key=lambda s: (self.size(s), s)):  # smallest paused first
            tracked = self.sessions[sid]
            held = tracked.phase is Phase.HELD
            need = self.need(sid) if held else tracked.context
            if held and now - tracked.since >= ta.resume_timeout_s:
                self.serve_held(sid, now=now, forced=True)
                out.append(sid)
            elif self.fits(name, need, level):
                if held:
                    self.serve_held(sid, now=now)
                    out.append(sid)
                else:
                    self.reactivate(sid, now=now)
            elif held:
                to = next((w.name for w in self.others(name) if self.fits(w.name, self.need(sid, w.name), level)), None)
                if to is not None:
                    self.serve_held(sid, now=now, to=to)
                    out.append(sid)
        return out


class LeastWorkingSet:
    """ThunderAgent's placement of a new program: the worker with the smallest working set that has room."""

    sticky = True
    capped = True

    def __init__(self, scheduler: ProgramScheduler) -> None:
        self.name = scheduler.name
        self.scheduler = scheduler

    def choose(self, request: Placement, table: SessionTable) -> str | None:
        best: tuple[float, int, str] | None = None
        for replica in table.replicas.values():
            if not replica.accepts_new():
                continue
            work = self.scheduler.replicas.get(replica.name)
            share = 0.0 if work is None or not work.capacity else work.counted / work.capacity
            key = (share, table.order(replica.name), replica.name)
            if best is None or key < best:
                best = key
        return None if best is None else best[2]
