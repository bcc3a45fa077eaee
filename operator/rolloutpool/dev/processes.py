"""Child processes in their own process groups: start one, signal it, stop it for good.

Every child runs in its own session (``start_new_session``), so signalling its group reaches
whatever it spawned. ``die_with_parent`` arms ``PR_SET_PDEATHSIG`` (Linux) in the child, so
the death of the parent, even by SIGKILL, takes the child down too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["pid_alive", "signal_group", "start_group", "stop_group"]

_PR_SET_PDEATHSIG = 1


def _parent_death_signal(sig: signal.Signals) -> Callable[[], None]:
    def arm() -> None:  # pragma: no cover - runs in the child between fork and exec
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)

    return arm


def start_group(
    argv: list[str],
    *,
    log: Path,
    append: bool = False,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    die_with_parent: signal.Signals | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session, stdin from /dev/null, stdout and stderr to ``log``.

    ``die_with_parent``: the signal the child gets when this process dies (None: it outlives us).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab" if append else "wb") as out:
        return subprocess.Popen(
            argv,
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=None if die_with_parent is None else _parent_death_signal(die_with_parent),  # noqa: PLW1509 - prctl only, no locks
        )


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group ``pid``; a group already gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _exists(kill: Callable[[int, int], None], pid: int) -> bool:
    try:
        kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - exists, owned by someone else
        return True
    return True


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (and is not a zombie of ours)."""
    if not _exists(os.kill, pid):
        return False
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):  # pragma: no cover - no procfs
        return True


def stop_group(pid: int, *, grace: float = 10.0, popen: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM the process group ``pid``, wait up to ``grace`` seconds for it to be gone, SIGKILL what is left.

    Reaps the leader when it is a child of ours (``popen``, or any child by its pid), so that a
    zombie leader does not keep the group alive. Idempotent.
    """
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        _reap(pid, popen)
        return
    except PermissionError:  # pragma: no cover - exists, owned by someone else
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(pid, popen)
        if not _exists(os.killpg, pid):
            return
        time.sleep(0.1)
    signal_group(pid, signal.SIGKILL)
    if popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=5.0)
    else:
        _reap(pid, None)


def _reap(pid: int, popen: subprocess.Popen[bytes] | None) -> None:
    if popen is not None:
        popen.poll()
        return
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
