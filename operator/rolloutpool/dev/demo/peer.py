"""The demo's other side: vllm-router ``--policy sticky_least_loaded`` over engine-sims of its own.

The engines are started as plain processes with exactly the flags the operator gives the
pool's engine pods (the same pod builder, only host and port replaced), so both sides serve
the same load on the same simulated hardware.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.dev.bench.peers import RouterLaunch, vllm_router_argv
from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.net import LOOPBACK, free_port
from rolloutpool.reconcile.children import engine_pod

__all__ = ["PEER", "StickyPeer", "find_vllm_router", "peer_engine_args"]

PEER = "vllm-sticky-least-loaded"
"""The bench's name of the peer configuration (``rolloutpool.dev.bench.peers``)."""


def find_vllm_router() -> str:
    """vllm-router on PATH or next to this Python (a venv not activated); ``FileNotFoundError`` if absent."""
    found = shutil.which("vllm-router") or shutil.which("vllm-router", path=str(Path(sys.executable).parent))
    if found is None:
        raise FileNotFoundError("vllm-router not found (`pip install vllm-router`; .ci/dev installs it)")
    return found


def peer_engine_args(pool: dict[str, Any], index: int, *, port: int) -> list[str]:
    """The arguments of the pool's engine pod ``index``, listening on ``LOOPBACK:port`` instead (pure).

    Without the pod's KV-event publisher: vllm-router reads none, and every peer engine would bind the same port.
    """
    spec = RolloutPoolSpec.model_validate(pool["spec"])
    # the pod builder names its owner; these processes have none, so any uid does
    owned = {**pool, "metadata": {"namespace": "default", "uid": "none", **pool["metadata"]}}
    pod = engine_pod(pool=owned, spec=spec, index=index, default_image="unused")
    args: list[str] = next(c for c in pod["spec"]["containers"] if c["name"] == "engine")["args"]
    kept = [a for a in args if not a.startswith(("--host=", "--port=", "--kv-events-config"))]
    return [f"--host={LOOPBACK}", f"--port={port}", *kept]


class StickyPeer:
    """Engine-sims like the pool's and vllm-router's sticky least-loaded in front; stopped on exit."""

    def __init__(self, pool: dict[str, Any], log_dir: Path, *, queue_timeout_s: float = 30.0) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.pool = pool
        self.procs = ProcessSet(log_dir)
        self.queue_timeout_s = queue_timeout_s
        self.engine_urls: list[str] = []
        self.router_url = ""

    def __enter__(self) -> StickyPeer:
        try:
            spec = self.pool["spec"]
            for i in range(int(spec["replicas"])):
                port = free_port()
                url = f"http://{LOOPBACK}:{port}"
                argv = rolloutpool_argv("engine-sim", *peer_engine_args(self.pool, i, port=port))
                self.procs.start(f"engine-{i}", argv, ready_url=f"{url}/health")
                self.engine_urls.append(url)
            engine = spec["engine"]
            launch = RouterLaunch(
                replica_urls=tuple(self.engine_urls),
                port=free_port(),
                kv_capacity_tokens=int(engine["kvCapacityTokens"]),
                max_model_len=int(engine["maxModelLen"]),
                time_scale=float(engine["simulator"]["timeScale"]),
                scrape_interval_s=1.0,
                queue_timeout_s=self.queue_timeout_s,
                prometheus_port=free_port(),
            )
            self.router_url = f"http://{LOOPBACK}:{launch.port}"
            argv = vllm_router_argv(PEER, launch, binary=find_vllm_router())
            self.procs.start("vllm-router", argv, ready_url=f"{self.router_url}/health")
        except BaseException:
            self.procs.stop_all()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.procs.stop_all()
