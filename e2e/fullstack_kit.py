"""Helpers of the full-stack e2e tests (this module holds no tests).

The stack is :class:`rolloutpool.dev.stack.LocalStack`: the real control plane, the process
kubelet (pods of our image as local processes, each on its own 127.0.0.x), Prometheus and
``helm install`` of the chart. These helpers read it the way a user would (``kubectl``,
the router's ``/metrics``) plus what only this machine allows: the processes of a pod,
found through ``/proc`` by the pod directory the kubelet gives them as ``HOME``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from rolloutpool.dev.bench.client import ClientConfig, ClientResult, run_client
from rolloutpool.dev.stack import LocalStack
from rolloutpool.sim.workload import Lognormal, scenario

__all__ = [
    "LoadRun",
    "RpWatch",
    "acquire",
    "chat_turn",
    "condition",
    "diagnosis",
    "engine_pods",
    "finished_sessions",
    "http_json",
    "isolated_stack",
    "jwt_subject",
    "live_by_replica",
    "pod_dirs",
    "pod_pids",
    "poll_samples",
    "processes_under",
    "quarantined_by",
    "replica_metric",
    "replica_of",
    "restarts",
    "router_metrics",
    "router_pod",
    "sigkill_pod",
]

Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def isolated_stack(directory: Path) -> LocalStack:
    """A ``LocalStack`` (not started) whose pods live on a random 127.a.b.0/24 of their own."""
    return LocalStack(directory, log=lambda _msg: None)


def diagnosis(stack: LocalStack, *, chars: int = 600) -> str:
    """The pods and the tail of every pod's log, for a failure message."""
    pods = stack.cluster.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
    tails = [
        f"== {path.relative_to(stack.directory)}\n{path.read_text(errors='replace')[-chars:]}" for path in stack.logs()
    ]
    return "\n".join([pods, *[t for t in tails if "/pods/" in t]])


