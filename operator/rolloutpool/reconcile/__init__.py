"""Pure decisions of the operator: desired manifests, needs_update, status and conditions."""

__all__: list[str] = []
