"""Admission by projected KV tokens: how many more new sessions a replica's KV cache holds (pure).

A fixed session-count cap from a residency guess (``floor / residency * (1 - headroom)``) queues
sessions whose short contexts would fit many times over, and admits too many where contexts are
long. The router sees every live session's context instead (prompt + output of its last turn),
so it projects what each will hold and admits a new session while the projection of the
replica's live sessions, plus the newcomer's, fits its KV capacity less a headroom.

A session with context ``c`` is projected at ``c + growth_share * (F(c) - c)``, where ``F(c)`` is the
mean final context of the finished sessions that reached at least ``c`` (a decayed histogram of
final contexts): one that outlived the short rollouts of a bimodal mix is projected towards the
long ones (at ``growth_share`` 0.5 a session would count at the mean of what it holds over the rest
of its life; the default 0.1 oversubscribes on purpose). A new session's context is its prompt
when the caller knows it, else the fleet's mean first context (prompt + first output).

Before anything finished the histogram holds one prior observation at
``min(1, 2 * residency) * max_model_len``, so a cold router admits about what the residency cap
would; it fades as sessions finish (exponential decay, so drift is followed). Nothing here is the
session-count cap: :func:`rolloutpool.routing.caps.effective_cap` turns :meth:`KvProjection.room`
into one (``live + room``), under the hard ceiling.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rolloutpool.routing.survival import censored_quantile

__all__ = ["GROWTH_SHARE", "KvAdmissionConfig", "KvProjection", "ReplicaProjection"]

GROWTH_SHARE = 0.1
"""The default share of its expected remaining growth a live session is projected with."""


@dataclass(frozen=True)
class KvAdmissionConfig:
    """How projections are made."""

    max_model_len: int
    expected_residency: float = 0.5
    """Only the prior: the mean final context before any session finished is ``2 * residency * max_model_len``."""
    headroom: float = 0.1
    """Fraction of the KV capacity kept out of the budget."""
    smoothing: float = 0.02
    """Weight of each new observation in the fleet's means and final-context histogram (exponential decay)."""
    growth_share: float = GROWTH_SHARE
    """Share of its expected remaining growth a live session is projected with. 0.5 (its mean over the rest of its
    life) and 0.25 admitted too few where contexts are long: some eviction pays for itself in bigger decode batches
    (``rolloutpool simulate-compare`` at 2x, where sticky least-loaded re-prefills a fifth of its prefill and still
    serves the most: 0.25 reached 0.92-0.97 of it, 0.1 0.97-1.0; docs/benchmarks.md). 0 admitted too many at 3x."""
    bins: int = 64
    """Buckets of the final-context histogram, over ``0..max_model_len``."""
    floor_window: int = 256
    """Final contexts of the last this many finished sessions kept for the measured floor's censored quantile."""
    floor_min_finished: int = 20
    """Finished sessions the censored quantile needs before the measured floor reads it (the histogram before)."""


@dataclass
class ReplicaProjection:
    """The projected KV tokens of one replica's live sessions."""

    tokens: float = 0.0
    sessions: dict[str, float] = field(default_factory=dict)
    """Session id -> its projection when last updated."""


