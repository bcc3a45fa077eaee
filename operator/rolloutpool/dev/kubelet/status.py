"""Pure status decisions of the process kubelet: container views, probes, pod phase and conditions.

The runtime keeps one :class:`ContainerView` per container; :func:`pod_status`
turns them into the pod's ``status`` as the API server stores it. Probe bookkeeping
(:func:`probe_due`, :func:`probe_step`) follows the kubelet's prober: an initial
delay, a period, consecutive success and failure thresholds.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

__all__ = [
    "ContainerView",
    "ProbeState",
    "Terminated",
    "pod_phase",
    "pod_status",
    "probe_due",
    "probe_step",
    "rfc3339",
    "unsupported_image_status",
    "will_restart",
]


def rfc3339(epoch: float) -> str:
    """``2026-11-30T01:02:03Z`` (seconds precision, as the API server stores pod times)."""
    return datetime.datetime.fromtimestamp(int(epoch), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Terminated:
    """How one run of a container ended."""

    exit_code: int
    reason: str
    started_at: float
    finished_at: float
    message: str = ""

    def as_state(self) -> dict[str, Any]:
        """The ``terminated`` state object of a container status."""
        state: dict[str, Any] = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": rfc3339(self.started_at),
            "finishedAt": rfc3339(self.finished_at),
        }
        if self.message:
            state["message"] = self.message
        return state


@dataclass(frozen=True)
class ContainerView:
    """What the runtime knows about one container, the input of :func:`pod_status`."""

    name: str
    image: str
    state: Literal["waiting", "running", "terminated"] = "waiting"
    reason: str = "ContainerCreating"
    message: str = ""
    started_at: float | None = None
    ready: bool = False
    started: bool = False
    restart_count: int = 0
    terminated: Terminated | None = None
    last_terminated: Terminated | None = None

    def as_status(self, *, pod_uid: str) -> dict[str, Any]:
        """The ``containerStatuses`` entry."""
        if self.state == "running":
            state: dict[str, Any] = {"running": {"startedAt": rfc3339(self.started_at or 0.0)}}
        elif self.state == "terminated" and self.terminated is not None:
            state = {"terminated": self.terminated.as_state()}
        else:
            state = {"waiting": {"reason": self.reason, **({"message": self.message} if self.message else {})}}
        status: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": "",
            "containerID": f"process://{pod_uid}/{self.name}/{self.restart_count}",
            "ready": self.ready,
            "started": self.started,
            "restartCount": self.restart_count,
            "state": state,
            "lastState": {"terminated": self.last_terminated.as_state()} if self.last_terminated else {},
        }
        return status


def will_restart(*, exit_code: int, restart_policy: str) -> bool:
    """Whether a container that exited with ``exit_code`` is started again under ``restart_policy``."""
    return restart_policy == "Always" or (restart_policy == "OnFailure" and exit_code != 0)


def pod_phase(*, containers: Sequence[ContainerView]) -> str:
    """Pending, Running, Succeeded or Failed, from the containers (as the kubelet's getPhase).

    Terminal only when every container has terminated for good: Succeeded if all exited 0.
    """
    if containers and all(c.state == "terminated" for c in containers):
        return "Succeeded" if all(c.terminated and c.terminated.exit_code == 0 for c in containers) else "Failed"
    if any(c.state in {"running", "terminated"} or c.last_terminated for c in containers):
        return "Running"
    return "Pending"


def _condition(
    kind: str, ok: bool, *, previous: Mapping[str, Mapping[str, Any]], now: float, reason: str = "", message: str = ""
) -> dict[str, Any]:
    status = "True" if ok else "False"
    before = previous.get(kind)
    since = before.get("lastTransitionTime") if before and before.get("status") == status else None
    condition: dict[str, Any] = {
        "type": kind,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": since or rfc3339(now),
    }
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def pod_status(
    *,
    pod_uid: str,
    containers: Sequence[ContainerView],
    pod_ip: str,
    host_ip: str,
    start_time: float,
    previous_conditions: Sequence[Mapping[str, Any]],
    now: float,
) -> dict[str, Any]:
    """The whole pod ``status`` (phase, conditions, containerStatuses, addresses, startTime)."""
    phase = pod_phase(containers=containers)
    previous = {c["type"]: c for c in previous_conditions if "type" in c}
    unready = [c.name for c in containers if not c.ready]
    if phase in {"Succeeded", "Failed"}:
        ready_reason, ready_message = "PodCompleted", ""
    elif unready:
        ready_reason, ready_message = "ContainersNotReady", f"containers with unready status: [{' '.join(unready)}]"
    else:
        ready_reason, ready_message = "", ""
    ready = not unready and phase == "Running"
    conditions = [
        _condition("PodReadyToStartContainers", True, previous=previous, now=now),
        _condition("Initialized", True, previous=previous, now=now),
        _condition("Ready", ready, previous=previous, now=now, reason=ready_reason, message=ready_message),
        _condition("ContainersReady", ready, previous=previous, now=now, reason=ready_reason, message=ready_message),
        _condition("PodScheduled", True, previous=previous, now=now),
    ]
    return {
        "phase": phase,
        "conditions": conditions,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": rfc3339(start_time),
        "containerStatuses": [c.as_status(pod_uid=pod_uid) for c in containers],
    }


def unsupported_image_status(
    *,
    images: Sequence[str],
    runnable: Sequence[str],
    host_ip: str,
    previous_conditions: Sequence[Mapping[str, Any]],
    now: float,
) -> dict[str, Any]:
    """Status of a pod the kubelet will not run: Failed, reason ``UnsupportedImage``, naming the images."""
    message = (
        f"image(s) {', '.join(images)} cannot run here: this process kubelet runs only images matching "
        f"{' or '.join(runnable)} as local processes"
    )
    previous = {c["type"]: c for c in previous_conditions if "type" in c}
    return {
        "phase": "Failed",
        "reason": "UnsupportedImage",
        "message": message,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": rfc3339(now),
        "conditions": [
            _condition("Initialized", True, previous=previous, now=now),
            _condition("Ready", False, previous=previous, now=now, reason="UnsupportedImage", message=message),
            _condition(
                "ContainersReady", False, previous=previous, now=now, reason="UnsupportedImage", message=message
            ),
            _condition("PodScheduled", True, previous=previous, now=now),
        ],
    }


@dataclass(frozen=True)
class ProbeState:
    """Consecutive results of one probe; ``passing`` is the current verdict (None before the first)."""

    successes: int = 0
    failures: int = 0
    passing: bool | None = None
    last_run: float | None = None


def probe_due(*, probe: Mapping[str, Any], started_at: float, state: ProbeState, now: float) -> bool:
    """Whether the probe should run at ``now`` (after ``initialDelaySeconds``, every ``periodSeconds``)."""
    if now < started_at + float(probe.get("initialDelaySeconds", 0)):
        return False
    return state.last_run is None or now >= state.last_run + float(probe.get("periodSeconds", 10))


def probe_step(*, state: ProbeState, ok: bool, probe: Mapping[str, Any], now: float) -> ProbeState:
    """The state after one probe result: the verdict flips after the threshold of consecutive results."""
    success_threshold = int(probe.get("successThreshold", 1))
    failure_threshold = int(probe.get("failureThreshold", 3))
    successes = state.successes + 1 if ok else 0
    failures = 0 if ok else state.failures + 1
    passing = state.passing
    if ok and successes >= success_threshold:
        passing = True
    elif not ok and failures >= failure_threshold:
        passing = False
    return replace(state, successes=successes, failures=failures, passing=passing, last_run=now)
