"""Side-by-side comparison of our router against sticky least-loaded, per scenario, load and seed.

Each (scenario, load, seed) runs the same trajectories under every variant: vllm-router's sticky
least-loaded (no cap), our router (turn-level scheduling by each replica's working set,
``rolloutpool``), the same under the operator's law tuning each replica's target (``adaptive``), a
fixed session cap without turn scheduling (``fixed-cap:N``: the mechanism the working set replaced;
the best such cap in hindsight comes from ``simulate-caps``), the scheduler with other targets
(``turns:target=0.95:keep_quantile=0.8``), and a bound: sticky least-loaded on a KV pool that holds
every session in flight at maxModelLen. Nothing is evicted there, so no scheduler serves more with
that placement on the same compute (a placement may: ours co-locates GRPO groups).

The table gives each variant's throughput over sticky least-loaded's, the share of sticky
least-loaded's prefill that was re-prefill of evicted context (where scheduling should win), and the
fast loop's quarantines with the evicted re-prefill of kept prefixes they reacted to (a quarantine
with none measured fired on noise).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from rolloutpool.autoscale.law import LawParams
from rolloutpool.capacity import DEFAULT_BLOCK_SIZE
from rolloutpool.routing.policies import POLICIES
from rolloutpool.routing.workingset import WorkingSetConfig
from rolloutpool.sim.config import ADAPTIVE, FleetConfig
from rolloutpool.sim.peers import PEERS
from rolloutpool.sim.results import RunResult
from rolloutpool.sim.runner import Job, fleet_floor, run_jobs
from rolloutpool.sim.workload import Scenario, scenario

__all__ = [
    "BASELINE",
    "FREE_RESTORE",
    "NO_EVICTION",
    "OURS",
    "VARIANTS",
    "CompareRow",
    "best_fixed",
    "compare_jobs",
    "compare_rows",
    "every_session_resident",
    "load_rows",
    "rows_json",
    "rows_markdown",
    "run_compare",
    "summary_markdown",
    "variant",
]

BASELINE = "sticky-least-loaded"
NO_EVICTION = "no-eviction"
"""Sticky least-loaded where nothing is evicted: the most any cap could serve with its placement."""
FREE_RESTORE = "free-restore"
"""Sticky least-loaded on the same KV pool, where context computed before costs nothing to compute again
(``FleetConfig.free_restore``): the no-eviction bound without its extra memory."""
_SUFFIXES: dict[str, dict[str, Any]] = {
    "+free-restore": {"free_restore": True},
    "+no-groups": {"infer_groups": False, "group_hint": False},
    "+known-tools": {"known_tools": True},
    "+renew": {"renew_every_s": 2.0},
}
"""``LABEL+SUFFIX``: variant ``LABEL`` with these FleetConfig changes (engines that restore context computed before at
no cost; a router told no GRPO group and naming none by the opening prompt, as ``rolloutpool router
--no-infer-groups``; our router told each tool call's duration as it starts, a reference; our router renewing the
prefixes it keeps every 2 s, as ``rolloutpool router --renew-every 2``)."""
OURS = "rolloutpool"
"""Our router alone: turn-level scheduling with its default targets."""
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    BASELINE: (BASELINE, {}),
    OURS: ("rolloutpool", {}),
    "adaptive": (ADAPTIVE, {}),
    NO_EVICTION: (BASELINE, {}),
    FREE_RESTORE: (BASELINE, {"free_restore": True}),
}
"""Variant label -> (policy, FleetConfig changes); ``NO_EVICTION`` also gets :func:`every_session_resident`.
Also ``fixed-cap:N``, ``turns:KEY=VALUE:...``, ``law:KEY=VALUE:...``, the peers' names (``thunderagent``,
``progress-ttl``, ``continuum``, ``continuum-fixed``: :mod:`rolloutpool.sim.peers`), the other placement policies
(``consistent-hash``, ``clairvoyant``, ...) and any of them as ``LABEL+free-restore`` or ``LABEL+no-groups``
(:func:`variant`)."""


def variant(label: str) -> tuple[str, dict[str, Any]]:
    """The policy and FleetConfig changes of a variant label (pure); ValueError names what is wrong.

    ``fixed-cap:N``: our router with a fixed cap of N live sessions per replica and no turn scheduling;
    ``turns:KEY=VALUE:...``: our router with these :class:`~rolloutpool.routing.workingset.WorkingSetConfig` fields;
    ``law:KEY=VALUE:...``: our router under the operator's law with these :class:`~rolloutpool.autoscale.law.LawParams`;
    ``LABEL+free-restore``: variant ``LABEL`` on engines that restore context computed before at no cost;
    ``LABEL+no-groups``: variant ``LABEL`` with no GRPO group known or named;
    ``LABEL+known-tools``: our router in variant ``LABEL`` told each tool call's duration;
    ``LABEL+renew``: our router in variant ``LABEL`` renewing the prefixes it keeps every 2 s (suffixes combine).
    """
    if label in VARIANTS:
        return VARIANTS[label]
    for suffix, extra in _SUFFIXES.items():
        if label.endswith(suffix) and label != suffix:
            policy, changes = variant(label.removesuffix(suffix))
            return policy, {**changes, **extra}
    if label in PEERS or label in POLICIES:  # a peer's turn scheduler (sim/peers.py) or another placement policy
        return label, {}
    name, _, rest = label.partition(":")
    try:
        if name == "fixed-cap":
            cap = int(rest)
            if cap < 1:
                raise ValueError
            return "rolloutpool", {"fixed_cap": cap}
        if name in ("turns", "law"):
            values: dict[str, Any] = {k: float(v) for k, v in (part.split("=", 1) for part in rest.split(":") if part)}
            if name == "law":
                return ADAPTIVE, {"law": LawParams(**values)}
            return "rolloutpool", {"working_set": WorkingSetConfig(**values)}
    except (ValueError, TypeError) as exc:
        raise ValueError(f"variant {label!r}: {str(exc) or 'N must be a positive whole number'}") from None
    known = ", ".join(dict.fromkeys((*VARIANTS, *PEERS, *POLICIES)))
    raise ValueError(f"unknown variant {label!r}; choose from {known}, fixed-cap:N or turns:KEY=VALUE:...")


def every_session_resident(config: FleetConfig) -> FleetConfig:
    """The same fleet with KV blocks for every session in flight at maxModelLen on each replica (pure)."""
    tokens = (config.in_flight + 1) * config.scenario.max_model_len
    return replace(config, num_gpu_blocks=-(-tokens // DEFAULT_BLOCK_SIZE) + 1)


@dataclass(frozen=True)
class CompareRow:
    """One variant at one (scenario, load, seed)."""

    scenario: str
    load: float
    seed: int
    variant: str
    in_flight: int
    tokens_per_s: float
    vs_baseline: float
    baseline_evicted_share: float
    """Sticky least-loaded's re-prefilled tokens over its prefilled tokens."""
    evicted_share: float
    fast_quarantines: int
    evicted_reprefill_tokens: int
    """Live sessions' evicted context the router measured (what the fast loop should react to)."""
    law_cuts: int | None
    law_quarantines: int | None
    preemptions: int


