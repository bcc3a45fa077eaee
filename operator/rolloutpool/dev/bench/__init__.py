"""``rolloutpool bench``: real processes on loopback, our router against vllm-router, same workload.

- :mod:`.processes` starts and stops engine-sim, our router and vllm-router as
  process groups on free 127.0.0.1 ports, with readiness waits and guaranteed cleanup;
- :mod:`.peers` builds each router configuration's command line (vllm-router at its best);
- :mod:`.client` is the RL-style asyncio driver and its re-prefill accounting;
- :mod:`.overhead` measures the added latency of each router at saturation;
- :mod:`.runner` runs one configuration after another on fresh engines;
- :mod:`.report` renders the table, JSON and markdown;
- :mod:`rolloutpool.cli.bench` is the ``bench`` click command.
"""

__all__: list[str] = []
