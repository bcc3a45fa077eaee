"""Where the operator finds its cluster: kubeconfig helpers (I/O: reads files)."""

from __future__ import annotations

from kubernetes import config

__all__ = ["current_namespace"]


def current_namespace(config_path: str | None) -> str | None:
    """The namespace of the kubeconfig's current context, if it names one."""
    try:
        _contexts, current = config.list_kube_config_contexts(config_file=config_path)
    except Exception:  # no kubeconfig: in-cluster or unconfigured
        return None
    namespace = (current or {}).get("context", {}).get("namespace")
    return str(namespace) if namespace else None
