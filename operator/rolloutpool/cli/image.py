"""``rolloutpool image build``: the project's image from the ``Dockerfile``, without a Docker engine.

Runs ``buildah bud`` on a base made from Debian packages, once per machine and content
(``rolloutpool.dev.image.build``), and with ``--archive`` writes it as an ``oci-archive`` for a
cluster that cannot pull from your registry (``podman load -i``, ``skopeo copy``, ``ctr images import``).
"""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["image"]


@click.group("image")
def image() -> None:
    """The operator/router/engine-sim image, built here from the Dockerfile (buildah, no Docker engine)."""


@image.command("build")
@click.option(
    "--archive",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the image to this file as an oci-archive (for air-gapped clusters).",
)
@click.option(
    "--name",
    default=None,
    metavar="REF",
    help="The reference recorded in the archive, e.g. registry.example.com/ml/rolloutpool:0.1.0 "
    "(default: the local one, localhost/rolloutpool:<version>-<key>).",
)
def build_command(archive: Path | None, name: str | None) -> None:
    """Build the image (or reuse this machine's build of the same content); print where it is and its size."""
    from rolloutpool.dev.image.build import (  # noqa: PLC0415 - keep the CLI import light
        ImageBuildError,
        buildah_unavailable,
        ensure_image,
        write_archive,
    )

    reason = buildah_unavailable()
    if reason is not None:
        raise click.ClickException(f"cannot build the image here: {reason}")
    try:
        built = ensure_image(log=click.echo)
    except ImageBuildError as err:
        raise click.ClickException(str(err)) from err
    click.echo(f"Image {built.reference}: {built.size_bytes / 1e6:.0f} MB uncompressed, root filesystem {built.rootfs}")
    if archive is not None:
        path = write_archive(built, archive, name=name)
        click.echo(f"Wrote {path} ({path.stat().st_size / 1e6:.0f} MB) as {name or built.reference}")
