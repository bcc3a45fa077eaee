"""The import-linter contracts catch what they promise: a planted forbidden import of each kind breaks them.

Each case copies the package to a temporary folder, appends one import to one module (or adds a
helper module that a pure one imports, for the indirect cases), runs ``lint-imports`` on the copy
with the project's own ``[tool.importlinter]`` section, and expects the named contract to break.
The unplanted copy keeps every contract.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "operator" / "rolloutpool"
LINT = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))

PURE_LIB = "Pure modules import no I/O library, directly or indirectly"
PURE_OURS = "Pure modules import no I/O module of ours, directly or indirectly"
ENGINE = "The engine model never imports the engine server"
KOPF = "kopf only in handlers/ and the operator command"
KUBE = "The kubernetes client only in kube/ and the dev kubelet"
HELPER = "planted_helper.py"  # a module in no list, so a pure module reaches I/O only through it

# (case id, {relative path: text appended (or the whole new file)}, contract that must break)
CASES: list[tuple[str, dict[str, str], str]] = [
    # a pure module imports one of our I/O modules directly
    *(
        (f"pure-imports-{target}", {"reconcile/caps.py": f"import {target}\n"}, PURE_OURS)
        for target in (
            "rolloutpool.engine.server.app",
            "rolloutpool.engine.server.runtime",
            "rolloutpool.router.app",
            "rolloutpool.kube.children",
            "rolloutpool.metrics.prom",
            "rolloutpool.handlers.passes",
            "rolloutpool.dev.localcluster.cluster",
            "rolloutpool.dev.bench.runner",
            "rolloutpool.dev.stack",
            "rolloutpool.dev.demo",
            "rolloutpool.dev.kubelet.runtime",
            "rolloutpool.cli",
            "rolloutpool.cli.router",
        )
    ),
    # ... or through a module in neither list
    (
        "pure-reaches-router-indirectly",
        {HELPER: "import rolloutpool.router.proxy\n", "routing/table.py": "import rolloutpool.planted_helper\n"},
        PURE_OURS,
    ),
    ("pure-imports-aiohttp", {"autoscale/law.py": "import aiohttp\n"}, PURE_LIB),
    (
        "pure-reaches-subprocess-indirectly",
        {HELPER: "import subprocess\n", "capacity.py": "import rolloutpool.planted_helper\n"},
        PURE_LIB,
    ),
    ("engine-model-imports-server", {"engine/model/blocks.py": "import rolloutpool.engine.server.protocol\n"}, ENGINE),
    (
        "engine-model-imports-a-new-server-module",
        {"engine/model/core.py": "import rolloutpool.engine.server.shapes\n"},
        ENGINE,
    ),
    ("kopf-in-router", {"router/app.py": "import kopf\n"}, KOPF),
    ("kopf-in-kube", {"kube/children.py": "import kopf\n"}, KOPF),
    ("kubernetes-in-metrics", {"metrics/prom.py": "import kubernetes\n"}, KUBE),
    ("kubernetes-in-handlers", {"handlers/passes.py": "from kubernetes import client\n"}, KUBE),
    ("kubernetes-in-the-dev-cluster-outside-the-kubelet", {"dev/localcluster/cluster.py": "import kubernetes\n"}, KUBE),
    ("kubernetes-in-the-dev-stack", {"dev/stack.py": "import kubernetes\n"}, KUBE),
    ("kopf-in-a-cli-command", {"cli/router_fleet.py": "import kopf\n"}, KOPF),
    ("image-recipe-imports-subprocess", {"dev/image/recipe.py": "import subprocess\n"}, PURE_LIB),
    (
        "kubelet-container-plan-imports-the-image-build",
        {"dev/kubelet/container.py": "import rolloutpool.dev.image.build\n"},
        PURE_OURS,
    ),
]


def _copy(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    shutil.copytree(PACKAGE, src / "rolloutpool", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return src


def _plant(src: Path, plants: dict[str, str]) -> None:
    for relative, text in plants.items():
        path = src / "rolloutpool" / relative
        if relative == HELPER:
            path.write_text(f'"""Planted by the test."""\n\n{text}')
        else:
            assert path.is_file(), path
            path.write_text(path.read_text() + f"\n{text}")


def _lint(tmp_path: Path, src: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(
        [LINT, str(tmp_path / "pyproject.toml"), "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _verdicts(output: str) -> dict[str, str]:
    verdicts: dict[str, str] = {}
    for line in output.splitlines():
        for word in ("KEPT", "BROKEN"):
            if f" {word}" in line:
                verdicts[line.split(f" {word}")[0].strip()] = word
    return verdicts


def _run_case(root: Path, plants: dict[str, str]) -> subprocess.CompletedProcess[str]:
    root.mkdir()
    src = _copy(root)
    _plant(src, plants)
    return _lint(root, src)


@pytest.fixture(scope="module")
def linted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every case (and the unplanted copy, id ``unplanted``) linted side by side, one process per core."""
    base = tmp_path_factory.mktemp("contracts")
    cases = [("unplanted", {}), *((case_id, plants) for case_id, plants, _ in CASES)]
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        futures = {case_id: pool.submit(_run_case, base / case_id, plants) for case_id, plants in cases}
        return {case_id: future.result() for case_id, future in futures.items()}


def test_the_unplanted_copy_keeps_every_contract(linted: dict[str, subprocess.CompletedProcess[str]]) -> None:
    result = linted["unplanted"]
    verdicts = _verdicts(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert {PURE_LIB, PURE_OURS, ENGINE, KOPF, KUBE} <= set(verdicts), verdicts
    assert set(verdicts.values()) == {"KEPT"}


@pytest.mark.parametrize(("case_id", "plants", "contract"), CASES, ids=[i for i, _, _ in CASES])
def test_a_planted_forbidden_import_breaks_its_contract(
    linted: dict[str, subprocess.CompletedProcess[str]], case_id: str, plants: dict[str, str], contract: str
) -> None:
    result = linted[case_id]
    assert result.returncode != 0, result.stdout
    assert _verdicts(result.stdout).get(contract) == "BROKEN", result.stdout + result.stderr
    importer = next(path for path in plants if path != HELPER).removesuffix(".py").replace("/", ".")
    assert f"rolloutpool.{importer} -> " in result.stdout  # the report shows the planted import
