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

from rolloutpool.api.pods import is_ready, is_terminating, pod_name
from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.reconcile.children import needs_update
from rolloutpool.reconcile.labels import engine_index

__all__ = ["DrainEnd", "DrainEndReason", "EnginePlan", "plan_engines"]

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


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded")


@dataclass
class _Decisions:
    """The plan being built: what each removal of a pod turns into."""

    pods: Mapping[str, Mapping[str, Any]]
    live_sessions: Mapping[str, int]
    draining: Mapping[str, float]
    now: float
    timeout: float
    delete: dict[str, str] = field(default_factory=dict)
    start: dict[str, str] = field(default_factory=dict)
    ends: list[DrainEnd] = field(default_factory=list)
    keep: list[str] = field(default_factory=list)

    def remove(self, name: str, why: str) -> None:
        """Drain a ready pod; delete an unready one, or a draining one once drained or timed out."""
        if name in self.draining:
            if self.live_sessions.get(name, 0) <= 0:
                self.ends.append(DrainEnd(name, "Drained"))
            elif self.now - self.draining[name] >= self.timeout:
                self.ends.append(DrainEnd(name, "DrainTimeout"))
            else:
                self.keep.append(name)
                return
            self.delete[name] = why
        elif is_ready(self.pods[name]):
            self.start[name] = why
        else:
            self.delete[name] = why

    def by_index(self, name: str) -> tuple[int, str]:
        """Sort key: replica index (unknown first), then name."""
        index = engine_index(self.pods[name])
        return (-1 if index is None else index, name)

    def roll(self, *, outdated: list[str], unready_wanted: list[str], desired: Mapping[str, Any]) -> None:
        """Rolling update: unready outdated pods go at once; ready ones one at a time, all others ready."""
        updating = [n for n in outdated if n not in self.delete]
        rolling = [n for n in updating if n in self.draining]
        for name in updating:
            if not is_ready(self.pods[name]) and name not in self.draining:
                self.delete[name] = "Update"
        for name in rolling:
            self.remove(name, "Update")
        candidates = [n for n in updating if n not in self.delete and n not in self.draining]
        if rolling or not candidates or unready_wanted or any(n in self.delete for n in desired):
            return
        self.remove(min(candidates, key=lambda n: (self.live_sessions.get(n, 0), self.by_index(n))), "Update")


def plan_engines(
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
    pods = {pod_name(pod): pod for pod in observed if pod_name(pod)}
    plan = _Decisions(pods, live_sessions, draining, now, drain_timeout_seconds)
    present = sorted(name for name, pod in pods.items() if not is_terminating(pod))
    outdated = [n for n in present if n in desired and needs_update(observed=pods[n], desired=desired[n])]

    # Surplus pods (scale down, or names the pool does not use), highest index first; finished
    # pods (wanted or not) are deleted at once and the wanted ones recreated once gone.
    for name in sorted((n for n in present if n not in desired), key=plan.by_index, reverse=True):
        if _finished(pods[name]):
            plan.delete[name] = "Failed"
        else:
            plan.remove(name, "ScaleDown" if engine_index(pods[name]) is not None else "Unknown")
    for name in present:
        if name in desired and _finished(pods[name]):
            plan.delete[name] = "Failed"
    unready_wanted = [name for name in desired if name not in pods or not is_ready(pods[name])]
    plan.roll(outdated=outdated, unready_wanted=unready_wanted, desired=desired)

    going = set(plan.delete) | set(plan.start) | set(plan.keep)
    cancelled = [DrainEnd(n, "Cancelled") for n in sorted(draining) if n in present and n not in going]
    deadlines = [draining[n] + drain_timeout_seconds - now for n in plan.keep]
    deadlines += [drain_timeout_seconds for _ in plan.start]
    return EnginePlan(
        create=tuple(dict(desired[name]) for name in sorted(desired) if name not in pods),
        delete=tuple(sorted(plan.delete, key=plan.by_index, reverse=True)),
        start_drain=tuple(sorted(plan.start, key=plan.by_index, reverse=True)),
        end_drain=tuple(sorted([*plan.ends, *cancelled], key=lambda e: e.name)),
        quarantine=tuple(sorted(set(plan.keep) | set(plan.start))),
        waiting=tuple(sorted(name for name, pod in pods.items() if is_terminating(pod))),
        outdated=tuple(outdated),
        missing=tuple(sorted(name for name in desired if name not in pods or is_terminating(pods[name]))),
        recheck_seconds=max(0.0, min(deadlines)) if deadlines else None,
        reasons={**plan.delete, **plan.start},
    )
