"""``rolloutpool demo``: the whole stack locally through a quarantine and its release."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from rolloutpool.cli.localcluster import dir_option

__all__ = ["demo"]

_console = Console()


@click.command()
@dir_option
@click.option("--once", is_flag=True, help="Exit once the quarantine has cleared instead of waiting for Ctrl-C.")
@click.option("--in-flight", type=click.IntRange(min=1), default=48, show_default=True, help="Concurrent rollouts.")
@click.option("--load-seconds", type=click.FloatRange(min=5), default=90, show_default=True, help="Length of the load.")
def demo(directory: Path, once: bool, in_flight: int, load_seconds: float) -> None:
    """Run the whole stack locally (chart, operator, simulated pool, load) through a quarantine and its release."""
    from rolloutpool.dev.demo import run_demo  # noqa: PLC0415

    run_demo(directory=directory, once=once, console=_console, in_flight=in_flight, load_seconds=load_seconds)
