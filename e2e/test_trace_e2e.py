"""Trace in, trace out, on the whole product: the router of a pool records a trace, ``simulate --trace`` replays it.

The full-stack fixtures (``LocalStack``: real control plane, process kubelet, Prometheus, the chart
installed with ``helm``; always stopped, no process left) run the demo's simulated pool with
``spec.router.trace.enabled`` and without autoscaling, so the operator publishes no working-set target and the
router schedules turns by its own (``concurrency.workingSetTarget``, the simulator's default too), with no session
ceiling. Rollouts (the bench client's tool-chat, with their GRPO group in ``X-Session-Group``) outgrow the replicas'
working sets, so turns are held and idle prefixes let go and re-prefilled; the trace is
read from the router pod's state volume and replayed on the trace's own fleet (its replicas and KV
capacity), at the engines' time scale. The replay's cached tokens per turn must land within
:data:`TOLERANCE` of what the router saw; the comparison is written to
``docs/img/trace-replay-e2e.md`` for docs/benchmarks.md.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from fullstack_kit import diagnosis, isolated_stack, pod_dirs, processes_under, router_pod
from rolloutpool.cli import main
from rolloutpool.dev.bench.client import ClientConfig, run_client
from rolloutpool.dev.demo import POOL, demo_pool
from rolloutpool.dev.stack import TRANSIENT_ERRORS, LocalStack
from rolloutpool.dev.wait import wait_until
from rolloutpool.routing.trace import read_trace
from rolloutpool.sim.workload import Lognormal, scenario

DOCS = Path(__file__).resolve().parent.parent / "docs" / "img"
TIME_SCALE = 10.0
IN_FLIGHT = 30
LOAD_SECONDS = 150.0
TARGET = 0.9
"""The working-set target of the pool and of the replay (``WorkingSetConfig``'s default): 10 rollouts per replica
whose contexts grow to 8,192 tokens outgrow 0.9 x 32,768 tokens, so the router holds turns and lets prefixes go."""
TOLERANCE = 0.10
"""Replayed total cached tokens within 10 % of the recorded (all turns, and turns 1+ alone), and the median
turn's error within 2 % of its prompt. The replay itself is exact (tests/test_trace.py: a synthetic trace
replays within 0.2 %), and 3 engine-sims behind a router on plain processes replayed within 0.2 % of the
cached tokens and 1 % of the re-prefill; here the engines run as pods of a loaded machine (their turns take
~1.4x the cost model's time: the test prints the ratio), which moves when sessions compete for the cache."""
MEDIAN_TOLERANCE = 0.02


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    directory = tmp_path_factory.mktemp("trace")
    with isolated_stack(directory) as running:
        yield running
    assert processes_under(str(directory)) == [], "processes of the stack left running"


def _trace_file(stack: LocalStack) -> Path:
    (pod,) = router_pod(stack, POOL)
    return pod_dirs(stack, pod) / "volumes" / "state" / "trace.jsonl"


def _settled(path: Path) -> Path | None:
    """The trace once the router has written everything it buffered (unchanged over 2.5 s)."""
    size = path.stat().st_size
    time.sleep(2.5)
    return path if path.stat().st_size == size else None


def test_a_trace_recorded_by_the_router_replays_with_the_cached_tokens_it_saw(
    stack: LocalStack, tmp_path: Path
) -> None:
    pool = demo_pool(
        prometheus_url=stack.prometheus_url, time_scale=TIME_SCALE, kv_capacity_tokens=32768, max_model_len=8192
    )
    pool["spec"]["autoscaling"] = {"enabled": False}
    pool["spec"]["concurrency"] = {"workingSetTarget": TARGET}  # no maxSessionsPerReplica: the replay has none
    pool["spec"]["router"]["trace"] = {"enabled": True, "maxBytes": 64 * 1024 * 1024}
    assert stack.apply(yaml.safe_dump(pool)) == f"rolloutpool.rolloutpool.io/{POOL} created"
    waited = stack.cluster.kubectl("wait", "--for=condition=Ready", f"rp/{POOL}", "--timeout=110s", check=False)
    assert "condition met" in waited.stdout, f"{waited.stderr}\n{diagnosis(stack)}"
    url: str = wait_until(
        lambda: stack.router_url(POOL), what="a ready router pod", timeout=120, interval=0.5, ignore=TRANSIENT_ERRORS
    )
    (router,) = router_pod(stack, POOL)
    args = router["spec"]["containers"][0]["args"]
    assert "--trace-file=/var/lib/rolloutpool/trace.jsonl" in args, args
    assert f"--target={TARGET:g}" in args, args
    assert not any(a.startswith("--cap") for a in args), args

    chat = scenario("tool-chat").with_(max_model_len=8192, turns=Lognormal(8, 16))
    config = ClientConfig(
        base_url=url, scenario=chat, seed=0, in_flight=IN_FLIGHT, duration_s=LOAD_SECONDS, time_scale=TIME_SCALE,
        session_prefix="replay", group_header="X-Session-Group",
    )  # fmt: skip
    result = asyncio.run(run_client(config))
    print(f"load: {len(result.turns)} turns, {len(result.completed)} rollouts, {result.errors} errors")
    assert result.errors == 0
    path: Path = wait_until(
        lambda: _settled(_trace_file(stack)),
        what="the trace written out",
        timeout=30,
        interval=0.5,
        ignore=TRANSIENT_ERRORS,
    )
    trace = read_trace(path.read_text().splitlines())
    assert trace.header.session_ids == "hashed"
    assert trace.header.max_model_len is None  # the router no longer knows it: the replay sizes from the contexts
    assert sorted(r.capacity_tokens for r in trace.replicas) == [32768] * 3
    assert not any("replay-" in t.session for t in trace.turns)  # the ids are hashed
    recorded_turns = len(trace.turns)
    assert recorded_turns >= len(result.turns)  # the router saw every turn the client saw (and ones it gave up on)
    recorded = sum(t.cached_tokens or 0 for t in trace.turns)
    assert recorded == pytest.approx(sum(t.cached_tokens for t in result.turns), rel=0.05)

    # without autoscaling the operator publishes no target and the router schedules turns by its own: the replay
    # runs the same working-set code at the same target
    entries = stack.pool(POOL)["status"]["replicaStatus"]
    assert all(r.get("target") is None and not r.get("quarantined") for r in entries), entries
    # ...whose budget is the target's share of each replica's capacity, and the load outgrew it: prefixes let go
    decisions = _router_metrics(url)
    assert decisions["rolloutpool_router_working_set_budget_tokens"] == {int(TARGET * 32768)}, decisions
    assert sum(decisions["let_go"]) > 0, decisions
    out = tmp_path / "replay"
    replayed = CliRunner().invoke(
        main,
        ["simulate", "--trace", str(path), "--trace-time-scale", str(TIME_SCALE), "--policy", "rolloutpool",
         "--out", str(out)],
    )  # fmt: skip
    assert replayed.exit_code == 0, replayed.output
    print(replayed.output)
    report = json.loads((out / "trace-replay.json").read_text())
    (run,) = report["runs"]
    assert run["replicas"] == 3
    assert run["kv_capacity_tokens"] == 32768
    assert run["turns_missing"] <= 0.02 * recorded_turns, run
    total = run["total"]
    later = _later_turns(run["by_turn"])
    recorded_s = TIME_SCALE * sum(t.ended - t.arrived for t in trace.turns) / recorded_turns
    slower = recorded_s / run["replay_mean_turn_s"]
    print(f"recorded turns took {slower:.2f}x the replayed ones ({recorded_s:.2f} s vs {run['replay_mean_turn_s']} s)")
    stamp = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, e2e/test_trace_e2e.py"
    (DOCS / "trace-replay-e2e.md").write_text(_markdown(run, stamp=stamp, later=later, slower=slower))
    print(json.dumps({"total": total, "turns_1_plus": later}, indent=1))
    assert abs(total["total_error"]) <= TOLERANCE, total
    assert abs(later["total_error"]) <= TOLERANCE, later
    assert total["median_abs_error_of_prompt"] <= MEDIAN_TOLERANCE, total


def _router_metrics(url: str) -> dict[str, set[float] | list[float]]:
    """The router's working-set budgets (distinct values over the replicas) and its let-go decisions per replica."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:  # noqa: S310 - the router's own http URL
        text = resp.read().decode()
    budgets: set[float] = set()
    let_go: list[float] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "rolloutpool_router_working_set_budget_tokens":
                budgets.add(sample.value)
            if sample.name == "rolloutpool_router_turn_decisions_total" and sample.labels["decision"] == "let_go":
                let_go.append(sample.value)
    return {"rolloutpool_router_working_set_budget_tokens": budgets, "let_go": let_go}


def _later_turns(by_turn: dict[str, dict[str, Any]]) -> dict[str, Any]:
    rows = [row for bucket, row in by_turn.items() if bucket != "0"]
    recorded = sum(r["recorded_cached"] for r in rows)
    replayed = sum(r["replayed_cached"] for r in rows)
    return {
        "turns": sum(r["turns"] for r in rows),
        "recorded_cached": recorded,
        "replayed_cached": replayed,
        "total_error": (replayed - recorded) / recorded if recorded else None,
    }


def _markdown(run: dict[str, Any], *, stamp: str, later: dict[str, Any], slower: float) -> str:
    lines = [
        f"<!-- {stamp}: the router's trace of {run['sessions']} sessions, replayed by simulate --trace;"
        f" recorded turns took {slower:.2f}x the replayed ones -->",
        "| turn | turns | recorded cached | replayed cached | error of the total | median abs error / prompt |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    rows = [*run["by_turn"].items(), ("1+", {**later, "median_abs_error_of_prompt": None}), ("all", run["total"])]
    for bucket, row in rows:
        err, med = row["total_error"], row["median_abs_error_of_prompt"]
        lines.append(
            f"| {bucket} | {row['turns']} | {row['recorded_cached']:,} | {row['replayed_cached']:,} | "
            f"{'-' if err is None else f'{err:+.1%}'} | {'-' if med is None else f'{med:.3f}'} |"
        )
    lines.append(
        f"\nRe-prefilled tokens of the previous context: recorded {run['recorded_reprefill_tokens']:,}, "
        f"replayed {run['replayed_reprefill_tokens']:,}."
    )
    return "\n".join(lines) + "\n"
