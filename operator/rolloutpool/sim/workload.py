"""The rollout workload shared by ``simulate`` and ``bench`` (DESIGN section 6), seeded.

Agentic GRPO, fully asynchronous: the trainer keeps ``in_flight`` trajectories going
and starts a new one when one finishes. Consecutive trajectories form groups of
``group_size`` sharing one prompt. Each turn the model generates an action, then the
environment answers after a tool latency with an observation appended to the
context. A trajectory ends after its drawn number of turns or at ``max_model_len``.

Every trajectory is drawn up front from its own generator seeded by
``(seed, index)``, so every policy sees exactly the same trajectories in the same
order, and the clairvoyant reference can read a trajectory's future.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np

__all__ = [
    "SCENARIOS",
    "Lognormal",
    "Scenario",
    "Trajectory",
    "TrajectorySource",
    "scenario",
]

_Z90 = 1.2815515655446004  # standard normal 90th percentile


@dataclass(frozen=True)
class Lognormal:
    """A lognormal distribution given by its median and 90th percentile."""

    median: float
    p90: float

    def __post_init__(self) -> None:
        if not 0 < self.median <= self.p90:
            raise ValueError(f"need 0 < median <= p90, got median={self.median} p90={self.p90}")

    @property
    def sigma(self) -> float:
        """Standard deviation of the underlying normal."""
        return math.log(self.p90 / self.median) / _Z90

    def draw(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` samples."""
        return np.asarray(rng.lognormal(math.log(self.median), self.sigma, size))


@dataclass(frozen=True)
class Scenario:
    """Every knob of the workload."""

    name: str
    description: str
    group_size: int = 16
    prompt_tokens: Lognormal = field(default_factory=lambda: Lognormal(2000, 2600))
    action_tokens: Lognormal = field(default_factory=lambda: Lognormal(300, 900))
    observation_tokens: Lognormal = field(default_factory=lambda: Lognormal(800, 2400))
    tool_latency_s: Lognormal = field(default_factory=lambda: Lognormal(2.0, 15.0))
    turns: Lognormal = field(default_factory=lambda: Lognormal(20, 50))
    max_model_len: int = 32768
    long_share: float = 0.0
    """A bimodal mix: this share of trajectories draws its turns from ``long_turns`` instead of ``turns``."""
    long_turns: Lognormal | None = None
    drift_growth: float = 0.0
    """Policy drift: actions and observations of trajectories started later are longer by up to this fraction."""
    drift_start_s: float = 1800.0
    """When the drift starts (virtual seconds)."""
    drift_duration_s: float = 3600.0
    """How long the growth takes to reach ``drift_growth`` (linear), after which it stays there."""

    def length_scale(self, t: float) -> float:
        """Factor on action and observation lengths of a trajectory started at ``t`` (1.0 without drift)."""
        if self.drift_growth == 0.0 or t <= self.drift_start_s:
            return 1.0
        progress = min(1.0, (t - self.drift_start_s) / self.drift_duration_s)
        return 1.0 + self.drift_growth * progress

    def with_(self, **changes: object) -> Scenario:
        """A copy with some knobs changed."""
        return replace(self, **changes)  # type: ignore[arg-type]


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario(
            name="agentic-grpo",
            description="Agentic GRPO: groups of 16, ~2k prompt, ~20 turns, 300-token actions, 800-token observations",
        ),
        Scenario(
            name="tool-chat",
            description="Short-horizon tool-use chat: ~5 turns, short actions and observations",
            group_size=8,
            prompt_tokens=Lognormal(1000, 1500),
            action_tokens=Lognormal(200, 500),
            observation_tokens=Lognormal(300, 900),
            tool_latency_s=Lognormal(0.5, 3.0),
            turns=Lognormal(5, 9),
        ),
        Scenario(
            name="high-pressure",
            description="Long-horizon coding agent: ~30 turns (p90 56), larger observations, contexts reach the limit",
            prompt_tokens=Lognormal(3000, 4000),
            observation_tokens=Lognormal(1200, 3500),
            turns=Lognormal(29, 56),
        ),
        Scenario(
            name="policy-drift",
            description="agentic-grpo whose actions and observations grow by half between minutes 15 and 75",
            drift_growth=0.5,
            drift_start_s=900.0,
        ),
        Scenario(
            name="policy-drifted",
            description="policy-drift's end state from the start: agentic-grpo with actions and observations x1.5",
            drift_growth=0.5,
            drift_start_s=0.0,
            drift_duration_s=1e-9,
        ),
        Scenario(
            name="short-burst",
            description="Short rollouts at high concurrency: ~4 turns of short actions and observations, contexts"
            " stay under a tenth of maxModelLen (held out: the law was not tuned on it)",
            group_size=8,
            prompt_tokens=Lognormal(800, 1200),
            action_tokens=Lognormal(150, 400),
            observation_tokens=Lognormal(200, 600),
            tool_latency_s=Lognormal(1.0, 6.0),
            turns=Lognormal(4, 8),
        ),
        Scenario(
            name="long-context",
            description="Very long contexts: ~6k prompt, ~40 turns of large observations, most rollouts reach"
            " maxModelLen (held out)",
            prompt_tokens=Lognormal(6000, 9000),
            action_tokens=Lognormal(400, 1200),
            observation_tokens=Lognormal(1500, 4000),
            turns=Lognormal(40, 70),
        ),
        Scenario(
            name="bimodal",
            description="A bimodal mix: 70 % of rollouts end in ~3 short turns, 30 % run ~40 long ones (held out)",
            group_size=8,
            prompt_tokens=Lognormal(1500, 2500),
            action_tokens=Lognormal(250, 800),
            observation_tokens=Lognormal(600, 2000),
            turns=Lognormal(3, 5),
            long_share=0.3,
            long_turns=Lognormal(40, 60),
        ),
        Scenario(
            name="agentic-128k",
            description="Long-horizon agent at 128K contexts, like vLLM's AgentX traces: ~40k-token task context,"
            " ~43 turns of ~444-token actions and ~1k-token observations; half the rollouts reach maxModelLen"
            " 131072, requests average ~80k input tokens (held out)",
            group_size=8,
            prompt_tokens=Lognormal(40_000, 56_000),
            action_tokens=Lognormal(444, 1400),
            observation_tokens=Lognormal(1000, 3500),
            tool_latency_s=Lognormal(3.0, 20.0),
            turns=Lognormal(43, 80),
            max_model_len=131_072,
        ),
    )
}