def condition(pool: dict[str, Any], kind: str) -> dict[str, Any]:
    """One condition of a pool object, or ``{}``."""
    for c in (pool.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def quarantined_by(pool: dict[str, Any]) -> dict[str, list[str]]:
    """Who quarantines each replica per the pool's status: replica -> ``operator`` and/or ``router``.

    ``operator`` is ``quarantined`` (what the routers obey: the control law or a drain); ``router`` is
    ``routerQuarantined`` (a router's own fast loop, as the routers report it).
    """
    held: dict[str, list[str]] = {}
    for entry in (pool.get("status") or {}).get("replicaStatus") or []:
        by = [who for who, key in (("operator", "quarantined"), ("router", "routerQuarantined")) if entry.get(key)]
        if by:
            held[entry["name"]] = by
    return held


def engine_pods(stack: LocalStack, pool: str, *, namespace: str = "default") -> dict[str, dict[str, Any]]:
    """The pool's engine pods by name (pods being deleted included)."""
    items = stack.get_json(
        "pods", "-n", namespace, "-l", f"rolloutpool.io/pool={pool},rolloutpool.io/component=engine"
    )["items"]
    return {p["metadata"]["name"]: p for p in items}


def router_pod(stack: LocalStack, pool: str, *, namespace: str = "default") -> list[dict[str, Any]]:
    """The pool's router pods (pods being deleted included)."""
    selector = f"rolloutpool.io/pool={pool},rolloutpool.io/component=router"
    items: list[dict[str, Any]] = stack.get_json("pods", "-n", namespace, "-l", selector)["items"]
    return items


def restarts(pod: dict[str, Any]) -> int:
    """Restart count of a pod's (first) container."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return int(statuses[0].get("restartCount") or 0)


def pod_dirs(stack: LocalStack, pod: dict[str, Any]) -> Path:
    """The kubelet's directory of one pod: ``<stack>/cluster/kubelet/pods/<ns>_<name>_<uid8>``."""
    meta = pod["metadata"]
    return stack.directory / "cluster" / "kubelet" / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"


def processes_under(marker: str) -> list[int]:
    """Processes whose environment or command line mentions ``marker`` (pods name their directory in HOME)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if any(marker.encode() in Path(f"/proc/{entry}/{part}").read_bytes() for part in ("environ", "cmdline")):
                found.append(int(entry))
        except OSError:
            continue
    return found


def pod_pids(stack: LocalStack, pod: dict[str, Any]) -> list[int]:
    """The processes of a pod's containers: those whose ``HOME`` is the pod's directory."""
    home = f"HOME={pod_dirs(stack, pod)}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if home in Path(f"/proc/{entry}/environ").read_bytes() + b"\0":
                found.append(int(entry))
        except OSError:
            continue
    return found


def sigkill_pod(stack: LocalStack, pod: dict[str, Any]) -> list[int]:
    """SIGKILL every process of a pod's containers (a crash, not a deletion); returns their pids."""
    pids = pod_pids(stack, pod)
    if not pids:
        raise AssertionError(f"no process of pod {pod['metadata']['name']} found under {pod_dirs(stack, pod)}")
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def http_json(
    method: str, url: str, body: dict[str, Any] | None = None, *, timeout: float = 10.0, session: str | None = None
) -> Any:
    """One JSON request (``session`` as ``X-Session-ID``); HTTP errors raise ``urllib.error.HTTPError``."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} | ({"X-Session-ID": session} if session else {})
    request = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310 - our http URL
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - our own http URL
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as err:
        err.close()  # its response holds the socket: close it now, not when the GC finds it (ResourceWarning)
        raise


def router_metrics(url: str, *, timeout: float = 5.0) -> Sample:
    """The router's ``/metrics`` as ``{(sample name, sorted labels): value}``."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout) as response:  # noqa: S310 - our own http URL
        text = response.read().decode()
    samples: Sample = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return samples


class RpWatch:
    """``kubectl get rp -w`` (``wide``: ``-o wide``) in the background, its output to a file; :meth:`stop` always
    ends it."""

    def __init__(self, stack: LocalStack, out: Path, *, namespace: str = "default", wide: bool = False) -> None:
        self.out = out
        with out.open("wb") as sink:
            self.proc = subprocess.Popen(
                [str(stack.cluster.binaries.kubectl), "get", "rp", "-n", namespace, "-w", *(["-o", "wide"] * wide)],
                env=stack.cluster.env(),
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def stop(self) -> str:
        """End the watch (by its own pid) and return what it printed."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.out.read_text()

    def __enter__(self) -> RpWatch:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


class LoadRun:
    """The bench client (agentic tool-chat rollouts) against a URL, on a thread with its own event loop.

    ``stop()`` cancels it early (the client releases what it holds; no result then);
    ``join()`` waits for the natural end of ``seconds`` and returns the client's result.
    """

    def __init__(self, url: str, *, in_flight: int, seconds: float, time_scale: float, prefix: str) -> None:
        chat = scenario("tool-chat").with_(max_model_len=8192, turns=Lognormal(8, 16))
        self.config = ClientConfig(
            base_url=url,
            scenario=chat,
            seed=0,
            in_flight=in_flight,
            duration_s=seconds,
            time_scale=time_scale,
            session_prefix=prefix,
        )
        self.started = time.monotonic()
        self.result: ClientResult | None = None
        self.error: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._task: asyncio.Task[ClientResult] | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"load-{prefix}", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._task = self._loop.create_task(run_client(self.config))
            self._ready.set()
            self.result = self._loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except BaseException as exc:  # handed to the test by join()
            self.error = exc
        finally:
            self._ready.set()
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()

    def running(self) -> bool:
        """Whether the load still runs."""
        return self._thread.is_alive()

    def stop(self, timeout: float = 60.0) -> None:
        """Cancel the load and wait until the client has let go of everything."""
        if self._thread.is_alive() and self._task is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError("the load did not stop")

    def join(self, timeout: float) -> ClientResult:
        """Wait for the end of the run and return its result."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.stop()
            raise AssertionError(f"the load ran past {timeout:g}s")
        if self.error is not None:
            raise self.error
        if self.result is None:
            raise AssertionError("the load was cancelled")
        return self.result


def poll_samples(check: Callable[[], Any], *, until: Callable[[], bool], timeout: float, interval: float) -> list[Any]:
    """``check()`` every ``interval`` until ``until()`` holds; every value seen (errors skipped)."""
    deadline = time.monotonic() + timeout
    seen: list[Any] = []
    while not until():
        if time.monotonic() > deadline:
            raise TimeoutError(f"still waiting after {timeout:.0f}s; samples: {seen[-5:]}")
        with contextlib.suppress(OSError, ValueError):
            seen.append(check())
        time.sleep(interval)
    return seen


def live_by_replica(samples: Sample) -> dict[str, float]:
    """``rolloutpool_router_live_sessions`` per replica."""
    return {
        dict(labels)["replica"]: v
        for (name, labels), v in samples.items()
        if name == "rolloutpool_router_live_sessions"
    }


def jwt_subject(kubeconfig: Path) -> str:
    """The subject of the token in a kubeconfig (``system:serviceaccount:<ns>:<name>``)."""
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    payload = token.split(".")[1]
    return str(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["sub"])


def replica_metric(samples: Sample, name: str, replica: str) -> float:
    """A router sample of one replica, summed over its other labels."""
    return sum(v for (n, labels), v in samples.items() if n == name and ("replica", replica) in labels)


def finished_sessions(samples: Sample) -> float:
    """Sessions the clients finished so far (``POST /finish_session``)."""
    name = "rolloutpool_router_releases_total"
    return sum(v for (n, labels), v in samples.items() if n == name and ("how", "finish_session") in labels)


def replica_of(url: str, sid: str) -> str | None:
    """The replica a session lives on, per the router; None when it is not live."""
    try:
        return str(http_json("GET", f"{url}/v1/sessions/{sid}")["replica"]["name"])
    except urllib.error.HTTPError:
        return None


def acquire(url: str, ids: list[str]) -> dict[str, tuple[str, bool]]:
    """``POST /v1/sessions`` for each id: where it lives and whether it was created now."""
    answers = [http_json("POST", f"{url}/v1/sessions", {"session_id": sid}) for sid in ids]
    return {a["session_id"]: (a["replica"]["name"], a["created"]) for a in answers}


def chat_turn(url: str, ids: list[str]) -> None:
    """One chat turn of each session through the router (refreshes its idle clock and the router's snapshot)."""
    for sid in ids:
        body = {"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": f"turn of {sid}"}], "max_tokens": 2}
        assert http_json("POST", f"{url}/v1/chat/completions", body, session=sid, timeout=60)["choices"]
