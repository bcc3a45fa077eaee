"""Run the four framework-style clients, unchanged, against vllm-router and against ours; print a table.

For each router it starts fresh engine-sim replicas (a small KV pool: ``--num-gpu-blocks``),
then the router on a free port, and runs ``art_style.py``, ``areal_style.py``,
``skyrl_style.py`` and ``prime_rl_style.py`` one after the other with only ``--url``
pointing at it. The routers:

- ``rolloutpool router``: vllm-router's flags as prime-rl launches it
  (``--policy sticky_least_loaded --request-id-headers x-session-id``) plus ``--cap``
  live sessions per replica, so every client runs with more trajectories than the fleet
  takes at once: the rest wait in the admission queue (at cap);
- ``vllm-router sticky_least_loaded``: the same line (prime-rl's launch);
- ``vllm-router cache_aware``: its prefix-tree policy, the one that keeps sessionless
  clients on their replica.

Besides each client's own summary (lost turns, affinity misses, logprobs present) the
table shows how the engines shared the requests (``vllm:request_success_total`` read
from each engine before and after the client), which a client of vllm-router cannot see.

    python examples/clients/run_all.py
    python examples/clients/run_all.py --routers ours --json out/clients.json

Exit 0 when every client passed against every router it ran against, else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CLIENTS = ("art_style.py", "areal_style.py", "skyrl_style.py", "prime_rl_style.py")
ROUTERS = {
    "ours": "rolloutpool router",
    "vllm-sticky": "vllm-router sticky_least_loaded",
    "vllm-cache-aware": "vllm-router cache_aware",
}
_SUCCESS = re.compile(r"^vllm:request_success_total\{[^}]*\}\s+(\S+)$", re.MULTILINE)
_QUEUED = re.compile(r"^rolloutpool_router_queue_wait_seconds_count\{[^}]*\}\s+(\S+)$", re.MULTILINE)


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):  # noqa: S310 - a loopback URL we built
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not come up")


def metric_sum(url: str, pattern: re.Pattern[str]) -> float:
    """The sum of every series of one counter on ``url``'s ``/metrics``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:  # noqa: S310 - a loopback URL we built
        text = resp.read().decode()
    return sum(float(v) for v in pattern.findall(text))


