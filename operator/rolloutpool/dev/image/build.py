"""Build the repository's ``Dockerfile`` without a Docker engine, once per machine and content.

``ensure_image()`` runs ``buildah bud`` (chroot isolation, vfs storage: no daemon, no
overlay driver, no user namespaces) on a base image made here by ``debootstrap`` from
Debian packages (:mod:`.base`, passed as the Dockerfile's ``PYTHON_IMAGE``), then
copies the image's root filesystem out, so the tests and the process kubelet can run it
(``enter.py``). The build's RUN steps share the host's network; they trust the CA bundle
this machine trusts (mounted over the base's bundle for the RUN steps only, never stored),
so pip reaches PyPI through a TLS-inspecting proxy as the host's pip does.

Everything lives in ``~/.cache/rolloutpool/image-<suite>-<recipe>/`` (``ROLLOUTPOOL_CACHE``
overrides the root): buildah's ``storage/``, and one folder per build, named by
:func:`~rolloutpool.dev.image.recipe.image_key` (the base, the Dockerfile and every file it
copies), holding ``rootfs/`` and ``image.json`` (written last). A second run with the same
content reuses it; the three most recent builds are kept. ``python -m rolloutpool.dev.image.build``
(``.ci/dev test``) builds or reuses and reports the size; ``rolloutpool image build --archive F``
also writes an ``oci-archive``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rolloutpool.dev.image.base import ensure_base
from rolloutpool.dev.image.buildah import Buildah, ImageBuildError
from rolloutpool.dev.image.recipe import (
    RECIPE,
    SUITE,
    copied_sources,
    failed_step,
    ignored,
    image_key,
    image_tag,
)
from rolloutpool.filelock import locked

__all__ = [
    "ENTER_SCRIPT",
    "BuiltImage",
    "ImageBuildError",
    "build_image",
    "buildah_unavailable",
    "checkout_root",
    "ensure_image",
    "image_cache",
    "main",
    "write_archive",
]

Log = Callable[[str], None]

ENTER_SCRIPT = Path(__file__).resolve().with_name("enter.py")
"""The script that starts a container from a root filesystem (run as ``python -I ENTER_SCRIPT SPEC``)."""

_KEEP = 3  # builds kept in the cache (the newest by use)
_BUNDLE_IN_BASE = "/etc/ssl/certs/ca-certificates.crt"


@dataclass(frozen=True)
class BuiltImage:
    """One build of the image: its reference in buildah's storage and its root filesystem on disk."""

    reference: str
    """``localhost/rolloutpool:<version>-<key>``, in the cache's buildah storage."""
    key: str
    """The content key the build is cached under."""
    directory: Path
    """The cache folder of this build (``rootfs/``, ``image.json``)."""
    image_id: str
    """buildah's image id (the config's digest)."""
    base: str
    """The base image the Dockerfile's ``PYTHON_IMAGE`` named."""
    config: dict[str, Any] = field(default_factory=dict)
    """The OCI image config: ``User``, ``Env``, ``Entrypoint``, ``Cmd``, ``WorkingDir``, ``Labels``."""
    size_bytes: int = 0
    """The root filesystem's size, uncompressed (every file's bytes, links once)."""
    build_seconds: float = 0.0
    """How long the build took (0 for a base-only record)."""

    @property
    def rootfs(self) -> Path:
        """The image's root filesystem, read by every container run from it (never written)."""
        return self.directory / "rootfs"

    @property
    def repository(self) -> str:
        """The reference without its tag (the chart's ``image.repository``)."""
        return self.reference.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        """The reference's tag (the chart's ``image.tag``)."""
        return self.reference.rsplit(":", 1)[1]

    def save(self) -> None:
        """Write ``image.json`` (the marker of a complete build)."""
        record = asdict(self) | {"directory": str(self.directory)}
        tmp = self.directory / "image.json.tmp"
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
        tmp.rename(self.directory / "image.json")

    @classmethod
    def load(cls, directory: Path) -> BuiltImage:
        """Read a build's ``image.json``; raises ``FileNotFoundError`` when the build is not complete."""
        record = json.loads((directory / "image.json").read_text())
        return cls(**(record | {"directory": directory}))


