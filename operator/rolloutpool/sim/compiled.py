"""The fleet simulator's optional compiled speed-up: its hot modules built with mypyc, in place (I/O).

Pure Python is the default and the reference. ``python -m rolloutpool.sim.compiled build`` compiles
:data:`MODULES` (the engine model and the fleet's event loop: about 80 % of a ``rolloutpool
simulate`` run's CPU) with mypyc, which ships with mypy (a dev dependency), and a C compiler; the
extension modules land next to their sources in a source checkout, where Python imports them
instead of the ``.py`` files. The results are identical (``tests/test_sim_compiled.py`` checks the
logic here; the figures were compared run by run), and a default ``simulate`` takes about half the
CPU. ``clean`` removes them; ``status`` says which modules run compiled.

A compiled module does not follow later edits of its source. The build records each source's
SHA-256 in :data:`STAMP`; :func:`stale` names the compiled modules whose source changed since, and
``rolloutpool simulate``, ``rolloutpool engine-sim`` and the test suite (tests/conftest.py) refuse to run
with any (rebuild or clean).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["MODULES", "STAMP", "build", "clean", "compiled", "stale", "stale_message"]

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


def stale_message(modules: list[str]) -> str:
    """What to tell a user whose compiled ``modules`` are older than their sources."""
    return (
        f"compiled modules older than their sources: {', '.join(modules)}; rebuild them "
        "(python -m rolloutpool.sim.compiled build) or remove them (python -m rolloutpool.sim.compiled clean)"
    )


def clean(root: Path = _ROOT) -> list[Path]:
    """Remove the compiled modules, mypyc's shared runtime library beside the package, and the stamp."""
    removed = [path for module in MODULES for path in _extensions(module, root)]
    removed += [path for path in root.glob("*__mypyc*") if path.is_file()]
    stamp = root / "rolloutpool" / STAMP
    if stamp.exists():
        removed.append(stamp)
    for path in removed:
        path.unlink()
    return removed


def build(root: Path = _ROOT) -> None:
    """Compile :data:`MODULES` in place with mypyc (needs mypy and a C compiler); raises on failure."""
    clean(root)
    sources = {module: _source(module, root) for module in MODULES}
    digests = {module: _digest(path) for module, path in sources.items()}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "MYPY_CACHE_DIR": cache}
        try:
            subprocess.run(  # our own interpreter and source files
                [sys.executable, "-m", "mypyc", *(str(path.relative_to(root)) for path in sources.values())],
                cwd=root,
                env=env,
                check=True,
            )
        finally:
            shutil.rmtree(root / "build", ignore_errors=True)  # mypyc's C sources and objects
    if any(_digest(path) != digests[module] for module, path in sources.items()):
        clean(root)
        raise RuntimeError("a source changed during the build: run it again")
    (root / "rolloutpool" / STAMP).write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")


def _main(argv: list[str]) -> int:
    command = argv[0] if argv else "status"
    if command == "build":
        build()
        print(f"compiled {len(MODULES)} modules with mypyc: {', '.join(compiled())}")
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
        print("usage: python -m rolloutpool.sim.compiled [build|clean|status]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
