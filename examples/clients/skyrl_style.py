"""Rollouts the way SkyRL's ``RemoteInferenceClient`` sends them: generate, then detokenize.

SkyRL's generator runs each trajectory as its own loop; every turn calls
``RemoteInferenceClient.generate`` with one prompt, which

- posts ``/inference/v1/generate`` with ``{"sampling_params": ..., "model": ...,
  "token_ids": [...]}`` and the header ``X-Session-ID`` = the trajectory's
  ``{instance_id}_{repetition_id}``; with ``sampling_params.logprobs`` set (the trainer
  needs them) it reads ``choices[0].logprobs.content[].logprob`` beside
  ``choices[0].token_ids``;
- then posts ``/detokenize`` with ``{"model": ..., "tokens": [...]}`` and no session
  header, to get the text for the environment.

The next prompt is the previous one, the output ids and the observation's ids. When the
trajectory ends (or fails), ``POST /finish_session?session_id=`` with a 10 s timeout;
an answer >= 400 is only logged.

Run more trajectories than the fleet's cap and the later ones wait for a place while the
first ones detokenize: a ``/detokenize`` is not a rollout and must be answered at once,
not queued behind them (a detokenize that waited for a place would hold its own
trajectory's place: the fleet would stall). The summary of ``common.py`` adds the
slowest generate (which may have queued) and the slowest detokenize; exit 1 if a turn
was lost, missed its cached prefix, lacked logprobs, or a detokenize took longer than
``--detokenize-max-s``.

    python examples/clients/skyrl_style.py --url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import aiohttp
from common import REPLICA_HEADER, Tally, Trajectory, client_parser, observation_ids, served_model, wait_healthy

FINISH_TIMEOUT = aiohttp.ClientTimeout(total=10.0)


class Timings:
    def __init__(self) -> None:
        self.generate = 0.0
        self.detokenize = 0.0


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
    async with http.post(url, json=body, headers=headers) as resp:
        answer = await resp.json(content_type=None)
        if resp.status >= 400:
            raise RuntimeError(f"{url}: HTTP {resp.status} {answer}")
        return answer, resp.headers.get(REPLICA_HEADER)


async def trajectory(
    http: aiohttp.ClientSession,
    args: argparse.Namespace,
    model: str,
    tally: Tally,
    timings: Timings,
    *,
    instance: int,
    repetition: int,
) -> None:
    session_id = f"{instance}_{repetition}"
    ids = observation_ids(20_000 + instance, 0, args.prompt_tokens)  # an instance's repetitions share the prompt
    sampling = {"max_tokens": args.max_tokens, "temperature": 1.0, "logprobs": 0}
    state = Trajectory()
    try:
        for turn in range(args.turns):
            body = {"sampling_params": sampling, "model": model, "token_ids": ids}
            t0 = time.monotonic()
            answer, engine = await _post(http, f"{args.url}/inference/v1/generate", body, {"X-Session-ID": session_id})
            timings.generate = max(timings.generate, time.monotonic() - t0)
            choice = answer["choices"][0]
            out = list(choice["token_ids"])
            content = (choice.get("logprobs") or {}).get("content") or []
            logprobs = [c["logprob"] for c in content]
            t0 = time.monotonic()
            text, _ = await _post(http, f"{args.url}/detokenize", {"model": model, "tokens": out}, {})
            timings.detokenize = max(timings.detokenize, time.monotonic() - t0)
            if not isinstance(text.get("prompt"), str):
                raise RuntimeError(f"/detokenize answered no text: {text}")
            tally.turn(state, usage=answer.get("usage"), engine=engine, logprobs_ok=len(logprobs) == len(out) > 0)
            ids = ids + out + observation_ids(instance * 10 + repetition, turn, args.observation_tokens)
            await asyncio.sleep(args.tool_time)
    except (RuntimeError, KeyError, aiohttp.ClientError, TimeoutError) as exc:
        tally.lost(f"trajectory {session_id} turn {state.turns_done}: {exc!r}")
    finally:
        try:
            async with http.post(
                f"{args.url}/finish_session", params={"session_id": session_id}, timeout=FINISH_TIMEOUT
            ) as resp:
                if resp.status >= 400:
                    print(f"finish_session answered HTTP {resp.status} session={session_id}", file=sys.stderr)
        except (aiohttp.ClientError, TimeoutError) as exc:
            print(f"finish_session failed session={session_id} error={exc!r}", file=sys.stderr)


async def run(args: argparse.Namespace) -> Tally:
    tally = Tally("skyrl", args.url, block_size=args.block_size)
    timings = Timings()
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await wait_healthy(http, args.url, args.health_timeout)
        model = args.model or await served_model(http, args.url)
        tally.planned = args.instances * args.repetitions * args.turns
        await asyncio.gather(
            *(
                trajectory(http, args, model, tally, timings, instance=i, repetition=rep)
                for i in range(args.instances)
                for rep in range(args.repetitions)
            )
        )
    tally.extra["slowest_generate_s"] = round(timings.generate, 3)
    tally.extra["slowest_detokenize_s"] = round(timings.detokenize, 3)
    tally.checks["detokenize answered at once"] = timings.detokenize <= args.detokenize_max_s
    return tally


def main() -> None:
    parser = client_parser(__doc__)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--detokenize-max-s", type=float, default=2.0, help="Slowest detokenize that passes.")
    args = parser.parse_args()
    raise SystemExit(asyncio.run(run(args)).report())


if __name__ == "__main__":
    main()
