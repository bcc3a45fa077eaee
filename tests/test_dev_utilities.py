"""The dev tools' shared utilities: polling, process groups, free ports."""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from rolloutpool.dev.net import free_port
from rolloutpool.dev.processes import pid_alive, signal_group, start_group, stop_group
from rolloutpool.dev.wait import wait_until, wait_until_async


def test_wait_until_returns_the_first_truthy_value() -> None:
    values = iter([None, 0, "", "found"])
    assert wait_until(lambda: next(values), timeout=5.0, interval=0.001) == "found"


def test_wait_until_names_what_it_waited_for_and_the_last_ignored_error() -> None:
    def check() -> bool:
        raise KeyError("not yet")

    with pytest.raises(TimeoutError, match=r"timed out after 0.05s waiting for the pod \(last error: 'not yet'\)"):
        wait_until(check, what="the pod", timeout=0.05, interval=0.01, ignore=(KeyError,))


def test_wait_until_lets_an_error_it_does_not_ignore_through_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(ValueError, match="broken"):
        wait_until(lambda: int("broken"), timeout=5.0, ignore=(KeyError,))
    assert time.monotonic() - started < 1.0


async def test_wait_until_async_awaits_a_check_that_returns_an_awaitable() -> None:
    calls = 0

    async def check() -> int | None:
        nonlocal calls
        calls += 1
        return calls if calls >= 3 else None

    assert await wait_until_async(check, timeout=5.0, interval=0.001) == 3
    with pytest.raises(TimeoutError, match="waiting for the condition"):
        await wait_until_async(lambda: False, timeout=0.02, interval=0.005)


def test_free_port_can_be_bound() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_stop_group_stops_a_child_that_ignores_sigterm_and_its_children(tmp_path: Path) -> None:
    script = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    log = tmp_path / "logs" / "child.log"
    popen = start_group([sys.executable, "-c", script], log=log, die_with_parent=signal.SIGKILL)
    wait_until(lambda: "up" in log.read_text(), timeout=20.0)
    stop_group(popen.pid, grace=0.3, popen=popen)
    assert popen.returncode == -signal.SIGKILL
    assert not pid_alive(popen.pid)
    signal_group(popen.pid, signal.SIGKILL)  # a group already gone is not an error
    stop_group(popen.pid, popen=popen)  # idempotent