class KvProjection:
    """Fleet-wide estimates and per-replica projections, updated by the ledger (pure)."""

    def __init__(self, config: KvAdmissionConfig) -> None:
        self.config = config
        self.replicas: dict[str, ReplicaProjection] = {}
        self.first_mean: float | None = None
        """Mean context after a session's first turn."""
        width = config.max_model_len / config.bins
        self._mids = [(i + 0.5) * width for i in range(config.bins)]
        self._weights = [0.0] * config.bins
        self._weights[self._bin(min(1.0, 2.0 * config.expected_residency) * config.max_model_len)] = 1.0
        self._finals: deque[float] = deque(maxlen=config.floor_window)
        """Final contexts of the last finished sessions (undecayed, for :meth:`measured_floor`)."""
        self._floor_contexts: dict[tuple[float, float], float | None] = {}
        """(quantile, beyond) -> the measured floor's final context, until a context or a finish changes: the same
        for every replica, asked for each one at every scrape."""
        self._first: dict[str, float] = {}
        """Session id -> its first context (or the estimate it was admitted with)."""
        self._context: dict[str, int] = {}
        self._replica: dict[str, str] = {}
        self.need = self.project(self.first_estimate())
        """Projected tokens of one new session, as of the last :meth:`refresh` (the fleet-wide estimates
        move with every first turn and every finish; caps follow them at each refresh, not on every turn)."""

    # -- estimates ---------------------------------------------------------------------

    def _bin(self, tokens: float) -> int:
        cfg = self.config
        return max(0, min(cfg.bins - 1, int(tokens * cfg.bins / cfg.max_model_len)))

    def final_estimate(self, reached: float = 0.0) -> float:
        """Mean final context of finished sessions that reached at least ``reached`` tokens (the prior at first)."""
        total = weight = 0.0
        for i in range(self._bin(reached), self.config.bins):
            w = self._weights[i]
            if w > 0.0:
                total += w * max(self._mids[i], reached)
                weight += w
        return total / weight if weight > 0.0 else float(reached)

    def first_estimate(self, prompt_tokens: int = 0) -> float:
        """A new session's first context: its prompt when known, else the fleet's mean first context."""
        if prompt_tokens > 0:
            return float(prompt_tokens)
        if self.first_mean is not None:
            return self.first_mean
        cfg = self.config  # the prior: the first context whose projection is the residency guess
        share, guess = cfg.growth_share, cfg.expected_residency * cfg.max_model_len
        return max(0.0, (guess - share * self.final_estimate()) / (1.0 - share)) if share < 1.0 else 0.0

    def project(self, context: float) -> float:
        """The projected tokens of a session at ``context`` tokens."""
        final = self.final_estimate(context)
        return min(float(self.config.max_model_len), context + self.config.growth_share * max(0.0, final - context))

    def final_quantile(self, q: float) -> float:
        """The ``q`` quantile of finished sessions' final contexts (a bucket's upper edge; the prior at first)."""
        total = sum(self._weights)
        seen = 0.0
        width = self.config.max_model_len / self.config.bins
        for i, w in enumerate(self._weights):
            seen += w
            if seen >= q * total:
                return (i + 1) * width
        return float(self.config.max_model_len)

    def measured_floor(self, *, capacity_tokens: int, quantile: float = 0.9, beyond: float = 0.1) -> int | None:
        """Sessions that fit the KV budget even if each reaches the ``quantile`` final context (pure).

        The quantile counts the live sessions as right-censored (:func:`~rolloutpool.routing.survival.censored_quantile`
        over the last ``floor_window`` finished and the live contexts) once ``floor_min_finished`` sessions finished:
        the first finishers are the short rollouts, and a session still running past them ends longer. Before that,
        or while the censored estimate has no such quantile, the decayed histogram's (the prior fades over ~115
        finishes). None while more than ``beyond`` of the live sessions already hold more than the quantile: the
        finished ones do not describe the live ones yet.
        """
        key = (quantile, beyond)
        if key not in self._floor_contexts:
            self._floor_contexts[key] = self._floor_context(quantile, beyond)
        final = self._floor_contexts[key]
        return None if final is None else int(capacity_tokens * (1.0 - self.config.headroom) // final)

    def _floor_context(self, quantile: float, beyond: float) -> float | None:
        contexts = self._context.values()
        censored = None
        if len(self._finals) >= self.config.floor_min_finished:
            censored = censored_quantile(finished=self._finals, live=contexts, q=quantile)
        final = max(self.final_quantile(quantile) if censored is None else censored, 1.0)
        if contexts and sum(1 for c in contexts if c > final) > beyond * len(contexts):
            return None
        return final

    # -- updates --------------------------------------------------------------------------

    def _set(self, session_id: str, replica: str, value: float) -> None:
        self._floor_contexts.clear()  # every context change passes here or through released
        state = self.replicas.setdefault(replica, ReplicaProjection())
        self._replica[session_id] = replica
        state.tokens += value - state.sessions.get(session_id, 0.0)
        state.sessions[session_id] = value

    def bound(self, session_id: str, replica: str, *, prompt_tokens: int = 0, context: int = 0) -> None:
        """A session became live on ``replica`` (placed, moved or restored with ``context``)."""
        self.released(session_id, finished=False)
        first = float(context) if context > 0 else self.first_estimate(prompt_tokens)
        self._first[session_id] = first
        if context > 0:
            self._context[session_id] = context
        self._set(session_id, replica, self.project(first))

    def turn_finished(self, session_id: str, replica: str, *, context: int) -> None:
        """A turn of a live session ended with ``context`` tokens (prompt + output)."""
        if session_id not in self._first or context <= 0:
            return
        if session_id not in self._context:
            self._first[session_id] = float(context)
            mean = self.first_mean
            self.first_mean = context if mean is None else mean + self.config.smoothing * (context - mean)
        self._context[session_id] = context
        self._set(session_id, replica, self.project(context))

    def released(self, session_id: str, *, finished: bool) -> None:
        """A session stopped being live; ``finished``: it ended its rollout (its context was its final one)."""
        self._floor_contexts.clear()
        first = self._first.pop(session_id, None)
        context = self._context.pop(session_id, None)
        if finished and first is not None and context is not None:
            keep = 1.0 - self.config.smoothing  # the prior is one observation that fades like the rest
            self._weights = [w * keep for w in self._weights]
            self._weights[self._bin(context)] += self.config.smoothing
            self._finals.append(float(context))
        replica = self._replica.pop(session_id, None)
        state = None if replica is None else self.replicas.get(replica)
        if state is not None:
            state.tokens -= state.sessions.pop(session_id, 0.0)
            if not state.sessions:
                state.tokens = 0.0  # no float drift once empty

    def replica_removed(self, replica: str) -> None:
        """Forget a replica and its sessions."""
        self._floor_contexts.clear()
        state = self.replicas.pop(replica, None)
        for session_id in () if state is None else state.sessions:
            self._first.pop(session_id, None)
            self._context.pop(session_id, None)
            self._replica.pop(session_id, None)

    # -- the decision -------------------------------------------------------------------------

    def room(self, replica: str, *, capacity_tokens: int, prompt_tokens: int = 0, scale: float = 1.0) -> int:
        """How many more new sessions fit the replica's KV budget by projection (pure; never negative).

        ``scale`` multiplies the budget (an eviction budget's factor, :mod:`~rolloutpool.routing.eviction_budget`).
        """
        state = self.replicas.get(replica)
        used = 0.0 if state is None else state.tokens
        budget = capacity_tokens * (1.0 - self.config.headroom) * scale - used
        need = self.project(self.first_estimate(prompt_tokens)) if prompt_tokens > 0 else self.need
        return max(0, int(budget // max(need, 1.0)))

    def refresh(self) -> bool:
        """Take up the fleet-wide estimates for new sessions' projections; whether :attr:`need` changed."""
        need = self.project(self.first_estimate())
        changed, self.need = need != self.need, need
        return changed
