"""``python -m rolloutpool.cli``: the ``rolloutpool`` command."""

from __future__ import annotations

from rolloutpool.cli import main

__all__: list[str] = []

if __name__ == "__main__":  # pragma: no cover
    main()
