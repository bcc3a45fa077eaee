"""Rollouts the way prime-rl calls vllm-router; the same script runs against our router (swap the URL).

What it does, as prime-rl (with ``verifiers``) does for training rollouts:

- ``GET /health`` and ``GET /v1/models`` first;
- each episode is a trajectory with ``X-Session-ID`` = its id; every turn is a token-in,
  token-out ``POST /inference/v1/generate`` carrying ``cache_salt`` = the policy version
  the group started with; the next turn's prompt is the previous prompt, the output ids
  and the observation's ids (``/tokenize`` stands in for the trainer's tokenizer);
- ``POST /finish_session?session_id=`` on success, on failure and on cancellation, each
  with a 5 s timeout; a failed finish is only logged.

One episode fails on purpose (a generate body without ``token_ids``) and one is
cancelled mid-turn, so all three finish paths run. It prints one JSON object:
``{"results": {check: "ok" | "FAIL: ..."}, ...}`` and exits 1 if a check failed.

    rolloutpool engine-sim --port 8100 --time-scale 50 &
    rolloutpool router --worker-urls http://127.0.0.1:8100 --port 8080 &
    python examples/prime_rl_client.py --url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from typing import Any

import aiohttp

FINISH_TIMEOUT = aiohttp.ClientTimeout(total=5.0)


class Checks:
    """What each endpoint answered: the first failure of a check wins."""

    def __init__(self) -> None:
        self.results: dict[str, str] = {}

    def record(self, check: str, ok: bool, detail: str = "") -> None:
        if not ok:
            self.results[check] = f"FAIL: {detail}"
        else:
            self.results.setdefault(check, "ok")


async def _json(resp: aiohttp.ClientResponse) -> Any:
    text = await resp.text()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


async def finish(http: aiohttp.ClientSession, url: str, session_id: str, checks: Checks, path: str) -> None:
    """``/finish_session`` with prime-rl's 5 s timeout; failures are only logged (and recorded)."""
    try:
        async with http.post(f"{url}/finish_session", params={"session_id": session_id}, timeout=FINISH_TIMEOUT) as r:
            body = await _json(r)
            checks.record(f"finish_session ({path})", r.status == 200, f"HTTP {r.status} {body}")
    except (aiohttp.ClientError, TimeoutError) as exc:
        print(f"finish_session failed session={session_id} error={exc!r}", file=sys.stderr)
        checks.record(f"finish_session ({path})", False, repr(exc))


async def tokenize(http: aiohttp.ClientSession, url: str, model: str, text: str, headers: dict[str, str]) -> list[int]:
    async with http.post(f"{url}/tokenize", json={"model": model, "prompt": text}, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"/tokenize: HTTP {r.status} {await r.text()}")
        return list((await r.json())["tokens"])


async def episode(
    http: aiohttp.ClientSession,
    args: argparse.Namespace,
    model: str,
    index: int,
    checks: Checks,
    *,
    broken: bool = False,
    turns: int | None = None,
) -> None:
    session_id = f"traj-{uuid.uuid4().hex[:12]}"
    headers = {"X-Session-ID": session_id}
    salt = f"policy-{args.policy_version}"
    try:
        try:
            ids = await tokenize(http, args.url, model, f"Task {index}: plan, call tools, answer.", headers)
            checks.record("tokenize", True)
        except RuntimeError as exc:
            checks.record("tokenize", False, str(exc))
            raise
        for turn in range(turns or args.turns):
            body: dict[str, Any] = {
                "model": model,
                "token_ids": ids,
                "sampling_params": {"max_tokens": args.max_tokens, "temperature": 1.0, "seed": index},
                "cache_salt": salt,
                "return_token_ids": True,
            }
            if broken and turn == 1:
                del body["token_ids"]  # a bug in the trainer: a 4xx
            async with http.post(f"{args.url}/inference/v1/generate", json=body, headers=headers) as r:
                answer = await _json(r)
                if broken and turn == 1:
                    # vLLM answers 400; vllm-router validates the body itself and answers 422
                    checks.record("generate without token_ids -> 4xx", 400 <= r.status < 500, f"HTTP {r.status}")
                    raise RuntimeError(f"generate failed: HTTP {r.status}")
                checks.record("inference/v1/generate", r.status == 200, f"HTTP {r.status} {answer}")
                if r.status != 200:
                    raise RuntimeError(f"generate failed: HTTP {r.status}")
            choice = answer["choices"][0]
            usage = answer["usage"]
            checks.record("generate: token ids out", bool(choice["token_ids"]), f"{choice}")
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            if turn > 0:  # the router kept the trajectory on its replica: the previous turn is cached
                checks.record("generate: later turns hit the prefix cache", cached > 0, f"turn {turn} cached {cached}")
            observation = await tokenize(http, args.url, model, f"tool output {index}.{turn}: " + "ok " * 30, headers)
            ids = ids + choice["token_ids"] + observation
    except asyncio.CancelledError:
        await finish(http, args.url, session_id, checks, "cancel")
        raise
    except (RuntimeError, aiohttp.ClientError) as exc:
        print(f"episode failed session={session_id} error={exc}", file=sys.stderr)
        await finish(http, args.url, session_id, checks, "failure")
        return
    await finish(http, args.url, session_id, checks, "success")


async def run(args: argparse.Namespace) -> Checks:
    checks = Checks()
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{args.url}/health") as r:
            checks.record("health", r.status == 200, f"HTTP {r.status}")
        async with http.get(f"{args.url}/v1/models") as r:
            checks.record("v1/models", r.status == 200, f"HTTP {r.status}")
            model = args.model or (await r.json())["data"][0]["id"]
        tasks = [
            asyncio.create_task(episode(http, args, model, i, checks, broken=i == 1)) for i in range(args.episodes)
        ]
        cancelled = asyncio.create_task(episode(http, args, model, 99, checks, turns=10_000))  # runs until cancelled
        await asyncio.sleep(args.cancel_after)
        cancelled.cancel()
        await asyncio.gather(*tasks)
        try:
            await cancelled
            checks.record("finish_session (cancel)", False, "the episode ended before it was cancelled")
        except asyncio.CancelledError:
            pass
        # finishing twice (a retry after a lost answer) is harmless
        async with http.post(f"{args.url}/finish_session", params={"session_id": "never-started"}) as r:
            checks.record("finish_session (unknown id) -> 200", r.status == 200, f"HTTP {r.status}")
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="vllm-router or rolloutpool router.")
    parser.add_argument("--model", default=None, help="Served model (default: the first of /v1/models).")
    parser.add_argument("--episodes", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--policy-version", type=int, default=0, help="cache_salt = policy-<version>.")
    parser.add_argument("--cancel-after", type=float, default=0.5, help="Seconds before one episode is cancelled.")
    args = parser.parse_args()
    checks = asyncio.run(run(args))
    print(json.dumps({"client": "prime-rl", "url": args.url, "results": checks.results}, indent=2))
    sys.exit(0 if all(v == "ok" for v in checks.results.values()) else 1)


if __name__ == "__main__":
    main()