@contextlib.contextmanager
def process(cmd: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def vllm_router_binary() -> str | None:
    found = shutil.which("vllm-router") or str(Path(sys.executable).with_name("vllm-router"))
    return found if Path(found).exists() else None


def start_engines(stack: contextlib.ExitStack, args: argparse.Namespace, logs: Path) -> list[str]:
    urls = []
    for i in range(args.engines):
        port = free_port()
        cmd = [sys.executable, "-m", "rolloutpool.cli", "engine-sim", "--port", str(port)]
        cmd += ["--time-scale", str(args.time_scale), "--seed", str(i), "--max-model-len", str(args.max_model_len)]
        cmd += ["--num-gpu-blocks", str(args.num_gpu_blocks)]
        stack.enter_context(process(cmd, logs / f"engine-{i}.log"))
        urls.append(f"http://127.0.0.1:{port}")
    for url in urls:
        wait_http(f"{url}/health")
    return urls


def start_router(stack: contextlib.ExitStack, which: str, urls: list[str], args: argparse.Namespace, logs: Path) -> str:
    port = free_port()
    policy = "cache_aware" if which == "vllm-cache-aware" else "sticky_least_loaded"
    launch = ["--worker-urls", *urls, "--policy", policy, "--request-id-headers", "x-session-id"]
    launch += ["--intra-node-data-parallel-size", "1", "--host", "127.0.0.1", "--port", str(port)]
    launch += ["--prometheus-port", str(free_port())]
    if which == "ours":
        cmd = [sys.executable, "-m", "rolloutpool.cli", "router", *launch, "--cap", str(args.cap)]
        cmd += ["--queue-timeout", str(args.queue_timeout)]
    else:
        binary = vllm_router_binary()
        if binary is None:
            raise SystemExit("vllm-router is not installed (pip install vllm-router), or pass --routers ours")
        cmd = [binary, *launch]
    stack.enter_context(process(cmd, logs / f"router-{which}.log"))
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/v1/models")
    return url


def run_client(script: str, url: str, engines: list[str], timeout_s: float, *, ours: bool) -> dict[str, Any]:
    """Run one client against ``url``; its summary, plus what the engines (and our router) counted meanwhile."""
    before = [metric_sum(e, _SUCCESS) for e in engines]
    queued_before = metric_sum(url, _QUEUED) if ours else 0.0
    done = subprocess.run(
        [sys.executable, str(HERE / script), "--url", url],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    after = [metric_sum(e, _SUCCESS) for e in engines]
    try:
        summary: dict[str, Any] = json.loads(done.stdout)
    except json.JSONDecodeError:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        summary = {"crashed": tail[0]}
    summary["exit"] = done.returncode
    summary["engine_spread"] = "/".join(f"{b - a:.0f}" for a, b in zip(before, after, strict=True))
    # our router counts every new session that waited for a place (admitted or timed out): the fleet was at cap
    summary["waited_at_cap"] = int(metric_sum(url, _QUEUED) - queued_before) if ours else None
    return summary


def _misses(summary: dict[str, Any]) -> str:
    evicted = f" (+{summary['evicted']} evicted)" if summary.get("evicted") else ""
    return f"{summary['affinity_misses']}{evicted}"


def _logprobs(summary: dict[str, Any]) -> str:
    if summary.get("verdicts", {}).get("logprobs present") == "ok":
        return "yes"
    return f"no ({summary['turns_without_logprobs']} turns)"


def _waited(summary: dict[str, Any]) -> str:
    waited = summary.get("waited_at_cap")
    return "no cap" if waited is None else str(waited)


CELLS: dict[str, Callable[[dict[str, Any]], str]] = {
    "sessions that waited at cap": _waited,
    "lost turns": lambda s: f"{s['lost_turns']} of {s['planned_turns']}",
    "affinity misses": _misses,
    "logprobs present": _logprobs,
    "requests per engine": lambda s: str(s["engine_spread"]),
    "slowest detokenize": lambda s: f"{s.get('slowest_detokenize_s', '-')} s",
    "exit": lambda s: "pass" if s["exit"] == 0 else f"FAIL (exit {s['exit']})",
}


def cell(summary: dict[str, Any], row: str) -> str:
    if "crashed" in summary:
        return f"crashed: {summary['crashed']}"[:80]
    return CELLS[row](summary)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--routers", nargs="+", choices=list(ROUTERS), default=list(ROUTERS))
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--cap", type=int, default=2, help="Our router's live sessions per replica.")
    parser.add_argument("--queue-timeout", type=float, default=60.0, help="Our router's admission wait.")
    parser.add_argument("--num-gpu-blocks", type=int, default=2048, help="Each engine's KV pool (16-token blocks).")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--time-scale", type=float, default=50.0)
    parser.add_argument("--client-timeout", type=float, default=300.0)
    parser.add_argument("--logs", type=Path, default=Path("out/clients"))
    parser.add_argument("--json", type=Path, default=None, help="Also write every summary here.")
    args = parser.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for which in args.routers:
        with contextlib.ExitStack() as stack:
            logs = args.logs / which
            logs.mkdir(parents=True, exist_ok=True)
            engines = start_engines(stack, args, logs)
            url = start_router(stack, which, engines, args, logs)
            for client in CLIENTS:
                summary = run_client(client, url, engines, args.client_timeout, ours=which == "ours")
                results.setdefault(client, {})[which] = summary
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    names = [ROUTERS[w] for w in args.routers]
    print(f"engines: {args.engines} engine-sim, {args.num_gpu_blocks} KV blocks each; our router: --cap {args.cap}")
    print("| client: check | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    rows = ["sessions that waited at cap", "lost turns", "affinity misses", "logprobs present", "requests per engine"]
    for client, by_router in results.items():
        name = client.removesuffix(".py")
        extra = ["slowest detokenize"] if client == "skyrl_style.py" else []
        for row in [*rows, *extra, "exit"]:
            print(f"| {name}: {row} | " + " | ".join(cell(by_router[w], row) for w in args.routers) + " |")
    passed = all(s.get("exit") == 0 for by_router in results.values() for s in by_router.values())
    raise SystemExit(0 if passed else 1)


if __name__ == "__main__":
    main()
