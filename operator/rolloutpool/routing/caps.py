"""The effective live-session cap of one replica: the one function every caller uses (pure).

A replica's cap comes from up to three places, combined here and nowhere else:

- a cap fixed on the router (a replica's own ``cap``, else the router's ``--cap``): a hard limit;
- a cap derived from the replica's reported KV capacity when ``max_model_len`` is set
  (:func:`rolloutpool.capacity.oversubscribed_cap`), which is 0 (no new sessions) while the
  capacity is unknown: the router's guess until the operator decides;
- the operator's cap (the RolloutPool status, or the simulator's control law).

A fixed cap and the operator's combine by taking the tighter. A derived cap is replaced by the
operator's (its control law may find a higher one), limited by ``ceiling``
(``maxSessionsPerReplica``). Until the operator decides, a derived cap follows the replica's measured
contexts when ``kv_admission`` is on and the caller passes ``kv_room`` (the new sessions its projected
KV tokens still hold, :mod:`rolloutpool.routing.admission_kv`): ``live + kv_room`` under ``ceiling``,
instead of the residency guess (which stays the cap of callers that do not project). Without a fixed
cap or ``max_model_len`` the router's own cap is ``ceiling`` (or unlimited), combined with the operator's
like a fixed one.
"""

from __future__ import annotations

from dataclasses import dataclass

from rolloutpool.capacity import oversubscribed_cap
from rolloutpool.routing.admission_kv import GROWTH_SHARE

__all__ = ["CapRule", "effective_cap"]


@dataclass(frozen=True)
class CapRule:
    """How a router (or the simulated one) sets its own caps; the same for every replica."""

    fixed: int | None = None
    """Fixed cap per replica (``--cap``); a replica's own cap overrides it."""
    max_model_len: int | None = None
    """Set to derive caps from each replica's KV capacity (ignored where a fixed cap applies)."""
    expected_residency: float = 0.5
    headroom: float = 0.1
    ceiling: int | None = None
    """Hard limit on a derived (or the operator's) cap; the cap itself when nothing else sets one."""
    kv_admission: bool = True
    """Derived caps admit by projected KV tokens (``kv_room``) rather than by the residency guess."""
    growth_share: float = GROWTH_SHARE
    """Share of its expected remaining growth each live session is projected with
    (:class:`~rolloutpool.routing.admission_kv.KvAdmissionConfig`)."""


def _tighter(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def effective_cap(
    rule: CapRule,
    *,
    replica_cap: int | None = None,
    capacity_tokens: int | None = None,
    operator_cap: int | None = None,
    live: int = 0,
    kv_room: int | None = None,
    reads_cheaply: bool = False,
) -> int | None:
    """The live-session cap a replica gets; None means no limit (pure).

    ``replica_cap`` is the replica's own fixed cap, ``capacity_tokens`` its reported KV capacity
    (None: not reported yet), ``operator_cap`` what the operator decided (None: nothing yet),
    ``live`` its live sessions and ``kv_room`` how many more its projected KV tokens hold (None: not projected).
    ``reads_cheaply``: the replica reads its whole cache in under a step's floor
    (:func:`rolloutpool.routing.eviction_budget.reads_cheaply`), so under KV admission its derived cap is
    ``ceiling`` (unlimited without one): eviction there costs re-prefill alone, which the engines have room for.
    """
    fixed = replica_cap if replica_cap is not None else rule.fixed
    if fixed is not None:
        return _tighter(fixed, operator_cap)
    if rule.max_model_len is None:
        return _tighter(rule.ceiling, operator_cap)
    if operator_cap is not None:
        return _tighter(operator_cap, rule.ceiling)
    if capacity_tokens is None:
        return 0
    if rule.kv_admission and (reads_cheaply or kv_room is not None):
        return rule.ceiling if reads_cheaply else _tighter(live + (kv_room or 0), rule.ceiling)
    return oversubscribed_cap(
        capacity_tokens=capacity_tokens,
        max_model_len=rule.max_model_len,
        expected_residency=rule.expected_residency,
        headroom=rule.headroom,
        ceiling=rule.ceiling,
    )
