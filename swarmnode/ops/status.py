"""`swarmnode status`: read a running node's /status from its local API and print a table."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from typing import Any

from swarmnode.errors import SwarmError
from swarmnode.home import NodeHome

TIMEOUT = 5.0


def fetch_status(home: NodeHome, timeout: float = TIMEOUT) -> dict[str, Any]:
    port_file = home.root / "api.port"
    if not port_file.exists():
        raise SwarmError(
            f"no running node found: {port_file} is missing (is `swarmnode run --home {home.root}` up?)"
        )
    url = f"http://127.0.0.1:{port_file.read_text().strip()}/status"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            payload: dict[str, Any] = json.loads(response.read())
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as exc:
        raise SwarmError(f"node API at {url} did not answer ({exc}); is the node still running?") from exc
    return payload


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_cell(v)}" for k, v in value.items() if v) or "-"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "-"
    return "-" if value is None else str(value)


def print_status(home: NodeHome, *, as_json: bool = False) -> int:
    status = fetch_status(home)
    if as_json:
        json.dump(status, sys.stdout, indent=1)
        print()
        return 0
    status.pop("metrics", None)
    width = max(len(k) for k in status)
    for key, value in status.items():
        print(f"{key.ljust(width)}  {_cell(value)}")
    return 0
