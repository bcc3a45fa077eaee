"""The README's demo, for real: chart, operator pod, simulated pool, load, full working sets and their release.

Runs ``rolloutpool demo --once`` as a user would (a subprocess), then checks what it
printed and wrote, and that nothing it started is left running. A second run is
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


def test_demo_fills_the_working_sets_releases_them_and_leaves_nothing(tmp_path: Path) -> None:
    directory, log = tmp_path / "demo", tmp_path / "demo.log"
    proc = _start(directory, log, "--once")
    try:
        assert proc.wait(timeout=900) == 0, log.read_text()[-5000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "The working sets filled (turns held, prefixes let go) and cleared." in text, text[-5000:]
    assert "no processes left behind" in text
    timeline = json.loads((directory / "timeline.json").read_text())
    assert {"load", "released", "cleared"} <= set(timeline["marks"])
    samples = [r for s in timeline["samples"] for r in s["replicas"]]
    full = [r for r in samples if r.get("heldTurns") or r.get("letGoSessions")]
    assert full, "the timeline never showed a held turn or a prefix let go"
    assert all(r["liveSessions"] > 0 for r in full), full
    assert all(r.get("target") is not None for r in full if r.get("targetReason") != "NoMetrics"), full
    last = timeline["samples"][-1]["replicas"]
    assert not any(r.get("heldTurns") or r.get("letGoSessions") or r.get("quarantined") for r in last), last
    by_law = [r for r in samples if r.get("quarantined")]
    by_router = [r for r in samples if r.get("routerQuarantined")]
    assert all(r.get("reason") for r in by_law)  # a quarantine, if any, says why
    assert all(r.get("routerReason") for r in by_router)
    print(
        f"{len(full)} samples with a full working set; quarantined samples: {len(by_law)} by the operator's law, "
        f"{len(by_router)} by a router"
    )
    assert (directory / "timeline.png").stat().st_size > 10_000
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
