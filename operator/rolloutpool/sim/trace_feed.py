"""A trace as the simulator's workload, and the simulator's own turns as a trace (pure).

:class:`TraceSource` turns the sessions of a :class:`~rolloutpool.routing.trace.Trace` into
:class:`~rolloutpool.sim.workload.Trajectory` objects in the order they started: the first
turn's prompt tokens, each turn's output tokens as its action, the prompt growth between two
turns beyond the previous output as the observation, and each recorded tool gap (times
``time_scale``, for engines that ran faster than real time) as the tool latency. A session id
whose turn counter starts again at 0 (reused after a release) is a new trajectory.

:class:`TraceLog` is the simulator's recorder: the router's :class:`~rolloutpool.routing.trace.TraceRecorder`
on virtual time, keeping its lines in memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from rolloutpool.routing.events import Usage
from rolloutpool.routing.trace import Trace, TraceRecorder, TurnLine, read_trace
from rolloutpool.sim.workload import Trajectory

__all__ = ["Episode", "TraceLog", "TraceSource", "TrajectoryFeed", "TurnRecorder", "episodes", "peak_concurrency"]


class TrajectoryFeed(Protocol):
    """Where the fleet takes its next trajectory from (None: no more)."""

    def next(self, now: float = 0.0) -> Trajectory | None:
        """The next trajectory to start at ``now``."""


class TurnRecorder(Protocol):
    """What the fleet tells a recorder (session ids are the trajectory index as a string)."""

    def arrived(self, session_id: str, *, now: float, group: str | None) -> None:
        """A turn of the session reached the router."""

    def turn(self, session_id: str, *, replica: str, usage: Usage | None, now: float) -> None:
        """A turn of the session was answered."""

    def released(self, session_id: str, *, how: str, now: float) -> None:
        """The session ended."""


@dataclass(frozen=True)
class Episode:
    """One recorded session from its turn 0 on: its turns in order."""

    session: str
    group: str | None
    turns: tuple[TurnLine, ...]

    @property
    def start(self) -> float:
        """When its first turn arrived."""
        return self.turns[0].arrived


def episodes(trace: Trace) -> list[Episode]:
    """The trace's sessions, split where a session's turn counter starts again, ordered by first arrival."""
    open_: dict[str, list[TurnLine]] = {}
    done: list[list[TurnLine]] = []
    for line in trace.turns:
        current = open_.get(line.session)
        if current is None or line.turn == 0 or line.turn != current[-1].turn + 1:
            if current is not None:
                done.append(current)
            current = open_[line.session] = []
        current.append(line)
    done.extend(open_.values())
    found = [Episode(t[0].session, t[0].group, tuple(t)) for t in done if t[0].turn == 0]
    return sorted(found, key=lambda e: (e.start, e.session))


def peak_concurrency(eps: Iterable[Episode]) -> int:
    """Most sessions between their first arrival and last answer at once."""
    edges = sorted(
        [(e.start, 1) for e in eps] + [(e.turns[-1].ended, -1) for e in eps],
        key=lambda edge: (edge[0], edge[1]),
    )
    peak = now = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


@dataclass
class TraceSource:
    """Yields a trace's sessions as trajectories, in their recorded start order, then None."""

    episodes: list[Episode]
    time_scale: float = 1.0
    """Virtual seconds per recorded second (the engine-sim's ``--time-scale`` for a trace of one)."""
    non_append: int = 0
    """Turns whose prompt did not contain the previous context (the observation was clamped to 1 token)."""
    _next: int = 0
    _groups: dict[str, int] = field(default_factory=dict)

    @classmethod
    def read(cls, lines: Iterable[str], *, time_scale: float = 1.0) -> tuple[Trace, TraceSource]:
        """Read a trace (raises :class:`~rolloutpool.routing.trace.TraceError`) and its source."""
        trace = read_trace(lines)
        return trace, cls(episodes(trace), time_scale=time_scale)

    def _group(self, episode: Episode, index: int) -> int:
        if episode.group is None:
            return len(self.episodes) + index  # a group of its own: shares no prompt
        return self._groups.setdefault(episode.group, len(self._groups))

    def trajectory(self, index: int) -> Trajectory:
        """Episode ``index`` as a trajectory (pure)."""
        episode = self.episodes[index]
        turns = episode.turns
        observations: list[int] = []
        for before, after in itertools.pairwise(turns):
            grown = after.prompt_tokens - before.prompt_tokens - before.output_tokens
            if grown < 1:
                self.non_append += 1
            observations.append(max(1, grown))
        gaps = [(t.tool_gap_s or 0.0) * self.time_scale for t in turns[1:]]
        return Trajectory(
            index=index,
            group=self._group(episode, index),
            prompt_tokens=max(1, turns[0].prompt_tokens),
            actions=tuple(max(1, t.output_tokens) for t in turns),
            observations=(*observations, 1),
            tool_latencies=(*gaps, 0.0),
        )

    def next(self, now: float = 0.0) -> Trajectory | None:
        """The next recorded session, or None once all started."""
        if self._next >= len(self.episodes):
            return None
        self._next += 1
        return self.trajectory(self._next - 1)

    def max_context(self) -> int:
        """The largest prompt + output of any turn."""
        return max((t.prompt_tokens + t.output_tokens for e in self.episodes for t in e.turns), default=1)


@dataclass
class TraceLog:
    """The simulator's recorder: trace lines of its turns, in memory (virtual clock, ids as given)."""

    recorder: TraceRecorder = field(default_factory=lambda: TraceRecorder(started_at=0.0))
    lines: list[dict[str, Any]] = field(default_factory=list)

    def arrived(self, session_id: str, *, now: float, group: str | None) -> None:
        """See :class:`TurnRecorder`."""
        self.recorder.arrived(session_id, now=now, group=group)

    def turn(self, session_id: str, *, replica: str, usage: Usage | None, now: float) -> None:
        """See :class:`TurnRecorder`."""
        line = self.recorder.turn(session_id, replica=replica, usage=usage, now=now)
        if line is not None:
            self.lines.append(line)

    def released(self, session_id: str, *, how: str, now: float) -> None:
        """See :class:`TurnRecorder`."""
        line = self.recorder.released(session_id, how=how, now=now)
        if line is not None:
            self.lines.append(line)

    def header(self, *, max_model_len: int | None) -> dict[str, Any]:
        """The header line of the simulator's trace."""
        return self.recorder.header(writer="simulator", clock="virtual", session_ids="raw", max_model_len=max_model_len)
