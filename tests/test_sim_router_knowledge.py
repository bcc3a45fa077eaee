"""What the simulated router is told about a turn: no more than the real router learns from its clients.

The real router never sees a prompt's size before the turn's usage, and learns a session's GRPO group only
from the ``X-Session-Group`` hint, which vllm-router's clients (and ``rolloutpool bench``'s, by default) do not
send. The fleet simulator must run our router (and the peers on its ledger) with the same knowledge, or its
figures credit the router with information it cannot have.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from rolloutpool.routing.policies import Clairvoyant, Placement, SessionAware, make_policy
from rolloutpool.sim import fleet as fleet_module
from rolloutpool.sim.config import FleetConfig
from rolloutpool.sim.runner import fleet_floor
from rolloutpool.sim.workload import scenario


def _config(*, group_hint: bool = False) -> FleetConfig:
    cfg = FleetConfig(scenario=scenario("agentic-grpo"), in_flight=1, replicas=2, duration_s=120.0)
    return replace(cfg, in_flight=round(2 * fleet_floor(cfg)), group_hint=group_hint)


def _placements(cfg: FleetConfig, policy_name: str, monkeypatch: pytest.MonkeyPatch) -> list[Placement]:
    """Every placement the fleet hands the ledger in a short run."""
    seen: list[Placement] = []
    original = fleet_module._Fleet._placement

    def spy(self: fleet_module._Fleet, traj: object, resident: int | None) -> Placement:
        placement = original(self, traj, resident)  # type: ignore[arg-type]
        seen.append(placement)
        return placement

    monkeypatch.setattr(fleet_module._Fleet, "_placement", spy)
    policy = make_policy(policy_name)
    fleet_module._Fleet(cfg, policy, None).run()
    assert seen, "the run placed no turn"
    return seen


def test_our_router_is_told_no_prompt_size_and_no_group_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _placements(_config(), "rolloutpool", monkeypatch)
    assert all(p.prompt_tokens == 0 and p.projected_tokens == 0 for p in seen)
    assert all(p.group is None for p in seen)


def test_the_group_hint_tells_it_each_rollouts_group_and_still_no_prompt_size(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _placements(_config(group_hint=True), "rolloutpool", monkeypatch)
    assert all(p.group is not None for p in seen)
    groups = {p.group for p in seen}
    assert 1 < len(groups) < len({p.session_id for p in seen})  # members of a group share it
    assert all(p.prompt_tokens == 0 for p in seen)


def test_only_the_clairvoyant_reference_knows_prompts_and_final_contexts(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _placements(_config(), "clairvoyant", monkeypatch)
    assert all(p.prompt_tokens > 0 and p.projected_tokens >= p.prompt_tokens for p in seen)
    assert isinstance(make_policy("clairvoyant"), Clairvoyant)
    assert isinstance(make_policy("rolloutpool"), SessionAware)


def test_a_group_learned_from_the_hint_shares_its_prompt_in_the_working_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the hint, members on one replica count their group's prompt once (learned from the first usage)."""
    cfg = _config(group_hint=True)
    fleet = fleet_module._Fleet(cfg, make_policy("rolloutpool"), None)
    fleet.run()
    work = fleet.ledger.work
    assert work is not None
    assert any(entry[0] > 1 and entry[1] > 0 for replica in work.replicas.values() for entry in replica.groups.values())
    plain = fleet_module._Fleet(_config(), make_policy("rolloutpool"), None)
    plain.run()
    assert plain.ledger.work is not None
    assert all(not replica.groups for replica in plain.ledger.work.replicas.values())
