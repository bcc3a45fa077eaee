"""``buildah`` on a storage of our own: vfs driver, no daemon, no registry configuration needed."""

from __future__ import annotations

import subprocess
from pathlib import Path

__all__ = ["Buildah", "ImageBuildError"]


class ImageBuildError(RuntimeError):
    """A step of the image build failed; the message names the step and shows buildah's last lines."""


class Buildah:
    """buildah commands against ``<cache>/storage`` (vfs) with their run state in ``<cache>/runroot``."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache

    def argv(self, *args: str) -> list[str]:
        """The full command line of ``buildah ARGS`` on this storage."""
        return [
            "buildah",
            "--root",
            str(self.cache / "storage"),
            "--runroot",
            str(self.cache / "runroot"),
            "--storage-driver",
            "vfs",
            *args,
        ]

    def run(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Run ``buildah ARGS`` (stdout and stderr together); with ``check`` a failure raises ``ImageBuildError``."""
        done = subprocess.run(
            self.argv(*args),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            check=False,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise ImageBuildError(f"buildah {' '.join(args[:2])} failed ({done.returncode}): {done.stdout[-2000:]}")
        return done

    def exists(self, reference: str) -> bool:
        """Whether the storage holds an image of this reference."""
        return self.run("inspect", "--type", "image", reference, check=False).returncode == 0
