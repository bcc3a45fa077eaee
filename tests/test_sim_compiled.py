"""The mypyc build of the simulator: which modules run compiled, when a build is no longer current (then the sources
run), the per-machine cache ``ensure`` keeps, and that a compiled run equals the pure Python one."""

from __future__ import annotations

import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rolloutpool import native
from rolloutpool.sim import compiled as comp

_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _tree(tmp: Path, name: str = "clone") -> Path:
    """A checkout's shape: ``<name>/pyproject.toml`` and ``<name>/operator/`` with a source for every module."""
    root = tmp / name / "operator"
    for module in native.MODULES:
        path = native.source(module, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {module}\n")
    (root.parent / "pyproject.toml").write_text("[project]\n")
    return root


def _compile(root: Path, module: str) -> Path:
    ext = Path(f"{root.joinpath(*module.split('.'))}{_SUFFIX}")
    ext.write_bytes(b"\x7fELF")
    return ext


def _fake_build(root: Path) -> None:
    """What a build leaves: every extension, the runtime library and the stamp (``build`` without a compiler)."""
    for module in native.MODULES:
        _compile(root, module)
    (root / f"0123abcd__mypyc{_SUFFIX}").write_bytes(b"runtime")
    (root / "rolloutpool" / native.STAMP).write_text(json.dumps(comp._stamp_now(root)))


def test_pure_tree_has_nothing_compiled_or_stale(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert native.compiled(root) == []
    assert native.stale(root) == []


def test_a_build_is_current_until_a_source_changes(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _fake_build(root)
    assert native.compiled(root) == list(native.MODULES)
    assert native.stale(root) == []
    native.source("rolloutpool.engine.model.blocks", root).write_text("# edited\n")
    assert native.stale(root) == ["rolloutpool.engine.model.blocks"]


def test_a_module_they_import_changing_makes_the_whole_build_stale(tmp_path: Path) -> None:
    """Its types shape the compiled code (a field's type, a constant): no compiled module is trusted after it."""
    root = _tree(tmp_path)
    native.source("rolloutpool.sim.fleet", root).write_text(
        "from typing import TYPE_CHECKING\nfrom rolloutpool.routing import ledger\n"
        "if TYPE_CHECKING:\n    from rolloutpool.sim.config import FleetConfig\n"
    )
    (root / "rolloutpool" / "routing").mkdir()
    for module in ("rolloutpool.routing.ledger", "rolloutpool.sim.config"):
        native.source(module, root).write_text("from .limits import Limits\n")
    native.source("rolloutpool.sim.limits", root).write_text("x = 1\n")
    native.source("rolloutpool.routing.limits", root).write_text("x = 1\n")
    assert comp.depends(root) == [
        "rolloutpool/routing/ledger.py",
        "rolloutpool/routing/limits.py",
        "rolloutpool/sim/config.py",
        "rolloutpool/sim/limits.py",
    ]
    _fake_build(root)
    assert native.stale(root) == []
    native.source("rolloutpool.routing.limits", root).write_text("x = 2.0\n")  # two imports away
    assert native.stale(root) == list(native.MODULES)


def test_an_extension_no_build_recorded_is_stale(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _compile(root, "rolloutpool.sim.fleet")
    assert native.stale(root) == ["rolloutpool.sim.fleet"]


def test_clean_removes_extensions_runtime_and_stamp(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _fake_build(root)
    exts = [path for module in native.MODULES for path in native.extensions(module, root)]
    removed = comp.clean(root)
    assert set(removed) == {*exts, root / f"0123abcd__mypyc{_SUFFIX}", root / "rolloutpool" / native.STAMP}
    assert native.compiled(root) == []
    assert all(native.source(m, root).exists() for m in native.MODULES)


def test_nothing_is_built_or_removed_outside_a_source_checkout(tmp_path: Path) -> None:
    """Installed, the package's folder is site-packages, shared with others' files (mypy's own runtime library)."""
    site = tmp_path / "site-packages"
    for module in native.MODULES:
        native.source(module, site).parent.mkdir(parents=True, exist_ok=True)
        native.source(module, site).write_text("x = 1\n")
    other = site / f"6ec57f84__mypyc{_SUFFIX}"
    other.write_bytes(b"mypy's")
    for command in (comp.clean, comp.build, comp.ensure):
        with pytest.raises(comp.BuildError, match="not a RolloutPool source checkout"):
            command(site)
    assert other.exists()


def test_ensure_builds_once_then_reuses_the_machine_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second, cache = _tree(tmp_path, "clone-1"), _tree(tmp_path, "clone-2"), tmp_path / "cache"
    builds: list[Path] = []
    monkeypatch.setattr(comp, "build", lambda root: (builds.append(root), _fake_build(root)))
    assert comp.ensure(first, cache) == "built"
    assert comp.ensure(first, cache) == "current"
    assert comp.ensure(second, cache) == "cached"  # a fresh clone of the same sources: no second build
    assert builds == [first]
    assert native.compiled(second) == list(native.MODULES)
    assert native.stale(second) == []
    assert (second / f"0123abcd__mypyc{_SUFFIX}").read_bytes() == b"runtime"
    native.source("rolloutpool.sim.fleet", second).write_text("# edited\n")  # another key: built, not copied
    assert comp.ensure(second, cache) == "built"
    assert builds == [first, second]
    assert native.stale(second) == []
    assert len(list(cache.glob("mypyc-*/"))) == 2


def test_the_cache_keeps_the_newest_builds_and_their_locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, cache = _tree(tmp_path), tmp_path / "cache"
    monkeypatch.setattr(comp, "build", _fake_build)
    for edit in range(comp._KEEP + 2):  # each edit is another build
        native.source("rolloutpool.sim.fleet", root).write_text(f"# edit {edit}\n")
        assert comp.ensure(root, cache) == "built"
        newest = cache / f"mypyc-{comp.cache_key(root)}"
        os.utime(newest, (1e9 + edit, 1e9 + edit))  # distinct ages however fast the loop
    builds = sorted(path for path in cache.glob("mypyc-*") if path.is_dir())
    locks = sorted(path for path in cache.glob("mypyc-*.lock"))
    assert len(builds) == comp._KEEP
    assert newest in builds
    assert [lock.name.removesuffix(".lock") for lock in locks] == [build.name for build in builds]


def test_ensure_ignores_an_incomplete_cached_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, cache = _tree(tmp_path), tmp_path / "cache"
    broken = cache / f"mypyc-{comp.cache_key(root)}"
    (broken / "files").mkdir(parents=True)
    (broken / "manifest.json").write_text(json.dumps({"files": ["rolloutpool/sim/fleet.so"], "stamp": {}}))
    monkeypatch.setattr(comp, "build", _fake_build)
    assert comp.ensure(root, cache) == "built"
    assert native.stale(root) == []


def test_a_failed_build_leaves_pure_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _tree(tmp_path)

    def no_compiler(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        _compile(root, "rolloutpool.sim.fleet")  # half done when the compiler stops
        return subprocess.CompletedProcess(args, 1, stdout="building...\n", stderr="error: command 'gcc' failed\n")

    monkeypatch.setattr(comp.subprocess, "run", no_compiler)
    with pytest.raises(comp.BuildError, match="gcc' failed"):
        comp.ensure(root, tmp_path / "cache")
    assert native.compiled(root) == []
    assert not list((tmp_path / "cache").glob("mypyc-*/"))


def _import_fleet(root: Path) -> subprocess.CompletedProcess[str]:
    """Import ``rolloutpool.sim.fleet`` in a fresh process from ``root`` (the package's real ``__init__``)."""
    for name in ("__init__.py", "native.py"):
        shutil.copy(native.ROOT / "rolloutpool" / name, root / "rolloutpool" / name)
    script = "import rolloutpool.sim.fleet as f; from rolloutpool import native; print(f.__file__, native.state())"
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(  # our interpreter, a fixed script
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=root, timeout=60, check=False
    )


def test_a_process_imports_the_sources_while_the_build_is_not_current(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _fake_build(root)  # extensions that are not loadable: importing one fails loudly
    stamp = root / "rolloutpool" / native.STAMP
    current = stamp.read_text()
    native.source("rolloutpool.engine.model.cost", root).write_text("# edited\n")
    edited = _import_fleet(root)
    assert edited.returncode == 0, edited.stderr
    where, chosen = edited.stdout.split()
    assert where.endswith("fleet.py")  # every module from its source, not only the edited one
    assert chosen == "stale"  # what the process chose at import, as simulate's banner says it
    native.source("rolloutpool.engine.model.cost", root).write_text("# rolloutpool.engine.model.cost\n")
    stamp.write_text(current)
    assert native.stale(root) == []
    built = _import_fleet(root)  # current: Python takes the extension
    assert built.returncode != 0
    assert "fleet" in built.stderr


_RUNS = """
import dataclasses, json, sys
from rolloutpool import native
if sys.argv[1] == "pure":
    native.prefer_sources()
from rolloutpool.sim.config import FleetConfig
from rolloutpool.sim.fleet import simulate_policy
from rolloutpool.sim.workload import scenario
out = {"state": native.state()}
fleet = FleetConfig(scenario=scenario("agentic-grpo"), in_flight=96, replicas=4, num_gpu_blocks=16384,
                    duration_s=900.0, seed=0, start_spread_s=0.0)
for policy in ("sticky-least-loaded", "rolloutpool", "rolloutpool-adaptive", "thunderagent", "continuum"):
    result = dataclasses.asdict(simulate_policy(fleet, policy))
    result.pop("wall_s", None)
    out[policy] = result
print(json.dumps(out))
"""


def _close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def test_a_compiled_run_equals_the_pure_python_one() -> None:
    """Five policies (ours, under the law, a peer's turn scheduler, Continuum's pinning engine) on a pressured fleet:
    the same figures from the extensions as from the sources."""
    if native.compiled() != list(native.MODULES) or native.stale():
        if os.environ.get("CI") == "true":
            pytest.fail("CI builds the compiled simulator (bash .ci/dev setup): none current here")
        pytest.skip("no current compiled simulator here: python -m rolloutpool.sim.compiled ensure")
    env = {**os.environ, "PYTHONPATH": str(native.ROOT)}
    runs = {}
    for kind in ("pure", "compiled"):
        done = subprocess.run(  # our interpreter, our script
            [sys.executable, "-c", _RUNS, kind], capture_output=True, text=True, env=env, timeout=600, check=True
        )
        runs[kind] = json.loads(done.stdout)
    assert runs["pure"].pop("state") == "pure"
    assert runs["compiled"].pop("state") == "compiled"
    for policy, pure in runs["pure"].items():
        assert pure["generated_tokens"] > 0
        assert pure["reprefilled_tokens"] > 0 or policy != "sticky-least-loaded"  # the fleet is pressured
        assert _close(pure, runs["compiled"][policy]), policy
