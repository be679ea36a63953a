#!/usr/bin/env python3
"""Container health check: GET /healthz of the node's (or the bootstrap's) local HTTP API.

    swarmnode-healthcheck [node|bootstrap]

node: the port is ``SWARMNODE_API__PORT`` when set and non-zero, else the one the
node wrote to ``$SWARMNODE_HOME/api.port``. bootstrap: ``SWARMNODE_BOOTSTRAP_HTTP_PORT``
(default 8700). The probe goes to 127.0.0.1 unless the API is bound to one specific
address. Exit 0 when /healthz answers 200, 1 otherwise (Docker's HEALTHCHECK rule).
Standard library only: the slim image has no curl, and this must start fast.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

TIMEOUT_S = 5.0
WILDCARDS = ("", "0.0.0.0", "::", "[::]")


def node_port(environ: dict[str, str]) -> int | None:
    configured = environ.get("SWARMNODE_API__PORT", "").strip()
    if configured and configured != "0":
        return int(configured)
    port_file = Path(environ.get("SWARMNODE_HOME", "/data")) / "api.port"
    try:
        return int(port_file.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None  # not started yet (warm start, model load) or a half-written file


def probe_url(role: str, environ: dict[str, str]) -> str | None:
    if role == "bootstrap":
        return f"http://127.0.0.1:{int(environ.get('SWARMNODE_BOOTSTRAP_HTTP_PORT', '8700'))}/healthz"
    port = node_port(environ)
    if port is None:
        return None
    host = environ.get("SWARMNODE_API__HOST", "127.0.0.1").strip().strip('"')
    host = "127.0.0.1" if host in WILDCARDS else host
    return f"http://{host}:{port}/healthz"


def main(argv: list[str]) -> int:
    role = argv[0] if argv else "node"
    if role not in ("node", "bootstrap"):
        print(f"usage: swarmnode-healthcheck [node|bootstrap] (got {role!r})", file=sys.stderr)
        return 2
    try:
        url = probe_url(role, dict(os.environ))
    except ValueError as exc:
        print(f"unhealthy: bad port setting ({exc})", file=sys.stderr)
        return 1
    if url is None:
        print("unhealthy: the node has not written api.port yet", file=sys.stderr)
        return 1
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            ok = response.status == 200
    except (urllib.error.URLError, OSError) as exc:  # HTTPError (503) is a URLError
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    print(f"{'healthy' if ok else 'unhealthy'}: {url}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
