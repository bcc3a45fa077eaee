"""The operator's kopf handlers: the only importer of kopf."""

__all__: list[str] = []
