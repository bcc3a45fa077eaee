"""``rolloutpool validate``: RolloutPool manifests checked against the API models."""

from __future__ import annotations

import sys
from typing import TextIO

import click
import yaml
from pydantic import ValidationError

from rolloutpool.api import RolloutPool

__all__ = ["validate"]


@click.command()
@click.argument("manifest", type=click.File("r"))
def validate(manifest: TextIO) -> None:
    """Check RolloutPool manifests (YAML, several documents allowed) against the API models."""
    failed = False
    for doc in yaml.safe_load_all(manifest):
        if not doc:
            continue
        name = (doc.get("metadata") or {}).get("name", "<unnamed>") if isinstance(doc, dict) else "<not a map>"
        try:
            RolloutPool.model_validate(doc)
        except ValidationError as err:
            failed = True
            click.echo(f"{name}: invalid", err=True)
            for problem in err.errors():
                where = ".".join(str(p) for p in problem["loc"])
                click.echo(f"  {where}: {problem['msg']}", err=True)
        else:
            click.echo(f"{name}: valid")
    if failed:
        sys.exit(1)
