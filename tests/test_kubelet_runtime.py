"""PodRun drives real local processes: restarts with back-off, probes, graceful and forced termination."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from rolloutpool.dev.kubelet.runtime import ContainerRun, Launch, PodRun, run_probe
from rolloutpool.dev.net import free_port
from rolloutpool.dev.wait import wait_until


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(max_workers=2)
    yield pool
    pool.shutdown(wait=True, cancel_futures=True)


def _run(tmp_path: Path, code: str, *, policy: str = "Always", grace: float = 5.0, **spec: Any) -> PodRun:
    launch = Launch(
        argv=[sys.executable, "-c", code], env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, log=tmp_path / "c.log"
    )
    container = ContainerRun(spec={"name": "c", "image": "img", **spec}, launch=launch)
    return PodRun(
        uid="u", key="ns/p", ip="127.0.0.1", directory=tmp_path, restart_policy=policy, grace_seconds=grace,
        containers=[container], now=time.time(), backoff_base=0.2, backoff_cap=0.4,
    )  # fmt: skip


def _log_text(directory: Path) -> str:
    log = directory / "c.log"
    return log.read_text() if log.exists() else ""


def _until(run: PodRun, executor: ThreadPoolExecutor, check: Callable[[], bool], timeout: float = 20.0) -> None:
    """Tick ``run`` until ``check`` holds; kill the pod's processes on any failure."""

    def ticked() -> bool:
        if check():
            return True
        run.tick(now=time.time(), executor=executor)
        return False

    try:
        wait_until(ticked, what="the containers' state", timeout=timeout, interval=0.02)
    except TimeoutError as err:
        run.kill_now()
        raise AssertionError(f"{err}; views={run.views()}") from err
    except BaseException:
        run.kill_now()
        raise


