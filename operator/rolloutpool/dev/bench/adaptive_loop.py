"""The I/O around :class:`~rolloutpool.dev.bench.adaptive.AdaptiveLaw`: scrape, step, write the status.

Runs in the benchmark's event loop beside the client: every ``intervalSeconds / time_scale``
wall seconds it reads each engine's and the router's ``/metrics``, runs one step of the
operator's law in simulated time (wall x time scale, the engines' clock) and writes the caps
to the router with ``PUT /admin/limits`` (bearer token). A failed scrape skips that replica's
signals (the law treats it as the operator treats a pod without metrics); a failed write is
counted and retried at the next step.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from pathlib import Path

import aiohttp

from rolloutpool.api.spec import RolloutPoolSpec
from rolloutpool.dev.bench.adaptive import (
    AdaptiveLaw,
    EngineScrape,
    parse_engine_scrape,
    parse_router_scrape,
    status_document,
)

__all__ = ["LawLoop", "admin_token"]

_log = logging.getLogger(__name__)


def admin_token(directory: Path) -> tuple[str, Path]:
    """A fresh admin token and the file (mode 0600, created anew) our router reads it from."""
    token = secrets.token_urlsafe(24)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "admin-token"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    return token, path


class LawLoop:
    """The slow control loop of one ``rolloutpool-adaptive`` run."""

    def __init__(
        self,
        law: AdaptiveLaw,
        *,
        engine_urls: dict[str, str],
        router_url: str,
        admin_token: str,
        time_scale: float,
    ) -> None:
        self.law = law
        self.engine_urls = engine_urls
        self.router_url = router_url
        self._headers = {"Authorization": f"Bearer {admin_token}"}
        self.time_scale = time_scale
        self._t0 = time.monotonic()
        self.write_failures = 0
        self.scrape_failures = 0

    @classmethod
    def for_router(cls, spec: RolloutPoolSpec, engine_urls: list[str], *, router_url: str, admin_token: str) -> LawLoop:
        """The loop over engines named ``r0``, ``r1``, ... as the bench names them on our router's command line."""
        names = [f"r{i}" for i in range(len(engine_urls))]
        time_scale = spec.engine.simulator.time_scale if spec.engine.simulator else 1.0
        return cls(
            AdaptiveLaw(spec=spec, names=names),
            engine_urls=dict(zip(names, engine_urls, strict=True)),
            router_url=router_url,
            admin_token=admin_token,
            time_scale=time_scale,
        )

    def report(self) -> dict[str, object]:
        """The law's summary, this loop's failures and every target move (plain JSON data)."""
        changes = [
            {"t": round(c.t, 1), "replica": c.replica, "target": c.target, "from": c.previous_target,
             "quarantined": c.quarantined, "reason": c.reason, "live": c.live}
            for c in self.law.changes
        ]  # fmt: skip
        return self.law.summary() | {
            "write_failures": self.write_failures,
            "scrape_failures": self.scrape_failures,
            "changes": changes,
        }

    def now(self) -> float:
        """Simulated seconds since the loop was created."""
        return (time.monotonic() - self._t0) * self.time_scale

    async def _text(self, http: aiohttp.ClientSession, url: str) -> str | None:
        try:
            async with http.get(f"{url}/metrics") as response:
                return await response.text() if response.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    async def write(self, http: aiohttp.ClientSession) -> bool:
        """Write the law's current controls to the router as the pool's status."""
        document = status_document(self.law.names, self.law.controls)
        try:
            async with http.put(f"{self.router_url}/admin/limits", json=document, headers=self._headers) as response:
                await response.read()
                ok = response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        if not ok:
            self.write_failures += 1
            _log.warning("Failed to write caps to the router url=%s", self.router_url)
        return ok

    async def start(self, http: aiohttp.ClientSession) -> None:
        """Publish the law's initial caps (what the operator writes before any metric)."""
        self.law.start(now=self.now())
        if not await self.write(http):
            raise RuntimeError(f"the router at {self.router_url} refused the operator's caps (PUT /admin/limits)")

    async def step(self, http: aiohttp.ClientSession) -> None:
        """One scrape, one law step, one write."""
        names = list(self.engine_urls)
        texts = await asyncio.gather(
            *(self._text(http, self.engine_urls[n]) for n in names), self._text(http, self.router_url)
        )
        router_text = texts[-1]
        if router_text is None:
            self.scrape_failures += 1
            return
        engines: dict[str, EngineScrape] = {}
        for name, text in zip(names, texts[:-1], strict=True):
            if text is None:
                self.scrape_failures += 1
            else:
                engines[name] = parse_engine_scrape(text)
        self.law.step(now=self.now(), engines=engines, router=parse_router_scrape(router_text))
        await self.write(http)

    async def run(self, http: aiohttp.ClientSession) -> None:
        """Step every interval until cancelled."""
        interval_wall = self.law.interval_s / self.time_scale
        while True:
            await asyncio.sleep(interval_wall)
            await self.step(http)
