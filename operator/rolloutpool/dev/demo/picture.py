"""The demo's picture: both sides on one time axis, read at a glance.

Three panels: generated tokens per simulated second (both sides), tokens re-prefilled so far
(both sides), and the turns our router held for room, shaded where a replica was quarantined.
The title carries the totals and their ratio.
"""

from __future__ import annotations

from pathlib import Path

from rolloutpool.dev.demo.figures import Side, SideSummary, cumulative, ratio_text, throughput

__all__ = ["draw"]

OURS_COLOUR = "#1f5fbf"
PEER_COLOUR = "#e07b00"


def _tokens(value: float, _: object) -> str:
    return f"{value / 1e6:g} M" if abs(value) >= 1e6 else f"{value:,.0f}"


def _smooth(values: list[float], width: int = 3) -> list[float]:
    out = []
    for i in range(len(values)):
        window = values[max(0, i - width + 1) : i + 1]
        out.append(sum(window) / len(window))
    return out


def draw(
    ours: Side,
    peer: Side,
    summaries: tuple[SideSummary, SideSummary],
    *,
    time_scale: float,
    replicas: int,
    out: Path,
) -> Path:
    """Write the picture to ``out`` (PNG) and return it."""
    import matplotlib  # noqa: PLC0415 - plotting only when the demo ends

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import FuncFormatter  # noqa: PLC0415

    s_ours, s_peer = summaries
    end = max([p.t for p in ours.points + peer.points] or [1.0])
    fig, (rate, reprefill, held) = plt.subplots(
        3, 1, figsize=(10, 8), sharex=True, gridspec_kw={"height_ratios": [3, 3, 2]}
    )
    for side, summary, colour in ((peer, s_peer, PEER_COLOUR), (ours, s_ours, OURS_COLOUR)):
        ts, rates = throughput(side.points, time_scale=time_scale)
        rate.plot(ts, _smooth(rates), color=colour, lw=2, label=f"{summary.label}: {summary.tokens_per_s:,.0f} tok/s")
        ts, totals = cumulative(side.turns, until=end)
        reprefill.step(ts, totals, where="post", color=colour, lw=2, label=f"{summary.label}: {summary.reprefilled:,}")
    rate.set_ylabel("generated tokens/s\n(simulated time)")
    rate.set_ylim(bottom=0)
    rate.legend(loc="lower right", fontsize=9)
    reprefill.set_ylabel("tokens re-prefilled\n(evicted prefixes, so far)")
    reprefill.set_ylim(bottom=0)
    reprefill.yaxis.set_major_formatter(FuncFormatter(_tokens))
    reprefill.legend(loc="upper left", fontsize=9)

    points = [p for p in ours.points if p.router is not None]
    ts = [p.t for p in points]
    values = [p.router.held for p in points if p.router is not None]
    quarantined = [p.router.quarantined > 0 for p in points if p.router is not None]
    top = max([*values, 1])
    held.fill_between(
        ts, 0, [top * 1.1 if q else 0 for q in quarantined], step="post", color="red", alpha=0.15, lw=0,
        label=f"a replica quarantined ({s_ours.quarantine_s or 0:.0f} s)",
    )  # fmt: skip
    held.step(
        ts, values, where="post", color=OURS_COLOUR, lw=2,
        label=f"{s_ours.label}: turns held for room ({s_ours.held_total or 0:,} in all, {s_ours.moved or 0} moved)",
    )  # fmt: skip
    held.set_ylabel("turns paused\nnow")
    held.set_ylim(0, top * 1.6)
    held.legend(loc="upper left", fontsize=8, ncols=2)
    held.set_title(
        f"{s_peer.label} pauses no turn: each goes to its engine at once, which evicts "
        f"({s_peer.preemptions:,} preemptions vs {s_ours.preemptions:,})",
        fontsize=8, color=PEER_COLOUR, loc="right",
    )  # fmt: skip
    held.set_xlabel(
        f"wall seconds since the load began (the engines run {time_scale:g}x faster than wall time; "
        f"CPU short, they lagged {s_peer.lag_pct:.0f} % / {s_ours.lag_pct:.0f} % behind it)"
    )
    fig.suptitle(
        f"The same rollouts on {replicas} simulated replicas each: {s_ours.label} vs {s_peer.label}\n"
        f"generated {ratio_text(s_ours.generated, s_peer.generated)} the tokens "
        f"({s_ours.generated:,} vs {s_peer.generated:,}), "
        f"re-prefilled {ratio_text(s_ours.reprefilled, s_peer.reprefilled)} "
        f"({s_ours.reprefilled:,} vs {s_peer.reprefilled:,})",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
