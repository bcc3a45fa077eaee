"""routing package."""

__all__: list[str] = []
