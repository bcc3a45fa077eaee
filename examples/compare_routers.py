"""Run the prime-rl and SkyRL example clients unchanged against vllm-router and against ours.

Starts engine-sim replicas, vllm-router (``--policy sticky_least_loaded
--request-id-headers x-session-id``, prime-rl's launch line) and ``rolloutpool router``
with the SAME flags, runs ``prime_rl_client.py`` and ``skyrl_client.py`` against each
(only the URL differs) and prints a markdown table: one row per check, one column per
router.

    python examples/compare_routers.py --engines 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent


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


def vllm_router_binary() -> str:
    found = shutil.which("vllm-router") or str(Path(sys.executable).with_name("vllm-router"))
    if not Path(found).exists():
        raise SystemExit("vllm-router is not installed (pip install vllm-router)")
    return found


def run_client(script: str, url: str) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, str(HERE / script), "--url", url], capture_output=True, text=True, timeout=600, check=False
    )
    try:
        return dict(json.loads(done.stdout)["results"])
    except (json.JSONDecodeError, KeyError):
        return {"(client crashed)": f"FAIL: {done.stderr.strip().splitlines()[-1:] or done.returncode}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=50.0)
    parser.add_argument("--logs", type=Path, default=Path("out/compare-routers"))
    args = parser.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    rolloutpool = [sys.executable, "-m", "rolloutpool.cli"]
    with contextlib.ExitStack() as stack:
        urls = []
        for i in range(args.engines):
            port = free_port()
            cmd = [
                *rolloutpool,
                "engine-sim",
                "--port",
                str(port),
                "--time-scale",
                str(args.time_scale),
                "--seed",
                str(i),
            ]
            stack.enter_context(process(cmd, args.logs / f"engine-{i}.log"))
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            wait_http(f"{url}/health")
        launch = ["--worker-urls", *urls, "--policy", "sticky_least_loaded", "--request-id-headers", "x-session-id"]
        launch += ["--intra-node-data-parallel-size", "1"]
        routers = {}
        port = free_port()
        prom = ["--prometheus-port", str(free_port())]
        cmd = [vllm_router_binary(), *launch, "--host", "127.0.0.1", "--port", str(port), *prom]
        stack.enter_context(process(cmd, args.logs / "vllm-router.log"))
        routers["vllm-router"] = f"http://127.0.0.1:{port}"
        port = free_port()
        cmd = [*rolloutpool, "router", *launch, "--host", "127.0.0.1", "--port", str(port), *prom]
        stack.enter_context(process(cmd, args.logs / "rolloutpool-router.log"))
        routers["rolloutpool router"] = f"http://127.0.0.1:{port}"
        for url in routers.values():
            wait_http(f"{url}/v1/models")
        table: dict[str, dict[str, str]] = {}
        for client in ("prime_rl_client.py", "skyrl_client.py"):
            for router, url in routers.items():
                for check, result in run_client(client, url).items():
                    table.setdefault(f"{client.split('_client')[0]}: {check}", {})[router] = result
    names = list(routers)
    print("| check | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for check, row in table.items():
        print(f"| {check} | " + " | ".join(row.get(n, "not run").replace("|", "/") for n in names) + " |")


if __name__ == "__main__":
    main()
