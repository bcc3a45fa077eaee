"""The optional mypyc build's bookkeeping: which modules run compiled, and which are older than their source."""

from __future__ import annotations

import importlib.machinery
import json
from pathlib import Path

import pytest

from rolloutpool.sim import compiled as comp
from rolloutpool.sim import runner

_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _tree(root: Path) -> None:
    for module in comp.MODULES:
        source = root.joinpath(*module.split(".")).with_suffix(".py")
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(f"# {module}\n")


def _compile(root: Path, module: str) -> Path:
    ext = Path(f"{root.joinpath(*module.split('.'))}{_SUFFIX}")
    ext.write_bytes(b"\x7fELF")
    return ext


def _stamp(root: Path, modules: tuple[str, ...]) -> None:
    digests = {m: comp._digest(comp._source(m, root)) for m in modules}
    (root / "rolloutpool" / comp.STAMP).write_text(json.dumps(digests))


def test_pure_tree_has_nothing_compiled_or_stale(tmp_path: Path) -> None:
    _tree(tmp_path)
    assert comp.compiled(tmp_path) == []
    assert comp.stale(tmp_path) == []


def test_a_build_is_current_until_a_source_changes(tmp_path: Path) -> None:
    _tree(tmp_path)
    for module in comp.MODULES:
        _compile(tmp_path, module)
    _stamp(tmp_path, comp.MODULES)
    assert comp.compiled(tmp_path) == list(comp.MODULES)
    assert comp.stale(tmp_path) == []
    comp._source("rolloutpool.engine.model.blocks", tmp_path).write_text("# edited\n")
    assert comp.stale(tmp_path) == ["rolloutpool.engine.model.blocks"]


def test_an_extension_no_build_recorded_is_stale(tmp_path: Path) -> None:
    _tree(tmp_path)
    _compile(tmp_path, "rolloutpool.sim.fleet")
    assert comp.stale(tmp_path) == ["rolloutpool.sim.fleet"]


def test_clean_removes_extensions_runtime_and_stamp(tmp_path: Path) -> None:
    _tree(tmp_path)
    exts = [_compile(tmp_path, m) for m in comp.MODULES]
    runtime = tmp_path / f"0123abcd__mypyc{_SUFFIX}"
    runtime.write_bytes(b"")
    _stamp(tmp_path, comp.MODULES)
    removed = comp.clean(tmp_path)
    assert set(removed) == {*exts, runtime, tmp_path / "rolloutpool" / comp.STAMP}
    assert comp.compiled(tmp_path) == []
    assert all(comp._source(m, tmp_path).exists() for m in comp.MODULES)


def test_run_jobs_refuses_stale_compiled_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "stale", lambda: ["rolloutpool.sim.fleet"])
    with pytest.raises(RuntimeError, match=r"rolloutpool\.sim\.fleet"):
        runner.run_jobs([], workers=1)


def test_engine_sim_refuses_stale_compiled_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    """engine-sim imports the engine model too: a stale compiled one is refused before anything starts (the
    conflicting flags after it make a missing check end in a usage error, not a server that never returns)."""
    from click.testing import CliRunner  # noqa: PLC0415

    from rolloutpool.cli.engine_sim import engine_sim  # noqa: PLC0415

    monkeypatch.setattr(comp, "stale", lambda: ["rolloutpool.engine.model.core"])
    result = CliRunner().invoke(engine_sim, ["--num-gpu-blocks", "4", "--kv-capacity-tokens", "64"])
    assert result.exit_code == 1, result.output
    assert "rolloutpool.engine.model.core" in result.output
    assert "rolloutpool.sim.compiled build" in result.output
