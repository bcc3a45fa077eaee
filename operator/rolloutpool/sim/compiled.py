"""The fleet simulator's compiled speed-up: its hot modules built with mypyc, in place (I/O).

Pure Python is the reference, what the tests import and what the image ships; the README's set-up compiles
(``ensure``, below). ``python -m rolloutpool.sim.compiled build`` compiles
:data:`MODULES` (the engine model and the fleet's event loop: about 80 % of a ``rolloutpool
simulate`` run's CPU) with mypyc, which ships with mypy (a dev dependency), and a C compiler; the
extension modules land next to their sources in a source checkout, where Python imports them
instead of the ``.py`` files. The results are identical (``tests/test_sim_compiled.py`` checks the
logic here and compares a compiled run with a pure one), and a default ``simulate`` takes about 0.44 of the
time. ``clean`` removes them; ``status`` says which modules run compiled.

A compiled module does not follow later edits of its source. The build records each source's
SHA-256 in :data:`STAMP`; :func:`stale` names the compiled modules whose source changed since, and
``rolloutpool simulate``, ``rolloutpool engine-sim`` and the test suite (tests/conftest.py) refuse to run
with any (rebuild or clean).

``ensure`` (what the README's set-up, ``bash .ci/dev``, runs) leaves a current build alone, else copies in
this machine's earlier build of the same sources, Python and mypyc (``~/.cache/rolloutpool/mypyc-<key>/``,
``ROLLOUTPOOL_CACHE`` overrides the folder), else builds and keeps a copy there: a fresh clone on the
same machine gets the compiled simulator in a second.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from importlib import metadata
from pathlib import Path

__all__ = [
    "MODULES",
    "STAMP",
    "BuildError",
    "build",
    "cache_key",
    "clean",
    "compiled",
    "ensure",
    "prefer_sources",
    "stale",
    "stale_message",
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
"""In the package directory: module -> SHA-256 of the source each extension was built from."""

_PACKAGE = Path(__file__).resolve().parent.parent  # operator/rolloutpool
_ROOT = _PACKAGE.parent  # operator/: the source root mypyc runs in


def _source(module: str, root: Path = _ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _extensions(module: str, root: Path = _ROOT) -> list[Path]:
    stem = _source(module, root).with_suffix("")
    paths = [Path(f"{stem}{suffix}") for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    return [path for path in paths if path.exists()]


def compiled(root: Path = _ROOT) -> list[str]:
    """The modules of :data:`MODULES` that an import here would load compiled (an extension beside the source)."""
    return [module for module in MODULES if _extensions(module, root)]


def stale(root: Path = _ROOT) -> list[str]:
    """Compiled modules whose source changed since the build (or that no build recorded): they would run old code."""
    try:
        recorded = json.loads((root / "rolloutpool" / STAMP).read_text())
    except (OSError, ValueError):
        recorded = {}
    return [module for module in compiled(root) if recorded.get(module) != _digest(_source(module, root))]


class _Sources(importlib.abc.MetaPathFinder):
    """Finds :data:`MODULES` at their source files, ahead of the extensions beside them."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, _source(fullname, self.root))


def prefer_sources(root: Path = _ROOT) -> None:
    """Make this process import :data:`MODULES` from their sources even where they are compiled: the test suite
    tests the reference, pure Python (``tests/test_sim_compiled.py`` checks the compiled build against it).
    Raises ``RuntimeError`` when one is imported already (too late to choose)."""
    if loaded := [module for module in MODULES if module in sys.modules]:
        raise RuntimeError(f"already imported, compiled or not: {', '.join(loaded)}")
    if not any(isinstance(finder, _Sources) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Sources(root))


def stale_message(modules: list[str]) -> str:
    """What to tell a user whose compiled ``modules`` are older than their sources."""
    return (
        f"compiled modules older than their sources: {', '.join(modules)}; rebuild them "
        "(python -m rolloutpool.sim.compiled build) or remove them (python -m rolloutpool.sim.compiled clean)"
    )


def _runtime(root: Path) -> list[Path]:
    """mypyc's shared runtime library beside the package (one per build)."""
    return [path for path in root.glob("*__mypyc*") if path.is_file()]


def clean(root: Path = _ROOT) -> list[Path]:
    """Remove the compiled modules, mypyc's shared runtime library beside the package, and the stamp."""
    removed = [path for module in MODULES for path in _extensions(module, root)]
    removed += _runtime(root)
    stamp = root / "rolloutpool" / STAMP
    if stamp.exists():
        removed.append(stamp)
    for path in removed:
        path.unlink()
    return removed


class BuildError(RuntimeError):
    """mypyc or the C compiler failed; the message ends with the tail of their output."""


