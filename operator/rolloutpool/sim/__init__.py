"""sim package."""

__all__: list[str] = []
