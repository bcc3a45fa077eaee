"""The tiny local model and a real vLLM server process for tests, conformance and the kubelet.

:func:`ensure_tiny_model` makes the model once per machine next to the vLLM venv
(see :mod:`rolloutpool.dev.localcluster.vllm_tiny_model`); :class:`VllmServer` starts
``vllm.entrypoints.openai.api_server`` from that venv with the flags DESIGN section 5
lists (block size 32, prompt tokens details on) and waits for ``/health``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from rolloutpool.dev.localcluster.vllm_env import VllmEnv, ensure_vllm, vllm_env
from rolloutpool.dev.processes import start_group, stop_group

__all__ = [
    "MODEL_RECIPE",
    "SERVED_MODEL",
    "VllmServer",
    "VllmServerConfig",
    "ensure_tiny_model",
    "server_command",
    "server_environment",
]

MODEL_RECIPE = "m1"
"""Revision of the tiny model recipe (part of its folder name)."""

SERVED_MODEL = "tiny-llama"
"""``--served-model-name`` of the tiny model."""

_BUILDER = Path(__file__).with_name("vllm_tiny_model.py")
Log = Callable[[str], None]


def ensure_tiny_model(env: VllmEnv, *, log: Log = print) -> Path:
    """The tiny model's folder, made once with the venv's python (idempotent)."""
    target = env.root / "models" / f"tiny-llama-{MODEL_RECIPE}"
    stamp = target / "rolloutpool-tiny-model.json"
    if stamp.is_file():
        return target
    if not env.ready():
        raise RuntimeError(
            f"vLLM is not installed at {env.venv}: run 'python -m rolloutpool.dev.localcluster.vllm_env'"
        )
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    log(f"Making the tiny model in {target}")
    started = time.monotonic()
    proc = subprocess.run(
        [str(env.python), str(_BUILDER), str(tmp)], capture_output=True, text=True, check=False, env=_offline_env()
    )
    if proc.returncode != 0:
        raise RuntimeError(f"making the tiny model failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    log(f"Made the tiny model in {time.monotonic() - started:.0f}s")
    return target


def _offline_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the project's modules must not shadow the venv's packages
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_HOST_IP="127.0.0.1",
        VLLM_TARGET_DEVICE="cpu",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


@dataclass(frozen=True)
class VllmServerConfig:
    """Flags of one tiny vLLM server."""

    port: int
    host: str = "127.0.0.1"
    block_size: int = 32
    num_gpu_blocks: int | None = None
    """``--num-gpu-blocks-override`` (a small cache for eviction tests)."""
    kv_cache_gib: int = 1
    max_model_len: int = 2048
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 2048
    prompt_tokens_details: bool = True
    prefix_caching: bool = True
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    extra_env: tuple[tuple[str, str], ...] = ()
    """More environment, e.g. ``("VLLM_SERVER_DEV_MODE", "1")`` for ``/reset_prefix_cache``."""


def server_command(python: Path, model: Path, cfg: VllmServerConfig) -> list[str]:
    """The argv that serves ``model`` with ``cfg`` (pure)."""
    cmd = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        SERVED_MODEL,
        "--host",
        cfg.host,
        "--port",
        str(cfg.port),
        "--max-model-len",
        str(cfg.max_model_len),
        "--dtype",
        "bfloat16",
        "--max-num-seqs",
        str(cfg.max_num_seqs),
        "--max-num-batched-tokens",
        str(cfg.max_num_batched_tokens),
        "--block-size",
        str(cfg.block_size),
    ]
    if cfg.prompt_tokens_details:
        cmd.append("--enable-prompt-tokens-details")
    if not cfg.prefix_caching:
        cmd.append("--no-enable-prefix-caching")
    if cfg.num_gpu_blocks is not None:
        cmd += ["--num-gpu-blocks-override", str(cfg.num_gpu_blocks)]
    return cmd + list(cfg.extra_args)


def server_environment(cfg: VllmServerConfig) -> dict[str, str]:
    """The environment a tiny vLLM server runs with (offline, CPU KV cache size)."""
    env = _offline_env()
    env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.kv_cache_gib)
    env.update(cfg.extra_env)
    return env


class VllmServer:
    """A real vLLM process serving the tiny model; a context manager that waits for ``/health``."""

    def __init__(
        self, cfg: VllmServerConfig, *, env: VllmEnv | None = None, log_path: Path | None = None, log: Log = print
    ) -> None:
        self.cfg = cfg
        self.env = env or vllm_env()
        self.log_path = log_path or Path(f"/tmp/rolloutpool-vllm-{cfg.port}.log")  # noqa: S108 - a dev log file
        self._log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.cfg.host}:{self.cfg.port}"

    def start(self, *, timeout_s: float = 420.0) -> None:
        """Start the process and block until ``/health`` answers 200 (or raise, with the log's tail)."""
        ensure_vllm(log=self._log)
        model = ensure_tiny_model(self.env, log=self._log)
        cmd = server_command(self.env.python, model, self.cfg)
        started = time.monotonic()
        self.proc = start_group(cmd, log=self.log_path, env=server_environment(self.cfg))
        while time.monotonic() - started < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {self.proc.returncode} during start-up:\n{self._tail()}")
            if _health(self.url):
                self._log(f"Started vLLM url={self.url} in {time.monotonic() - started:.0f}s")
                return
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"vLLM did not answer /health within {timeout_s:.0f}s:\n{self._tail()}")

    def stop(self) -> None:
        """Stop the whole process group (API server, engine core, workers)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        stop_group(proc.pid, grace=30.0, popen=proc)

    def _tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _health(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:  # noqa: S310 - loopback URL
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def main(argv: Sequence[str] | None = None) -> int:  # pragma: no cover - manual entry point
    """``ensure``: install vLLM and make the tiny model (what ``.ci/dev`` runs); ``serve [PORT]``: serve it."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m rolloutpool.dev.localcluster.vllm_model")
    parser.add_argument("command", choices=("ensure", "serve"))
    parser.add_argument("port", nargs="?", type=int, default=8000)
    parser.add_argument("--num-gpu-blocks", type=int, default=None, help="--num-gpu-blocks-override")
    args = parser.parse_args(argv)

    def log(msg: str) -> None:
        print(f"[vllm {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    started = time.monotonic()
    if args.command == "ensure":
        try:
            env = ensure_vllm(log=log)
            model = ensure_tiny_model(env, log=log)
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            log(f"Failed to set up vLLM: {exc}")
            return 1
        log(f"vLLM ready python={env.python} model={model} (checked in {time.monotonic() - started:.2f}s)")
        return 0
    server = VllmServer(VllmServerConfig(port=args.port, num_gpu_blocks=args.num_gpu_blocks), log=log)

    def terminate(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, terminate)
    with server:
        log(f"Serving {SERVED_MODEL} at {server.url} (log {server.log_path})")
        with contextlib.suppress(KeyboardInterrupt):
            while server.proc is not None and server.proc.poll() is None:
                time.sleep(1)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
