"""The process kubelet: runs the pods of a local control plane as process groups on this machine."""

__all__: list[str] = []
