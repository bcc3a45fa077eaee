"""Rollouts the way OpenPipe ART's client sends them: sessionless OpenAI chat.

ART hands the rollout code ``model.openai_client()``, an ``AsyncOpenAI`` whose base URL
is the inference server (or the router in front of several), and the rollout calls
``client.chat.completions.create(model=..., messages=..., max_completion_tokens=...,
logprobs=True)``. On the wire that is ``POST /v1/chat/completions`` with a bearer key
and no session id: no ``X-Session-ID`` header, no ``session_id`` or ``user`` field. A
multi-turn trajectory is known only by its messages: each turn repeats the previous
turn's messages and appends the assistant's reply and a tool observation. A group's
trajectories (GRPO) share the system prompt and the scenario.

This script does that with plain aiohttp (the SDK is not needed to send these bytes), for
``--trajectories`` trajectories at once, ``--turns`` turns each, and prints the summary
of ``common.py``: lost turns, affinity misses (a later turn that did not find its
previous prompt cached), per-engine spread where the router names the engine, and
whether every answer carried logprobs. Exit 1 if any of those checks fails.

    python examples/clients/art_style.py --url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import aiohttp
from common import REPLICA_HEADER, Tally, Trajectory, client_parser, served_model, wait_healthy

SYSTEM = (
    "You are an agent playing a text game. Think step by step, call a tool when you need "
    "information, and answer with your move. " * 6
)


def _tool_result(trajectory: int, turn: int, words: int) -> str:
    cells = (f"cell{(trajectory * 13 + turn * 5 + i) % 97}" for i in range(words))
    return f"tool result {trajectory}.{turn}: " + " ".join(cells)


async def trajectory(
    http: aiohttp.ClientSession, args: argparse.Namespace, model: str, index: int, tally: Tally
) -> None:
    group = index // max(args.group_size, 1)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Scenario {group}: reach 2048 in as few moves as you can."},
    ]
    headers = {"Authorization": f"Bearer {args.api_key}"}  # what AsyncOpenAI sends; no session id
    state = Trajectory()
    for turn in range(args.turns):
        body = {
            "model": model,
            "messages": messages,
            "max_completion_tokens": args.max_tokens,
            "temperature": 1.0,
            "logprobs": True,
        }
        try:
            async with http.post(f"{args.url}/v1/chat/completions", json=body, headers=headers) as resp:
                answer = await resp.json(content_type=None)
                if resp.status != 200:
                    tally.lost(f"trajectory {index} turn {turn}: HTTP {resp.status} {answer}")
                    return
                engine = resp.headers.get(REPLICA_HEADER)
        except (aiohttp.ClientError, TimeoutError) as exc:
            tally.lost(f"trajectory {index} turn {turn}: {exc!r}")
            return
        choice = answer["choices"][0]
        content = (choice.get("logprobs") or {}).get("content") or []
        completion = answer["usage"]["completion_tokens"]
        tally.turn(state, usage=answer["usage"], engine=engine, logprobs_ok=len(content) == completion > 0)
        messages.append({"role": "assistant", "content": choice["message"]["content"]})
        messages.append({"role": "user", "content": _tool_result(index, turn, args.observation_words)})
        await asyncio.sleep(args.tool_time)


async def run(args: argparse.Namespace) -> Tally:
    tally = Tally("art", args.url, block_size=args.block_size)
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await wait_healthy(http, args.url, args.health_timeout)
        model = args.model or await served_model(http, args.url)
        tally.planned = args.trajectories * args.turns
        await asyncio.gather(*(trajectory(http, args, model, i, tally) for i in range(args.trajectories)))
    tally.extra["session_id_sent"] = False
    return tally


def main() -> None:
    parser = client_parser(__doc__, token_ids=False)
    parser.add_argument("--api-key", default="EMPTY", help="ART's client sends a bearer key; vLLM ignores it.")
    parser.add_argument("--trajectories", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4, help="Trajectories per scenario (a GRPO group).")
    parser.add_argument("--observation-words", type=int, default=40)
    args = parser.parse_args()
    raise SystemExit(asyncio.run(run(args)).report())


if __name__ == "__main__":
    main()