def build(root: Path = _ROOT) -> None:
    """Compile :data:`MODULES` in place with mypyc (needs mypy and a C compiler); raises :class:`BuildError` with the
    tail of the compiler's output (kept quiet while it succeeds) on failure, leaving pure Python."""
    clean(root)
    sources = {module: _source(module, root) for module in MODULES}
    digests = {module: _digest(path) for module, path in sources.items()}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "MYPY_CACHE_DIR": cache}
        try:
            done = subprocess.run(  # our own interpreter and source files
                [sys.executable, "-m", "mypyc", *(str(path.relative_to(root)) for path in sources.values())],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
        finally:
            shutil.rmtree(root / "build", ignore_errors=True)  # mypyc's C sources and objects
    if done.returncode != 0:
        clean(root)
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise BuildError(f"mypyc failed (exit {done.returncode}); the last of its output:\n{tail}")
    if any(_digest(path) != digests[module] for module, path in sources.items()):
        clean(root)
        raise RuntimeError("a source changed during the build: run it again")
    (root / "rolloutpool" / STAMP).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")


_MANIFEST = "manifest.json"
"""In a cached build's folder, written last: its files (paths under the source root) and its stamp."""
_KEEP = 4
"""Cached builds kept per machine (the newest; each about 2 MB)."""


def cache_key(root: Path = _ROOT) -> str:
    """What a build depends on: every compiled module's source, the Python that imports it and mypyc's version."""
    try:
        mypy = metadata.version("mypy")
    except metadata.PackageNotFoundError:
        mypy = "none"
    parts = {
        "sources": {module: _digest(_source(module, root)) for module in MODULES},
        "python": sys.version,
        "abi": sysconfig.get_config_var("EXT_SUFFIX"),
        "mypy": mypy,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _cache_base() -> Path:
    return Path(os.environ.get("ROLLOUTPOOL_CACHE") or Path.home() / ".cache" / "rolloutpool")


def _restore(cached: Path, root: Path) -> bool:
    """Copy a cached build into ``root``; False when the cache holds no complete build."""
    try:
        manifest = json.loads((cached / _MANIFEST).read_text())
        files, digests = list(manifest["files"]), dict(manifest["stamp"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if not all((cached / "files" / rel).is_file() for rel in files):
        return False
    clean(root)
    for rel in files:
        shutil.copy2(cached / "files" / rel, root / rel)
    (root / "rolloutpool" / STAMP).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    os.utime(cached)  # the newest kept
    return True


def _keep(cached: Path, root: Path) -> None:
    """Copy the build in ``root`` into the cache (manifest last), then drop all but the newest cached builds."""
    files = [path.relative_to(root).as_posix() for module in MODULES for path in _extensions(module, root)]
    files += [path.name for path in _runtime(root)]
    staging = Path(tempfile.mkdtemp(prefix=f".{cached.name}-", dir=cached.parent))
    try:
        for rel in files:
            target = staging / "files" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, target)
        stamp = json.loads((root / "rolloutpool" / STAMP).read_text())
        (staging / _MANIFEST).write_text(json.dumps({"files": files, "stamp": stamp}, indent=1) + "\n")
        shutil.rmtree(cached, ignore_errors=True)
        staging.rename(cached)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    builds = sorted(cached.parent.glob("mypyc-*"), key=lambda path: path.stat().st_mtime, reverse=True)
    for old in builds[_KEEP:]:
        shutil.rmtree(old, ignore_errors=True)


def ensure(root: Path = _ROOT, cache: Path | None = None) -> str:
    """Make the compiled modules current: ``"current"`` (nothing to do), ``"cached"`` (this machine's earlier
    build of the same sources copied in) or ``"built"`` (compiled now, and kept in the cache); raises
    :class:`BuildError` when the build fails (no C compiler, no Python headers), leaving pure Python."""
    if compiled(root) == list(MODULES) and not stale(root):
        return "current"
    cached = (cache or _cache_base()) / f"mypyc-{cache_key(root)}"
    if _restore(cached, root):
        return "cached"
    build(root)
    cached.parent.mkdir(parents=True, exist_ok=True)
    _keep(cached, root)
    return "built"


def _main(argv: list[str]) -> int:
    command = argv[0] if argv else "status"
    try:
        return _command(command)
    except BuildError as exc:
        print(f"the simulator stays pure Python: {exc}", file=sys.stderr)
        return 1


def _command(command: str) -> int:
    if command == "build":
        build()
        print(f"compiled {len(MODULES)} modules with mypyc: {', '.join(compiled())}")
    elif command == "ensure":
        how = ensure()
        said = {"current": "already current", "cached": "copied from this machine's cache", "built": "built now"}
        print(f"compiled simulator ({len(MODULES)} modules, mypyc): {said[how]}")
    elif command == "clean":
        for path in clean():
            print(f"removed {path}")
    elif command == "status":
        done, old = compiled(), stale()
        print("compiled (mypyc): " + (", ".join(done) or "none: pure Python"))
        if old:
            print("STALE (source changed since the build; rebuild or clean): " + ", ".join(old))
            return 1
    else:
        print("usage: python -m rolloutpool.sim.compiled [build|ensure|clean|status]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
