"""The engine model: vLLM's KV blocks, prefix cache, scheduler and cost model, pure and in virtual time."""

__all__: list[str] = []
