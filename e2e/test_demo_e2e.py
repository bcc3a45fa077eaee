"""The README's demo: control plane, CRD, example pools, `kubectl get rp`; Ctrl-C leaves nothing behind."""

from __future__ import annotations

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
            try:
                if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_demo_shows_pools_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    log = tmp_path / "demo.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rolloutpool.cli", "demo", "--dir", str(directory)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "200"},
        )
    try:
        deadline = time.monotonic() + 180
        while "press Ctrl-C" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.5)
        text = log.read_text()
        assert "NAME" in text
        assert "QUARANTINED" in text
        assert "sim-grpo" in text
        assert "qwen3-8b-grpo" in text
        assert len(_mentioning(str(directory))) >= 3  # etcd, apiserver, controller-manager
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "no processes left behind" in log.read_text()
    assert _mentioning(str(directory)) == []
