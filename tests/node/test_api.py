"""The local HTTP API serves health, Prometheus metrics, JSON status and a page, on loopback."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from swarmnode.ops.api import ApiServer, build_app
from swarmnode.ops.metrics import Metrics


def test_api_endpoints_on_loopback() -> None:
    metrics = Metrics()
    metrics.inc("rounds", "Rounds completed", 3)
    state = {"healthy": True}

    async def main() -> None:
        app = build_app(
            metrics, lambda: {"name": "alice", "round": 3, "peers": {"bob": 1}}, lambda: state["healthy"]
        )
        server = ApiServer(app, "127.0.0.1", 0)
        await server.start()
        base = f"http://127.0.0.1:{server.port}"
        timeout = aiohttp.ClientTimeout(total=10)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session:
                async with session.get(base + "/healthz") as r:
                    assert r.status == 200
                async with session.get(base + "/metrics") as r:
                    assert "swarmnode_rounds_total 3" in await r.text()
                async with session.get(base + "/status") as r:
                    assert json.loads(await r.text())["round"] == 3
                async with session.get(base + "/") as r:
                    page = await r.text()
                    assert "alice" in page and "<table>" in page
                state["healthy"] = False
                async with session.get(base + "/healthz") as r:
                    assert r.status == 503
        finally:
            await server.stop()

    asyncio.run(main())
