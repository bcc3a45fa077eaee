"""PrometheusServer runs and always stops a real Prometheus; restart keeps its port and data."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from rolloutpool.dev.localcluster.prometheus import PrometheusServer, StaticTarget, static_scrape_config
from rolloutpool.dev.processes import pid_alive


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_start_stop_restart() -> None:
    server = PrometheusServer(static_scrape_config([], scrape_interval_seconds=1.0))
    with server:
        pid, port, directory = server.pid, server.port, server.directory
        assert pid is not None
        assert pid_alive(pid)
        with urllib.request.urlopen(f"{server.url}/-/ready", timeout=5) as resp:  # noqa: S310 - loopback
            assert resp.status == 200
        assert server.api("status/buildinfo")["version"].startswith("2.")
        server.restart()
        assert server.port == port
        assert server.directory == directory
        assert (directory / "data").is_dir()
        assert server.pid not in (None, pid)
        assert not pid_alive(pid)
        second = server.pid
        assert second is not None
    assert not server.running
    assert not pid_alive(second)
    assert not directory.exists(), "the temporary directory is removed"
    assert port_free(port)
    server.stop()  # idempotent


def test_stopped_when_the_block_raises() -> None:
    server = PrometheusServer(static_scrape_config([StaticTarget("127.0.0.1:9", {"pod": "x"})]))
    pids: list[int | None] = []

    def fail_inside() -> None:
        with server:
            pids.append(server.pid)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_inside()
    (pid,) = pids
    assert pid is not None
    assert not pid_alive(pid)


def test_a_bad_configuration_fails_start_with_the_log_and_leaves_nothing(tmp_path: Path) -> None:
    bad = {"scrape_configs": [{"job_name": "j", "no_such_field": True}]}
    server = PrometheusServer(bad, directory=tmp_path / "prom")
    with pytest.raises(RuntimeError, match="no_such_field"):
        server.start()
    assert not server.running
    assert (tmp_path / "prom" / "prometheus.log").exists(), "a given directory is kept for inspection"
