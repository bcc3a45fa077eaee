"""Residency from KV events matches the cached_tokens each returning turn reports, on a real vLLM (issue 26).

A tiny real vLLM 0.32 (CPU build, block size 32, a 72-block KV pool) publishes KV events
(``--kv-events-config`` with a replay socket); then ``rolloutpool engine-sim`` with the same
limits and the same flag. On each, the router's subscriber keeps a residency index while 8
token-id sessions take 6 turns each, one at a time in shuffled rounds, their contexts growing
past the pool so returning turns find their prefixes evicted, wholly or in part. Each session's
id travels one of the four ways vLLM reads it. Before every turn the index's resident tokens for
the session, capped by vLLM's rule (no hit past ``(prompt_len - 1)`` in whole blocks), must equal
the ``cached_tokens`` the turn then reports. Both streams must decode with the same structs and
carry the same fields. ``python -m rolloutpool.dev.bench.kv_residency`` prints the counts.
Skipped only without the vLLM cache outside CI (``bash .ci/dev vllm`` installs it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rolloutpool.dev.bench.kv_residency import (
    ResidencyReport,
    check_engine,
    engine_sim_publishing,
    same_traces,
    summary,
    vllm_publishing,
)
from rolloutpool.dev.localcluster.vllm_env import vllm_env

if not vllm_env().ready() and os.environ.get("CI") != "true":
    pytest.skip(f"vLLM is not installed at {vllm_env().venv} (bash .ci/dev vllm)", allow_module_level=True)

SESSIONS = {f"kv-{i}" for i in range(8)} | {"kv-reset"}


def _assert_exact(report: ResidencyReport) -> None:
    assert len(report.returning) == 8 * 5
    assert report.mismatches == []
    assert report.evicted >= 8  # the pool was outgrown: returning prefixes were evicted
    assert sum(t.cached > 0 for t in report.returning) >= 4  # and others were still there to hit
    assert report.gaps == 0
    assert report.malformed == 0
    assert report.stats.unknown_removals == 0
    assert report.stats.reliable
    assert report.after_reset == [0] * 8  # AllBlocksCleared: nothing of theirs is left


async def test_residency_from_kv_events_predicts_cached_tokens_on_vllm_and_engine_sim(tmp_path: Path) -> None:
    with vllm_publishing(tmp_path) as (url, source):
        real = await check_engine(url, source, quiet_s=0.5)
    print(summary("vLLM 0.32", real))  # the counts, in the test log
    with engine_sim_publishing(tmp_path) as (url, source):
        sim = await check_engine(url, source, quiet_s=0.2)
    print(summary("engine-sim", sim))
    print(f"turn-by-turn cached_tokens identical: {same_traces(real, sim)}")  # eviction fidelity, not asserted
    _assert_exact(real)
    _assert_exact(sim)
    assert real.shape.fields == sim.shape.fields  # same event types, same field names on the wire
    assert set(real.shape.fields) == {"BlockStored", "BlockRemoved", "AllBlocksCleared"}
    for name in ("batch_lengths", "topics", "mediums", "hash_types", "removed_per_event", "sessions"):
        assert getattr(real.shape, name) == getattr(sim.shape, name), name
    assert real.shape.sessions == SESSIONS  # every carrier of the session id reached the events
    assert real.shape.seqs == list(range(len(real.shape.seqs)))
    assert sim.shape.seqs == list(range(len(sim.shape.seqs)))
