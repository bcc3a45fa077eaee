"""The process side of the kubelet: one pod's containers as local processes, their probes and restarts.

:class:`PodRun` is driven by the kubelet's loop thread through :meth:`PodRun.tick`;
it never talks to the API server. Each container runs in its own process group
(``start_new_session``) with ``PR_SET_PDEATHSIG`` (SIGKILL) so that the death of the
kubelet's loop thread, even by SIGKILL, takes it down too; stopping sends SIGTERM to the group, waits the
grace period, then SIGKILL. Probes run on a shared thread pool and are collected on
the next tick.
"""

from __future__ import annotations

import contextlib
import http.client
import logging
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rolloutpool.dev.kubelet.decide import backoff_seconds
from rolloutpool.dev.kubelet.status import (
    ContainerView,
    ProbeState,
    Terminated,
    probe_due,
    probe_step,
    will_restart,
)
from rolloutpool.dev.processes import signal_group, start_group

__all__ = ["ContainerRun", "Launch", "PodRun", "run_probe"]

_log = logging.getLogger(__name__)
_RESET_AFTER_SECONDS = 600.0  # a container that ran this long starts its back-off afresh


@dataclass(frozen=True)
class Launch:
    """How to start one container: argv (argv[0] resolved), environment, working directory, log file.

    ``join`` is set for a container run from an image's root filesystem: the command that runs
    ``[*join, PID, "--", *argv]`` inside the running container PID (its exec probes).
    """

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log: Path
    join: tuple[str, ...] = ()


