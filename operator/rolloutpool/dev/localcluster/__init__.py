"""The local control plane: building, starting and stopping a real kube-apiserver on loopback."""

__all__: list[str] = []