def compare_jobs(
    base: FleetConfig,
    *,
    scenarios: Iterable[str | Scenario],
    loads: Iterable[float],
    seeds: Iterable[int],
    variants: Iterable[str],
) -> list[tuple[str, Job]]:
    """One (variant label, job) per scenario (a name or a workload file's), load, seed and variant (pure)."""
    jobs = []
    chosen = list(variants)
    for named in scenarios:
        cfg = replace(base, scenario=scenario(named) if isinstance(named, str) else named)
        floor = fleet_floor(cfg)
        for seed in seeds:
            for load in loads:
                for label in chosen:
                    policy, changes = variant(label)
                    config = replace(cfg, in_flight=max(1, round(load * floor)), seed=seed, **changes)
                    if label == NO_EVICTION:
                        config = every_session_resident(config)
                    jobs.append((label, Job(load, policy, config)))
    return jobs


def _share(r: RunResult) -> float:
    return r.reprefilled_tokens / r.prefilled_tokens if r.prefilled_tokens else 0.0


def compare_rows(results: list[tuple[str, Job, RunResult]]) -> list[CompareRow]:
    """Rows with ratios over the baseline run of the same (scenario, load, seed) (pure)."""
    base = {(r.scenario, j.load, j.config.seed): r for label, j, r in results if label == BASELINE}
    rows = []
    for label, job, r in results:
        b = base.get((r.scenario, job.load, job.config.seed))
        row = CompareRow(
            scenario=r.scenario, load=job.load, seed=job.config.seed, variant=label, in_flight=r.in_flight,
            tokens_per_s=r.tokens_per_s,
            vs_baseline=r.tokens_per_s / b.tokens_per_s if b is not None and b.tokens_per_s else float("nan"),
            baseline_evicted_share=_share(b) if b is not None else float("nan"), evicted_share=_share(r),
            fast_quarantines=r.quarantines, evicted_reprefill_tokens=r.evicted_reprefill_tokens,
            law_cuts=r.law_cuts, law_quarantines=r.law_quarantines, preemptions=r.preemptions,
        )  # fmt: skip
        rows.append(row)
    return rows


