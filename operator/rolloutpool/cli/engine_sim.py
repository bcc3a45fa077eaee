"""``rolloutpool engine-sim``: the vLLM-compatible engine simulator's HTTP server."""

from __future__ import annotations

import click

__all__ = ["engine_sim"]


@click.command("engine-sim")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(min=0, max=65535), default=8000, show_default=True)
@click.option("--model", default="Qwen/Qwen3-8B", show_default=True, help="Served model name.")
@click.option("--max-model-len", type=click.IntRange(min=16), default=32768, show_default=True)
@click.option("--hardware", type=click.Choice(["h100-80gb", "h200-141gb"]), default="h100-80gb", show_default=True)
@click.option("--num-gpu-blocks", type=click.IntRange(min=2), default=None, help="KV pool size (default: preset's).")
@click.option("--kv-capacity-tokens", type=click.IntRange(min=32), default=None, help="KV pool size in tokens.")
@click.option("--block-size", type=click.IntRange(min=1), default=16, show_default=True, help="Tokens per KV block.")
@click.option(
    "--enable-prefix-caching/--no-enable-prefix-caching", default=True, show_default=True, help="As vLLM's flag."
)
@click.option(
    "--enable-prompt-tokens-details/--no-enable-prompt-tokens-details",
    default=True,
    show_default=True,
    help="Report usage.prompt_tokens_details (vLLM's default is off; the simulator's on).",
)
@click.option(
    "--prefill-cost-scale",
    type=click.FloatRange(min=0.01, max=100.0),
    default=1.0,
    show_default=True,
    help="Multiply what prefill tokens cost in the --hardware preset (0.5 halves, 2.0 doubles).",
)
@click.option(
    "--max-num-seqs", type=click.IntRange(min=1), default=1024, show_default=True,
    help="As vLLM's flag; its default on H100/H200-class GPUs.",
)  # fmt: skip
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=8192, show_default=True)
@click.option("--time-scale", type=click.FloatRange(min=0.001), default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--fault-latency-ms", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--fault-error-rate", type=click.FloatRange(min=0, max=1), default=0.0, show_default=True)
@click.option("--fault-hang-rate", type=click.FloatRange(min=0, max=1), default=0.0, show_default=True)
@click.option(
    "--kv-events-config",
    default=None,
    metavar="JSON",
    help="vLLM's flag: publish KV events over ZMQ in vLLM's wire format, e.g. "
    '\'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}\'. Off by default.',
)
@click.option(
    "--continuum",
    type=click.Choice(["paper", "fixed"]),
    default=None,
    hidden=True,
    help="Continuum's TTL pinning (a peer, for comparisons; docs/peers.md).",
)
def engine_sim(
    host: str,
    port: int,
    model: str,
    max_model_len: int,
    hardware: str,
    prefill_cost_scale: float,
    num_gpu_blocks: int | None,
    kv_capacity_tokens: int | None,
    block_size: int,
    enable_prefix_caching: bool,
    enable_prompt_tokens_details: bool,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    time_scale: float,
    seed: int,
    fault_latency_ms: float,
    fault_error_rate: float,
    fault_hang_rate: float,
    kv_events_config: str | None,
    continuum: str | None,
) -> None:
    """Serve a vLLM-compatible engine simulator (KV cache, scheduler, /metrics) on the CPU."""
    from rolloutpool.api.kv_events import KVEventsConfig  # noqa: PLC0415
    from rolloutpool.engine.server.app import ServerConfig, run_server  # noqa: PLC0415

    if kv_capacity_tokens is not None:
        if num_gpu_blocks is not None:
            raise click.UsageError("give --num-gpu-blocks or --kv-capacity-tokens, not both")
        num_gpu_blocks = kv_capacity_tokens // block_size
    try:
        config = ServerConfig(
            host=host,
            port=port,
            model=model,
            max_model_len=max_model_len,
            hardware=hardware,
            prefill_cost_scale=prefill_cost_scale,
            num_gpu_blocks=num_gpu_blocks,
            block_size=block_size,
            enable_prefix_caching=enable_prefix_caching,
            prompt_tokens_details=enable_prompt_tokens_details,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            time_scale=time_scale,
            seed=seed,
            added_latency_ms=fault_latency_ms,
            error_rate=fault_error_rate,
            hang_rate=fault_hang_rate,
            kv_events=None if kv_events_config is None else KVEventsConfig.parse(kv_events_config),
            continuum=continuum,
        )
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    run_server(config)
