"""``rolloutpool localcluster``: a real control plane on loopback (up, down, env, and its kubelet)."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from rolloutpool.cli.kubelet import kubelet_command

__all__ = ["DEFAULT_CLUSTER_DIR", "dir_option", "localcluster"]

_console = Console()
DEFAULT_CLUSTER_DIR = Path.home() / ".cache" / "rolloutpool" / "clusters" / "default"


@click.group()
def localcluster() -> None:
    """A real Kubernetes control plane (etcd, kube-apiserver, controller-manager) on loopback."""


dir_option = click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_CLUSTER_DIR,
    show_default=True,
    help="Where the cluster keeps its state, certificates and logs.",
)


@localcluster.command("up")
@dir_option
@click.option("--kubelet", is_flag=True, help="Also run the process kubelet (pods of our image run as processes).")
def localcluster_up(directory: Path, kubelet: bool) -> None:
    """Build (once) and start the control plane in the background."""
    from rolloutpool.dev.localcluster.cluster import LocalCluster  # noqa: PLC0415 - keep `plan` fast

    cluster = LocalCluster(directory, detach=True, log=_console.log, kubelet=kubelet).start()
    click.echo(f"export KUBECONFIG={cluster.kubeconfig}")
    click.echo(f"export PATH={cluster.binaries.kubectl.parent}:$PATH")


localcluster.add_command(kubelet_command)


@localcluster.command("down")
@dir_option
def localcluster_down(directory: Path) -> None:
    """Stop a control plane started with `up`."""
    from rolloutpool.dev.localcluster.cluster import stop_recorded  # noqa: PLC0415

    stopped = stop_recorded(directory)
    click.echo(f"Stopped {', '.join(stopped)}" if stopped else f"No running cluster recorded in {directory}")


@localcluster.command("env")
@dir_option
def localcluster_env(directory: Path) -> None:
    """Print shell exports for kubectl and helm against the running control plane."""
    from rolloutpool.dev.localcluster.build import cache_root  # noqa: PLC0415

    if not (directory / "pids.json").exists():
        raise click.ClickException(f"no running cluster in {directory}; run `rolloutpool localcluster up`")
    click.echo(f"export KUBECONFIG={directory / 'kubeconfig'}")
    click.echo(f"export PATH={cache_root() / 'bin'}:$PATH")