def rows_markdown(rows: list[CompareRow]) -> str:
    """A markdown table, one line per (scenario, load, seed, variant)."""
    lines = [
        "| scenario | load | seed | variant | in-flight | tok/s | / sticky LL | LL evicted % | evicted % "
        "| fast quar. | live re-prefill tok | law cuts | law quar. | preempt |",
        "|---|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.scenario} | {r.load:g}x | {r.seed} | {r.variant} | {r.in_flight} | {r.tokens_per_s:,.0f} "
            f"| {r.vs_baseline:.3f} | {100 * r.baseline_evicted_share:.1f} | {100 * r.evicted_share:.1f} "
            f"| {r.fast_quarantines} | {r.evicted_reprefill_tokens:,} | {'-' if r.law_cuts is None else r.law_cuts} "
            f"| {'-' if r.law_quarantines is None else r.law_quarantines} | {r.preemptions} |"
        )
    return "\n".join(lines) + "\n"


def run_compare(
    jobs: list[tuple[str, Job]], *, workers: int, on_done: Callable[[Job, RunResult, float], None] | None = None
) -> list[CompareRow]:
    """Run every job and compare."""
    done = run_jobs([j for _, j in jobs], workers=workers, on_done=on_done)
    return compare_rows([(label, job, result) for (label, _), (job, result, _w) in zip(jobs, done, strict=True)])


def rows_json(rows: list[CompareRow], meta: dict[str, Any]) -> str:
    """Every row and the run's settings as JSON (NaN ratios as null)."""
    out = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(r).items()} for r in rows]
    return json.dumps({"meta": meta, "rows": out}, indent=1) + "\n"


def load_rows(text: str) -> list[CompareRow]:
    """The rows `rows_json` wrote."""
    names = {f.name for f in fields(CompareRow)}
    rows = []
    for raw in json.loads(text)["rows"]:
        values: dict[str, Any] = {k: v for k, v in raw.items() if k in names}
        for key in ("vs_baseline", "baseline_evicted_share"):
            values[key] = float("nan") if values.get(key) is None else values[key]
        rows.append(CompareRow(**values))
    return rows


def best_fixed(
    runs: Iterable[tuple[str, float, int, int | None, float]],
) -> dict[tuple[str, float, int], tuple[int, float]]:
    """(scenario, load, seed) -> the best fixed cap in hindsight and its tokens/s (pure).

    ``runs`` are (scenario, load, seed, cap, tokens/s) of a ``simulate-caps`` sweep; adaptive runs (cap None) are
    left out.
    """
    best: dict[tuple[str, float, int], tuple[int, float]] = {}
    for name, load, seed, cap, tokens in runs:
        key = (name, load, seed)
        if cap is not None and (key not in best or tokens > best[key][1]):
            best[key] = (cap, tokens)
    return best