def test_crashing_container_restarts_with_backoff(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    run = _run(tmp_path, "import sys; print('hello', flush=True); sys.exit(3)")
    _until(run, executor, lambda: run.views()[0].restart_count >= 3)
    view = run.views()[0]
    assert view.last_terminated is not None
    assert view.last_terminated.exit_code == 3
    assert view.last_terminated.reason == "Error"
    assert (tmp_path / "c.log").read_text().count("hello") >= 3  # one log across restarts
    _until(run, executor, lambda: run.views()[0].reason == "CrashLoopBackOff")
    assert "back-off 0.4s" in run.views()[0].message  # 0.2 doubled, capped at 0.4
    run.kill_now()


@pytest.mark.parametrize(("policy", "code", "state"), [("Never", 3, "terminated"), ("OnFailure", 0, "terminated")])
def test_no_restart_policies(tmp_path: Path, executor: ThreadPoolExecutor, policy: str, code: int, state: str) -> None:
    run = _run(tmp_path, f"import sys; sys.exit({code})", policy=policy)
    _until(run, executor, lambda: run.views()[0].state == state)
    view = run.views()[0]
    assert view.terminated is not None
    assert view.terminated.exit_code == code
    assert view.restart_count == 0
    assert not run.running()


def test_graceful_termination_then_kill(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    )
    run = _run(tmp_path, stubborn)
    _until(run, executor, lambda: "up" in _log_text(tmp_path))
    started = time.monotonic()
    run.terminate(now=time.time(), grace_seconds=0.5)
    _until(run, executor, lambda: not run.running())
    assert 0.4 < time.monotonic() - started < 5
    view = run.views()[0]
    assert view.state == "terminated"
    assert view.terminated is not None
    assert view.terminated.exit_code == 137  # SIGKILL after the grace period


def test_sigterm_ends_a_polite_process_at_once(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    run = _run(tmp_path, "import time; print('up', flush=True); time.sleep(60)", grace=30)
    _until(run, executor, lambda: "up" in _log_text(tmp_path))
    started = time.monotonic()
    run.terminate(now=time.time(), grace_seconds=30)
    _until(run, executor, lambda: not run.running())
    assert time.monotonic() - started < 5
    assert run.views()[0].terminated is not None
    assert run.views()[0].terminated.exit_code == 128 + 15  # type: ignore[union-attr]


def test_readiness_and_liveness_probes(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    port = free_port()
    server = f"import http.server as h; h.HTTPServer(('127.0.0.1', {port}), h.SimpleHTTPRequestHandler).serve_forever()"
    probe = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 0.1, "failureThreshold": 2}
    run = _run(tmp_path, server, readinessProbe=probe, ports=[{"name": "http", "containerPort": port}])
    assert not run.views()[0].ready
    _until(run, executor, lambda: run.views()[0].ready)
    run.kill_now()
    # a liveness probe that never passes gets the container restarted
    dead = {"tcpSocket": {"port": free_port()}, "periodSeconds": 0.1, "failureThreshold": 2}
    run = _run(tmp_path, "import time; time.sleep(60)", livenessProbe=dead)
    _until(run, executor, lambda: run.views()[0].restart_count >= 1)
    assert run.views()[0].last_terminated is not None
    run.kill_now()


def test_startup_probe_gates_readiness(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    flag = tmp_path / "started"
    startup = {"exec": {"command": ["test", "-e", str(flag)]}, "periodSeconds": 0.1, "failureThreshold": 1000}
    run = _run(tmp_path, "import time; time.sleep(60)", startupProbe=startup)
    _until(run, executor, lambda: run.views()[0].state == "running")
    time.sleep(0.3)
    run.tick(now=time.time(), executor=executor)
    assert not run.views()[0].started
    assert not run.views()[0].ready
    flag.touch()
    _until(run, executor, lambda: run.views()[0].ready)
    assert run.views()[0].started
    run.kill_now()


def test_missing_executable_is_a_start_error(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    launch = Launch(argv=[str(tmp_path / "nope")], env={}, cwd=tmp_path, log=tmp_path / "c.log")
    container = ContainerRun(spec={"name": "c", "image": "img"}, launch=launch)
    run = PodRun(
        uid="u", key="ns/p", ip="127.0.0.1", directory=tmp_path, restart_policy="Never", grace_seconds=1,
        containers=[container], now=time.time(), backoff_base=0.2, backoff_cap=0.4,
    )  # fmt: skip
    run.tick(now=time.time(), executor=executor)
    view = run.views()[0]
    assert view.state == "terminated"
    assert view.terminated is not None
    assert (view.terminated.reason, view.terminated.exit_code) == ("StartError", 128)


def test_config_error_waits(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    container = ContainerRun(spec={"name": "c", "image": "img"}, launch=None, config_error="Secret 's' not found")
    run = PodRun(
        uid="u", key="ns/p", ip="127.0.0.1", directory=tmp_path, restart_policy="Always", grace_seconds=1,
        containers=[container], now=time.time(), backoff_base=0.2, backoff_cap=0.4,
    )  # fmt: skip
    run.tick(now=time.time(), executor=executor)
    view = run.views()[0]
    assert (view.state, view.reason, view.message) == ("waiting", "CreateContainerConfigError", "Secret 's' not found")


def test_an_exec_probe_of_an_image_container_runs_inside_it(tmp_path: Path) -> None:
    # ``join`` stands in for ``enter.py SPEC --join``: it sees the container's pid, then the probe's command
    record = tmp_path / "joined"
    join = (sys.executable, "-c", f"import sys; open({str(record)!r}, 'w').write(' '.join(sys.argv[1:]))")
    launch = Launch(argv=["unused"], env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, log=tmp_path / "c.log", join=join)
    probe = {"exec": {"command": ["false"]}}
    assert run_probe(probe, pod_ip="127.0.0.1", ports={}, launch=launch, pid=4242)
    assert record.read_text() == "4242 -- false"
    plain = Launch(argv=["unused"], env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, log=tmp_path / "c.log")
    assert not run_probe(probe, pod_ip="127.0.0.1", ports={}, launch=plain, pid=4242)
