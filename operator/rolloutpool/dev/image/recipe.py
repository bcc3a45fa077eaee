"""What goes into the locally built image, and what must never be in it (pure).

The build (:mod:`rolloutpool.dev.image.build`) runs the repository's ``Dockerfile`` with
``buildah bud`` on a base made here from Debian packages (:data:`BASE_PACKAGES` of
:data:`SUITE`, the Python 3.11 that bookworm ships). Its cache is keyed by what goes into it:
:func:`base_key` for the base, :func:`image_key` for the image (the base, the Dockerfile, and
every file its ``COPY`` instructions take from the context). Everything here is pure: keyword
arguments, no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "BASE_CLEANUP",
    "BASE_PACKAGES",
    "FORBIDDEN",
    "RECIPE",
    "SUITE",
    "Finding",
    "base_key",
    "copied_sources",
    "failed_step",
    "forbidden_content",
    "ignored",
    "image_key",
    "image_tag",
]

RECIPE = "r1"
"""Revision of the build recipe; part of both keys, so a changed recipe builds afresh."""

SUITE = "bookworm"
"""The Debian release of the base: its ``python3`` is 3.11, the Dockerfile's default base's version."""

BASE_PACKAGES = ("python3", "python3-venv", "python3-pip", "python-is-python3", "ca-certificates")
"""What ``debootstrap --variant=minbase`` adds: ``python`` with ``pip`` (the build stage) and ``venv`` (the final)."""

BASE_CLEANUP = (
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
)
"""Directories emptied in the base: package caches and documentation, as slim images do."""

FORBIDDEN = {
    "a compiler": (r"usr/(local/)?bin/(gcc|g\+\+|cc|c\+\+|clang|clang\+\+|tcc|x86_64-linux-gnu-gcc)(-[\d.]+)?",),
    "a test tool": (
        r"(.*/)?site-packages/(pytest|_pytest|hypothesis|mypy|ruff|pytest_asyncio|pytest_timeout|importlinter)/.*",
        r"(.*/)?bin/(pytest|py\.test|mypy|ruff|lint-imports)",
    ),
    "a plotting or simulation library": (r"(.*/)?site-packages/(matplotlib|numpy|PIL|pandas|scipy)/.*",),
    "a build leftover": (r"(src|wheels)(/.*)?",),
}
"""What the image must not hold, by kind: regular expressions over paths relative to its root."""

_JUNK = re.compile(
    r"(^|/)(__pycache__|[^/]*\.egg-info|\.mypy_cache|\.pytest_cache|\.ruff_cache|\.mypyc-sources\.json)(/|$)|\.py[cod]$|\.so$"
)
"""What ``.dockerignore`` leaves out of the context below the copied paths (keep the two in step): caches, bytecode,
and the simulator's mypyc build (extensions made for this machine's Python, not the image's)."""
_COPY = re.compile(r"^\s*(?:COPY|ADD)\s+(.*)$", re.IGNORECASE)
_STEP = re.compile(r"^(?:\[\d+/\d+\] )?STEP \d+/\d+: .*$")
_BUILD_ERROR = re.compile(r'^Error: building at STEP "(.*)": (.*)$')


def base_key(*, mirror: str) -> str:
    """The base image's cache key: suite, packages, cleanup, mirror and recipe."""
    text = "\n".join([RECIPE, SUITE, mirror, *BASE_PACKAGES, *BASE_CLEANUP])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def copied_sources(dockerfile: str) -> list[str]:
    """The context paths the Dockerfile's ``COPY``/``ADD`` instructions take (``--from`` stages excluded).

    Both forms: ``COPY [--flag ...] SRC... DEST`` and ``COPY [--flag ...] ["SRC", ..., "DEST"]``.
    """
    sources: list[str] = []
    for line in dockerfile.replace("\\\n", " ").splitlines():
        match = _COPY.match(line)
        if not match:
            continue
        rest, flags = match.group(1).strip(), []
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            flags.append(flag)
            rest = rest.strip()
        if any(f.startswith("--from") for f in flags):
            continue
        words = [str(w) for w in json.loads(rest)] if rest.startswith("[") else shlex.split(rest)
        sources += [p.rstrip("/") or "." for p in words[:-1]]
    return sources


def ignored(path: str) -> bool:
    """Whether a context path is left out of the image (``.dockerignore``'s caches, bytecode, egg-info, the
    simulator's mypyc build)."""
    return bool(_JUNK.search(path))


def image_key(*, base: str, dockerfile: bytes, files: Iterable[tuple[str, bytes]]) -> str:
    """The image's cache key: the base's key, the Dockerfile and each copied file's path and bytes."""
    digest = hashlib.sha256()
    for part in (RECIPE.encode(), base.encode(), dockerfile):
        digest.update(len(part).to_bytes(8, "big") + part)
    for path, data in sorted(files):
        digest.update(len(path).to_bytes(8, "big") + path.encode() + hashlib.sha256(data).digest())
    return digest.hexdigest()[:16]


def image_tag(*, version: str, key: str) -> str:
    """The local reference of one build: ``localhost/rolloutpool:<version>-<key>``."""
    return f"localhost/rolloutpool:{version}-{key[:12]}"


def failed_step(output: str) -> str:
    """Which Dockerfile step a failed ``buildah bud`` stopped at, from its output, in one line.

    ``[1/2] STEP 6/6: RUN python -m pip wheel ...`` (the last step header) and buildah's own
    error line; falls back to the last lines of output when neither is there.
    """
    lines = [line.rstrip() for line in output.splitlines() if line.strip()]
    steps = [line for line in lines if _STEP.match(line)]
    errors = [m for line in lines if (m := _BUILD_ERROR.match(line))]
    if steps and errors:
        return f"{steps[-1]} ({errors[-1].group(2)})"
    if steps:
        return steps[-1]
    if errors:
        return f"STEP {errors[-1].group(1)} ({errors[-1].group(2)})"
    return " | ".join(lines[-3:]) or "no output"


@dataclass(frozen=True)
class Finding:
    """One thing the image must not hold: its kind and the first paths found."""

    kind: str
    paths: tuple[str, ...]


def forbidden_content(*, paths: Iterable[str], rules: Mapping[str, tuple[str, ...]] = FORBIDDEN) -> list[Finding]:
    """Which forbidden kinds of content the paths (relative to the image's root) show, with examples."""
    compiled = {kind: [re.compile(p) for p in patterns] for kind, patterns in rules.items()}
    found: dict[str, list[str]] = {}
    for path in paths:
        for kind, patterns in compiled.items():
            if any(p.fullmatch(path) for p in patterns):
                found.setdefault(kind, []).append(path)
    return [Finding(kind=k, paths=tuple(sorted(v)[:5])) for k, v in sorted(found.items())]
