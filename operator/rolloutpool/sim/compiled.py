"""The fleet simulator's compiled speed-up: its hot modules built with mypyc, in place (I/O).

Pure Python is the reference, what the tests import and what the image ships; the README's set-up compiles
(``ensure``, below). ``python -m rolloutpool.sim.compiled build`` compiles :data:`~rolloutpool.native.MODULES`
(the engine model and the fleet's event loop: about 80 % of a ``rolloutpool simulate`` run's CPU) with mypyc,
which ships with mypy (a dev dependency), a C compiler and the Python headers; the extension modules land next
to their sources in the source checkout, where Python imports them instead of the ``.py`` files. The results are
identical (``tests/test_sim_compiled.py`` compares a compiled run with a pure one), and a default ``simulate``
takes about 0.44 of the time. ``clean`` removes them; ``status`` says what runs.

A compiled module does not follow later edits: the build records the digests of its inputs (the compiled
sources and every module of ours they import, found from their import statements) and
:func:`rolloutpool.native.choose` makes a process import the sources while any differ.

``ensure`` (what the README's set-up, ``bash .ci/dev``, runs) leaves a current build alone, else copies in
this machine's earlier build of the same inputs, Python and mypyc (``~/.cache/rolloutpool/mypyc-<key>/``,
``ROLLOUTPOOL_CACHE`` overrides the folder), else builds and keeps a copy there: a fresh clone on the
same machine gets the compiled simulator in a second. Every command works only in a source checkout (the
package under ``operator/`` beside ``pyproject.toml``): elsewhere the package's folder is shared with others.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from importlib import metadata
from pathlib import Path

from rolloutpool.filelock import locked
from rolloutpool.native import MODULES, ROOT, STAMP, compiled, digest, extensions, read_stamp, source, stale, state

__all__ = ["BuildError", "build", "cache_key", "clean", "depends", "ensure"]

_MANIFEST = "manifest.json"
"""In a cached build's folder, written last: its files (paths under the source root) and its stamp."""
_KEEP = 4
"""Cached builds kept per machine (the newest; each about 2 MB)."""


class BuildError(RuntimeError):
    """No build here (not a source checkout, no compiler or headers) or mypyc failed; pure Python stays."""


def _checkout(root: Path) -> None:
    if root.name != "operator" or not (root.parent / "pyproject.toml").is_file():
        raise BuildError(f"{root} is not a RolloutPool source checkout's operator/ folder: nothing is built there")


def depends(root: Path = ROOT) -> list[str]:
    """Every module file of ours that :data:`~rolloutpool.native.MODULES` import, directly or not, at run time or
    only for their types (``TYPE_CHECKING``), and the packages above them: paths under ``root``, MODULES' own left
    out (read from the sources' import statements)."""
    seen: set[Path] = set()
    todo = [source(module, root) for module in MODULES]
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        for name in _imports(path, root):
            parts = name.split(".")
            for i in range(1, len(parts) + 1):  # the packages above it and the module (or package) itself
                base = root.joinpath(*parts[:i])
                todo += [base / "__init__.py", base.with_suffix(".py")]
    own = {source(module, root) for module in MODULES}
    return sorted(path.relative_to(root).as_posix() for path in seen - own)


