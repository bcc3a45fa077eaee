"""``rolloutpool bench --overhead-only``: wrk output parsing, the acceptance check, and one tiny real run."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from rolloutpool.dev.bench.overhead_only import DIRECT, OURS, PEER, OverheadOnlyConfig, run_overhead_only
from rolloutpool.dev.bench.wrk import WrkResult, acceptance, lua_script, median_of, parse_wrk

WRK_OUTPUT = """Running 2s test @ http://127.0.0.1:1
  1 threads and 32 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     5.10ms    2.00ms  40.00ms   90.00%
  Latency Distribution
     50%  812.00us
     75%    5.00ms
     90%    7.00ms
     99%    1.20s
  1234 requests in 2.00s, 1.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 5
Requests/sec:    617.00
Transfer/sec:    500.00KB
"""


def test_wrk_output_is_parsed_with_its_units() -> None:
    r = parse_wrk(WRK_OUTPUT)
    assert r == WrkResult(requests_per_s=617.0, p50_ms=0.812, p99_ms=1200.0, requests=1234, non_2xx=5, socket_errors=3)
    with pytest.raises(ValueError, match="not wrk"):
        parse_wrk("wrk: connection refused")
    assert median_of([r, r, WrkResult(1, 1, 1, 1, 0, 0)]).requests_per_s == 617.0
    script = lua_script(body_path="body.json", delay_ms=10)
    assert 'wrk.headers["X-Session-ID"] = "s" .. (counter % 512)' in script
    assert "return math.random() * 20.000" in script
    assert "delay" not in lua_script(body_path="body.json")


def test_acceptance_targets_of_issue_13() -> None:
    def row(rps: float, p99: float) -> WrkResult:
        return WrkResult(rps, 1.0, p99, 100, 0, 0)

    sat = {"small": {OURS: row(60, 10), PEER: row(100, 4)}, "large": {OURS: row(79, 8), PEER: row(100, 4)}}
    checks = {c.name: c.passed for c in acceptance(sat, {"small": 0.9}, ours=OURS, peer=PEER)}
    assert checks == {
        f"small: req/s vs {PEER}": True,
        f"small: p99 vs {PEER}": False,
        f"large: req/s vs {PEER}": False,
        f"large: p99 vs {PEER}": True,
        f"small: added p50 over direct at half {PEER}'s rate (ms)": True,
    }


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (apt-get install -y wrk)")
def test_tiny_overhead_only_run_measures_every_target_and_leaves_no_process(tmp_path: Path) -> None:
    peer = shutil.which("vllm-router") or shutil.which("vllm-router", path=str(Path(sys.executable).parent))
    config = OverheadOnlyConfig(
        out_dir=tmp_path, vllm_router_bin=peer, rounds=1, duration_s=1.0, large_prompt_tokens=2000
    )
    summary = run_overhead_only(config, lambda _: None)
    targets = [DIRECT, OURS] + ([PEER] if peer else [])
    for size in ("small", "large"):
        rows = summary["saturation"][size]
        assert list(rows) == targets
        assert all(r["requests"] > 0 and r["non_2xx"] == 0 for r in rows.values()), rows
        assert summary["cpu_us_per_request"][size][OURS] > 0
        assert set(summary["added_p50_ms"][size]) == set(targets) - {DIRECT}
    assert json.loads((tmp_path / "summary.json").read_text())["targets"] == targets
    assert "| acceptance |" in (tmp_path / "summary.md").read_text()
    assert summary["leftover_pids"] == []
