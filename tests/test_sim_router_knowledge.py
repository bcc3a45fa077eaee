"""What the simulated router is told about a turn: no more than the real router learns from its clients.

The real router never sees a prompt's size before the turn's usage. It learns a session's GRPO group from the
``X-Session-Group`` hint, which vllm-router's clients (and ``rolloutpool bench``'s, by default) do not send, or,
ours only, from the opening prompt the group's rollouts share (``RouterConfig.infer_groups``). The fleet simulator
must run our router and the peers on its ledger with the same knowledge, or its figures credit a router with
information it cannot have.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from rolloutpool.router.config import RouterConfig
from rolloutpool.routing.policies import Clairvoyant, Placement, SessionAware, make_policy
from rolloutpool.sim import fleet as fleet_module
from rolloutpool.sim.config import FleetConfig
from rolloutpool.sim.peers import peer_setup
from rolloutpool.sim.runner import fleet_floor
from rolloutpool.sim.workload import scenario


def _config(*, group_hint: bool = False) -> FleetConfig:
    cfg = FleetConfig(scenario=scenario("agentic-grpo"), in_flight=1, replicas=2, duration_s=120.0)
    return replace(cfg, in_flight=round(2 * fleet_floor(cfg)), group_hint=group_hint)


def _fleet(cfg: FleetConfig, policy_name: str) -> fleet_module._Fleet:
    peer = peer_setup(policy_name)
    policy = peer.policy if peer is not None else make_policy(policy_name)
    return fleet_module._Fleet(cfg, policy, None, peer=peer)


def _placements(cfg: FleetConfig, policy_name: str, monkeypatch: pytest.MonkeyPatch) -> list[Placement]:
    """Every placement the fleet hands the ledger in a short run."""
    seen: list[Placement] = []
    original = fleet_module._Fleet._placement

    def spy(self: fleet_module._Fleet, traj: object, resident: int | None) -> Placement:
        placement = original(self, traj, resident)  # type: ignore[arg-type]
        seen.append(placement)
        return placement

    monkeypatch.setattr(fleet_module._Fleet, "_placement", spy)
    _fleet(cfg, policy_name).run()
    assert seen, "the run placed no turn"
    return seen


def _shares_groups(placements: list[Placement]) -> bool:
    groups = {p.group for p in placements}
    return None not in groups and 1 < len(groups) < len({p.session_id for p in placements})


def test_our_router_is_told_no_prompt_size_and_names_groups_by_their_opening_prompt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen = _placements(_config(), "rolloutpool", monkeypatch)
    assert all(p.prompt_tokens == 0 and p.projected_tokens == 0 for p in seen)
    assert _shares_groups(seen)  # a group's rollouts open with one prompt: router/proxy.py names the group by it


def test_the_simulated_router_infers_groups_as_the_real_one_does_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert FleetConfig.infer_groups is RouterConfig.infer_groups is True  # one default for both
    assert all(p.group is None for p in _placements(replace(_config(), infer_groups=False), "rolloutpool", monkeypatch))


@pytest.mark.parametrize("name", ["sticky-least-loaded", "thunderagent", "progress-ttl"])
def test_the_others_learn_a_group_only_from_the_hint(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert all(p.group is None for p in _placements(_config(), name, monkeypatch))
    hinted = _placements(_config(group_hint=True), name, monkeypatch)
    assert _shares_groups(hinted)
    assert all(p.prompt_tokens == 0 for p in hinted)


def test_only_the_clairvoyant_reference_knows_prompts_and_final_contexts(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _placements(_config(), "clairvoyant", monkeypatch)
    assert all(p.prompt_tokens > 0 and p.projected_tokens >= p.prompt_tokens for p in seen)
    assert isinstance(make_policy("clairvoyant"), Clairvoyant)
    assert isinstance(make_policy("rolloutpool"), SessionAware)


def test_a_known_group_shares_its_prompt_in_the_working_set() -> None:
    """Members on one replica count their group's prompt once (learned from the first usage); a peer told no group
    counts it per member."""
    fleet = _fleet(_config(), "rolloutpool")
    fleet.run()
    work = fleet.ledger.work
    assert work is not None
    assert any(entry[0] > 1 and entry[1] > 0 for replica in work.replicas.values() for entry in replica.groups.values())
    peer = _fleet(_config(), "thunderagent")
    peer.run()
    assert peer.ledger.work is not None
    assert all(not replica.groups for replica in peer.ledger.work.replicas.values())


def test_residency_is_told_only_where_the_engines_publish_kv_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """With KV events a returning turn carries its resident context (the index's exact count); without them the router
    has no index (``rolloutpool router`` without ``--kv-events``), so neither has the simulated one."""
    told = [p.resident_tokens for p in _placements(_config(), "rolloutpool", monkeypatch)]
    assert any(r is not None and r > 0 for r in told)  # returning turns found their prefix
    assert all(
        p.resident_tokens is None for p in _placements(replace(_config(), kv_events=False), "rolloutpool", monkeypatch)
    )


def test_bench_simulate_follows_the_benchs_kv_events_switch() -> None:
    from rolloutpool.dev.bench.config import BenchConfig  # noqa: PLC0415
    from rolloutpool.dev.bench.simulated import fleet_config  # noqa: PLC0415

    bench = BenchConfig(scenario=scenario("agentic-grpo"), routers=("rolloutpool",))
    assert fleet_config(bench).kv_events is True
    assert fleet_config(replace(bench, kv_events=False)).kv_events is False
