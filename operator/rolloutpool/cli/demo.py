"""``rolloutpool demo``: the whole stack locally, RolloutPool beside sticky least-loaded under the same load."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from rolloutpool.cli.localcluster import dir_option

__all__ = ["demo"]

_console = Console()


@click.command()
@dir_option
@click.option(
    "--once",
    is_flag=True,
    help="Exit after the load (and the release of any quarantine) instead of waiting for Ctrl-C.",
)
@click.option("--in-flight", type=click.IntRange(min=1), default=96, show_default=True, help="Concurrent rollouts.")
@click.option("--load-seconds", type=click.FloatRange(min=5), default=90, show_default=True, help="Length of the load.")
@click.option(
    "--time-scale",
    type=click.FloatRange(min=1),
    default=5,
    show_default=True,
    help="Simulated seconds per wall second of every engine-sim (lower it when the engines lag: see the summary).",
)
def demo(directory: Path, once: bool, in_flight: int, load_seconds: float, time_scale: float) -> None:
    """Run the stack locally (chart, operator, simulated pool) beside sticky least-loaded, under the same load."""
    from rolloutpool.dev.demo import run_demo  # noqa: PLC0415

    run_demo(
        directory=directory,
        once=once,
        console=_console,
        in_flight=in_flight,
        load_seconds=load_seconds,
        time_scale=time_scale,
    )
