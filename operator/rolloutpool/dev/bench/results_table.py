"""The results table docs/benchmarks.md opens with, generated from the runs' JSON (never edited by hand).

Inputs are what the project's commands write: ``rolloutpool simulate-compare --json`` (one file per
prefill-cost scale; its ``meta`` names the scale) and ``rolloutpool bench --json`` (real processes).
The output is Markdown: first the few figures a user reads first (:func:`glance_table`); then, per
prefill-cost scale, scenario and load, our router alone and under the operator's law against sticky
least-loaded, each peer that ran and the best of them, the clairvoyant reference, the no-eviction
bound, and which acceptance criteria ours misses there; then the real-process runs. ``--write FILE``
replaces the block between ``<!-- results:begin -->`` and ``<!-- results:end -->`` in FILE.

``python -m rolloutpool.dev.bench.results_table --sim a.json --sim b.json --bench c.json --write docs/benchmarks.md``
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["PEERS", "bench_commands", "bench_table", "glance_table", "main", "misses", "replace_block", "sim_table"]

BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
BASELINE, OURS, ADAPTIVE, BOUND = "sticky-least-loaded", "rolloutpool", "adaptive", "no-eviction"
CLAIRVOYANT = "clairvoyant"
PEERS = ("thunderagent", "progress-ttl", "continuum", "continuum-fixed", "consistent-hash", "vllm-program")
"""Peer variants the table names when a run has them."""

Key = tuple[str, float]


def _ratio(value: float | None) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.3f}"


def _by_point(rows: Iterable[Mapping[str, Any]]) -> dict[Key, dict[str, list[Mapping[str, Any]]]]:
    points: dict[Key, dict[str, list[Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        points[(str(row["scenario"]), float(row["load"]))][str(row["variant"])].append(row)
    return points


def _mean(rows: list[Mapping[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if r.get(key) is not None and not math.isnan(float(r[key]))]
    return sum(values) / len(values) if values else None


def misses(
    *,
    ours: float | None,
    evicted: float | None,
    best_peer: float | None,
    clairvoyant: float | None,
    bound: float | None,
) -> list[str]:
    """Which of issue 26's simulated acceptance criteria our router alone misses at one point (pure).

    ``>= sLL``: at least sticky least-loaded (as printed, 3 decimals); ``>= 0.99 peer``: at least 0.99x the best
    peer; ``>= 1.3x``: where sticky least-loaded evicts over 10 % of its prefill, 1.3x it, or within 3 % of the
    no-eviction bound where that bound is lower; ``~ clairvoyant``: within 3 % of the clairvoyant reference or above.
    """  # fmt: skip
    if ours is None:
        return []
    ours = round(ours, 3)  # as printed
    out = []
    if ours < 1.0:
        out.append(">= sLL")
    if best_peer is not None and ours / best_peer < 0.99:
        out.append(">= 0.99 peer")
    if evicted is not None and evicted > 0.10 and ours < 1.3 and not (bound is not None and bound < 1.3
                                                                       and ours >= 0.97 * bound):  # fmt: skip
        out.append(">= 1.3x")
    if clairvoyant is not None and ours < 0.97 * clairvoyant:
        out.append("~ clairvoyant")
    return out


def _by_seed(rows: list[Mapping[str, Any]], key: str) -> dict[int, float]:
    return {int(r["seed"]): float(r[key]) for r in rows if r.get(key) is not None and not math.isnan(float(r[key]))}


def _point_misses(point: Mapping[str, list[Mapping[str, Any]]], peer_names: Sequence[str]) -> list[str]:
    """The criteria ours misses at any seed of the point, each seed judged against that seed's peers, clairvoyant run
    and bound; a seed whose bound did not run is judged against the mean bound of the seeds that did (peers and the
    clairvoyant reference are only compared on the seeds they ran)."""
    ours = _by_seed(point.get(OURS, []), "vs_baseline")
    evicted = _by_seed(point.get(BASELINE, []), "baseline_evicted_share")
    peers = {name: _by_seed(point.get(name, []), "vs_baseline") for name in peer_names}
    oracle = _by_seed(point.get(CLAIRVOYANT, []), "vs_baseline")
    bound = _by_seed(point.get(BOUND, []), "vs_baseline")
    mean_bound = sum(bound.values()) / len(bound) if bound else None
    found: dict[str, None] = {}
    for seed, value in sorted(ours.items()):
        best = max((p[seed] for p in peers.values() if seed in p), default=None)
        for miss in misses(ours=value, evicted=evicted.get(seed), best_peer=best, clairvoyant=oracle.get(seed),
                           bound=bound.get(seed, mean_bound)):  # fmt: skip
            found[miss] = None
    return list(found)


def _versus_best(
    point: Mapping[str, list[Mapping[str, Any]]], peer_names: Sequence[str]
) -> tuple[dict[str, float], str | None, float | None]:
    """Each peer's mean ratio at a point, the best of them, and ours over it on the seeds both ran (pure)."""
    ours = _by_seed(point.get(OURS, []), "vs_baseline")
    peers = {name: _by_seed(point.get(name, []), "vs_baseline") for name in peer_names}
    known = {n: sum(v.values()) / len(v) for n, v in peers.items() if v}
    best = max(known, key=lambda n: known[n]) if known else None
    common = [seed for seed in ours if best is not None and seed in peers[best]]
    versus = (sum(ours[x] for x in common) / sum(peers[best][x] for x in common)) if best and common else None
    return known, best, versus


