"""The engine simulator's HTTP server: vLLM's OpenAI API, /metrics and RL endpoints over the engine model."""

__all__: list[str] = []
