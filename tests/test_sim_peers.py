"""The peers' turn schedulers in the fleet simulator (sim/peers.py): names, runs, and what each one did."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from rolloutpool.cli import main
from rolloutpool.engine.model.pins import PinningEngine
from rolloutpool.routing.peers.programs import ProgramScheduler
from rolloutpool.routing.peers.progress_ttl import ProgressTTL
from rolloutpool.routing.peers.thunderagent import ThunderAgent
from rolloutpool.sim import fleet as fleet_module
from rolloutpool.sim.compare import variant
from rolloutpool.sim.config import FleetConfig
from rolloutpool.sim.peers import PEERS, peer_setup
from rolloutpool.sim.runner import fleet_floor
from rolloutpool.sim.simulate_run import DEFAULT_POLICIES
from rolloutpool.sim.workload import scenario


def _config(load: float = 3.0) -> FleetConfig:
    cfg = FleetConfig(scenario=scenario("agentic-grpo"), in_flight=1, replicas=2, duration_s=240.0)
    return replace(cfg, in_flight=round(load * fleet_floor(cfg)))


def _fleet(name: str, cfg: FleetConfig):  # type: ignore[no-untyped-def]
    peer = peer_setup(name)
    assert peer is not None
    fleet = fleet_module._Fleet(cfg, peer.policy, None, peer=peer)
    return fleet, fleet.run()


def test_every_peer_has_a_setup_and_none_is_a_default_policy() -> None:
    assert set(PEERS) == {"thunderagent", "progress-ttl", "continuum", "continuum-fixed"}
    assert not set(PEERS) & set(DEFAULT_POLICIES)
    assert peer_setup("sticky-least-loaded") is None
    for name in PEERS:
        assert variant(name) == (name, {})
    assert variant("clairvoyant") == ("clairvoyant", {})  # every anchor in one compare table
    assert variant("consistent-hash") == ("consistent-hash", {})
    with pytest.raises(ValueError, match="thunderagent"):
        variant("thunder")


@pytest.mark.parametrize(("name", "kind"), [("thunderagent", ThunderAgent), ("progress-ttl", ProgressTTL)])
def test_a_program_scheduler_replaces_the_working_set_and_pauses_under_load(name: str, kind: type) -> None:
    cfg = _config()
    fleet, result = _fleet(name, cfg)
    work = fleet.ledger.work
    assert isinstance(work, kind)
    assert isinstance(work, ProgramScheduler)
    assert work.pauses > 0  # three times the floor: its programs' working sets pass the thresholds
    assert sum(r.resumes for r in work.replicas.values()) > 0
    assert result.policy == name
    assert result.completed > 0
    baseline = fleet_module.simulate_policy(cfg, "sticky-least-loaded")
    assert result.reprefilled_tokens < baseline.reprefilled_tokens  # pausing at tool boundaries spares re-prefill


def test_continuum_pins_turns_and_some_programs_come_back_to_their_pin() -> None:
    fleet, result = _fleet("continuum-fixed", _config())
    engines = [d.engine for d in fleet.drivers.values()]
    assert all(isinstance(e, PinningEngine) for e in engines)
    assert fleet.ledger.work is None  # sticky least-loaded in front
    pinned = sum(e.pinned_turns for e in engines)  # type: ignore[attr-defined]
    hits = sum(e.pin_hits for e in engines)  # type: ignore[attr-defined]
    assert pinned > 0
    assert 0 < hits <= pinned
    assert result.completed > 0


def test_the_paper_ttl_learns_the_tools_and_the_run_is_deterministic() -> None:
    cfg = _config(load=1.0)
    fleet, first = _fleet("continuum", cfg)
    engines = [d.engine for d in fleet.drivers.values()]
    assert all(len(e._durations) > 0 for e in engines)  # type: ignore[attr-defined]
    _, second = _fleet("continuum", cfg)
    assert first.tokens_per_s == second.tokens_per_s


def test_simulate_runs_a_peer_by_name(tmp_path: Path) -> None:
    args = ["simulate", "--replicas", "1", "--duration", "60", "--workers", "1", "--no-plots", "--scenario",
            "tool-chat", "--load", "1", "--policy", "thunderagent", "--policy", "continuum",
            "--out", str(tmp_path)]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "results.json").read_text())
    assert [r["policy"] for r in data["runs"]] == ["thunderagent", "continuum"]
