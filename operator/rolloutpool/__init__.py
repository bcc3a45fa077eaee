"""RolloutPool: Kubernetes operator, session router and sampler simulator for RL rollout fleets."""

__all__: list[str] = []
