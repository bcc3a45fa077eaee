"""Pure decisions of the operator: desired manifests, needs_update, the engine plan, status and conditions.

Nothing here does I/O or reads a clock: the ``kube`` and ``handlers`` layers observe, call these
functions with what they saw and ``now``, and act on the answer.
"""

from rolloutpool.reconcile.caps import (
    controls_from_status,
    estimated_kv_capacity_tokens,
    law_params,
    parse_spec,
    plan_controls,
    replica_caps,
)
from rolloutpool.reconcile.children import (
    desired_engine_pods,
    engine_pod,
    needs_update,
    router_objects,
    spec_hash,
)
from rolloutpool.reconcile.conditions import EventIntent, events_between, set_condition
from rolloutpool.reconcile.engines import DrainEnd, EnginePlan, plan_engines
from rolloutpool.reconcile.labels import (
    draining_from_pods,
    engine_pod_name,
    engine_selector,
    owner_reference,
    pool_labels,
    router_name,
)
from rolloutpool.reconcile.status import build_status

__all__ = [
    "DrainEnd",
    "EnginePlan",
    "EventIntent",
    "build_status",
    "controls_from_status",
    "desired_engine_pods",
    "draining_from_pods",
    "engine_pod",
    "engine_pod_name",
    "engine_selector",
    "estimated_kv_capacity_tokens",
    "events_between",
    "law_params",
    "needs_update",
    "owner_reference",
    "parse_spec",
    "plan_controls",
    "plan_engines",
    "pool_labels",
    "replica_caps",
    "router_name",
    "router_objects",
    "set_condition",
    "spec_hash",
]
