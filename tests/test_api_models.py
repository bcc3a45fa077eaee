"""The pydantic models accept the examples and reject every invalid case, naming the field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from poolcases import invalid_cases, load_example
from rolloutpool.api import RolloutPool, RolloutPoolStatus


@pytest.mark.parametrize("name", ["simulated-pool.yaml", "vllm-pool.yaml"])
def test_examples_are_valid(name: str) -> None:
    pool = RolloutPool.model_validate(load_example(name))
    assert pool.spec.replicas >= 1
    # defaults of omitted sections are filled, as the API server fills them
    assert pool.spec.update_strategy.drain_timeout_seconds == 1800


def test_there_are_at_least_twelve_invalid_cases() -> None:
    assert len({c.id for c in invalid_cases()}) >= 12


@pytest.mark.parametrize("case", invalid_cases(), ids=lambda c: c.id)
def test_invalid_manifest_rejected_naming_field(case) -> None:
    with pytest.raises(ValidationError) as info:
        RolloutPool.model_validate(case.manifest)
    locations = [".".join(str(p) for p in err["loc"]) for err in info.value.errors()]
    messages = " ".join(err["msg"] for err in info.value.errors())
    leaf = case.field.rsplit(".", 1)[-1]
    # pydantic names the field by location, or (for cross-field rules) in the message
    assert any(loc.startswith(case.field) for loc in locations) or case.field in messages or (leaf in messages), (
        locations,
        messages,
    )


def test_camel_case_round_trip() -> None:
    pool = RolloutPool.model_validate(load_example("vllm-pool.yaml"))
    dumped = pool.model_dump(by_alias=True, exclude_none=True)
    assert dumped["spec"]["engine"]["maxModelLen"] == 32768
    assert dumped["spec"]["concurrency"]["maxSessionsPerReplica"] == 256
    assert RolloutPool.model_validate(dumped) == pool


def test_status_tolerates_unknown_fields_and_parses_times() -> None:
    status = RolloutPoolStatus.model_validate(
        {
            "readyReplicas": 2,
            "futureField": 1,
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "AllReady", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ],
        }
    )
    assert status.ready_replicas == 2
    assert status.conditions[0].last_transition_time.year == 2026


def test_the_specs_scheduler_defaults_are_the_routers() -> None:
    """A pool without ``concurrency`` schedules turns as ``rolloutpool router`` does with no flags (the spec cannot
    import the routing layer, so the two defaults are written twice and kept equal here)."""
    from rolloutpool.api.spec import ConcurrencySpec  # noqa: PLC0415
    from rolloutpool.routing.workingset_state import WorkingSetConfig  # noqa: PLC0415

    spec, router = ConcurrencySpec(), WorkingSetConfig()
    assert spec.working_set_target == router.target
    assert spec.keep_quantile == router.keep_quantile
    assert spec.prefill_tokens_per_second == router.prefill_tokens_per_s
    assert spec.hold_limit_seconds == router.hold_limit_s
