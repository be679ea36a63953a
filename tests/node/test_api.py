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
                    assert r.content_type == "text/html" and "fetch(SOURCE" in page
                    assert "default-src 'self'" in r.headers["Content-Security-Policy"]
                async with session.get(base + "/dashboard.json") as r:
                    document = json.loads(await r.text())  # a role without a page: its status, tabled
                    assert document["title"] == "swarmnode · alice"
                    assert ["round", "3"] in document["sections"][0]["tables"][0]["rows"]
                state["healthy"] = False
                async with session.get(base + "/healthz") as r:
                    assert r.status == 503
        finally:
            await server.stop()

    asyncio.run(main())


def test_a_request_naming_another_host_is_refused_so_a_rebound_domain_cannot_read_the_api() -> None:
    from swarmnode.ops.api import host_allowed

    for ok in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080", "10.0.0.5", "::1", None, ""):
        assert host_allowed(ok), ok
    for bad in ("evil.example:8080", "evil.example", "127.0.0.1.nip.io:80", "[::1"):
        assert not host_allowed(bad), bad

    async def main() -> None:
        server = ApiServer(build_app(Metrics(), lambda: {"name": "alice"}), "127.0.0.1", 0)
        await server.start()
        url = f"http://127.0.0.1:{server.port}/status"
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
                async with session.get(url, headers={"Host": "evil.example"}) as r:
                    assert r.status == 421
                async with session.get(url) as r:
                    assert r.status == 200
        finally:
            await server.stop()

    asyncio.run(main())
