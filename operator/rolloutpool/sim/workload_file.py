"""A user's own workload for the simulator: a YAML file checked by pydantic, turned into a :class:`Scenario`.

```yaml
name: my-agent              # optional (the file's stem)
groupSize: 8
maxModelLen: 32768
promptTokens: {median: 2000, p90: 2600}
actionTokens: {median: 300, p90: 900}
observationTokens: {median: 800, p90: 2400}
toolLatencySeconds: {median: 2.0, p90: 15.0}
turns: {median: 20, p90: 50}
longShare: 0.3              # optional bimodal mix: this share draws its turns from longTurns
longTurns: {median: 40, p90: 60}
drift: {growth: 0.5, startSeconds: 900, durationSeconds: 3600}   # optional
```

Every distribution is a lognormal given by its median and 90th percentile. Unknown keys,
missing distributions and impossible values are errors that name the field (and its line).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rolloutpool.sim.workload import Lognormal, Scenario

__all__ = ["Distribution", "Drift", "WorkloadFile", "WorkloadFileError", "load_workload"]


class WorkloadFileError(ValueError):
    """A workload file that cannot be read or does not validate (the message names the field)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True, use_attribute_docstrings=True)


class Distribution(_Model):
    """A lognormal by its median and 90th percentile."""

    median: float = Field(gt=0)
    """Median."""
    p90: float = Field(gt=0)
    """90th percentile (at least the median)."""

    @model_validator(mode="after")
    def _ordered(self) -> Distribution:
        if self.p90 < self.median:
            raise ValueError(f"p90 ({self.p90:g}) must be at least the median ({self.median:g})")
        return self

    def lognormal(self) -> Lognormal:
        """The simulator's distribution."""
        return Lognormal(self.median, self.p90)


class Drift(_Model):
    """Policy drift: actions and observations of later trajectories grow linearly."""

    growth: float = Field(ge=0, le=10)
    """Fraction by which lengths have grown at the end of the drift."""
    start_seconds: float = Field(default=1800.0, ge=0, alias="startSeconds")
    """When the drift starts (simulated seconds)."""
    duration_seconds: float = Field(default=3600.0, gt=0, alias="durationSeconds")
    """How long the growth takes."""


class WorkloadFile(_Model):
    """The workload: every knob of a :class:`~rolloutpool.sim.workload.Scenario`."""

    name: str | None = Field(default=None, min_length=1, max_length=63)
    """Name in tables (default: the file's stem)."""
    description: str = ""
    """Free text."""
    group_size: int = Field(ge=1, le=1024, alias="groupSize")
    """Rollouts per group sharing one prompt (GRPO)."""
    max_model_len: int = Field(ge=256, le=4_194_304, alias="maxModelLen")
    """The engines' ``--max-model-len``; a rollout ends there."""
    prompt_tokens: Distribution = Field(alias="promptTokens")
    """A group's prompt length."""
    action_tokens: Distribution = Field(alias="actionTokens")
    """Tokens the model generates per turn."""
    observation_tokens: Distribution = Field(alias="observationTokens")
    """Tokens the environment appends per turn."""
    tool_latency_seconds: Distribution = Field(alias="toolLatencySeconds")
    """Seconds the environment takes per turn."""
    turns: Distribution
    """Turns per rollout."""
    long_share: float = Field(default=0.0, ge=0, le=1, alias="longShare")
    """Share of rollouts whose turns come from ``longTurns`` (a bimodal mix)."""
    long_turns: Distribution | None = Field(default=None, alias="longTurns")
    """Turns of the long share."""
    drift: Drift | None = None
    """Optional policy drift."""

    @model_validator(mode="after")
    def _mix(self) -> WorkloadFile:
        if self.long_share > 0 and self.long_turns is None:
            raise ValueError("longShare needs longTurns")
        if self.prompt_tokens.median >= self.max_model_len:
            raise ValueError(f"promptTokens.median must be under maxModelLen ({self.max_model_len})")
        return self

    def scenario(self, default_name: str) -> Scenario:
        """The simulator's scenario."""
        drift = self.drift or Drift(growth=0.0)
        return Scenario(
            name=self.name or default_name,
            description=self.description or f"workload file {default_name}",
            group_size=self.group_size,
            prompt_tokens=self.prompt_tokens.lognormal(),
            action_tokens=self.action_tokens.lognormal(),
            observation_tokens=self.observation_tokens.lognormal(),
            tool_latency_s=self.tool_latency_seconds.lognormal(),
            turns=self.turns.lognormal(),
            max_model_len=self.max_model_len,
            long_share=self.long_share,
            long_turns=None if self.long_turns is None else self.long_turns.lognormal(),
            drift_growth=drift.growth,
            drift_start_s=drift.start_seconds,
            drift_duration_s=drift.duration_seconds,
        )


def _where(error: dict[str, object]) -> str:
    return ".".join(str(p) for p in error.get("loc", ())) or "(file)"  # type: ignore[attr-defined]


def _key_lines(text: str) -> dict[tuple[str, ...], int]:
    """1-based line of every mapping key, by its path (pure)."""
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                where = (*path, str(key.value))
                lines[where] = key.start_mark.line + 1
                walk(value, where)

    root = yaml.compose(text)
    if root is not None:
        walk(root, ())
    return lines


def _problem(error: dict[str, object], lines: dict[tuple[str, ...], int]) -> str:
    loc = tuple(str(p) for p in error.get("loc", ()))  # type: ignore[attr-defined]
    while loc and loc not in lines:  # a missing field: the line of the mapping it is missing from
        loc = loc[:-1]
    line = f" (line {lines[loc]})" if loc else ""
    return f"{_where(error)}: {error['msg']}{line}"


def load_workload(path: Path) -> Scenario:
    """Read and check a workload file; :class:`WorkloadFileError` names every bad field."""
    try:
        text = path.read_text()
        data = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as err:
        raise WorkloadFileError(f"{path}: cannot read: {err}") from None
    if not isinstance(data, dict):
        raise WorkloadFileError(f"{path}: expected a mapping of workload fields, got {type(data).__name__}")
    try:
        model = WorkloadFile.model_validate(data)
    except ValidationError as err:
        lines = _key_lines(text)
        problems = "; ".join(_problem(e, lines) for e in err.errors())  # type: ignore[arg-type]
        raise WorkloadFileError(f"{path}: {problems}") from None
    return model.scenario(path.stem)
