"""``rolloutpool demo``: the stack on one machine, RolloutPool beside sticky least-loaded under the same load.

:mod:`.run` drives it, :mod:`.peer` starts the sticky least-loaded side, :mod:`.scrape` reads
both sides, :mod:`.figures` turns the samples into totals (pure) and :mod:`.picture` draws them.
"""

from rolloutpool.dev.demo.run import POOL, DemoPhases, demo_pool, examples_dir, pool_table, run_demo, summary_table

__all__ = ["POOL", "DemoPhases", "demo_pool", "examples_dir", "pool_table", "run_demo", "summary_table"]
