"""RolloutPool: Kubernetes operator, session router and sampler simulator for RL rollout fleets."""

from rolloutpool.native import choose as _choose

__all__: list[str] = []

_choose()  # the simulator's compiled modules only while current, else their sources (rolloutpool.native)
