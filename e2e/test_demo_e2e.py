"""The README's demo, for real: chart, operator pod, simulated pool and sticky least-loaded beside it.

Runs ``rolloutpool demo --once`` as a user would (a subprocess), then checks what it
printed and wrote (both sides served the load; sticky least-loaded evicted and re-prefilled
more than RolloutPool), and that nothing it started is left running. A second run is
interrupted with SIGINT mid-load and must stop just as cleanly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rolloutpool.dev.processes import pid_alive


def _mentioning(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:  # pods run by the kubelet name their pod directory in HOME, not on the command line
                if any(marker.encode() in Path(f"/proc/{entry}/{f}").read_bytes() for f in ("cmdline", "environ")):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _start(directory: Path, log: Path, *args: str) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "rolloutpool.cli", "demo", "--dir", str(directory), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "200"},
        )


def test_demo_runs_both_sides_under_the_same_load_and_leaves_nothing(tmp_path: Path) -> None:
    directory, log = tmp_path / "demo", tmp_path / "demo.log"
    proc = _start(directory, log, "--once")
    try:
        assert proc.wait(timeout=900) == 0, log.read_text()[-5000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "no processes left behind" in text
    assert "Same load: RolloutPool generated" in text, text[-5000:]
    timeline = json.loads((directory / "timeline.json").read_text())
    assert {"load", "released"} <= set(timeline["marks"])
    ours, peer = timeline["sides"]["rolloutpool"], timeline["sides"]["vllm-sticky-least-loaded"]
    assert len(ours["points"]) >= 20
    assert len(peer["points"]) >= 20
    assert all(p["router"] is not None for p in ours["points"])
    assert all(p["router"] is None for p in peer["points"])
    summary = timeline["summary"]
    s_ours, s_peer = summary["rolloutpool"], summary["vllm-sticky-least-loaded"]
    print(f"demo summary: {s_ours} vs {s_peer}")
    assert s_ours["generated"] > 0
    assert s_peer["generated"] > 0
    assert s_ours["errors"] == s_peer["errors"] == 0
    assert s_peer["preemptions"] > 0, "the load should make sticky least-loaded evict"
    assert s_ours["reprefilled"] < s_peer["reprefilled"] / 2
    assert s_ours["held_total"] > 0
    samples = [r for s in timeline["samples"] for r in s["replicas"]]
    assert all(r.get("reason") for r in samples if r.get("quarantined"))
    assert all(r.get("routerReason") for r in samples if r.get("routerQuarantined"))
    if any(r.get("quarantined") or r.get("routerQuarantined") for r in samples):
        assert "A replica was quarantined and released." in text, text[-5000:]
    assert (directory / "timeline.png").stat().st_size > 30_000
    assert timeline["peer_pids"]
    assert [pid for pid in timeline["peer_pids"] if pid_alive(pid)] == []
    assert _mentioning(str(directory)) == []


def test_demo_stops_cleanly_on_ctrl_c_under_load(tmp_path: Path) -> None:
    directory, log = tmp_path / "demo", tmp_path / "demo.log"
    proc = _start(directory, log)
    try:
        deadline = time.monotonic() + 600
        while "starting" not in log.read_text():
            assert proc.poll() is None, log.read_text()[-5000:]
            assert time.monotonic() < deadline, log.read_text()[-5000:]
            time.sleep(0.5)
        assert len(_mentioning(str(directory))) >= 6  # control plane, kubelet, Prometheus, operator, engines, router
        time.sleep(5)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=180) == 0, log.read_text()[-5000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "no processes left behind" in log.read_text()
    assert _mentioning(str(directory)) == []
    peer_pids = json.loads((directory / "timeline.json").read_text())["peer_pids"]
    assert peer_pids
    assert [pid for pid in peer_pids if pid_alive(pid)] == []
