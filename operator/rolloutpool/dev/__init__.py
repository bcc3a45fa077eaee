"""The dev tools (not in the operator image): local control plane, process kubelet, stack, demo, benchmarks."""

__all__: list[str] = []
