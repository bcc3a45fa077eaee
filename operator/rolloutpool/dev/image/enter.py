"""Start one container of the image: chroot into its root filesystem as the pod's user, exec its command.

Run as root with the host's Python (``python -I enter.py SPEC``, standard library only, so
it needs nothing on ``sys.path``); SPEC is a JSON file that
:func:`rolloutpool.dev.kubelet.container.container_plan` wrote (its keys are documented there).
What a container runtime does, in the order runc does it, inside a new mount and UTS namespace:

1. an overlay of the image's root filesystem (read-only lower layer, shared by every container)
   with a fresh writable layer of this container (``<container dir>/upper``);
2. ``/proc``, a ``/dev`` of its own (tmpfs with null, zero, full, random, urandom, tty, shm);
3. ``chroot`` into it; each volume bound at its mount path (paths resolved inside the root, so an
   image's symlinks such as ``/var/run -> /run`` stay inside), read-only where the mount says so;
4. the root remounted read-only when ``readOnlyRootFilesystem`` is set;
5. the user, group and supplementary groups set, no new privileges when
   ``allowPrivilegeEscalation: false``, the parent-death signal armed again (a change of user
   clears it), then ``execvpe`` of the command with the container's environment.

The process keeps its pid, so the kubelet signals the container itself. Not isolated: the
network (pods bind their own 127.0.0.x), pids and IPC. ``--join PID -- ARGV`` runs ARGV in the
running container PID instead (exec probes): its mounts, its root, the spec's user and env.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Any

__all__ = ["enter", "join", "main"]

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUTS = 0x04000000
_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_NOEXEC = 8
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {source} on {target}",
    )


def _prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, value, 0, 0, 0), f"prctl {option}")


def _overlay(spec: dict[str, Any]) -> Path:
    """A fresh writable layer over the image's root filesystem, mounted at ``<container dir>/root``."""
    base = Path(spec["container_dir"])
    upper, work, root = base / "upper", base / "work", base / "root"
    for path in (upper, work):  # a restarted container starts from the image again, as on a node
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    root.mkdir(parents=True, exist_ok=True)
    for path in (spec["rootfs"], upper, work):
        if "," in str(path) or ":" in str(path):
            raise ValueError(f"overlay paths may not hold ',' or ':': {path}")
    _mount("overlay", str(root), "overlay", 0, f"lowerdir={spec['rootfs']},upperdir={upper},workdir={work}")
    return root


def _devices(root: Path) -> None:
    dev = root / "dev"
    dev.mkdir(exist_ok=True)
    _mount("tmpfs", str(dev), "tmpfs", _MS_NOSUID | _MS_NOEXEC, "mode=755,size=65536k")
    for name in _DEVICES:
        (dev / name).touch()
        _mount(f"/dev/{name}", str(dev / name), None, _MS_BIND)
    (dev / "shm").mkdir()
    _mount("shm", str(dev / "shm"), "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, "mode=1777,size=65536k")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
        (dev / name).symlink_to(target)
    (dev / "stderr").symlink_to("/proc/self/fd/2")


def _bind_volumes(opened: list[tuple[int, dict[str, Any]]]) -> None:
    """Bind every volume: sources opened before the chroot, targets resolved inside it."""
    for fd, mount in opened:
        target = mount["target"]
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target) or "/", exist_ok=True)
            Path(target).touch(exist_ok=True)
        _mount(f"/proc/self/fd/{fd}", target, None, _MS_BIND | _MS_REC)
        if mount.get("read_only"):
            _mount("none", target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
        os.close(fd)


def _become(spec: dict[str, Any]) -> None:
    """Drop to the container's user; keep the parent-death signal; no new privileges if asked."""
    parent = os.getppid()
    os.setgroups([int(g) for g in spec.get("groups") or []])
    os.setgid(int(spec["gid"]))
    os.setuid(int(spec["uid"]))
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # a change of user cleared the one the kubelet armed
    if os.getppid() != parent:  # the kubelet died in between
        os._exit(137)
    if spec.get("no_new_privs"):
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)


def _exec(spec: dict[str, Any], argv: list[str]) -> None:
    env = {str(k): str(v) for k, v in spec["env"].items()}
    try:
        os.execvpe(argv[0], argv, env)  # noqa: S606 - the container's own command, exec'd as a runtime does
    except OSError as err:
        print(f"enter: cannot run {argv[0]!r} in the container: {err}", file=sys.stderr)
        os._exit(127)


def enter(spec: dict[str, Any]) -> None:
    """Build the container's root as the module docstring says and exec its command (never returns)."""
    _check(_libc.unshare(_CLONE_NEWNS | _CLONE_NEWUTS), "unshare")
    _mount("none", "/", None, _MS_REC | _MS_PRIVATE)
    if spec.get("hostname"):
        socket.sethostname(spec["hostname"])
    root = _overlay(spec)
    _mount("proc", str(root / "proc"), "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _devices(root)
    opened = [(os.open(m["source"], os.O_PATH | os.O_CLOEXEC), m) for m in spec.get("mounts") or []]
    os.chroot(root)
    os.chdir("/")
    _bind_volumes(opened)
    cwd = spec.get("cwd") or "/"
    os.makedirs(cwd, exist_ok=True)  # a runtime creates the working directory, as it does mount points
    if spec.get("read_only"):
        _mount("none", "/", None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
    os.chdir(cwd)
    _become(spec)
    _exec(spec, list(spec["argv"]))


def join(spec: dict[str, Any], pid: int, argv: list[str]) -> None:
    """Run ``argv`` inside the running container ``pid``: its mount namespace and root (never returns)."""
    root_fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_CLOEXEC)
    ns_fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    _check(_libc.setns(ns_fd, _CLONE_NEWNS), "setns")
    os.fchdir(root_fd)
    os.chroot(".")
    os.chdir(spec.get("cwd") or "/")
    _become(spec)
    _exec(spec, argv)


def main(args: list[str]) -> None:
    """``enter.py SPEC`` or ``enter.py SPEC --join PID -- ARGV...``."""
    spec = json.loads(Path(args[0]).read_text())
    try:
        if len(args) > 3 and args[1] == "--join" and args[3] == "--":
            join(spec, int(args[2]), args[4:])
        enter(spec)
    except (OSError, ValueError) as err:
        print(f"enter: cannot start the container: {err}", file=sys.stderr)
        sys.exit(128)


if __name__ == "__main__":
    main(sys.argv[1:])
