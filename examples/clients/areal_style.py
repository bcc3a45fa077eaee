"""Rollouts the way AReaL's ``RemotevLLMEngine`` sends them: token-id completions without ``model``.

AReaL builds a flat vLLM completion body from its generation config and posts it to
``/v1/completions``: ``prompt`` is the list of input token ids, and the body carries
``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``stop_token_ids``,
``ignore_eos``, ``skip_special_tokens``, ``return_tokens_as_token_ids: true``,
``logprobs: 0`` (the sampled token's logprob alone), ``use_beam_search`` and
``stream: false``. There is no ``model`` field (vLLM serves its one model; AReaL adds
``model`` only for a LoRA adapter) and no session id: AReaL balances inside the trainer,
so behind a router the conversation is known only by its token prefix. The output ids
are read back from ``logprobs.tokens`` (``"token_id:<id>"``) with their
``logprobs.token_logprobs``. A multi-turn workflow's next prompt is the previous prompt,
the output ids and the observation's ids (AReaL tokenizes with its own tokenizer; here
deterministic ids stand in).

Prints the summary of ``common.py`` and exits 1 if a turn was lost, a later turn missed
its cached prefix, or an answer lacked logprobs.

    python examples/clients/areal_style.py --url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import aiohttp
from common import REPLICA_HEADER, Tally, Trajectory, client_parser, observation_ids, wait_healthy

ID_MARK = "token_id:"
"""``return_tokens_as_token_ids`` writes each output token as this mark and its id."""


def _output_ids(logprobs: dict[str, Any] | None) -> tuple[list[int], list[float]]:
    """Output ids and their logprobs from a completion's ``logprobs`` (``return_tokens_as_token_ids``)."""
    if not logprobs:
        return [], []
    tokens = [str(t) for t in logprobs.get("tokens") or []]
    ids = [int(t[len(ID_MARK) :]) for t in tokens if t.startswith(ID_MARK)]
    values = [float(v) for v in logprobs.get("token_logprobs") or [] if v is not None]
    return (ids, values) if len(ids) == len(tokens) else ([], values)


async def trajectory(http: aiohttp.ClientSession, args: argparse.Namespace, index: int, tally: Tally) -> None:
    group = index // max(args.group_size, 1)
    prompt = observation_ids(10_000 + group, 0, args.prompt_tokens)  # a group's trajectories share their prompt
    state = Trajectory()
    for turn in range(args.turns):
        body = {
            "prompt": prompt,
            "top_p": 1.0,
            "top_k": -1,
            "max_tokens": args.max_tokens,
            "temperature": 1.0,
            "stop_token_ids": [],
            "ignore_eos": False,
            "skip_special_tokens": True,
            "return_tokens_as_token_ids": True,
            "logprobs": 0,
            "use_beam_search": False,
            "stream": False,
        }
        try:
            async with http.post(f"{args.url}/v1/completions", json=body) as resp:
                answer = await resp.json(content_type=None)
                if resp.status != 200:
                    tally.lost(f"trajectory {index} turn {turn}: HTTP {resp.status} {answer}")
                    return
                engine = resp.headers.get(REPLICA_HEADER)
        except (aiohttp.ClientError, TimeoutError) as exc:
            tally.lost(f"trajectory {index} turn {turn}: {exc!r}")
            return
        ids, logprobs = _output_ids(answer["choices"][0].get("logprobs"))
        completion = answer["usage"]["completion_tokens"]
        ok = len(ids) == len(logprobs) == completion > 0
        tally.turn(state, usage=answer["usage"], engine=engine, logprobs_ok=ok)
        if not ids:
            tally.lost(f"trajectory {index} turn {turn}: no output token ids in logprobs.tokens")
            return
        prompt = prompt + ids + observation_ids(index, turn, args.observation_tokens)
        await asyncio.sleep(args.tool_time)


async def run(args: argparse.Namespace) -> Tally:
    tally = Tally("areal", args.url, block_size=args.block_size)
    timeout = aiohttp.ClientTimeout(total=args.request_timeout)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        await wait_healthy(http, args.url, args.health_timeout)
        tally.planned = args.trajectories * args.turns
        await asyncio.gather(*(trajectory(http, args, i, tally) for i in range(args.trajectories)))
    tally.extra["model_sent"] = False
    tally.extra["session_id_sent"] = False
    return tally


def main() -> None:
    parser = client_parser(__doc__, model=False)
    parser.add_argument("--trajectories", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4, help="Trajectories sharing one prompt (a GRPO group).")
    args = parser.parse_args()
    raise SystemExit(asyncio.run(run(args)).report())


if __name__ == "__main__":
    main()
