"""engine package."""

__all__: list[str] = []