def _imports(path: Path, root: Path) -> list[str]:
    """The modules of ours a file imports (``from a import b``: ``a`` and ``a.b``, which may be a module)."""
    names: list[str] = []
    package = ".".join(path.relative_to(root).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package up
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            names += [base, *(f"{base}.{alias.name}" for alias in node.names)]
    return [name for name in names if name == "rolloutpool" or name.startswith("rolloutpool.")]


def _runtime(root: Path) -> list[Path]:
    """mypyc's shared runtime library beside the package (one per build)."""
    return [path for path in root.glob("*__mypyc*") if path.is_file()]


def clean(root: Path = ROOT) -> list[Path]:
    """Remove the compiled modules, mypyc's shared runtime library beside the package, and the stamp."""
    _checkout(root)
    removed = [path for module in MODULES for path in extensions(module, root)]
    removed += _runtime(root)
    stamp = root / "rolloutpool" / STAMP
    if stamp.exists():
        removed.append(stamp)
    for path in removed:
        path.unlink()
    return removed


def _stamp_now(root: Path) -> dict[str, dict[str, str]]:
    return {
        "modules": {module: digest(source(module, root)) for module in MODULES},
        "depends": {rel: digest(root / rel) for rel in depends(root)},
    }


def build(root: Path = ROOT) -> None:
    """Compile :data:`~rolloutpool.native.MODULES` in place with mypyc; raises :class:`BuildError` (with the tail
    of the compiler's output, which is kept quiet while it succeeds) and leaves pure Python on failure."""
    _checkout(root)
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.is_file():
        raise BuildError(f"no Python headers ({headers} is missing): install this Python's development package")
    clean(root)
    inputs = _stamp_now(root)
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "MYPY_CACHE_DIR": cache}
        try:
            done = subprocess.run(  # our own interpreter and source files
                [sys.executable, "-m", "mypyc", *(str(source(module, root).relative_to(root)) for module in MODULES)],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
        except OSError as exc:
            raise BuildError(f"could not run mypyc: {exc}") from exc
        finally:
            shutil.rmtree(root / "build", ignore_errors=True)  # mypyc's C sources and objects
    if done.returncode != 0:
        clean(root)
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise BuildError(f"mypyc failed (exit {done.returncode}); the last of its output:\n{tail}")
    if _stamp_now(root) != inputs:
        clean(root)
        raise BuildError("a source changed during the build: run it again")
    (root / "rolloutpool" / STAMP).write_text(json.dumps(inputs, indent=1, sort_keys=True) + "\n")


def cache_key(root: Path = ROOT) -> str:
    """What a build depends on: its inputs (the stamp's digests), the Python that imports it and mypyc's version."""
    try:
        mypy = metadata.version("mypy")
    except metadata.PackageNotFoundError:
        mypy = "none"
    parts = {"inputs": _stamp_now(root), "python": sys.version, "abi": sysconfig.get_config_var("EXT_SUFFIX")}
    parts["mypy"] = mypy
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _cache_base() -> Path:
    return Path(os.environ.get("ROLLOUTPOOL_CACHE") or Path.home() / ".cache" / "rolloutpool")


def _restore(cached: Path, root: Path) -> bool:
    """Copy a cached build into ``root``; False when the cache holds no complete build."""
    try:
        manifest = json.loads((cached / _MANIFEST).read_text())
        files, stamp = list(manifest["files"]), dict(manifest["stamp"])
        if not all((cached / "files" / rel).is_file() for rel in files):
            return False
        clean(root)
        for rel in files:
            shutil.copy2(cached / "files" / rel, root / rel)
        (root / "rolloutpool" / STAMP).write_text(json.dumps(stamp, indent=1, sort_keys=True) + "\n")
        os.utime(cached)  # the newest kept
    except (OSError, ValueError, KeyError, TypeError):
        clean(root)
        return False
    return not stale(root)


def _keep(cached: Path, root: Path) -> None:
    """Copy the build in ``root`` into the cache (manifest last), then drop all but the newest cached builds."""
    files = [path.relative_to(root).as_posix() for module in MODULES for path in extensions(module, root)]
    files += [path.name for path in _runtime(root)]
    staging = Path(tempfile.mkdtemp(prefix=f".{cached.name}-", dir=cached.parent))
    try:
        for rel in files:
            target = staging / "files" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, target)
        (staging / _MANIFEST).write_text(json.dumps({"files": files, "stamp": read_stamp(root)}, indent=1) + "\n")
        shutil.rmtree(cached, ignore_errors=True)
        staging.rename(cached)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    builds = []
    for path in cached.parent.glob("mypyc-*"):
        with contextlib.suppress(OSError):  # another set-up may be removing it
            if path.is_dir():
                builds.append((path.stat().st_mtime, path))
    for _, old in sorted(builds, reverse=True)[_KEEP:]:
        shutil.rmtree(old, ignore_errors=True)
        old.with_name(f"{old.name}.lock").unlink(missing_ok=True)


def ensure(root: Path = ROOT, cache: Path | None = None) -> str:
    """Make the compiled modules current: ``"current"`` (nothing to do), ``"cached"`` (this machine's earlier
    build of the same inputs copied in) or ``"built"`` (compiled now, and kept in the cache: a failure to keep it
    is only reported); raises :class:`BuildError` when the build fails, leaving pure Python."""
    _checkout(root)
    if compiled(root) == list(MODULES) and not stale(root):
        return "current"
    key = cache_key(root)
    base = cache or _cache_base()
    cached = base / f"mypyc-{key}"
    with locked(base / f"mypyc-{key}.lock"):
        if _restore(cached, root):
            return "cached"
        build(root)
        try:
            _keep(cached, root)
        except OSError as exc:
            print(f"the compiled simulator is built but not cached ({exc})", file=sys.stderr)
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
        now, built = state(), ", ".join(compiled())
        if now == "compiled":
            print(f"the simulator runs compiled (mypyc): {built}")
        elif now == "stale":
            print(f"the simulator runs pure Python: its build is older than its sources ({built}); rebuild it with")
            print("python -m rolloutpool.sim.compiled ensure")
            return 1
        else:
            print("the simulator runs pure Python: nothing is compiled (python -m rolloutpool.sim.compiled ensure)")
    else:
        print("usage: python -m rolloutpool.sim.compiled [build|ensure|clean|status]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
