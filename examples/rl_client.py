"""Multi-turn rollouts the way RL frameworks call vllm-router; works unchanged against our router.

Every turn is an OpenAI chat completion with the header ``X-Session-ID`` (the
session key both routers understand); after the last turn the trajectory is
released with ``POST /finish_session?session_id=ID``.

    rolloutpool engine-sim --port 8100 --time-scale 50 &
    rolloutpool router --replica e0=http://127.0.0.1:8100 --port 8080 &
    python examples/rl_client.py --url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import asyncio
import uuid

import aiohttp


async def rollout(http: aiohttp.ClientSession, args: argparse.Namespace, model: str, index: int) -> int:
    """One trajectory; returns the cached prompt tokens the server reported over its turns."""
    session_id = f"rollout-{uuid.uuid4().hex[:8]}-{index}"
    headers = {"X-Session-ID": session_id}
    messages = [{"role": "user", "content": f"Solve task {index // 2} with the tools you have."}]
    cached = 0
    try:
        for turn in range(args.turns):
            body = {"model": model, "messages": messages, "max_tokens": args.max_tokens, "seed": index}
            async with http.post(f"{args.url}/v1/chat/completions", json=body, headers=headers) as response:
                response.raise_for_status()
                reply = await response.json()
            usage = reply["usage"]
            cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
            messages.append({"role": "user", "content": f"tool output {index} {turn}: " + "ok " * 40})
            print(f"{session_id} turn {turn}: prompt {usage['prompt_tokens']}, completion {usage['completion_tokens']}")
    finally:
        async with http.post(f"{args.url}/finish_session", params={"session_id": session_id}) as response:
            print(f"{session_id} finish_session: HTTP {response.status}")
    return cached


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="The router (or any vLLM-compatible server).")
    parser.add_argument("--model", default=None, help="Served model (default: the first of /v1/models).")
    parser.add_argument("--trajectories", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        model = args.model
        if model is None:
            async with http.get(f"{args.url}/v1/models") as response:
                response.raise_for_status()
                model = (await response.json())["data"][0]["id"]
        cached = await asyncio.gather(*(rollout(http, args, model, i) for i in range(args.trajectories)))
    print(f"{args.trajectories} trajectories x {args.turns} turns done; cached prompt tokens reported: {sum(cached)}")


if __name__ == "__main__":
    asyncio.run(main())