def _scale_table(main: dict[Key, dict[str, list[Mapping[str, Any]]]]) -> str:
    peer_names = sorted({v for point in main.values() for v in point if v in PEERS})
    clairvoyant = any(CLAIRVOYANT in point for point in main.values())
    seeds = any(len(point.get(OURS, [])) > 1 for point in main.values())
    head = ["scenario", "load", "seeds", "sLL evicted %", "ours"]
    head += ["ours, worst seed"] if seeds else []
    head += ["ours + operator", *peer_names, "best peer", "ours / best peer"]
    head += ["clairvoyant"] if clairvoyant else []
    head += ["no-eviction bound", "ours misses"]
    rule = ["---" if name in ("scenario", "best peer", "ours misses") else "--:" for name in head]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(rule) + "|"]
    for (scenario, load), point in sorted(main.items()):
        base = point.get(BASELINE, [])
        evicted = _mean(base, "baseline_evicted_share")
        ours = _by_seed(point.get(OURS, []), "vs_baseline")
        known, best, versus = _versus_best(point, peer_names)
        cells = [scenario, f"{load:g}x", str(len({r["seed"] for r in base})),
                 "-" if evicted is None else f"{100 * evicted:.0f}",
                 _ratio(sum(ours.values()) / len(ours) if ours else None)]  # fmt: skip
        cells += [_ratio(min(ours.values()) if ours else None)] if seeds else []
        cells.append(_ratio(_mean(point.get(ADAPTIVE, []), "vs_baseline")))
        cells += [_ratio(known.get(n)) for n in peer_names]
        cells += [best or "-", _ratio(versus)]
        cells += [_ratio(_mean(point.get(CLAIRVOYANT, []), "vs_baseline"))] if clairvoyant else []
        cells.append(_ratio(_mean(point.get(BOUND, []), "vs_baseline")))
        cells.append(", ".join(_point_misses(point, peer_names)) or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def sim_table(runs: Mapping[float, list[Mapping[str, Any]]]) -> str:
    """Markdown: per prefill-cost scale (x1 first) one line per scenario and load; ``runs`` maps a scale to its
    compare rows (pure).

    Ratios are throughput over sticky least-loaded's on the same trajectories, the mean over the seeds that ran;
    "ours / best peer" over the seeds both ran; "ours misses" names a criterion missed at any seed (each seed judged
    against its own peers and bounds).
    """
    scales = sorted(runs, key=lambda s: (s != 1.0, s))
    sections = []
    for scale in scales:
        title = "" if len(scales) == 1 else f"#### Prefill cost x{scale:g}\n\n"
        sections.append(title + _scale_table(_by_point(runs[scale])))
    return "\n".join(sections)


def glance_table(runs: Mapping[float, list[Mapping[str, Any]]], documents: Sequence[Mapping[str, Any]]) -> str:
    """Markdown of the few figures a user reads first (pure): the simulated ones (:func:`_glance_sim`), then the real
    processes' at the published prefill price, ours over vllm-router's sticky least-loaded per context scale and
    measured window (medians of the runs combined)."""
    real: dict[tuple[float, float], dict[float, float]] = defaultdict(dict)
    for document in documents:
        for row, config in _rows(document):
            if row["router"] != OURS or float(config.get("prefill_cost_scale", 1.0)) != 1.0 or row.get("ratio") is None:
                continue
            key = (float(config.get("context_scale", 0.0)), float(config.get("duration_s", 0.0)))
            real[key][float(row["load"])] = float(row["ratio"])
    sim = _glance_sim(runs)
    if not real:
        return sim
    loads = sorted({load for by_load in real.values() for load in by_load})
    lines = ["| context scale | window s | " + " | ".join(f"ours / vllm-router sLL, {x:g}x" for x in loads) + " |",
             "|--:|--:|" + "--:|" * len(loads)]  # fmt: skip
    for (scale, window), by_load in sorted(real.items()):
        lines.append(f"| {scale:g} | {window:g} | " + " | ".join(_ratio(by_load.get(x)) for x in loads) + " |")
    return sim + "\n" + "\n".join(lines) + "\n"


def _glance_sim(runs: Mapping[float, list[Mapping[str, Any]]]) -> str:
    """Per scenario: ours over sticky least-loaded at each load (the mean over seeds) and over the best peer at 3x and
    4x, at the published prefill price; then ours at 3x and 4x with prefill halved and doubled (pure)."""
    main = _by_point(runs.get(1.0, []))
    others = {scale: _by_point(rows) for scale, rows in sorted(runs.items()) if scale != 1.0}
    loads = sorted({load for _, load in main})
    pressured = [load for load in loads if load >= 3]
    peer_names = sorted({v for point in main.values() for v in point if v in PEERS})
    head = [f"ours / sLL, {load:g}x" for load in loads]
    head += [f"ours / best peer, {load:g}x" for load in pressured] if peer_names else []
    head += [f"{load:g}x, prefill x{scale:g}" for scale in others for load in pressured]
    lines = ["| scenario | " + " | ".join(head) + " |", "|---|" + "--:|" * len(head)]

    def ours(point: Mapping[str, list[Mapping[str, Any]]] | None) -> str:
        return _ratio(None if point is None else _mean(point.get(OURS, []), "vs_baseline"))

    for name in sorted({scenario for scenario, _ in main}):
        cells = [ours(main.get((name, load))) for load in loads]
        if peer_names:
            cells += [_ratio(_versus_best(main.get((name, load), {}), peer_names)[2]) for load in pressured]
        cells += [ours(points.get((name, load))) for points in others.values() for load in pressured]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _rows(document: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    """A bench document's rows, each with its point's configuration ({} for a document made without), by scenario
    and load, each point's routers in their order (pure): combined runs of different loads list their points in the
    order the runs were given."""
    configs = {(str(p.get("scenario")), float(p.get("load", 0))): p.get("config") or {}
               for p in document.get("points") or []}  # fmt: skip
    rows: list[Mapping[str, Any]] = document.get("rows", document.get("ratios")) or []
    ordered = sorted(rows, key=lambda row: (str(row["scenario"]), float(row["load"])))
    return [(row, configs.get((str(row["scenario"]), float(row["load"])), {})) for row in ordered]


def bench_table(documents: Sequence[Mapping[str, Any]]) -> str:
    """Markdown of real-process sweeps (``rolloutpool bench`` with several ``--load``: its ``bench.json``, or the
    ``combined.json`` of ``bench --combine`` over repeated runs) (pure).

    Per scenario, context scale, prefill cost (the engine-sims' ``--prefill-cost-scale``), KV events (our router
    subscribed or not), measured window (wall seconds, ``--duration``), load and router: generated tokens/s, the
    ratio over vllm-router sticky least-loaded the bench computed, and the share of prefilled tokens that were
    re-prefill of evicted context; for repeated runs, the median of each figure and every run's own ratio. Rows
    go by scenario and load.
    """
    lines = [
        "| scenario | context scale | prefill cost | KV events | window s | load | router | generated tok/s "
        "| / vllm-router sticky least-loaded | ratio per run | re-prefilled % |",
        "|---|--:|--:|---|--:|--:|---|--:|--:|--:|--:|",
    ]
    for document in documents:
        for row, config in _rows(document):
            rate = row.get("tokens_per_s")
            pct = row.get("evicted_pct")
            scale = config.get("context_scale")
            price = "-" if not config else f"x{float(config.get('prefill_cost_scale', 1.0)):g}"
            events = "-" if not config else "on" if config.get("kv_events") else "off"  # absent: made before the flag
            window = config.get("duration_s")
            each = row.get("ratios")
            lines.append(
                f"| {row['scenario']} | {'-' if scale is None else f'{float(scale):g}'} | {price} | {events} | "
                f"{'-' if window is None else f'{float(window):g}'} | "
                f"{float(row['load']):g}x | {row['router']} | "
                f"{'-' if rate is None else f'{rate:,.0f}'} | {_ratio(row.get('ratio'))} | "
                f"{'-' if not each else ' / '.join(_ratio(r) for r in each)} | "
                f"{'-' if pct is None else f'{pct:.0f}'} |"
            )
    return "\n".join(lines) + "\n"


def bench_commands(document: Mapping[str, Any]) -> list[str]:
    """Markdown list items of the commands behind a bench document: its own, or each repeated run's (pure)."""
    commands = document.get("commands")
    if not commands:
        return [f"- `{document.get('command', '?')}`"]
    n = len(commands)
    note = "the table gives each point's median"
    return [f"- `{c}` (combined run {i} of {n}; {note})" for i, c in enumerate(commands, 1)]


def first_rows(
    rows: Iterable[Mapping[str, Any]], *, scale: float, seen: set[tuple[float, str, float, int, str]]
) -> list[Mapping[str, Any]]:
    """The rows of a (prefill scale, scenario, load, seed, variant) not in ``seen``, which they join (pure but for
    ``seen``): given first, a later run of some variants replaces those of an earlier, complete one."""
    kept = []
    for row in rows:
        key = (scale, str(row["scenario"]), float(row["load"]), int(row["seed"]), str(row["variant"]))
        if key not in seen:
            seen.add(key)
            kept.append(row)
    return kept


def replace_block(text: str, block: str) -> str:
    """``text`` with the generated block between the markers replaced (pure); raises when they are missing."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the file has no {BEGIN} ... {END} block to replace")
    return text[: start + len(BEGIN)] + "\n" + block + text[end:]


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: read the JSON, print (or write) the block."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--sim",
        type=Path,
        action="append",
        default=[],
        help="simulate-compare --json output; a variant's row read from an earlier --sim wins over a later one's",
    )
    parser.add_argument("--bench", type=Path, action="append", default=[], help="a multi-load bench's bench.json")
    parser.add_argument("--write", type=Path, default=None)
    args = parser.parse_args(argv)
    runs: dict[float, list[Mapping[str, Any]]] = defaultdict(list)
    notes = []
    seen: set[tuple[float, str, float, int, str]] = set()
    for path in args.sim:  # in order: a row of a (scenario, load, seed, variant) already read is skipped
        data = json.loads(path.read_text())
        scale = float(data["meta"].get("prefill_cost_scale", 1.0))
        runs[scale] += first_rows(data["rows"], scale=scale, seen=seen)
        meta = data["meta"]
        notes.append(f"`{path.name}`: {meta.get('replicas')} replicas, {meta.get('duration_s'):g} simulated s, "
                     f"prefill cost x{scale:g}")  # fmt: skip
    documents = [json.loads(p.read_text()) for p in args.bench]
    block = "### At a glance\n\n" + glance_table(runs, documents) + "\n"
    block += "### Simulated (fleet simulator, calibrated H100 cost model)\n\n" + sim_table(runs) + "\n"
    block += "".join(f"- {n}\n" for n in notes)
    if args.bench:
        block += "\n### Real processes (`rolloutpool bench`, four engine-sims)\n\n" + bench_table(documents)
        block += "\n" + "".join(f"{line}\n" for d in documents for line in bench_commands(d))
    if args.write is None:
        print(block)
    else:
        args.write.write_text(replace_block(args.write.read_text(), block))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
