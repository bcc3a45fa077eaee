"""``rolloutpool router`` as one of N routers: the fleet options turned into a :class:`Fleet`.

Two ways to form a fleet:

- Kubernetes (what the operator deploys with ``spec.router.replicas > 1``): ``--self-name`` (the
  pod's name) and ``--peer-selector`` (the router pods) next to ``--discover-namespace`` and
  ``--discover-selector``; engines come from the operator's assignment annotation, the ring from
  the ready router pods.
- Static (loopback, Slurm): every router gets the same ``--replica`` list and ``--peer-urls``
  (every router's base URL) and its own ``--self-url``; each takes its share of the engines by
  the operator's own assignment function, so all agree on the split and the ring. Each router
  probes its peers every ``--peer-probe-interval`` seconds (:mod:`rolloutpool.router.peers`): a
  peer that stops answering is taken off the ring and its engines go to the survivors until it
  answers again (``0``: no probes; a dead peer's sessions then get 503s until it is back).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import click

from rolloutpool.router.app import run_router
from rolloutpool.router.config import RouterConfig
from rolloutpool.router.fleet import Fleet, FleetSource, static_source
from rolloutpool.router.peers import PeerProbe
from rolloutpool.router.types import Discovery
from rolloutpool.routing.fleetsplit import assign_engines
from rolloutpool.routing.fleetview import static_view

__all__ = ["FleetSetup", "kubernetes_fleet", "run_fleet_member", "static_fleet"]


@dataclass(frozen=True)
class FleetSetup:
    """What ``run_router`` needs for a fleet member."""

    config: RouterConfig
    fleet: Fleet
    discovery: Discovery


def _fleet(config: RouterConfig, *, self_name: str, source: FleetSource) -> Fleet:
    return Fleet(
        self_name=self_name,
        source=source,
        admin_token=config.admin_token,
        session_header=config.session_header,
        connect_timeout_s=config.upstream_connect_timeout_s,
        read_timeout_s=config.upstream_timeout_s,
    )


def static_fleet(
    config: RouterConfig, *, self_url: str, peer_urls: Sequence[str], probe_interval_s: float = 1.0
) -> FleetSetup:
    """A member of a fleet given on the command line: its share of ``config.replicas``.

    ``probe_interval_s``: how often the peers are probed (a silent one leaves the ring); 0: never.
    """
    peers = [u.strip().rstrip("/") for text in peer_urls for u in text.split(",") if u.strip()]
    me = self_url.strip().rstrip("/")
    if not me.startswith(("http://", "https://")):
        raise ValueError(f"--self-url {self_url!r} must be http(s)://host:port")
    if me not in peers:
        peers.append(me)
    if len(set(peers)) != len(peers):
        raise ValueError(f"--peer-urls: duplicate URLs in {peers}")
    if not config.replicas:
        raise ValueError("a static fleet needs --replica (the same list on every router)")
    urls = {r.name: r.url for r in config.replicas}
    if probe_interval_s < 0:
        raise ValueError(f"--peer-probe-interval {probe_interval_s:g}: seconds, or 0 (no probes)")
    source: FleetSource
    if probe_interval_s > 0:
        source = PeerProbe(self_name=me, peers=peers, engine_urls=urls, interval_s=probe_interval_s).views
    else:
        split = assign_engines(engines=urls, routers=peers, previous={})
        source = static_source(static_view(peers={p: p for p in peers}, split=split, engine_urls=urls, self_name=me))
    fleet = _fleet(config, self_name=me, source=source)
    return FleetSetup(replace(config, replicas=(), discovery=True), fleet, fleet.discovery)


def kubernetes_fleet(
    config: RouterConfig,
    *,
    kubeconfig: str | None,
    namespace: str,
    engine_selector: str,
    router_selector: str,
    self_name: str,
) -> FleetSetup:
    """A member of a fleet of router pods: engines by the operator's assignment, the ring from the pods."""
    from rolloutpool.kube.fleet import FleetWatch  # noqa: PLC0415 - the kubernetes client only when used
    from rolloutpool.kube.pods import api_client  # noqa: PLC0415

    watch = FleetWatch(
        api_client(kubeconfig),
        namespace=namespace,
        engine_selector=engine_selector,
        router_selector=router_selector,
        self_name=self_name,
    )
    fleet = _fleet(config, self_name=self_name, source=watch.views)
    return FleetSetup(config, fleet, fleet.discovery)


def run_fleet_member(
    config: RouterConfig,
    *,
    self_name: str | None,
    peer_selector: str | None,
    self_url: str | None,
    peer_urls: tuple[str, ...],
    peer_probe_interval: float = 1.0,
    kubeconfig: str | None,
    namespace: str | None,
    selector: str | None,
    pool: str | None,
) -> None:
    """Serve as one of N routers: static (``--self-url``, ``--peer-urls``) or pods (``--self-name`` ...).

    The fleet options of ``rolloutpool router`` are checked here; a wrong combination is a usage error.
    """
    limits = None
    try:
        if self_url or peer_urls:
            if not (self_url and peer_urls) or self_name or peer_selector or namespace:
                raise click.UsageError("a static fleet needs --self-url, --peer-urls and --replica, nothing else")
            setup = static_fleet(config, self_url=self_url, peer_urls=peer_urls, probe_interval_s=peer_probe_interval)
        else:
            if not (self_name and peer_selector and namespace and selector):
                raise click.UsageError("a fleet needs --self-name, --peer-selector, --discover-namespace/-selector")
            setup = kubernetes_fleet(
                config,
                kubeconfig=kubeconfig,
                namespace=namespace,
                engine_selector=selector,
                router_selector=peer_selector,
                self_name=self_name,
            )
            if pool:
                from rolloutpool.kube.pods import api_client  # noqa: PLC0415
                from rolloutpool.kube.pools import PoolWatch  # noqa: PLC0415

                limits = PoolWatch(api_client(kubeconfig), namespace=namespace, name=pool).events
    except ValueError as err:
        raise click.UsageError(str(err)) from err
    run_router(setup.config, discovery=setup.discovery, limits=limits, fleet=setup.fleet)
