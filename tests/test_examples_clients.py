"""The four framework-style clients of ``examples/clients`` run unchanged against our router and vllm-router.

One run of ``examples/clients/run_all.py`` (real engine-sim processes with a small KV pool,
our router with a cap of 2 live sessions per replica, and vllm-router when it is
installed) feeds every test here; each test reads the summaries it wrote.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

CLIENTS_DIR = Path(__file__).resolve().parents[1] / "examples" / "clients"
CLIENTS = ["art_style.py", "areal_style.py", "skyrl_style.py", "prime_rl_style.py"]
SESSIONLESS = ["art_style.py", "areal_style.py"]
WITH_SESSION_ID = ["skyrl_style.py", "prime_rl_style.py"]


def _vllm_router_installed() -> bool:
    return bool(shutil.which("vllm-router")) or Path(sys.executable).with_name("vllm-router").exists()


ROUTERS = ["ours", *(["vllm-sticky", "vllm-cache-aware"] if _vllm_router_installed() else [])]


@pytest.fixture(scope="module")
def summaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("clients")
    cmd = [sys.executable, str(CLIENTS_DIR / "run_all.py"), "--routers", *ROUTERS]
    cmd += ["--json", str(out / "summaries.json"), "--logs", str(out / "logs"), "--client-timeout", "60"]
    # its own process group: a timeout ends run_all.py and every engine and router it started
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    path = out / "summaries.json"
    assert path.exists(), f"run_all.py wrote no summaries (exit {proc.returncode}): {stderr[-2000:]}"
    print(stdout)  # the table, shown with -s or on failure
    data: dict[str, dict[str, Any]] = json.loads(path.read_text())
    return data


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("client", CLIENTS)
def test_no_turn_is_lost_and_every_answer_carries_logprobs(
    summaries: dict[str, dict[str, Any]], client: str, router: str
) -> None:
    summary = summaries[client][router]
    assert "crashed" not in summary, summary
    assert summary["planned_turns"] > 0
    assert summary["turns"] == summary["planned_turns"], summary["errors"]
    assert summary["lost_turns"] == 0, summary["errors"]
    assert summary["turns_without_logprobs"] == 0
    assert summary["verdicts"]["no lost turns"] == summary["verdicts"]["logprobs present"] == "ok"


@pytest.mark.parametrize("client", CLIENTS)
def test_our_router_ran_every_client_at_cap(summaries: dict[str, dict[str, Any]], client: str) -> None:
    """More trajectories than the fleet's places: some waited in the admission queue, and none was lost."""
    summary = summaries[client]["ours"]
    assert summary["waited_at_cap"] > 0
    assert summary["lost_turns"] == 0


@pytest.mark.parametrize("router", ROUTERS)
def test_skyrl_detokenize_is_answered_at_once(summaries: dict[str, dict[str, Any]], router: str) -> None:
    summary = summaries["skyrl_style.py"][router]
    assert summary["verdicts"]["detokenize answered at once"] == "ok", summary["slowest_detokenize_s"]


@pytest.mark.parametrize("router", ROUTERS)
@pytest.mark.parametrize("client", WITH_SESSION_ID)
def test_clients_with_a_session_id_keep_their_replica_and_pass(
    summaries: dict[str, dict[str, Any]], client: str, router: str
) -> None:
    summary = summaries[client][router]
    assert summary["affinity_misses"] == 0
    assert summary["exit"] == 0, summary["verdicts"]


@pytest.mark.parametrize("router", ["ours", *(r for r in ROUTERS if r == "vllm-cache-aware")])
@pytest.mark.parametrize("client", SESSIONLESS)
def test_sessionless_clients_keep_their_replica_and_pass(
    summaries: dict[str, dict[str, Any]], client: str, router: str
) -> None:
    """ART and AReaL send no session id: only the prefix says which replica holds the conversation.

    vllm-router's ``cache_aware`` keeps them (a prefix tree per worker); its
    ``sticky_least_loaded`` is not held to it: without a session id it balances AReaL's
    completions across workers and they miss (the table of ``run_all.py`` shows it).
    """
    summary = summaries[client][router]
    assert summary["affinity_misses"] == 0
    assert summary["exit"] == 0, summary["verdicts"]


# -- the verdicts of common.py, on made-up turns -------------------------------------------------


def _common() -> ModuleType:
    spec = importlib.util.spec_from_file_location("clients_common", CLIENTS_DIR / "common.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _usage(prompt: int, cached: int | None) -> dict[str, Any]:
    details = None if cached is None else {"cached_tokens": cached}
    return {"prompt_tokens": prompt, "completion_tokens": 8, "prompt_tokens_details": details}


def test_a_shortfall_is_a_miss_on_another_engine_and_eviction_on_the_same_one() -> None:
    common = _common()
    tally = common.Tally("t", "u", block_size=16)
    hit, moved, evicted, unnamed = (common.Trajectory() for _ in range(4))
    for state, engines in ((hit, ("a", "a")), (moved, ("a", "b")), (evicted, ("a", "a")), (unnamed, (None, None))):
        tally.turn(state, usage=_usage(100, 0), engine=engines[0], logprobs_ok=True)
    tally.turn(hit, usage=_usage(150, 96), engine="a", logprobs_ok=True)  # 100 tokens resident: 6 whole blocks
    tally.turn(moved, usage=_usage(150, 0), engine="b", logprobs_ok=True)
    tally.turn(evicted, usage=_usage(150, 32), engine="a", logprobs_ok=True)
    tally.turn(unnamed, usage=_usage(150, 80), engine=None, logprobs_ok=False)
    tally.planned = 9
    assert (tally.misses, tally.evicted, tally.logprobs_missing, tally.lost_turns) == (2, 1, 1, 1)
    assert tally.verdicts() == {"no lost turns": False, "no affinity misses": False, "logprobs present": False}
    assert tally.engines == {"a": 5, "b": 1}
