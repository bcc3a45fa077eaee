"""Rollouts the way prime-rl sends them: token-in/token-out generate that reads ``logprobs``.

prime-rl (with ``verifiers``) runs training rollouts on ``POST /inference/v1/generate``:
each episode is a trajectory with the header ``X-Session-ID`` = its id, and every turn
sends ``token_ids`` (the previous prompt, the output ids and the observation's ids),
``sampling_params`` with ``logprobs`` (the trainer's importance ratios need the
sampler's per-token logprobs), ``cache_salt`` = the policy version the group started
with and ``return_token_ids``. It reads ``choices[0].token_ids`` and
``choices[0].logprobs.content[].logprob``. Evaluation episodes go to
``/v1/chat/completions`` with the same header and ``logprobs: true``. Every episode ends
with ``POST /finish_session?session_id=`` (5 s timeout; a failure is only logged).

Prints the summary of ``common.py``; exit 1 if a turn was lost, a later turn missed its
cached prefix, or an answer lacked logprobs.

    python examples/clients/prime_rl_style.py --url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from typing import Any

import aiohttp
from common import REPLICA_HEADER, Tally, Trajectory, client_parser, observation_ids, served_model, wait_healthy

FINISH_TIMEOUT = aiohttp.ClientTimeout(total=5.0)


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    async with http.post(url, json=body, headers=headers) as resp:
        answer = await resp.json(content_type=None)
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status} {answer}")
        return answer, resp.headers.get(REPLICA_HEADER)


async def _finish(http: aiohttp.ClientSession, url: str, session_id: str) -> None:
    try:
        async with http.post(f"{url}/finish_session", params={"session_id": session_id}, timeout=FINISH_TIMEOUT) as r:
            if r.status != 200:
                print(f"finish_session answered HTTP {r.status} session={session_id}", file=sys.stderr)
    except (aiohttp.ClientError, TimeoutError) as exc:
        print(f"finish_session failed session={session_id} error={exc!r}", file=sys.stderr)


async def train_episode(
    http: aiohttp.ClientSession, args: argparse.Namespace, model: str, index: int, tally: Tally
) -> None:
    session_id = f"traj-{uuid.uuid4().hex[:12]}"
    headers = {"X-Session-ID": session_id}
    group = index // max(args.group_size, 1)
    ids = observation_ids(30_000 + group, 0, args.prompt_tokens)
    state = Trajectory()
    try:
        for turn in range(args.turns):
            body = {
                "model": model,
                "token_ids": ids,
                "sampling_params": {"max_tokens": args.max_tokens, "temperature": 1.0, "seed": index, "logprobs": 0},
                "cache_salt": f"policy-{args.policy_version}",
                "return_token_ids": True,
            }
            answer, engine = await _post(http, f"{args.url}/inference/v1/generate", body, headers)
            choice = answer["choices"][0]
            out = list(choice["token_ids"])
            content = (choice.get("logprobs") or {}).get("content") or []
            ok = len(content) == len(out) > 0 and all(isinstance(c.get("logprob"), float) for c in content)
            tally.turn(state, usage=answer.get("usage"), engine=engine, logprobs_ok=ok)
            ids = ids + out + observation_ids(index, turn, args.observation_tokens)
            await asyncio.sleep(args.tool_time)
    except (RuntimeError, KeyError, aiohttp.ClientError, TimeoutError) as exc:
        tally.lost(f"episode {session_id} turn {state.turns_done}: {exc!r}")
    finally:
        await _finish(http, args.url, session_id)


async def eval_episode(
    http: aiohttp.ClientSession, args: argparse.Namespace, model: str, index: int, tally: Tally
) -> None:
    session_id = f"eval-{uuid.uuid4().hex[:12]}"
    headers = {"X-Session-ID": session_id}
    messages = [
        {"role": "system", "content": "Solve the task. Use the tools. " * 20},
        {"role": "user", "content": f"Evaluation task {index}."},
    ]
    state = Trajectory()
    try:
        for turn in range(args.turns):
            body = {"model": model, "messages": messages, "max_tokens": args.max_tokens, "logprobs": True}
            answer, engine = await _post(http, f"{args.url}/v1/chat/completions", body, headers)
            choice = answer["choices"][0]
            content = (choice.get("logprobs") or {}).get("content") or []
            ok = len(content) == answer["usage"]["completion_tokens"] > 0
            tally.turn(state, usage=answer["usage"], engine=engine, logprobs_ok=ok)
            messages.append({"role": "assistant", "content": choice["message"]["content"]})
            messages.append({"role": "user", "content": f"tool output {index}.{turn}: " + "ok " * 30})
            await asyncio.sleep(args.tool_time)
    except (RuntimeError, KeyError, aiohttp.ClientError, TimeoutError) as exc:
        tally.lost(f"eval {session_id} turn {state.turns_done}: {exc!r}")
    finally:
        await _finish(http, args.url, session_id)


async def run(args: argparse.Namespace) -> Tally:
    tally = Tally("prime-rl", args.url, block_size=args.block_size)
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await wait_healthy(http, args.url, args.health_timeout)
        model = args.model or await served_model(http, args.url)
        tally.planned = (args.episodes + args.eval_episodes) * args.turns
        await asyncio.gather(
            *(train_episode(http, args, model, i, tally) for i in range(args.episodes)),
            *(eval_episode(http, args, model, i, tally) for i in range(args.eval_episodes)),
        )
    return tally


def main() -> None:
    parser = client_parser(__doc__)
    parser.add_argument("--episodes", type=int, default=8, help="Training episodes (/inference/v1/generate).")
    parser.add_argument("--eval-episodes", type=int, default=2, help="Evaluation episodes (/v1/chat/completions).")
    parser.add_argument("--group-size", type=int, default=4, help="Episodes sharing one prompt (a GRPO group).")
    parser.add_argument("--policy-version", type=int, default=0, help="cache_salt = policy-<version>.")
    args = parser.parse_args()
    raise SystemExit(asyncio.run(run(args)).report())


if __name__ == "__main__":
    main()
