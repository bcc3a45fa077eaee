"""``rolloutpool crd``: the RolloutPool CRD generated from the API models."""

from __future__ import annotations

from pathlib import Path

import click

from rolloutpool.api.crd import render_crd

__all__ = ["crd"]


@click.command()
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), default=None)
def crd(output: Path | None) -> None:
    """Print (or write) the RolloutPool CRD generated from the API models."""
    text = render_crd()
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text)
        click.echo(f"Wrote {output}")
