"""The tools that develop and test RolloutPool: local clusters, the process kubelet, the stack, demo and bench.

Nothing in the product (api, routing, router, autoscale, reconcile, kube, metrics, handlers)
imports from here.
"""
