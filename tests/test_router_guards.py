"""Guards of the router process against bad input and exhausted resources (real processes on loopback).

An infinite fan-out timeout, an unwritable trace file, a body trickled in for ever, running out of
file descriptors, and a restart without ``--state-path``: each used to fail badly (a hang, a
traceback, a held handler, silence, every session re-placed).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

import aiohttp
import pytest

from rolloutpool.dev.bench.fleet import start_engines
from rolloutpool.dev.bench.processes import ProcessSet, rolloutpool_argv
from rolloutpool.dev.net import LOOPBACK, free_port
from rolloutpool.router.hop import REPLICA_HEADER
from rolloutpool.router.state import default_state_path

NOWHERE = "http://127.0.0.1:9"
"""A replica URL nothing answers at (the tests below never reach a replica)."""


def _router_argv(port: int, *flags: str) -> list[str]:
    return rolloutpool_argv("router", f"--host={LOOPBACK}", f"--port={port}", *flags)


def _metric(text: str, name: str) -> float | None:
    found = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
    return float(found[1]) if found else None


def _start(procs: ProcessSet, name: str, *flags: str, prefix: tuple[str, ...] = ()) -> str:
    port = free_port()
    url = f"http://{LOOPBACK}:{port}"
    procs.start(name, [*prefix, *_router_argv(port, *flags)], ready_url=f"{url}/healthz")
    return url


async def test_an_infinite_or_odd_fan_out_timeout_is_a_clear_400(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret")
    with ProcessSet(tmp_path) as procs:
        url = _start(procs, "router", f"--replica=e0={NOWHERE}", f"--admin-token-file={token}", "--no-state")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            for value in ("inf", "-inf", "nan", "1e999", "0", "-1", "soon"):
                async with http.post(
                    f"{url}/admin/rl/pause", params={"timeout_s": value}, headers={"Authorization": "Bearer secret"}
                ) as resp:
                    body = await resp.json()
                assert resp.status == 400, (value, body)
                assert body["error"]["param"] == "timeout_s"


def test_an_unwritable_trace_file_is_a_usage_error(tmp_path: Path) -> None:
    if os.geteuid() == 0:  # root writes anywhere on a disk; sysfs refuses even root (EACCES)
        target = Path("/sys/rolloutpool-trace.jsonl")
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        target = locked / "trace.jsonl"
    argv = _router_argv(free_port(), f"--replica=e0={NOWHERE}", f"--trace-file={target}", "--no-state")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert f"--trace-file {target}: cannot write it (Permission denied)" in done.stderr


async def test_a_body_trickled_in_is_cut_with_a_408(tmp_path: Path) -> None:
    with ProcessSet(tmp_path) as procs:
        url = _start(procs, "router", f"--replica=e0={NOWHERE}", "--request-read-timeout=1", "--no-state")
        port = int(url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        try:
            head = (
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                "X-Session-ID: slow\r\nContent-Length: 1000\r\n\r\n"
            )
            writer.write(head.encode())
            started = time.monotonic()
            answer = b""
            for _ in range(20):  # 10 bytes every 0.3 s: 6 s of body at most, never complete
                writer.write(b"x" * 10)
                await writer.drain()
                try:
                    answer = await asyncio.wait_for(reader.read(4096), timeout=0.3)
                except TimeoutError:
                    continue
                break
            took = time.monotonic() - started
        finally:
            writer.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"RequestTimeoutError" in answer
    assert took < 4.0


async def test_the_router_raises_its_open_file_limit_to_the_hard_one(tmp_path: Path) -> None:
    with ProcessSet(tmp_path) as procs:
        url = _start(procs, "router", f"--replica=e0={NOWHERE}", "--no-state", prefix=("prlimit", "--nofile=256:2048"))
        async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
            text = await resp.text()
    assert _metric(text, "rolloutpool_router_max_fds") == 2048
    assert (_metric(text, "rolloutpool_router_open_fds") or 0) > 0


def test_running_out_of_file_descriptors_is_counted_and_logged(tmp_path: Path) -> None:
    with ProcessSet(tmp_path) as procs:
        url = _start(procs, "router", f"--replica=e0={NOWHERE}", "--no-state", prefix=("prlimit", "--nofile=64:64"))
        port = int(url.rsplit(":", 1)[1])
        held = []
        try:
            for _ in range(80):  # more connections than the router has descriptors
                held.append(socket.create_connection((LOOPBACK, port), timeout=5))
            time.sleep(1.5)  # the watch samples twice a second
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.5)
        with socket.create_connection((LOOPBACK, port), timeout=5) as sock:  # it serves again once they are gone
            sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        text = b"".join(chunks).decode()
        log = procs.processes[0].log_path.read_text()
    assert (_metric(text, "rolloutpool_router_fd_exhaustions_total") or 0) >= 1, text[-2000:]
    assert "Ran out of file descriptors" in log


def test_the_default_state_path_follows_the_xdg_rules(tmp_path: Path) -> None:
    assert default_state_path(host="10.0.0.1", port=8080, env={"XDG_STATE_HOME": str(tmp_path)}) == (
        tmp_path / "rolloutpool" / "router-10.0.0.1-8080.json"
    )
    assert default_state_path(host="::", port=1, env={"HOME": str(tmp_path)}) == (
        tmp_path / ".local/state/rolloutpool/router-__-1.json"
    )
    assert default_state_path(host="h", port=1, env={"XDG_STATE_HOME": "relative", "HOME": "/home/u"}) == Path(
        "/home/u/.local/state/rolloutpool/router-h-1.json"
    )


async def test_a_restart_without_state_flags_keeps_every_session_on_its_replica(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with ProcessSet(tmp_path) as procs:
        engines = start_engines(procs, 2)
        port = free_port()
        url = f"http://{LOOPBACK}:{port}"
        argv = _router_argv(port, "--scrape-interval=0.2", *(f"--replica={n}={u}" for n, u in engines.items()))

        async def turns(http: aiohttp.ClientSession, n: int) -> dict[str, str | None]:
            async def one(sid: str) -> str | None:
                body = {"model": "sim", "messages": [{"role": "user", "content": f"{sid} turn {n}"}], "max_tokens": 2}
                async with http.post(f"{url}/v1/chat/completions", json=body, headers={"X-Session-ID": sid}) as r:
                    assert r.status == 200, await r.text()
                    return r.headers.get(REPLICA_HEADER)

            sids = [f"sticky-{i}" for i in range(20)]
            random.Random(n).shuffle(sids)  # another order each time: a fresh placement would differ
            return dict(zip(sids, await asyncio.gather(*(one(s) for s in sids)), strict=True))

        timeout = aiohttp.ClientTimeout(total=60)
        first = procs.start("router", argv, ready_url=f"{url}/readyz")
        async with aiohttp.ClientSession(timeout=timeout) as http:
            before = await turns(http, 0)
        first.stop()  # SIGTERM: the final snapshot is written
        assert default_state_path(host=LOOPBACK, port=port, env=os.environ).is_file()
        procs.start("router-again", argv, ready_url=f"{url}/readyz")
        async with aiohttp.ClientSession(timeout=timeout) as http:
            after = await turns(http, 1)
        assert sorted(Counter(before.values()).values()) == [10, 10]
        moved = [sid for sid in before if after[sid] != before[sid]]
        assert not moved, f"{len(moved)}/20 sessions moved"  # before: about half, placed again by the policy

        # --no-state keeps nothing
        other = free_port()
        procs.start(
            "no-state",
            _router_argv(other, f"--replica=e0={NOWHERE}", "--no-state"),
            ready_url=f"http://{LOOPBACK}:{other}/healthz",
        )
        assert not default_state_path(host=LOOPBACK, port=other, env=os.environ).exists()
