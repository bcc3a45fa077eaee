"""vllm-router's flags on ``rolloutpool router``: the pure translation and a real launch."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

import aiohttp
import pytest
from click.testing import CliRunner

from rolloutpool.cli import main
from rolloutpool.dev.net import free_port
from rolloutpool.router.compat import ACCEPTED, REFUSED, CompatError, replica_name, translate
from routerkit import MODEL, engines

PRIME_RL = [
    "--worker-urls",
    "http://10.0.0.1:8000",
    "http://10.0.0.2:8000",
    "--policy",
    "sticky_least_loaded",
    "--request-id-headers",
    "x-session-id",
    "--intra-node-data-parallel-size",
    "1",
]


def test_prime_rl_launch_line_translates() -> None:
    t = translate(PRIME_RL)
    assert t.worker_urls == ("http://10.0.0.1:8000", "http://10.0.0.2:8000")
    assert t.overrides == {"session_header": "x-session-id"}
    assert [flag for flag, _ in t.accepted] == ["--policy"]
    assert translate([]).worker_urls == ()


def test_honoured_flags_set_router_fields() -> None:
    t = translate(
        [
            "--request-timeout-secs=120",
            "--max-payload-size",
            "1048576",
            "--queue-size",
            "0",
            "--queue-timeout-secs",
            "5",
            "--kv-aware-session-affinity-ttl-secs",
            "900",
            "--log-level",
            "debug",
            "--api-key",
            "sk-1",
        ]
    )
    assert t.overrides == {
        "upstream_timeout_s": 120.0,
        "max_body_bytes": 1048576,
        "queue_max": 0,
        "queue_timeout_s": 5.0,
        "idle_timeout_s": 900.0,
        "api_key": "sk-1",
    }
    assert t.log_level == "debug"


@pytest.mark.parametrize("flag", sorted(ACCEPTED))
def test_every_accepted_flag_is_named_once(flag: str) -> None:
    args = [flag] if flag in {"--enable-program-scheduling", "--disable-retries", "--disable-circuit-breaker"} else []
    if not args:
        args = [flag, "cache_aware" if flag == "--policy" else "1"]
    assert translate(args).accepted == ((flag, ACCEPTED[flag]),)


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_every_refused_flag_is_an_error_naming_it(flag: str) -> None:
    switches = {"--vllm-pd-disaggregation", "--mini-lb", "--enable-igw", "--service-discovery"}
    args = [flag] if flag in switches else [flag, "x=y"]
    with pytest.raises(CompatError, match=f"^{flag}: cannot be honoured"):
        translate(args)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--intra-node-data-parallel-size", "4"], "--intra-node-data-parallel-size 4: cannot be honoured"),
        (["--request-id-headers", "a", "b"], "--request-id-headers: give exactly one header"),
        (["--worker-urls", "ftp://x"], "--worker-urls: 'ftp://x'"),
        (["--worker-urls", "http://a:1", "http://a:1/"], "the same worker is given twice"),
        (["--policy", "fastest"], "invalid choice"),
        (["--queue-timeout-secs", "0"], "must be positive"),
        (["--queue-timeout-secs", "soon"], "invalid float"),
        (["--no-such-flag"], "--no-such-flag: not an option"),
    ],
)
def test_bad_flags_are_clear_errors(args: list[str], match: str) -> None:
    with pytest.raises(CompatError, match=match):
        translate(args)


def test_replica_names_are_host_port() -> None:
    assert replica_name("http://10.0.0.7:8000/") == "10.0.0.7:8000"


def test_cli_refuses_a_flag_it_cannot_honour_before_serving() -> None:
    result = CliRunner().invoke(main, ["router", "--worker-urls", "http://127.0.0.1:1", "--mini-lb"])
    assert result.exit_code == 2
    assert "--mini-lb: cannot be honoured" in result.output
    result = CliRunner().invoke(main, ["router", "--worker-urls", "http://127.0.0.1:1", "--api-key", " "])
    assert result.exit_code == 2
    assert "--api-key: must not be empty" in result.output
    result = CliRunner().invoke(main, ["router", "--worker-urls", "http://127.0.0.1:1", "--discover-namespace", "n"])
    assert result.exit_code == 2
    assert "not both" in result.output


async def test_router_launched_with_prime_rl_flags_serves_sessions() -> None:
    async with engines(2) as urls:
        port = free_port()
        args = ["--worker-urls", *urls.values(), "--policy", "sticky_least_loaded", "--request-id-headers"]
        args += ["x-session-id", "--intra-node-data-parallel-size", "1", "--host", "127.0.0.1", "--port", str(port)]
        args += ["--cache-threshold", "0.5", "--prometheus-port", "29000"]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "rolloutpool.cli",
            "router",
            *args,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            base = f"http://127.0.0.1:{port}"
            async with aiohttp.ClientSession() as http:
                for _ in range(200):
                    with contextlib.suppress(aiohttp.ClientError):
                        async with http.get(f"{base}/health") as resp:
                            if resp.status == 200:
                                break
                    await asyncio.sleep(0.1)
                served = set()
                for _ in range(3):
                    body = {"model": MODEL, "prompt": "hello there", "max_tokens": 4}
                    async with http.post(f"{base}/v1/completions", json=body, headers={"X-SESSION-ID": "t1"}) as r:
                        assert r.status == 200
                        served.add(r.headers["X-RolloutPool-Replica"])
                assert len(served) == 1  # one session, one replica: the header was read case-insensitively
                assert served <= {u.removeprefix("http://") for u in urls.values()}
        finally:
            proc.terminate()
            _, err = await asyncio.wait_for(proc.communicate(), timeout=30)
        log = err.decode()
        assert log.count("Ignored vllm-router flag flag=--policy") == 1
        assert log.count("Ignored vllm-router flag flag=--cache-threshold") == 1
        assert log.count("Ignored vllm-router flag flag=--prometheus-port") == 1
