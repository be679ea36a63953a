"""The node's local HTTP API (aiohttp), bound to 127.0.0.1 by default.

GET /healthz   200 "ok" while the node's jobs run
GET /metrics   Prometheus text format
GET /status    JSON snapshot (what `swarmnode status` prints)
GET /          a small status page a person can read (refreshes itself)

``build_http_app`` is the one app; ``build_app`` feeds it a node's registry and snapshot, the
bootstrap peer feeds it its DHT figures (``roles.bootstrap``).
"""

from __future__ import annotations

import asyncio
import html
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from swarmnode.ops.metrics import Metrics

log = logging.getLogger(__name__)

StatusProvider = Callable[[], dict[str, Any]]

_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>swarmnode {name}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:60em}}
table{{border-collapse:collapse}}td,th{{border-bottom:1px solid #ddd;padding:.3em .8em;text-align:left}}
h1{{font-size:1.4em}}</style></head>
<body><h1>swarmnode &middot; {name}</h1>{body}
<p><a href="/metrics">/metrics</a> &middot; <a href="/status">/status</a></p></body></html>
"""


def _table(mapping: dict[str, Any]) -> str:
    rows = []
    for key, value in mapping.items():
        if isinstance(value, dict):
            cell = _table(value) if value else "&ndash;"
        elif isinstance(value, float):
            cell = f"{value:.4g}"
        else:
            cell = html.escape(str(value))
        rows.append(f"<tr><th>{html.escape(str(key))}</th><td>{cell}</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


StatusSource = Callable[[], Awaitable[dict[str, Any]]]
MetricsSource = Callable[[], Awaitable[str]]
HealthSource = Callable[[], Awaitable[str | None]]  # None: healthy; otherwise the reason (the 503 body)


def build_http_app(
    status: StatusSource, metrics: MetricsSource, health: HealthSource, *, page: bool = True
) -> web.Application:
    """The one HTTP app every process serves: ``/healthz``, ``/metrics``, ``/status`` and (``page``) ``/``.

    Nodes of every role and the bootstrap peer differ only in where the three documents come
    from; the routes, content types and the 503 rule are the same for all of them."""

    async def healthz(_: web.Request) -> web.Response:
        reason = await health()
        if reason is None:
            return web.Response(text="ok\n")
        return web.Response(status=503, text=f"{reason}\n")

    async def metrics_handler(_: web.Request) -> web.Response:
        return web.Response(text=await metrics(), content_type="text/plain", charset="utf-8")

    async def status_handler(_: web.Request) -> web.Response:
        document = await status()
        return web.Response(text=json.dumps(document, indent=1, default=str), content_type="application/json")

    async def page_handler(_: web.Request) -> web.Response:
        snapshot = await status()
        body = _table({k: v for k, v in snapshot.items() if k != "metrics"})
        text = _PAGE.format(name=html.escape(str(snapshot.get("name", "node"))), body=body)
        return web.Response(text=text, content_type="text/html")

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/status", status_handler)
    if page:
        app.router.add_get("/", page_handler)
    return app


def build_app(
    metrics: Metrics, status: StatusProvider, healthy: Callable[[], bool] = lambda: True
) -> web.Application:
    """A node's app: its metrics registry, its status snapshot and its liveness flag."""

    async def status_now() -> dict[str, Any]:
        return status()

    async def metrics_now() -> str:
        return metrics.render()

    async def health_now() -> str | None:
        return None if healthy() else "unhealthy"

    return build_http_app(status_now, metrics_now, health_now)


class ApiServer:
    """Start/stop wrapper; ``port`` is the bound port (useful when configured as 0)."""

    def __init__(self, app: web.Application, host: str, port: int) -> None:
        self._runner = web.AppRunner(app, access_log=None)
        self.host = host
        self.port = port

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]  # the bound port (``port`` 0 picks a free one)

    async def stop(self) -> None:
        await self._runner.cleanup()


async def serve_forever(
    metrics: Metrics,
    status: Callable[[], dict[str, Any]],
    healthy: Callable[[], bool],
    host: str,
    port: int,
    port_file: Path,
) -> None:
    """Serve the API until cancelled; ``port_file`` (a Path) holds the bound port meanwhile.

    `swarmnode status` reads the port file; it is written atomically and removed on exit, so
    no stale port outlives the node."""
    from swarmnode.store import atomic_write_text

    server = ApiServer(build_app(metrics, status, healthy), host, port)
    await server.start()
    atomic_write_text(port_file, str(server.port))
    log.info("API on http://%s:%d/", host, server.port)
    try:
        await asyncio.Event().wait()
    finally:
        port_file.unlink(missing_ok=True)
        await server.stop()
