"""The build's base image, made here from Debian packages: ``debootstrap`` of a minimal root with Python 3.11.

The Dockerfile's default base (``python:3.11-slim``) comes from a registry; this one is made
on the machine from Debian's archive (``ROLLOUTPOOL_DEBIAN_MIRROR``, default
``http://deb.debian.org/debian``): ``debootstrap --variant=minbase`` of
:data:`~rolloutpool.dev.image.recipe.SUITE` with
:data:`~rolloutpool.dev.image.recipe.BASE_PACKAGES`, package caches and docs removed, the host's
hostname and resolver left out, committed into buildah's storage as
``localhost/rolloutpool-base:<suite>-<key>`` once per machine and recipe.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rolloutpool.dev.image.buildah import Buildah, ImageBuildError
from rolloutpool.dev.image.recipe import BASE_CLEANUP, BASE_PACKAGES, SUITE, base_key

__all__ = ["DEFAULT_MIRROR", "base_reference", "ensure_base"]

Log = Callable[[str], None]

DEFAULT_MIRROR = "http://deb.debian.org/debian"
"""Debian's archive (a CDN); ``ROLLOUTPOOL_DEBIAN_MIRROR`` names another."""

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _mirror() -> str:
    return os.environ.get("ROLLOUTPOOL_DEBIAN_MIRROR") or DEFAULT_MIRROR


def base_reference() -> str:
    """The base image's reference for this recipe and mirror."""
    return f"localhost/rolloutpool-base:{SUITE}-{base_key(mirror=_mirror())}"


def _debootstrap(rootfs: Path, log: Log) -> None:
    command = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(BASE_PACKAGES)}",
        SUITE,
        str(rootfs),
        _mirror(),
    ]
    log(f"Running {' '.join(command)}")
    started = time.monotonic()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if done.returncode != 0:
        debootstrap_log = rootfs / "debootstrap" / "debootstrap.log"
        detail = debootstrap_log.read_text(errors="replace")[-2000:] if debootstrap_log.exists() else ""
        raise ImageBuildError(f"debootstrap of the base failed ({done.returncode}): {done.stdout[-2000:]}\n{detail}")
    log(f"Finished debootstrap in {time.monotonic() - started:.0f}s")


def _clean(rootfs: Path) -> None:
    """Drop package caches and docs; leave out what a runtime provides (/dev, hostname, resolver)."""
    for rel in (*BASE_CLEANUP, "dev"):
        where = rootfs / rel
        if where.is_dir():
            for child in where.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    for rel in ("etc/hostname", "etc/resolv.conf"):
        (rootfs / rel).unlink(missing_ok=True)
        (rootfs / rel).touch()


def ensure_base(buildah: Buildah, *, cache: Path, log: Log = print) -> str:
    """Make the base image once (about two minutes on 2 cores); returns its reference."""
    reference = base_reference()
    if buildah.exists(reference):
        return reference
    log(f"Making the base image {reference} from Debian {SUITE} packages (once per machine)")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="base-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _debootstrap(rootfs, log)
        _clean(rootfs)
        container = buildah.run("from", "scratch").stdout.strip().splitlines()[-1]
        try:
            mounted = buildah.run("mount", container).stdout.strip()
            subprocess.run(["cp", "-a", f"{rootfs}/.", mounted], check=True, capture_output=True, timeout=600)
            buildah.run("config", "--env", f"PATH={_PATH}", "--env", "LANG=C.UTF-8", "--cmd", "python3", container)
            buildah.run("commit", "--rm", container, reference)
        except BaseException:
            buildah.run("rm", container, check=False)
            raise
    log(f"Made the base image {reference}")
    return reference
