"""The node's local HTTP API (aiohttp), bound to 127.0.0.1 by default.

GET /healthz   200 "ok" while the node's jobs run
GET /metrics   Prometheus text format
GET /status    JSON snapshot (what `swarmnode status` prints)
GET /dashboard.json   what the page draws (``ops.dashboard``): curves, peers, intake, the role's panels
GET /          the dashboard page: draws /dashboard.json and redraws it live, no reload

``build_http_app`` is the one app; ``build_app`` feeds it a node's registry and snapshot, the
bootstrap peer feeds it its DHT figures (``roles.bootstrap``), the local swarm launcher its nodes'.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from swarmnode.ops.dashboard import Dashboard, Section, key_value_table, page_html
from swarmnode.ops.metrics import Metrics

log = logging.getLogger(__name__)

StatusProvider = Callable[[], dict[str, Any]]

# The page is the same file for every process; what it shows comes from /dashboard.json. The
# policy keeps it from loading anything but this origin, and from running inline event handlers.
_PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}


def host_allowed(host_header: str | None) -> bool:
    """A request's ``Host`` may name an IP address or ``localhost``, never another name.

    DNS rebinding: a web page the operator visits can point its own domain at 127.0.0.1 and read
    this API from their browser; its requests then carry that domain in ``Host``. Addresses and
    ``localhost`` cannot be re-pointed by a stranger. A missing ``Host`` (HTTP/1.0) is allowed."""
    if not host_header:
        return True
    host = host_header.strip()
    if host.startswith("["):  # [v6]:port
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@web.middleware
async def _only_address_hosts(request: web.Request, handler: Any) -> web.StreamResponse:
    if not host_allowed(request.headers.get("Host")):
        return web.Response(status=421, text="Host must be an IP address or localhost\n")
    response: web.StreamResponse = await handler(request)
    return response


StatusSource = Callable[[], Awaitable[dict[str, Any]]]
MetricsSource = Callable[[], Awaitable[str]]
HealthSource = Callable[[], Awaitable[str | None]]  # None: healthy; otherwise the reason (the 503 body)
DashboardSource = Callable[[], Awaitable[Dashboard]]


def status_dashboard(snapshot: dict[str, Any]) -> Dashboard:
    """The page of a process that draws nothing of its own: its status snapshot as one table."""
    figures = {k: v for k, v in snapshot.items() if k != "metrics" and not isinstance(v, dict | list)}
    name = str(snapshot.get("name", "node"))
    return Dashboard(
        f"swarmnode · {name}",
        str(snapshot.get("role", "")),
        sections=[Section("Status", tables=[key_value_table("status", "Status", figures)])],
        links=[("/status", "/status"), ("/metrics", "/metrics")],
    )


def build_http_app(
    status: StatusSource,
    metrics: MetricsSource,
    health: HealthSource,
    *,
    page: bool = True,
    dashboard: DashboardSource | None = None,
) -> web.Application:
    """The one HTTP app every process serves: ``/healthz``, ``/metrics``, ``/status`` and (``page``)
    the dashboard, ``/`` and ``/dashboard.json`` (``dashboard``, else the status as a table).

    Nodes of every role and the bootstrap peer differ only in where the documents come from; the
    routes, content types and the 503 rule are the same for all of them."""

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
        return web.Response(text=page_html(), content_type="text/html", headers=_PAGE_HEADERS)

    async def dashboard_handler(_: web.Request) -> web.Response:
        document = await dashboard() if dashboard is not None else status_dashboard(await status())
        return web.Response(
            text=json.dumps(document.as_json(), separators=(",", ":"), allow_nan=False),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    app = web.Application(middlewares=[_only_address_hosts])
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/status", status_handler)
    if page:
        app.router.add_get("/", page_handler)
        app.router.add_get("/dashboard.json", dashboard_handler)
    return app


def build_app(
    metrics: Metrics,
    status: StatusProvider,
    healthy: Callable[[], bool] = lambda: True,
    dashboard: DashboardSource | None = None,
) -> web.Application:
    """A node's app: its metrics registry, its status snapshot, its liveness flag and its page."""

    async def status_now() -> dict[str, Any]:
        return status()

    async def metrics_now() -> str:
        return metrics.render()

    async def health_now() -> str | None:
        return None if healthy() else "unhealthy"

    return build_http_app(status_now, metrics_now, health_now, dashboard=dashboard)


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


def dashboard_app(dashboard: DashboardSource, status: StatusSource | None = None) -> web.Application:
    """The app of a process that only shows a page (the swarm launcher, the page tests, the page's
    bench): its dashboard and status (empty unless given), no metrics, always healthy."""

    async def no_status() -> dict[str, Any]:
        return {}

    async def no_metrics() -> str:
        return ""

    async def healthy() -> str | None:
        return None

    return build_http_app(status or no_status, no_metrics, healthy, dashboard=dashboard)


class ThreadedApiServer:
    """An app served on an event loop of its own in a daemon thread, for callers that run no loop
    (the launcher's plain loop, a sync Playwright session): ``url`` while it runs, ``stop()``.

    The loop runs in its thread from the start and the server is started on it from here, so the
    caller's thread may itself be running a loop. A port that cannot be bound raises ``OSError``."""

    def __init__(
        self, app: web.Application, host: str = "127.0.0.1", port: int = 0, name: str = "api"
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._server = ApiServer(app, host, port)
        try:
            asyncio.run_coroutine_threadsafe(self._server.start(), self._loop).result(30)
        except BaseException:
            self._close_loop()
            raise
        self.url = f"http://{host}:{self._server.port}/"

    def stop(self) -> None:
        if self._loop.is_closed():
            return
        asyncio.run_coroutine_threadsafe(self._server.stop(), self._loop).result(10)
        self._close_loop()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


async def serve_forever(
    metrics: Metrics,
    status: Callable[[], dict[str, Any]],
    healthy: Callable[[], bool],
    host: str,
    port: int,
    port_file: Path,
    dashboard: DashboardSource | None = None,
) -> None:
    """Serve the API until cancelled; ``port_file`` (a Path) holds the bound port meanwhile.

    `swarmnode status` reads the port file; it is written atomically and removed on exit, so
    no stale port outlives the node."""
    from swarmnode.store import atomic_write_text

    server = ApiServer(build_app(metrics, status, healthy, dashboard), host, port)
    await server.start()
    atomic_write_text(port_file, str(server.port))
    log.info("API on http://%s:%d/", host, server.port)
    try:
        await asyncio.Event().wait()
    finally:
        port_file.unlink(missing_ok=True)
        await server.stop()
