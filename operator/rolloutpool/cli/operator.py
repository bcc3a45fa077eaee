"""``rolloutpool operator``: run the kopf operator that reconciles RolloutPools."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import click

__all__ = ["operator_command"]


@click.command("operator")
@click.option(
    "--namespace",
    "-n",
    "namespaces",
    multiple=True,
    help="Namespace to serve (repeatable, exact names). Default: $POD_NAMESPACE, then the kubeconfig's.",
)
@click.option("--all-namespaces", "-A", is_flag=True, help="Serve RolloutPools in every namespace.")
@click.option("--liveness-port", type=click.IntRange(min=0, max=65535), default=8081, show_default=True)
@click.option("--liveness-host", default="0.0.0.0", show_default=True, help="Address of the /healthz endpoint.")  # noqa: S104
@click.option(
    "--standalone/--peering",
    default=True,
    show_default=True,
    help="Run without kopf peering (one operator replica) or coordinate with peers.",
)
@click.option(
    "--kubeconfig",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Kubeconfig file; default: $KUBECONFIG, then the in-cluster service account.",
)
@click.option("--status-interval", type=click.FloatRange(min=0.5), default=5.0, show_default=True)
@click.option("--verbose", "-v", is_flag=True, help="Debug logging.")
def operator_command(  # noqa: PLR0917 - click passes every option as a positional parameter
    namespaces: tuple[str, ...],
    all_namespaces: bool,
    liveness_port: int,
    liveness_host: str,
    standalone: bool,
    kubeconfig: Path | None,
    status_interval: float,
    verbose: bool,
) -> None:
    """Run the RolloutPool operator until SIGINT or SIGTERM."""

    if namespaces and all_namespaces:
        raise click.UsageError("--namespace and --all-namespaces exclude each other")
    if kubeconfig is not None:
        # before the kubernetes client is imported: its default kubeconfig path is read at import,
        # and kopf's login (through that client) uses the default
        os.environ["KUBECONFIG"] = str(kubeconfig)
    config_path = os.environ.get("KUBECONFIG")
    import kopf  # noqa: PLC0415 - kopf and the handlers load only when the operator runs

    import rolloutpool.handlers.lifecycle  # noqa: F401, PLC0415 - registers the handlers with kopf
    from rolloutpool.kube.config import current_namespace  # noqa: PLC0415

    if not namespaces and not all_namespaces:
        namespaces = (os.environ.get("POD_NAMESPACE") or current_namespace(config_path) or "default",)
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    if not verbose:  # kopf logs every successful event handler and every liveness probe at INFO
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    memo = kopf.Memo(kubeconfig=config_path, status_interval=status_interval)
    liveness = f"http://{liveness_host}:{liveness_port}/healthz" if liveness_port else None
    # kopf stops on SIGINT/SIGTERM by itself (signal handlers of the main thread's loop)
    asyncio.run(
        kopf.operator(
            clusterwide=all_namespaces,
            namespaces=() if all_namespaces else namespaces,
            standalone=standalone,
            liveness_endpoint=liveness,
            memo=memo,
        )
    )