def run_probe(
    probe: Mapping[str, Any], *, pod_ip: str, ports: Mapping[str, int], launch: Launch, pid: int | None = None
) -> bool:
    """Run one probe (httpGet, tcpSocket or exec) once; True when it passes. gRPC probes always pass.

    An exec probe of a container run from an image runs inside it (``launch.join`` with its ``pid``).
    """
    timeout = float(probe.get("timeoutSeconds", 1))
    try:
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = get.get("port", 80)
            port = ports.get(port, 0) if isinstance(port, str) and not port.isdigit() else int(port)
            host = get.get("host") or pod_ip
            cls = (
                http.client.HTTPSConnection
                if get.get("scheme", "HTTP").upper() == "HTTPS"
                else http.client.HTTPConnection
            )
            conn = cls(host, port, timeout=timeout)
            try:
                headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
                conn.request("GET", get.get("path", "/"), headers={"User-Agent": "kube-probe/1.35", **headers})
                return 200 <= conn.getresponse().status < 400
            finally:
                conn.close()
        if "tcpSocket" in probe:
            port = probe["tcpSocket"].get("port", 0)
            port = ports.get(port, 0) if isinstance(port, str) and not port.isdigit() else int(port)
            with socket.create_connection((probe["tcpSocket"].get("host") or pod_ip, port), timeout=timeout):
                return True
        if "exec" in probe:
            command = list(probe["exec"]["command"])
            if launch.join and pid is not None:
                command = [*launch.join, str(pid), "--", *command]
            done = subprocess.run(
                command,
                env=launch.env,
                cwd=launch.cwd,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
            return done.returncode == 0
    except (OSError, http.client.HTTPException, subprocess.TimeoutExpired):
        return False
    return True


@dataclass
class ContainerRun:
    """One container of a pod: its process, its status view and its probes."""

    spec: Mapping[str, Any]
    launch: Launch | None
    config_error: str = ""
    proc: subprocess.Popen[bytes] | None = None
    view: ContainerView = field(default_factory=lambda: ContainerView(name="", image=""))
    crashes: int = 0
    next_start: float = 0.0
    kill_deadline: float | None = None
    probes: dict[str, ProbeState] = field(default_factory=dict)
    pending: dict[str, Future[bool]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """The container's name."""
        return str(self.spec["name"])

    @property
    def ports(self) -> dict[str, int]:
        """Named container ports (for probes that name their port)."""
        return {p["name"]: int(p["containerPort"]) for p in self.spec.get("ports") or [] if p.get("name")}


class PodRun:
    """The processes of one pod and everything the kubelet tracks about them."""

    def __init__(
        self,
        *,
        uid: str,
        key: str,
        ip: str,
        directory: Path,
        restart_policy: str,
        grace_seconds: float,
        containers: list[ContainerRun],
        now: float,
        backoff_base: float,
        backoff_cap: float,
        spawn: Callable[[Launch], subprocess.Popen[bytes]] | None = None,
    ) -> None:
        self.uid = uid
        self.key = key
        self.ip = ip
        self.directory = directory
        self.restart_policy = restart_policy
        self.grace_seconds = grace_seconds
        self.containers = containers
        self.start_time = now
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.terminating_until: float | None = None
        self.config_retry_at = now  # when the kubelet may rebuild containers whose config failed
        self._spawn = spawn or _spawn
        for run in containers:
            run.view = replace(run.view, name=run.name, image=str(run.spec.get("image", "")))

    # -- queries ------------------------------------------------------------------------

    def views(self) -> list[ContainerView]:
        """The containers' current views, in spec order."""
        return [run.view for run in self.containers]

    def running(self) -> bool:
        """Whether any process of the pod is still alive."""
        return any(run.proc is not None for run in self.containers)

    # -- driving ------------------------------------------------------------------------

    def tick(self, *, now: float, executor: Executor) -> None:
        """Reap exits, restart after back-off, collect and start probes, escalate kills."""
        for run in self.containers:
            self._reap(run, now)
            if self.terminating_until is not None:
                if run.proc is not None and now >= self.terminating_until:
                    signal_group(run.proc.pid, signal.SIGKILL)
                continue
            if run.proc is None and run.view.state == "waiting" and now >= run.next_start:
                self._start(run, now)
            if run.proc is not None:
                self._probe(run, now, executor)
                if run.kill_deadline is not None and now >= run.kill_deadline:
                    signal_group(run.proc.pid, signal.SIGKILL)

    def terminate(self, *, now: float, grace_seconds: float) -> None:
        """Begin graceful termination: SIGTERM every process; SIGKILL what is left after the grace."""
        deadline = now + max(0.0, grace_seconds)
        if self.terminating_until is not None and self.terminating_until <= deadline:
            return
        first = self.terminating_until is None
        self.terminating_until = deadline
        if first:
            for run in self.containers:
                if run.proc is not None:
                    _log.info("Killing container pod=%s container=%s grace=%ss", self.key, run.name, grace_seconds)
                    signal_group(run.proc.pid, signal.SIGTERM)

    def kill_now(self) -> None:
        """SIGKILL every process group of the pod and reap them (used when stopping the kubelet)."""
        for run in self.containers:
            if run.proc is not None:
                signal_group(run.proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    run.proc.wait(timeout=5)
                run.proc = None

    # -- pieces -------------------------------------------------------------------------

    def _start(self, run: ContainerRun, now: float) -> None:
        restart_count = run.view.restart_count + (1 if run.view.last_terminated or run.crashes else 0)
        if run.launch is None:
            run.view = replace(run.view, reason="CreateContainerConfigError", message=run.config_error)
            return
        try:
            run.proc = self._spawn(run.launch)
        except OSError as err:
            ended = Terminated(exit_code=128, reason="StartError", started_at=now, finished_at=now, message=str(err))
            run.view = replace(run.view, restart_count=restart_count)
            self._exited(run, ended, now)
            return
        _log.info("Started container pod=%s container=%s pid=%d", self.key, run.name, run.proc.pid)
        run.probes = {}
        run.kill_deadline = None
        has_startup = "startupProbe" in run.spec
        run.view = replace(
            run.view,
            state="running",
            reason="",
            message="",
            started_at=now,
            started=not has_startup,
            ready=not has_startup and "readinessProbe" not in run.spec,
            restart_count=restart_count,
        )

    def _reap(self, run: ContainerRun, now: float) -> None:
        if run.proc is None or run.proc.poll() is None:
            return
        code = run.proc.returncode
        signal_group(run.proc.pid, signal.SIGKILL)  # stray children of the container
        run.proc = None
        for future in run.pending.values():
            future.cancel()
        run.pending.clear()
        exit_code = code if code >= 0 else 128 - code
        reason = "Completed" if exit_code == 0 else "Error"
        started = run.view.started_at or now
        ended = Terminated(exit_code=exit_code, reason=reason, started_at=started, finished_at=now)
        _log.info("Container exited pod=%s container=%s exitCode=%d", self.key, run.name, exit_code)
        self._exited(run, ended, now)

    def _exited(self, run: ContainerRun, ended: Terminated, now: float) -> None:
        restart = self.terminating_until is None and will_restart(
            exit_code=ended.exit_code, restart_policy=self.restart_policy
        )
        if not restart:
            run.view = replace(run.view, state="terminated", terminated=ended, ready=False, reason="", message="")
            return
        run.crashes = 1 if ended.finished_at - ended.started_at > _RESET_AFTER_SECONDS else run.crashes + 1
        delay = backoff_seconds(crashes=run.crashes, base=self.backoff_base, cap=self.backoff_cap)
        run.next_start = now + delay
        run.view = replace(
            run.view,
            state="waiting",
            reason="CrashLoopBackOff",
            message=f"back-off {delay:g}s restarting failed container={run.name} pod={self.key}",
            ready=False,
            started=False,
            last_terminated=ended,
        )

    def _probe(self, run: ContainerRun, now: float, executor: Executor) -> None:
        assert run.proc is not None  # noqa: S101 - called for running containers only
        assert run.launch is not None  # noqa: S101
        started_at = run.view.started_at or now
        for kind, future in list(run.pending.items()):
            if not future.done():
                continue
            del run.pending[kind]
            ok = not future.cancelled() and future.exception() is None and future.result()
            probe = run.spec[kind]
            before = run.probes.get(kind, ProbeState())
            run.probes[kind] = after = probe_step(state=before, ok=ok, probe=probe, now=now)
            if kind == "startupProbe" and after.passing is True:
                run.view = replace(run.view, started=True, ready="readinessProbe" not in run.spec)
            elif kind == "readinessProbe" and after.passing is not None:
                run.view = replace(run.view, ready=after.passing)
            if kind in {"startupProbe", "livenessProbe"} and after.passing is False and run.kill_deadline is None:
                grace = float(probe.get("terminationGracePeriodSeconds", self.grace_seconds))
                _log.info("Container failed %s, will be restarted pod=%s container=%s", kind, self.key, run.name)
                run.kill_deadline = now + grace
                signal_group(run.proc.pid, signal.SIGTERM)
        if run.kill_deadline is not None:
            return
        wanted = ["startupProbe"] if not run.view.started else ["livenessProbe", "readinessProbe"]
        for kind in wanted:
            probe = run.spec.get(kind)
            if not probe or kind in run.pending:
                continue
            state = run.probes.get(kind, ProbeState())
            if probe_due(probe=probe, started_at=started_at, state=state, now=now):
                run.probes[kind] = replace(state, last_run=now)
                run.pending[kind] = executor.submit(
                    run_probe, probe, pod_ip=self.ip, ports=run.ports, launch=run.launch, pid=run.proc.pid
                )


def _spawn(launch: Launch) -> subprocess.Popen[bytes]:
    return start_group(
        launch.argv, log=launch.log, append=True, env=launch.env, cwd=launch.cwd, die_with_parent=signal.SIGKILL
    )