def scenario(name: str) -> Scenario:
    """Look up a named scenario; ``ValueError`` lists the names."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; choose from {sorted(SCENARIOS)}") from None


@dataclass(frozen=True)
class Trajectory:
    """One rollout, drawn in full before it starts."""

    index: int
    group: int
    prompt_tokens: int
    actions: tuple[int, ...]
    observations: tuple[int, ...]
    tool_latencies: tuple[float, ...]

    @property
    def turns(self) -> int:
        """Planned turns (the context limit may end it earlier)."""
        return len(self.actions)

    def final_context(self, max_model_len: int) -> int:
        """Tokens resident at its largest (the clairvoyant reference reads this)."""
        ctx = self.prompt_tokens
        for turn, action in enumerate(self.actions):
            if ctx >= max_model_len - 1:
                return max_model_len
            ctx += min(action, max_model_len - ctx)
            if turn + 1 < self.turns:
                if ctx + self.observations[turn] >= max_model_len - 1:
                    return ctx
                ctx += self.observations[turn]
        return min(ctx, max_model_len)


class TrajectorySource:
    """Yields trajectories in start order; index ``i`` is the same in every run.

    A trajectory drawn without drift is remembered for the process (keyed by scenario, seed and index, a few
    scenarios at most): the runs of a sweep, one per policy and load, draw each one once.
    """

    _drawn: ClassVar[dict[tuple[Scenario, int], dict[int, Trajectory]]] = {}
    _DRAWN_KEYS: ClassVar[int] = 4

    def __init__(self, scenario: Scenario, seed: int) -> None:
        self.scenario = scenario
        self.seed = seed
        self._next = 0
        self._group_prompt: dict[int, int] = {}
        drawn = TrajectorySource._drawn
        key = (scenario, seed)
        if key not in drawn and len(drawn) >= self._DRAWN_KEYS:
            drawn.clear()
        self._memo = drawn.setdefault(key, {})

    def _group_prompt_tokens(self, group: int) -> int:
        if group not in self._group_prompt:
            rng = np.random.default_rng([self.seed, 1, group])
            self._group_prompt[group] = max(1, round(float(self.scenario.prompt_tokens.draw(rng, 1)[0])))
        return self._group_prompt[group]

    def next(self, now: float = 0.0) -> Trajectory:
        """The next trajectory to start, at virtual time ``now`` (which only matters under drift)."""
        index = self._next
        self._next += 1
        s = self.scenario
        scale = s.length_scale(now)
        if scale == 1.0:
            known = self._memo.get(index)
            if known is None:
                known = self._memo[index] = self._draw(index, scale)
            return known
        return self._draw(index, scale)

    def _draw(self, index: int, scale: float) -> Trajectory:
        group = index // self.scenario.group_size
        s = self.scenario
        rng = np.random.default_rng([self.seed, 2, index])
        turns_dist = s.turns
        if s.long_share > 0.0 and s.long_turns is not None and float(rng.random()) < s.long_share:
            turns_dist = s.long_turns  # drawn only for a mix, so other scenarios keep their streams
        turns = max(1, round(float(turns_dist.draw(rng, 1)[0])))
        # Python floats (tolist) are the same numbers as numpy's, and far cheaper to loop over
        actions = tuple(max(1, round(x * scale)) for x in s.action_tokens.draw(rng, turns).tolist())
        observations = tuple(max(1, round(x * scale)) for x in s.observation_tokens.draw(rng, turns).tolist())
        latencies = tuple(s.tool_latency_s.draw(rng, turns).tolist())
        return Trajectory(
            index=index,
            group=group,
            prompt_tokens=self._group_prompt_tokens(group),
            actions=actions,
            observations=observations,
            tool_latencies=latencies,
        )
