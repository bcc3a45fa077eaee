"""The project's image built here without a Docker engine (buildah), and run from its root filesystem."""

__all__: list[str] = []
