"""Child processes of the benchmark: free loopback ports, readiness waits, guaranteed cleanup.

Every child runs in its own session (process group), so stopping it also stops
whatever it spawned. :class:`ProcessSet` is a context manager: leaving it for any
reason (an exception, Ctrl-C, the end of a phase) terminates every group it started,
newest first, with SIGTERM, then SIGKILL after a grace period. An ``atexit`` hook
is the last safety net for groups still alive when the interpreter exits.
"""

from __future__ import annotations

import atexit
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from rolloutpool.dev.processes import start_group, stop_group

__all__ = [
    "ManagedProcess",
    "ProcessSet",
    "ReadinessError",
    "rolloutpool_argv",
]

_LIVE: dict[int, ManagedProcess] = {}


class ReadinessError(RuntimeError):
    """A child did not become ready in time (or exited first)."""


def rolloutpool_argv(*args: str) -> list[str]:
    """The command line running ``rolloutpool ARGS`` with this interpreter."""
    return [sys.executable, "-c", "from rolloutpool.cli import main; main()", *args]


@dataclass
class ManagedProcess:
    """One child process group, its readiness URL and its log file."""

    name: str
    argv: list[str]
    ready_url: str
    log_path: Path
    popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        """The child's pid (also its process-group id)."""
        if self.popen is None:
            raise RuntimeError(f"{self.name} was not started")
        return self.popen.pid

    def start(self) -> None:
        """Start the child in its own session, output to its log file."""
        self.popen = start_group(self.argv, log=self.log_path)
        _LIVE[self.popen.pid] = self

    def wait_ready(self, *, timeout_s: float, interval_s: float = 0.1) -> None:
        """Poll ``ready_url`` until it answers 200; ``ReadinessError`` on exit or timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.popen is None or self.popen.poll() is not None:
                code = None if self.popen is None else self.popen.returncode
                raise ReadinessError(f"{self.name} exited with code {code} before it was ready; see {self.log_path}")
            try:
                with urllib.request.urlopen(self.ready_url, timeout=2.0) as response:  # noqa: S310 - our http URL
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ReadinessError(f"{self.name} was not ready at {self.ready_url} after {timeout_s:.0f} s")
            time.sleep(interval_s)

    def stop(self, *, grace_s: float = 5.0) -> None:
        """SIGTERM the group, SIGKILL it after ``grace_s``, reap the child; idempotent."""
        popen = self.popen
        if popen is not None:
            stop_group(popen.pid, grace=grace_s, popen=popen)
            _LIVE.pop(popen.pid, None)


class ProcessSet:
    """Children started together and stopped together (newest first) when the block ends."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: list[ManagedProcess] = []

    def start(self, name: str, argv: list[str], *, ready_url: str, timeout_s: float = 60.0) -> ManagedProcess:
        """Start one child and wait until it is ready."""
        process = ManagedProcess(name=name, argv=argv, ready_url=ready_url, log_path=self.log_dir / f"{name}.log")
        self.processes.append(process)
        process.start()
        process.wait_ready(timeout_s=timeout_s)
        return process

    @property
    def pids(self) -> list[int]:
        """Pids of every child started (alive or not)."""
        return [p.pid for p in self.processes if p.popen is not None]

    def stop_all(self) -> None:
        """Stop every child, newest first."""
        for process in reversed(self.processes):
            process.stop()

    def __enter__(self) -> ProcessSet:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()


@atexit.register
def _stop_leftovers() -> None:  # pragma: no cover - only runs when a caller forgot a ProcessSet
    for process in list(_LIVE.values()):
        process.stop(grace_s=1.0)
