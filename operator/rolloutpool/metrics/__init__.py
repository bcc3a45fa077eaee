"""PromQL and /metrics readers of the operator's slow loop (I/O)."""

__all__: list[str] = []