def _ratio(a: float, b: float | None) -> str:
    return "" if not b else f"{a / b:.3f}"


def _by_point(rows: Iterable[CompareRow]) -> dict[tuple[str, float, int], dict[str, CompareRow]]:
    """Rows grouped by (scenario, load, seed), then by variant label (pure)."""
    points: dict[tuple[str, float, int], dict[str, CompareRow]] = {}
    for r in rows:
        points.setdefault((r.scenario, r.load, r.seed), {})[r.variant] = r
    return points


def summary_markdown(
    rows: list[CompareRow], best: dict[tuple[str, float, int], tuple[int, float]] | None = None
) -> str:
    """One line per (scenario, load, seed), every variant over sticky least-loaded (pure).

    With ``best`` (:func:`best_fixed`), the best fixed cap in hindsight and our router over it; with ``NO_EVICTION``
    rows, the bound no scheduler passes with sticky least-loaded's placement, and ours over it. Ends with the
    fast-quarantine check: every run that quarantined measured evicted re-prefill of kept prefixes.
    """
    points = _by_point(rows)
    best = best or {}
    lines = [
        "| scenario | load | seed | sticky LL tok/s | LL evicted % | ours / LL | ours evicted % | adaptive / LL "
        "| adaptive law cuts | best fixed cap (tok/s) | best fixed / LL | no-eviction bound / LL | ours / bound "
        "| ours / best fixed |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for key, by in points.items():
        base, ours, adaptive, bound = (by.get(v) for v in (BASELINE, OURS, "adaptive", NO_EVICTION))
        if base is None:
            continue
        cap, tokens = best.get(key, (None, None))
        cells = [
            key[0], f"{key[1]:g}x", str(key[2]), f"{base.tokens_per_s:,.0f}", f"{100 * base.evicted_share:.1f}",
            "" if ours is None else f"{ours.vs_baseline:.3f}",
            "" if ours is None else f"{100 * ours.evicted_share:.1f}",
            "" if adaptive is None else f"{adaptive.vs_baseline:.3f}",
            "" if adaptive is None or adaptive.law_cuts is None else str(adaptive.law_cuts),
            "" if cap is None or tokens is None else f"{cap} ({tokens:,.0f})",
            "" if tokens is None else _ratio(tokens, base.tokens_per_s),
            "" if bound is None else f"{bound.vs_baseline:.3f}",
            "" if bound is None or ours is None else _ratio(ours.tokens_per_s, bound.tokens_per_s),
            "" if ours is None else _ratio(ours.tokens_per_s, tokens),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    noisy = [r for r in rows if r.fast_quarantines > 0 and r.evicted_reprefill_tokens == 0]
    check = (
        f"Fast quarantines without measured evicted re-prefill: {len(noisy)} of {len(rows)} runs"
        + "".join(f"; {r.scenario} {r.load:g}x seed {r.seed} {r.variant} ({r.fast_quarantines})" for r in noisy)
        + "."
    )
    return "\n".join(lines) + "\n\n" + check + "\n"


def _main(argv: list[str]) -> None:
    """``python -m rolloutpool.sim.compare COMPARE.json... [--caps SWEEP.json...]``: the summary table on stdout."""
    from pathlib import Path  # noqa: PLC0415

    split = argv.index("--caps") if "--caps" in argv else len(argv)
    unique: dict[tuple[str, float, int, str], CompareRow] = {}
    for path in argv[:split]:  # files of one sweep split by variant each hold the baseline: count it once
        for row in load_rows(Path(path).read_text()):
            unique.setdefault((row.scenario, row.load, row.seed, row.variant), row)
    rows = list(unique.values())
    runs = []
    for path in argv[split + 1 :]:
        for r in json.loads(Path(path).read_text())["runs"].values():
            runs.append((r["scenario"], r["load"], r["seed"], r["cap"], r["row"]["tokens_per_s"]))
    sys.stdout.write(summary_markdown(rows, best_fixed(runs)))


if __name__ == "__main__":
    _main(sys.argv[1:])
