"""``rolloutpool localcluster kubelet``: the process kubelet in the foreground until SIGTERM/SIGINT.

``LocalCluster(kubelet=True)`` (and ``rolloutpool localcluster up --kubelet``) runs this
command as one more child process of the control plane, so a detached cluster keeps
its kubelet and ``down`` stops it (the kubelet then stops every pod process).
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

import click

__all__ = ["kubelet_command", "run_kubelet"]


def run_kubelet(
    *,
    directory: Path,
    kubeconfig: Path,
    node_name: str,
    scheduler_name: str,
    pod_subnet: str,
    gpus: int,
    backoff_base: float,
    stop: threading.Event,
    local_images: Mapping[str, Path] | None = None,
) -> None:
    """Run a :class:`ProcessKubelet` until ``stop`` is set; every pod process is stopped on the way out."""
    from rolloutpool.dev.kubelet.kubelet import ProcessKubelet  # noqa: PLC0415 - keep the CLI import light

    with ProcessKubelet(
        kubeconfig,
        directory,
        node_name=node_name,
        scheduler_name=scheduler_name,
        pod_subnet=pod_subnet,
        gpus=gpus,
        backoff_base=backoff_base,
        local_images=local_images,
    ):
        stop.wait()


def _images(values: tuple[str, ...]) -> dict[str, Path]:
    images = {}
    for value in values:
        reference, sep, directory = value.partition("=")
        if not sep or not reference or not directory:
            raise click.BadParameter(f"expected REF=DIR, got {value!r}", param_hint="--image")
        if not (Path(directory) / "image.json").is_file():
            raise click.BadParameter(f"{directory} holds no image build (image.json)", param_hint="--image")
        images[reference] = Path(directory)
    return images


@click.command("kubelet")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="The cluster's directory (its kubeconfig is read from there; pods live in <dir>/kubelet).",
)
@click.option(
    "--kubeconfig", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Default: <dir>/kubeconfig."
)
@click.option("--node-name", default="rolloutpool-local", show_default=True)
@click.option(
    "--scheduler-name", default="default-scheduler", show_default=True, help="Bind pods naming this scheduler."
)
@click.option("--pod-subnet", default="127.0.0.0/24", show_default=True, help="Loopback /24 of the pod addresses.")
@click.option("--gpus", type=click.IntRange(min=0), default=8, show_default=True, help="nvidia.com/gpu capacity.")
@click.option("--backoff-base", type=click.FloatRange(min=0.01), default=10.0, show_default=True)
@click.option(
    "--image",
    "images",
    multiple=True,
    metavar="REF=DIR",
    help="Run containers of image REF from the build in DIR (`rolloutpool image build`): a chroot into its "
    "root filesystem as the pod's user. Repeatable. Without it, our image runs from this checkout.",
)
def kubelet_command(  # noqa: PLR0917 - click passes every option as a positional parameter
    directory: Path,
    kubeconfig: Path | None,
    node_name: str,
    scheduler_name: str,
    pod_subnet: str,
    gpus: int,
    backoff_base: float,
    images: tuple[str, ...],
) -> None:
    """Run the process kubelet: a Node whose pods of our image run as local processes."""
    local_images = _images(images)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    run_kubelet(
        directory=directory / "kubelet",
        kubeconfig=kubeconfig or directory / "kubeconfig",
        node_name=node_name,
        scheduler_name=scheduler_name,
        pod_subnet=pod_subnet,
        gpus=gpus,
        backoff_base=backoff_base,
        stop=stop,
        local_images=local_images,
    )
