"""The engine model's data: a replica's limits, one request, counters, a step's outcome (pure).

:mod:`rolloutpool.engine.model.core` schedules over these and re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rolloutpool.engine.model.cost import CostModel

__all__ = ["DEFAULT_MAX_NUM_SEQS", "EngineConfig", "EngineCounters", "Request", "StepOutcome"]

DEFAULT_MAX_NUM_SEQS = 1024
"""vLLM's ``max_num_seqs`` on GPUs of 70 GiB or more other than the A100 (H100, H200), for the OpenAI server and
the ``LLM`` class alike (``EngineArgs.get_batch_defaults`` in ``vllm/engine/arg_utils.py``); 256 on smaller GPUs."""


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler limits of one replica."""

    num_gpu_blocks: int
    block_size: int = 16
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    cost: CostModel = field(default_factory=CostModel)
    enable_prefix_caching: bool = True
    """vLLM's ``--enable-prefix-caching`` (on by default): off, no admission finds a cached block."""
    lazy_decode: bool = False
    """Settle decoding requests' counters and block seals when they leave the batch or a step needs them, not
    every decode run (the fleet simulator's speed-up; identical results where no other request can look up a
    decoding request's unsealed output blocks, as there: each output is its own chain). Off while KV events are
    recorded."""
    free_restore: bool = False
    """A bound, not vLLM: context computed before costs nothing to compute again (an evicted prefix, a preempted
    request's progress; :attr:`Request.free_tokens`). Its blocks are still allocated and its tokens still take the
    step's token budget: the KV pool limits the batch as before, only the re-prefill is free."""

    @property
    def kv_capacity_tokens(self) -> int:
        """``num_gpu_blocks * block_size`` as vLLM reports it."""
        return self.num_gpu_blocks * self.block_size


class Request:
    """One generation request: a prompt, a planned output length, and the chain hashes.

    ``hashes`` holds the chain hash of every full block of ``prompt + planned output``;
    blocks beyond it (never reached) are not needed. ``tag`` is the caller's.
    """

    __slots__ = (
        "arrival",
        "batch_order",
        "cached_tokens",
        "finish_reason",
        "first_token_step",
        "free_tokens",
        "hashes",
        "lazy_since",
        "max_tokens",
        "n_hashed",
        "n_private",
        "num_computed",
        "num_output",
        "pool_hint",
        "preemptions",
        "prompt_len",
        "rid",
        "scheduled_once",
        "skip_cache_read",
        "tag",
    )

    def __init__(
        self, rid: int, *, prompt_len: int, max_tokens: int, hashes: list[int], tag: Any = None, arrival: float = 0.0
    ) -> None:
        if prompt_len < 1 or max_tokens < 1:
            raise ValueError("prompt_len and max_tokens must be at least 1")
        self.rid = rid
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.hashes = hashes
        self.tag = tag
        self.arrival = arrival
        self.num_computed = 0
        self.num_output = 0
        self.n_hashed = 0
        self.n_private = 0
        self.cached_tokens = 0
        self.preemptions = 0
        self.scheduled_once = False
        self.first_token_step = False
        self.finish_reason: str | None = None
        self.pool_hint: object = None
        """The pool's hint for this request's next seal (opaque)."""
        self.free_tokens = 0
        """Leading tokens computed before, whose prefill costs nothing (``EngineConfig.free_restore``)."""
        self.skip_cache_read = False
        """Never look up cached blocks (vLLM skips the lookup for ``prompt_logprobs``); its own blocks get cached."""
        self.batch_order = 0
        """The engine's admission count when it last joined the batch (the batch's order)."""
        self.lazy_since = 0
        """The engine's lazy decode clock when its counters were last settled (``EngineConfig.lazy_decode``)."""

    @property
    def seq_len(self) -> int:
        """Prompt plus tokens generated so far."""
        return self.prompt_len + self.num_output

    @property
    def held_blocks(self) -> int:
        """Blocks this request holds."""
        return self.n_hashed + self.n_private


@dataclass
class EngineCounters:
    """Cumulative counters with vLLM's meanings."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    """Tokens looked up in the prefix cache at first admissions (``vllm:prefix_cache_queries``)."""
    prefix_hits: int = 0
    """Of those, tokens found cached (``vllm:prefix_cache_hits``)."""
    prompt_tokens_cached: int = 0
    """Cached prompt tokens of first admissions (``vllm:prompt_tokens_cached``)."""
    preemptions: int = 0
    finished_stop: int = 0
    finished_length: int = 0
    steps: int = 0
    busy_seconds: float = 0.0
    token_step_seconds: float = 0.0
    """Each generated token's step duration, summed: over ``generation_tokens`` the token-weighted mean step, what
    ``vllm:inter_token_latency_seconds`` ``_sum / _count`` measures (but for the first tokens, which it leaves out)."""


@dataclass
class StepOutcome:
    """What one step (or one decode run) did."""

    duration: float
    steps: int
    finished: list[Request]
    first_tokens: list[Request]
    preempted: list[Request]
    generated: int