def image_cache() -> Path:
    """The image cache folder: ``<ROLLOUTPOOL_CACHE or ~/.cache/rolloutpool>/image-<suite>-<recipe>``."""
    base = os.environ.get("ROLLOUTPOOL_CACHE") or str(Path.home() / ".cache" / "rolloutpool")
    return Path(base) / f"image-{SUITE}-{RECIPE}"


def checkout_root() -> Path:
    """The checkout this package runs from (the build context: ``Dockerfile``, ``pyproject.toml``)."""
    root = Path(__file__).resolve().parents[4]
    if not (root / "Dockerfile").is_file():
        raise FileNotFoundError(f"no Dockerfile at {root}: build the image from a RolloutPool checkout")
    return root


def buildah_unavailable() -> str | None:
    """Why the image cannot be built and run on this machine, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "building and running the image needs Linux (buildah, debootstrap, chroot)"
    if os.geteuid() != 0:
        return (
            "building and running the image needs root here (debootstrap, buildah's chroot isolation, "
            "and the kubelet's chroot into the image as the pod's user): run as root"
        )
    missing = [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]
    if missing:
        return (
            f"{' and '.join(missing)} not installed: `bash .ci/dev setup` installs them "
            f"(apt-get install {' '.join(missing)})"
        )
    return None


def _host_ca_bundle() -> Path | None:
    """The CA bundle this machine's Python and pip trust (a TLS-inspecting proxy's CA included)."""
    names = [os.environ.get(v) for v in ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")]
    names.append(ssl.get_default_verify_paths().cafile)
    names.append(_BUNDLE_IN_BASE)
    return next((Path(n) for n in names if n and Path(n).is_file()), None)


def _context_files(context: Path, dockerfile: str) -> Iterator[tuple[str, bytes]]:
    """Every file the Dockerfile copies from the context (caches and bytecode left out), with its bytes."""
    for source in copied_sources(dockerfile):
        path = context / source
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in found:
            rel = file.relative_to(context).as_posix()
            if not ignored(rel):
                yield rel, file.read_bytes()


def _version(context: Path) -> str:
    with (context / "pyproject.toml").open("rb") as handle:
        return str(tomllib.load(handle)["project"]["version"])


def _tree_size(root: Path) -> int:
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, _dirs, files in os.walk(root):
        for name in files:
            info = os.lstat(os.path.join(directory, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_size
    return total


def build_image(
    buildah: Buildah, *, context: Path, dockerfile: Path, base: str, reference: str, log: Log = print
) -> None:
    """``buildah bud`` of ``dockerfile`` on ``base``, tagged ``reference``; :class:`ImageBuildError` names the step."""
    args = ["bud", "--isolation=chroot", "--build-arg", f"PYTHON_IMAGE={base}"]
    bundle = _host_ca_bundle()
    if bundle is not None:
        args += ["--volume", f"{bundle}:{_BUNDLE_IN_BASE}:ro"]
    args += ["--file", str(dockerfile), "--tag", reference, str(context)]
    log(f"Building image {reference} from {dockerfile} (buildah bud, chroot isolation, base {base})")
    output = buildah.run(*args, check=False, timeout=1800)
    if output.returncode != 0:
        step = failed_step(output.stdout)
        tail = "\n".join(output.stdout.splitlines()[-25:])
        raise ImageBuildError(f"the image build failed at {step}\n--- last lines of buildah bud ---\n{tail}")


def _extract(buildah: Buildah, reference: str, target: Path) -> None:
    """Copy the image's root filesystem to ``target`` (from a working container buildah mounts)."""
    container = buildah.run("from", "--pull-never", reference).stdout.strip().splitlines()[-1]
    try:
        mounted = Path(buildah.run("mount", container).stdout.strip())
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["cp", "-a", f"{mounted}/.", str(tmp)], check=True, capture_output=True, timeout=600)
        tmp.rename(target)
    finally:
        buildah.run("rm", container, check=False)


