"""Rollouts the way SkyRL calls vllm-router; the same script runs against our router (swap the URL).

What it does, as SkyRL's generator does:

- polls ``GET /health`` until it answers 200 (the router's start-up);
- each trajectory has ``X-Session-ID`` = ``{instance_id}_{repetition_id}``, and the same
  ids come back in the next epoch (a reused id after a finish is a new session);
- a turn renders the chat (``POST /v1/chat/completions/render``) or tokenizes
  (``/tokenize``), generates token-in/token-out (``POST /inference/v1/generate``) and
  detokenizes the output (``/detokenize``); one chat completion and one completion per
  trajectory cover the OpenAI paths it also uses;
- ``POST /finish_session?session_id=`` in ``finally`` with a 10 s timeout; an answer
  >= 400 is only logged.

It prints one JSON object ``{"results": {check: "ok" | "FAIL: ..."}, ...}`` and exits 1
if a check failed.

    rolloutpool engine-sim --port 8100 --time-scale 50 &
    rolloutpool router --worker-urls http://127.0.0.1:8100 --port 8080 &
    python examples/skyrl_client.py --url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import aiohttp

FINISH_TIMEOUT = aiohttp.ClientTimeout(total=10.0)


class Checks:
    """What each endpoint answered: the first failure of a check wins."""

    def __init__(self) -> None:
        self.results: dict[str, str] = {}

    def record(self, check: str, ok: bool, detail: str = "") -> None:
        if not ok:
            self.results[check] = f"FAIL: {detail}"[:300]
        else:
            self.results.setdefault(check, "ok")


async def post(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str], *, checks: Checks, check: str
) -> Any:
    async with http.post(url, json=body, headers=headers) as r:
        text = await r.text()
        checks.record(check, r.status == 200, f"HTTP {r.status} {text[:200]}")
        if r.status != 200:
            raise RuntimeError(f"{check}: HTTP {r.status}")
        return json.loads(text)


async def wait_healthy(http: aiohttp.ClientSession, url: str, checks: Checks, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            async with http.get(f"{url}/health") as r:
                if r.status == 200:
                    checks.record("health (poll until 200)", True)
                    return
                last = f"HTTP {r.status}"
        except aiohttp.ClientError as exc:
            last = repr(exc)
        await asyncio.sleep(0.2)
    checks.record("health (poll until 200)", False, last)


async def trajectory(
    http: aiohttp.ClientSession, args: argparse.Namespace, model: str, session_id: str, *, epoch: int, checks: Checks
) -> None:
    headers = {"X-Session-ID": session_id}
    url = args.url
    messages = [{"role": "user", "content": f"Instance {session_id}: fix the failing test."}]
    try:
        rendered = await post(
            http,
            f"{url}/v1/chat/completions/render",
            {"model": model, "messages": messages},
            headers,
            checks=checks,
            check="v1/chat/completions/render",
        )
        ids = list(rendered["token_ids"])
        for turn in range(args.turns):
            body = {"model": model, "token_ids": ids, "sampling_params": {"max_tokens": args.max_tokens}}
            answer = await post(
                http, f"{url}/inference/v1/generate", body, headers, checks=checks, check="inference/v1/generate"
            )
            out = answer["choices"][0]["token_ids"]
            cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            if turn > 0:
                checks.record("generate: later turns hit the prefix cache", cached > 0, f"{session_id} turn {turn}")
            text = await post(
                http, f"{url}/detokenize", {"model": model, "tokens": out}, headers, checks=checks, check="detokenize"
            )
            checks.record("detokenize: text out", isinstance(text.get("prompt"), str), f"{text}")
            observation = f"<tool_response> epoch {epoch} turn {turn}: " + "passed " * 20
            tok = await post(
                http,
                f"{url}/tokenize",
                {"model": model, "prompt": observation},
                headers,
                checks=checks,
                check="tokenize",
            )
            ids = ids + out + tok["tokens"]
        chat = {"model": model, "messages": messages, "max_tokens": 4}
        await post(http, f"{url}/v1/chat/completions", chat, headers, checks=checks, check="v1/chat/completions")
        plain = {"model": model, "prompt": f"summary of {session_id}", "max_tokens": 4}
        await post(http, f"{url}/v1/completions", plain, headers, checks=checks, check="v1/completions")
    except (RuntimeError, aiohttp.ClientError, KeyError) as exc:
        print(f"trajectory failed session={session_id} error={exc!r}", file=sys.stderr)
    finally:
        try:
            async with http.post(
                f"{url}/finish_session", params={"session_id": session_id}, timeout=FINISH_TIMEOUT
            ) as r:
                if r.status >= 400:
                    print(f"finish_session answered HTTP {r.status} session={session_id}", file=sys.stderr)
                checks.record("finish_session (finally)", r.status == 200, f"HTTP {r.status}")
                if epoch > 0:
                    checks.record("finish_session (reused id, next epoch)", r.status == 200, f"HTTP {r.status}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            print(f"finish_session failed session={session_id} error={exc!r}", file=sys.stderr)
            checks.record("finish_session (finally)", False, repr(exc))


async def run(args: argparse.Namespace) -> Checks:
    checks = Checks()
    async with aiohttp.ClientSession() as http:
        await wait_healthy(http, args.url, checks, args.health_timeout)
        async with http.get(f"{args.url}/v1/models") as r:
            model = args.model or (await r.json())["data"][0]["id"]
        for epoch in range(args.epochs):
            ids = [f"{i}_{rep}" for i in range(args.instances) for rep in range(args.repetitions)]
            await asyncio.gather(*(trajectory(http, args, model, sid, epoch=epoch, checks=checks) for sid in ids))
        # SkyRL's finally also runs after an early failure: a finish for an id that never started
        async with http.post(f"{args.url}/finish_session", params={"session_id": "9999_0"}) as r:
            checks.record("finish_session (unknown id) -> 200", r.status == 200, f"HTTP {r.status}")
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="vllm-router or rolloutpool router.")
    parser.add_argument("--model", default=None, help="Served model (default: the first of /v1/models).")
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--health-timeout", type=float, default=30.0)
    args = parser.parse_args()
    checks = asyncio.run(run(args))
    print(json.dumps({"client": "skyrl", "url": args.url, "results": checks.results}, indent=2))
    sys.exit(0 if all(v == "ok" for v in checks.results.values()) else 1)


if __name__ == "__main__":
    main()
