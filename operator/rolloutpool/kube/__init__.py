"""The only user of the kubernetes client: API access for the operator and the router."""

__all__: list[str] = []