def _prune(buildah: Buildah, cache: Path, *, keep: int, log: Log) -> None:
    builds = sorted(
        (d for d in cache.iterdir() if d.is_dir() and (d / "image.json").exists()),
        key=lambda d: (d / "image.json").stat().st_mtime,
        reverse=True,
    )
    for old in builds[keep:]:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            buildah.run("rmi", BuiltImage.load(old).reference, check=False)
        shutil.rmtree(old, ignore_errors=True)
        log(f"Removed old image build {old.name}")
    buildah.run("rmi", "--prune", check=False)


def ensure_image(context: Path | None = None, *, log: Log = print) -> BuiltImage:
    """Build the image from ``context``'s Dockerfile, or reuse the cached build of the same content.

    Raises ``RuntimeError`` with :func:`buildah_unavailable`'s reason where it cannot run, and
    :class:`ImageBuildError` (naming the failed step) when the build fails.
    """
    reason = buildah_unavailable()
    if reason is not None:
        raise RuntimeError(reason)
    context = context or checkout_root()
    cache = image_cache()
    with locked(cache / "lock"):
        buildah = Buildah(cache)
        base = ensure_base(buildah, cache=cache, log=log)
        dockerfile = (context / "Dockerfile").read_text()
        key = image_key(base=base, dockerfile=dockerfile.encode(), files=_context_files(context, dockerfile))
        directory = cache / key
        with contextlib.suppress(FileNotFoundError):
            cached = BuiltImage.load(directory)
            if buildah.exists(cached.reference):
                os.utime(directory / "image.json")
                log(f"Reused image {cached.reference} ({cached.size_bytes / 1e6:.0f} MB) from {directory}")
                return cached
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        started = time.monotonic()
        try:
            reference = image_tag(version=_version(context), key=key)
            build_image(
                buildah, context=context, dockerfile=context / "Dockerfile", base=base, reference=reference, log=log
            )
            _extract(buildah, reference, directory / "rootfs")
            inspected = json.loads(buildah.run("inspect", "--type", "image", reference).stdout)
            image = BuiltImage(
                reference=reference,
                key=key,
                directory=directory,
                image_id=str(inspected.get("FromImageID") or inspected.get("FromImage") or ""),
                base=base,
                config=dict((inspected.get("OCIv1") or {}).get("config") or {}),
                size_bytes=_tree_size(directory / "rootfs"),
                build_seconds=round(time.monotonic() - started, 1),
            )
            image.save()
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)  # a failed build leaves nothing to mistake for one
            raise
        log(f"Built image {reference} ({image.size_bytes / 1e6:.0f} MB uncompressed) in {image.build_seconds:.0f}s")
        _prune(buildah, cache, keep=_KEEP, log=log)
        return image


def write_archive(image: BuiltImage, path: Path, *, name: str | None = None) -> Path:
    """Write the image as an ``oci-archive`` (what ``podman load``, ``skopeo copy`` and ``ctr import`` read).

    ``name`` is the reference recorded in the archive (default: the local reference).
    """
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    Buildah(image.directory.parent).run("push", image.reference, f"oci-archive:{path}:{name or image.reference}")
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m rolloutpool.dev.image.build [--archive FILE [--name REF]]``: build or reuse the image.

    Prints where it is, its size and how long it took; exits 3 where buildah cannot run here.
    """
    parser = argparse.ArgumentParser(
        prog="python -m rolloutpool.dev.image.build",
        description="Build the image from the Dockerfile (buildah), or reuse this machine's build of the same content.",
    )
    parser.add_argument("--archive", type=Path, help="also write the image to this file as an oci-archive")
    parser.add_argument("--name", help="the reference recorded in the archive (default: the local one)")
    args = parser.parse_args(argv)
    reason = buildah_unavailable()
    if reason is not None:
        print(f"Cannot build the image here: {reason}")
        return 3
    started = time.monotonic()
    try:
        image = ensure_image(log=lambda line: print(line, flush=True))
    except ImageBuildError as err:
        print(str(err), file=sys.stderr)
        return 1
    print(
        f"Image {image.reference}: {image.size_bytes / 1e6:.0f} MB uncompressed, rootfs {image.rootfs}, "
        f"ready in {time.monotonic() - started:.1f}s"
    )
    if args.archive is not None:
        path = write_archive(image, args.archive, name=args.name)
        print(f"Wrote {path} ({path.stat().st_size / 1e6:.0f} MB) as {args.name or image.reference}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
