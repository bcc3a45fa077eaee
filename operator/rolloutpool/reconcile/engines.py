"""The engine-pod plan: which pods to create, drain, delete (pure).

Rules, in the order they apply to an observed pod:

- A pod being deleted (``deletionTimestamp``) is waited for; nothing else happens to it.
- A ``Failed`` or ``Succeeded`` pod is deleted at once (no drain: it serves nothing) and
  recreated once it is gone (pod names are stable, so not in the same pass).
- A pod of an index at or above ``spec.replicas`` (scale down), or one the pool does not
  name, is removed: a ready pod drains first (quarantined, then deleted when its live sessions
  reach zero or the drain times out); an unready pod is deleted at once.
- A pod whose spec hash differs from the desired one is replaced: an unready one at once;
  ready ones one at a time (a rolling update), and a new one only when every other wanted
  replica exists and is ready.
- A wanted index without a pod is created at once.
- A draining pod that no longer has to go (scaled back up, spec reverted) stops draining.

The caller keeps the drain start times (``draining``) where they survive a restart, e.g. the
``rolloutpool.io/drain-started`` annotation (``labels.draining_from_pods``): add ``start_drain``
at ``now``, forget ``end_drain``. The same inputs always give the same plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.reconcile.children import needs_update
from rolloutpool.reconcile.labels import engine_index

__all__ = ["DrainEnd", "DrainEndReason", "EnginePlan", "is_ready", "is_terminating", "plan_engines"]

DrainEndReason = Literal["Drained", "DrainTimeout", "Cancelled"]


@dataclass(frozen=True)
class DrainEnd:
    """A drain that ends in this pass, and why."""

    name: str
    reason: DrainEndReason
    """``Drained`` (no live sessions left) and ``DrainTimeout`` delete the pod; ``Cancelled`` keeps it."""


@dataclass(frozen=True)
class EnginePlan:
    """What to do to the engine pods in this pass (all lists sorted for stable output)."""

    create: tuple[dict[str, Any], ...] = ()
    """Pod manifests to create."""
    delete: tuple[str, ...] = ()
    """Pod names to delete now."""
    start_drain: tuple[str, ...] = ()
    """Pods that start draining now (record ``now`` as their drain start)."""
    end_drain: tuple[DrainEnd, ...] = ()
    """Drains that end now."""
    quarantine: tuple[str, ...] = ()
    """Pods the router must not place new sessions on: every drain still running after this pass."""
    waiting: tuple[str, ...] = ()
    """Pods being deleted that the plan waits for."""
    outdated: tuple[str, ...] = ()
    """Pods whose spec hash differs from the desired one (replaced one at a time)."""
    missing: tuple[str, ...] = ()
    """Wanted pods that do not exist (created now, or once the old pod of the name is gone)."""
    recheck_seconds: float | None = None
    """When a drain will time out, so the caller can look again then; None without drains."""
    reasons: Mapping[str, str] = field(default_factory=dict)
    """Why each pod named in ``delete`` or ``start_drain`` goes: ``ScaleDown``, ``Update``, ``Failed``, ``Unknown``."""

    @property
    def idle(self) -> bool:
        """Whether the plan acts on nothing and waits for nothing."""
        return not (self.create or self.delete or self.start_drain or self.end_drain or self.quarantine or self.waiting)


def is_terminating(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is being deleted (pure)."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def is_ready(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's ``Ready`` condition is True and it is not being deleted (pure)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return ready and not is_terminating(pod)


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", ""))


def plan_engines(  # noqa: PLR0912, PLR0915 -- one decision table, read top to bottom with the module docstring
    *,
    spec: RolloutPoolSpec,
    desired: Mapping[str, Mapping[str, Any]],
    observed: Sequence[Mapping[str, Any]],
    live_sessions: Mapping[str, int],
    draining: Mapping[str, float],
    now: float,
    drain_timeout_seconds: float,
) -> EnginePlan:
    """Decide the engine pods' next actions from the desired pods and the observed ones (pure).

    ``desired`` maps pod name to manifest (``children.desired_engine_pods``), ``observed`` are the
    pool's engine pods, ``live_sessions`` the router's live sessions per pod (missing = 0),
    ``draining`` pod name -> unix time its drain started.
    """
    del spec  # the desired pods already carry everything the spec says
    pods = {_name(pod): pod for pod in observed if _name(pod)}
    create: list[dict[str, Any]] = []
    delete: dict[str, str] = {}
    start: dict[str, str] = {}
    ends: list[DrainEnd] = []
    keep_draining: list[str] = []
    waiting = sorted(name for name, pod in pods.items() if is_terminating(pod))
    missing = sorted(name for name in desired if name not in pods or is_terminating(pods[name]))
    outdated = sorted(
        name
        for name, pod in pods.items()
        if name in desired and not is_terminating(pod) and needs_update(observed=pod, desired=desired[name])
    )
    unready_wanted = [name for name in desired if name not in pods or not is_ready(pods[name])]

    def remove(name: str, why: str) -> None:
        """Drain a ready pod, delete an unready or drained one."""
        pod = pods[name]
        if name in draining:
            started = draining[name]
            if live_sessions.get(name, 0) <= 0:
                ends.append(DrainEnd(name, "Drained"))
            elif now - started >= drain_timeout_seconds:
                ends.append(DrainEnd(name, "DrainTimeout"))
            else:
                keep_draining.append(name)
                return
            delete[name] = why
        elif is_ready(pod):
            start[name] = why
        else:
            delete[name] = why

    def by_index(name: str) -> tuple[int, str]:
        index = engine_index(pods[name])
        return (-1 if index is None else index, name)

    # Surplus pods (scale down or names the pool does not use), highest index first.
    for name in sorted(
        (n for n in pods if n not in desired and not is_terminating(pods[n])), key=by_index, reverse=True
    ):
        if _finished(pods[name]):
            delete[name] = "Failed"
        else:
            remove(name, "ScaleDown" if engine_index(pods[name]) is not None else "Unknown")

    # Wanted pods that failed: delete at once; they are recreated once gone.
    for name in sorted(desired):
        if name in pods and not is_terminating(pods[name]) and _finished(pods[name]):
            delete[name] = "Failed"

    # Rolling update: unready outdated pods go at once, ready ones one at a time.
    updating = [n for n in outdated if n not in delete]
    rolling = [n for n in updating if n in draining]
    for name in updating:
        if not is_ready(pods[name]) and name not in draining:
            delete[name] = "Update"
    for name in rolling:
        remove(name, "Update")
    candidates = [n for n in updating if n not in delete and n not in draining]
    if not rolling and candidates and not unready_wanted and not any(n in delete for n in desired):
        first = min(candidates, key=lambda n: (live_sessions.get(n, 0), by_index(n)))
        remove(first, "Update")

    # Drains that no longer have a reason.
    going = set(delete) | set(start) | set(keep_draining)
    for name in sorted(draining):
        if name in pods and not is_terminating(pods[name]) and name not in going:
            ends.append(DrainEnd(name, "Cancelled"))

    for name in sorted(desired):
        if name not in pods:
            create.append(dict(desired[name]))

    quarantine = sorted(set(keep_draining) | set(start))
    deadlines = [draining[n] + drain_timeout_seconds - now for n in keep_draining]
    deadlines += [drain_timeout_seconds for _ in start]
    return EnginePlan(
        create=tuple(create),
        delete=tuple(sorted(delete, key=by_index, reverse=True)),
        start_drain=tuple(sorted(start, key=by_index, reverse=True)),
        end_drain=tuple(sorted(ends, key=lambda e: e.name)),
        quarantine=tuple(quarantine),
        waiting=tuple(waiting),
        outdated=tuple(outdated),
        missing=tuple(missing),
        recheck_seconds=max(0.0, min(deadlines)) if deadlines else None,
        reasons={**delete, **start},
    )
