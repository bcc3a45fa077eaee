"""Whether the simulator's hot modules run compiled with mypyc or from their sources (reads files, imports nothing).

:mod:`rolloutpool.sim.compiled` builds :data:`MODULES` with mypyc (the README's set-up runs it); the extensions
land beside their sources, where Python would import them first. A build is *current* while every compiled
module's source and every module of ours that they import (their types shape the compiled code) is unchanged
since it; the build records their SHA-256 digests in :data:`STAMP`. :func:`choose`, which runs when the
``rolloutpool`` package is imported, makes a process import the sources of every module in :data:`MODULES` when
the build is not current, so an edit never runs old compiled code: it runs pure Python until the next build.
Pure Python is the reference: the test suite imports it (:func:`prefer_sources`) and compares the build with it.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path

__all__ = [
    "MODULES",
    "ROOT",
    "STAMP",
    "choose",
    "compiled",
    "digest",
    "extensions",
    "prefer_sources",
    "read_stamp",
    "source",
    "stale",
    "state",
]

MODULES = (
    "rolloutpool.engine.model.blocks",
    "rolloutpool.engine.model.cache_events",
    "rolloutpool.engine.model.core",
    "rolloutpool.engine.model.decoderuns",
    "rolloutpool.engine.model.cost",
    "rolloutpool.engine.model.hashing",
    "rolloutpool.engine.model.pins",
    "rolloutpool.engine.model.request",
    "rolloutpool.sim.fleet",
    "rolloutpool.sim.fleet_loops",
)
"""What is compiled: nothing outside it subclasses a class of it (mypyc classes refuse interpreted subclasses)."""

STAMP = ".mypyc-sources.json"
"""In the package directory: the build's inputs, ``{"modules": {module: sha256}, "depends": {path: sha256}}``
(``depends``: every other module file of ours they import, directly or not, as a path under :data:`ROOT`)."""

ROOT = Path(__file__).resolve().parent.parent
"""The source root the package sits in (``operator/`` in a checkout)."""


def source(module: str, root: Path = ROOT) -> Path:
    """A module's source file."""
    return root.joinpath(*module.split(".")).with_suffix(".py")


def digest(path: Path) -> str:
    """A file's SHA-256."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def extensions(module: str, root: Path = ROOT) -> list[Path]:
    """The compiled extensions of a module beside its source."""
    stem = source(module, root).with_suffix("")
    paths = [Path(f"{stem}{suffix}") for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    return [path for path in paths if path.exists()]


def compiled(root: Path = ROOT) -> list[str]:
    """The modules of :data:`MODULES` with an extension beside the source (what Python would import compiled)."""
    return [module for module in MODULES if extensions(module, root)]


def read_stamp(root: Path = ROOT) -> dict[str, dict[str, str]] | None:
    """The recorded build inputs; None when there is no readable stamp."""
    try:
        stamp = json.loads((root / "rolloutpool" / STAMP).read_text())
        modules, depends = dict(stamp["modules"]), dict(stamp["depends"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return {"modules": modules, "depends": depends}


def stale(root: Path = ROOT) -> list[str]:
    """The compiled modules whose build is not current: their source changed, or a module of ours they import did
    (then every compiled one: its types may be in any), or no build recorded them."""
    built = compiled(root)
    if not built:
        return []
    stamp = read_stamp(root)
    if stamp is None:
        return built
    for rel, recorded in stamp["depends"].items():
        path = root / rel
        if not path.is_file() or digest(path) != recorded:
            return built
    return [module for module in built if stamp["modules"].get(module) != digest(source(module, root))]


class _Sources(importlib.abc.MetaPathFinder):
    """Finds :data:`MODULES` at their source files, ahead of the extensions beside them; ``stale``: the compiled
    modules that were not current when it was installed (empty: the sources were chosen, as the tests do)."""

    def __init__(self, root: Path, stale: list[str]) -> None:
        self.root = root
        self.stale = stale

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source(fullname, self.root))


def _finder() -> _Sources | None:
    return next((finder for finder in sys.meta_path if isinstance(finder, _Sources)), None)


def prefer_sources(root: Path = ROOT, *, stale: list[str] | None = None) -> None:
    """Make this process import :data:`MODULES` from their sources even where they are compiled (``stale``: the
    compiled modules that are not current, when that is why). Raises ``RuntimeError`` when one is imported already
    (too late to choose)."""
    if _finder() is not None:
        return
    if loaded := [module for module in MODULES if module in sys.modules]:
        raise RuntimeError(f"already imported, compiled or not: {', '.join(loaded)}")
    sys.meta_path.insert(0, _Sources(root, stale or []))


def choose(root: Path = ROOT) -> list[str]:
    """The package's import-time choice: the sources wherever the build is not current. Returns the stale modules
    (empty: the build is current, or nothing is compiled)."""
    old = stale(root)
    if old:
        prefer_sources(root, stale=old)
    return old


def state(root: Path = ROOT) -> str:
    """What this process chose to run: ``"compiled"``, ``"pure"`` (nothing compiled, or the sources chosen, as the
    tests do) or ``"stale"`` (compiled, but not current when the package was imported: pure Python runs)."""
    finder = _finder()
    if finder is not None:
        return "stale" if finder.stale else "pure"
    return "compiled" if compiled(root) else "pure"
