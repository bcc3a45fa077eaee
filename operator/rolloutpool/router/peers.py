"""A static fleet's failover: probe the peer routers, drop the silent ones from the ring, take them back.

Routers given each other's URLs (``--peer-urls``) have no Kubernetes to say a peer died. Each router
therefore asks every peer's ``/healthz`` every ``interval_s`` (``--peer-probe-interval``); the pure
:mod:`rolloutpool.routing.peerhealth` decides when a peer is down (failures in a row) or up again
(answers in a row). Each change of the set of routers up yields a new
:class:`~rolloutpool.routing.fleetview.FleetView`: the down router's engines go to the survivors
(:func:`~rolloutpool.routing.peerhealth.failover_split`), its ring points with them, so the survivors
own its sessions and place each once; when it answers again it gets its engines back.
:class:`PeerProbe` is the :data:`~rolloutpool.router.fleet.FleetSource` of such a fleet.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence

import aiohttp

from rolloutpool.routing.fleetview import FleetView, static_view
from rolloutpool.routing.peerhealth import PeerHealthConfig, PeerState, failover_split, observe

__all__ = ["PeerProbe"]

_log = logging.getLogger(__name__)


class PeerProbe:
    """The fleet views of one router of a static fleet, following which peers answer."""

    def __init__(
        self,
        *,
        self_name: str,
        peers: Sequence[str],
        engine_urls: Mapping[str, str],
        interval_s: float = 1.0,
        timeout_s: float | None = None,
        health: PeerHealthConfig | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.self_name = self_name
        self.peers = list(peers)
        """Every router of the fleet, this one included, by URL (also its name)."""
        self.engine_urls = dict(engine_urls)
        self.interval_s = interval_s
        self.timeout_s = timeout_s if timeout_s is not None else max(2.0, interval_s)
        """A probe's timeout: a busy peer that answers late is not silent (a dead one refuses at once)."""
        self.health = health or PeerHealthConfig()
        self.states: dict[str, PeerState] = {p: PeerState() for p in self.peers if p != self_name}

    def up(self) -> set[str]:
        """The routers on the ring now (this one always)."""
        return {self.self_name} | {p for p, s in self.states.items() if s.up}

    def view(self) -> FleetView:
        """The fleet view for the routers up now (pure given the states)."""
        up = self.up()
        split = failover_split(engines=self.engine_urls, peers=self.peers, up=up)
        return static_view(
            peers={p: p for p in self.peers if p in up},
            split=split,
            engine_urls=self.engine_urls,
            self_name=self.self_name,
        )

    async def _answers(self, client: aiohttp.ClientSession, peer: str) -> bool:
        try:
            async with client.get(f"{peer}/healthz") as resp:
                await resp.read()
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    async def probe(self, client: aiohttp.ClientSession) -> bool:
        """Probe every peer once; whether the set of routers up changed."""
        names = list(self.states)
        answers = await asyncio.gather(*(self._answers(client, p) for p in names))
        changed = False
        for peer, answered in zip(names, answers, strict=True):
            before = self.states[peer]
            after = self.states[peer] = observe(before, answered=answered, config=self.health)
            if after.up != before.up:
                changed = True
                if after.up:
                    _log.info("Marked peer router up router=%s peer=%s", self.self_name, peer)
                else:
                    _log.warning(
                        "Marked peer router down router=%s peer=%s failures=%d",
                        self.self_name,
                        peer,
                        self.health.down_after,
                    )
        return changed

    async def views(self) -> AsyncIterator[FleetView]:
        """The first view (every peer assumed up), then a new one whenever a peer goes down or comes back."""
        yield self.view()
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as client:
            while True:
                await asyncio.sleep(self.interval_s)
                if await self.probe(client):
                    yield self.view()
