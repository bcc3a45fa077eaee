"""A multi-turn agentic client against any vLLM-compatible server (engine-sim, vLLM, a router).

Each session appends the model's reply and a tool observation to its chat and asks
again; sessions take turns, so a session sits idle (its prefix unreferenced) while the
others run, as a rollout does during a tool call. For every turn it prints the prompt
tokens, the cached tokens the server reports, and the cached tokens a perfect prefix
cache would give; at the end, the server's prefix-cache counters.

The block size is read from the server's ``vllm:cache_config_info`` (vLLM: 16 on GPUs,
a multiple of 32 on CPUs; ``--block-size`` overrides it). A shortfall of up to one
block is reported as ``retokenized``, not eviction: the next prompt re-tokenizes the
previous answer, which can differ from the sampled ids. A server started without
``--enable-prompt-tokens-details`` answers ``prompt_tokens_details: null``; then the
cached tokens are unknown and printed as ``-``.

    rolloutpool engine-sim --port 8100 --time-scale 50 &
    python examples/multiturn_client.py --url http://127.0.0.1:8100
"""

from __future__ import annotations

import argparse
import asyncio
import re
from typing import Any

import aiohttp

_WORDS = ["ls", "cat", "grep", "pytest", "diff", "patch", "build", "error", "warning", "passed", "failed", "line"]


def _observation(session: int, turn: int, words: int) -> str:
    return " ".join(_WORDS[(session * 31 + turn * 7 + i) % len(_WORDS)] + str(i % 97) for i in range(words))


async def _metric(http: aiohttp.ClientSession, url: str, name: str) -> float:
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    total = 0.0
    for line in text.splitlines():
        if re.match(rf"^{re.escape(name)}(\{{|\s)", line):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _block_size(http: aiohttp.ClientSession, url: str) -> int | None:
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    match = re.search(r'^vllm:cache_config_info\{[^}]*block_size="(\d+)"', text, re.MULTILINE)
    return int(match.group(1)) if match else None


def _verdict(cached: int | None, ideal: int, block: int) -> str:
    if cached is None:
        return "unknown (no prompt_tokens_details: start vLLM with --enable-prompt-tokens-details)"
    if cached >= ideal:
        return "hit"
    if ideal - cached <= block:
        return f"retokenized ({ideal - cached} tokens, within one block)"
    return f"EVICTED {ideal - cached} tokens re-prefilled"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8100")
    parser.add_argument("--model", default="Qwen/Qwen3-8B")
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=150)
    parser.add_argument("--observation-words", type=int, default=200)
    parser.add_argument("--block-size", type=int, default=None, help="Default: the server's cache_config_info.")
    args = parser.parse_args()

    chats: list[list[dict[str, str]]] = [
        [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": f"Fix bug {s}."}]
        for s in range(args.sessions)
    ]
    previous_context = [0] * args.sessions
    async with aiohttp.ClientSession() as http:
        queries0 = await _metric(http, args.url, "vllm:prefix_cache_queries_total")
        hits0 = await _metric(http, args.url, "vllm:prefix_cache_hits_total")
        block = args.block_size or await _block_size(http, args.url) or 16
        print(f"block size {block}")
        reported = 0
        print(f"{'turn':>4} {'session':>7} {'prompt':>7} {'cached':>7} {'no-evict':>8}  verdict")
        for turn in range(args.turns):
            for s in range(args.sessions):
                body: dict[str, Any] = {
                    "model": args.model,
                    "messages": chats[s],
                    "max_tokens": args.max_tokens,
                    "session_id": f"session-{s}",
                }
                async with http.post(
                    f"{args.url}/v1/chat/completions", json=body, headers={"X-Session-ID": f"session-{s}"}
                ) as response:
                    data = await response.json()
                    if response.status != 200:
                        raise SystemExit(f"HTTP {response.status}: {data}")
                usage = data["usage"]
                details = usage.get("prompt_tokens_details") or {}
                prompt, cached = usage["prompt_tokens"], details.get("cached_tokens")
                reported += cached or 0
                ideal = (min(previous_context[s], prompt - 1) // block) * block
                shown = "-" if cached is None else cached
                print(f"{turn:>4} {s:>7} {prompt:>7} {shown:>7} {ideal:>8}  {_verdict(cached, ideal, block)}")
                previous_context[s] = prompt + usage["completion_tokens"] - 1
                chats[s].append({"role": "assistant", "content": data["choices"][0]["message"]["content"]})
                chats[s].append({"role": "user", "content": _observation(s, turn, args.observation_words)})
        queries = await _metric(http, args.url, "vllm:prefix_cache_queries_total") - queries0
        hits = await _metric(http, args.url, "vllm:prefix_cache_hits_total") - hits0
    print(f"prefix_cache_queries_total +{queries:.0f}, prefix_cache_hits_total +{hits:.0f} "
          f"(sum of reported cached_tokens: {reported}), hit ratio {hits / max(queries, 1):.3f}")  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
