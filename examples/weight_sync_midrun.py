"""A weight update mid-run on real processes: engine-sim replicas, our router, a fan-out pause/flush/resume.

Starts ``--engines`` engine-sim processes and ``rolloutpool router`` (admin token on),
runs ``--sessions`` concurrent multi-turn chat sessions for ``--duration`` seconds, and at
the middle sends the trainer's weight sync through the router's one URL:
``POST /admin/rl/pause?mode=wait``, ``/admin/rl/update_weights``, ``/admin/rl/resume``.
It prints JSON: the fan-out answers, the turns that found their context cached before and
after the update, and the router's counters (evicted re-prefill, quarantines) before the
update, just before it and at the end. The update flushes every cache, so the next turn
of every live session re-prefills; none of it may count as eviction.

    python examples/weight_sync_midrun.py --engines 2 --sessions 32 --duration 30
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

TOKEN = "example-admin-token"  # noqa: S105 - a loopback demo


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_http(http: aiohttp.ClientSession, url: str) -> None:
    for _ in range(300):
        with contextlib.suppress(aiohttp.ClientError):
            async with http.get(url) as r:
                if r.status == 200:
                    return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def counters(http: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with http.get(f"{url}/metrics") as r:
        text = await r.text()
    out = {"reprefilled_tokens": 0.0, "quarantines": 0.0}
    for line in text.splitlines():
        if line.startswith("rolloutpool_router_reprefilled_tokens_total{"):
            out["reprefilled_tokens"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("rolloutpool_router_quarantines_total{"):
            out["quarantines"] += float(line.rsplit(" ", 1)[1])
    return out


async def session(
    http: aiohttp.ClientSession,
    url: str,
    index: int,
    *,
    stop: float,
    log: list[dict[str, Any]],
) -> None:
    sid = f"midrun-{index}"
    messages = [{"role": "user", "content": f"Episode {index}: inspect the repository and fix the bug."}]
    turn = 0
    while time.monotonic() < stop:
        body = {"model": "sim", "messages": messages, "max_tokens": 24}
        started = time.monotonic()
        async with http.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-ID": sid}) as r:
            answer = await r.json()
        if r.status != 200:
            log.append({"session": sid, "turn": turn, "status": r.status})
            await asyncio.sleep(0.2)
            continue
        cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        log.append({"session": sid, "turn": turn, "cached": cached, "t": started, "ended": time.monotonic()})
        messages.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        messages.append({"role": "user", "content": f"tool output {index}.{turn}: " + "ok " * 40})
        turn += 1
        await asyncio.sleep(0.3)  # the tool call
    async with http.post(f"{url}/finish_session", params={"session_id": sid}) as r:
        await r.read()


def phase(ended: float, *, update_start: float, flushed: float) -> str:
    """Where a turn that ended at ``ended`` ran: on the old cache, drained by the pause, or after the flush."""
    if ended < update_start:
        return "before"
    return "after" if ended > flushed else "drained"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rolloutpool = [sys.executable, "-m", "rolloutpool.cli"]
    procs: list[subprocess.Popen[bytes]] = []
    logs = Path(tempfile.mkdtemp(prefix="weight-sync-"))
    try:
        urls = []
        for i in range(args.engines):
            port = free_port()
            cmd = [*rolloutpool, "engine-sim", "--port", str(port), "--model", "sim", "--time-scale", "20"]
            cmd += ["--kv-capacity-tokens", "400000", "--seed", str(i)]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            urls.append(f"http://127.0.0.1:{port}")
        token = logs / "token"
        token.write_text(TOKEN)
        port = free_port()
        cmd = [*rolloutpool, "router", "--worker-urls", *urls, "--port", str(port), "--admin-token-file", str(token)]
        router_log = (logs / "router.log").open("wb")
        procs.append(subprocess.Popen(cmd, stdout=router_log, stderr=subprocess.STDOUT))
        url = f"http://127.0.0.1:{port}"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with aiohttp.ClientSession() as http:
            for engine in urls:
                await wait_http(http, f"{engine}/health")
            await wait_http(http, f"{url}/health")
            stop = time.monotonic() + args.duration
            log: list[dict[str, Any]] = []
            tasks = [asyncio.create_task(session(http, url, i, stop=stop, log=log)) for i in range(args.sessions)]
            await asyncio.sleep(args.duration / 2)
            before = await counters(http, url)
            update_start = flushed = time.monotonic()
            fan_out = {}
            for call in ("pause?mode=wait", "update_weights", "resume"):
                async with http.post(f"{url}/admin/rl/{call}", json={}, headers=auth) as r:
                    body = await r.json()
                    fan_out[call] = {"status": r.status, "ok": body["ok"], "failed": body["failed"]}
                if call == "update_weights":
                    flushed = time.monotonic()
            await asyncio.gather(*tasks)
            after = await counters(http, url)
        # A turn that ended before the update began ran on the old cache ("before"). The pause
        # drains what is in flight and holds what is new until the resume, so a turn that ended
        # after the flush had answered ran entirely on the flushed cache ("after"); one that
        # ended in between (sent just as the pause went out) ran before the flush and is neither.
        for row in log:
            if "ended" in row:
                row["phase"] = phase(row["ended"], update_start=update_start, flushed=flushed)
        first_after = {}
        for row in log:
            if row.get("phase") == "after" and row["session"] not in first_after:
                first_after[row["session"]] = row["cached"]
        return {
            "fan_out": fan_out,
            "turns": len(log),
            "errors": sum(1 for r in log if "status" in r),
            "first_turn_after_update_cached_zero": sum(1 for v in first_after.values() if v == 0),
            "sessions_with_a_turn_after_update": len(first_after),
            "turns_with_cache_hits_before": sum(1 for r in log if r.get("phase") == "before" and r["cached"] > 0),
            "turns_with_cache_hits_after": sum(1 for r in log if r.get("phase") == "after" and r["cached"] > 0),
            "turns_drained_by_the_pause": sum(1 for r in log if r.get("phase") == "drained"),
            "router_before_update": before,
            "router_at_end": after,
            "router_log": str(logs / "router.log"),
        }
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--duration", type=float, default=30.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
