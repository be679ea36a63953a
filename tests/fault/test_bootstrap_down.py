"""The bootstrap peer goes down: the nodes keep training and exchanging with the peers they know;
when it comes back (same identity and address), they re-bootstrap through it, so a node that
joins through it afterwards finds them and they exchange rollouts both ways.

Bootstrap (fixed port) + 2 ``swarmnode run`` processes, then a third node that knows only the
bootstrap. This needs ``HivemindRuntime._rejoin_loop`` to re-dial an initial peer missing from
the routing table (it used to re-dial only when the table was empty): a restarted bootstrap
starts with an empty routing table and learns of a node only when the node contacts it.
"""

from __future__ import annotations

import json
import signal
import socket
import time
import urllib.request
from typing import Any

import pytest

from swarmnode.testing import LocalSwarm, wait_until

pytestmark = [pytest.mark.network, pytest.mark.fault, pytest.mark.timeout(900)]

ROUND_SECONDS = 2.0
OLD = ("node-0", "node-1")
NEW = "node-2"
MORE_GROUPS = 8  # groups each old node must admit from the other while the bootstrap is down


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_bootstrap_at(swarm: LocalSwarm, port: int) -> dict[str, Any]:
    """The bootstrap peer on a fixed port (it comes back at the same address); its ready file."""
    swarm.start_bootstrap(listen=f"/ip4/127.0.0.1/tcp/{port}")
    info = swarm.procs["bootstrap"].ready()
    assert info is not None
    return info


def bootstrap_dht_peers(info: dict[str, Any]) -> int:
    try:
        with urllib.request.urlopen(info["http_url"] + "/status", timeout=5) as response:
            return int(json.loads(response.read())["dht_peers"])
    except OSError:
        return -1


def groups_from(status: dict[str, Any], sender: str) -> int:
    return int(status["external_by_sender"].get(sender, {}).get("groups", 0))


def test_nodes_outlive_their_bootstrap_and_re_bootstrap_when_it_returns(local_swarm: Any) -> None:
    swarm: LocalSwarm = local_swarm(ROUND_SECONDS)
    port = free_port()
    first = start_bootstrap_at(swarm, port)
    for i, name in enumerate(OLD):
        swarm.write_node_config(name, i)
        swarm.start_node(name)
    up = swarm.wait_statuses(lambda s: True, "the nodes' APIs")
    ids = {n: up[n]["peer_id"] for n in OLD}
    swarm.wait_statuses(
        lambda s: all(groups_from(s[a], ids[b]) > 0 for a in OLD for b in OLD if a != b),
        "the two nodes to admit each other's groups",
    )

    # 1. The bootstrap dies (SIGKILL of its whole group: p2pd too).
    boot = swarm.procs.pop("bootstrap")  # gone on purpose: waits must not fail on its exit
    boot.kill_group(signal.SIGKILL)
    boot.popen.wait(10)
    down_at = time.monotonic()
    at_kill = swarm.wait_statuses(lambda s: True, "the nodes after the bootstrap died")

    # 2. They notice (the bootstrap leaves their routing tables: each knows only the other) and
    # keep training and exchanging with each other.
    during = swarm.wait_statuses(
        lambda s: all(
            s[a]["peers"] == 1
            and s[a]["rounds"] >= at_kill[a]["rounds"] + 5
            and groups_from(s[a], ids[b]) >= groups_from(at_kill[a], ids[b]) + MORE_GROUPS
            for a in OLD
            for b in OLD
            if a != b
        ),
        "the nodes to drop the bootstrap and keep exchanging without it",
        timeout=180,
    )
    down_s = time.monotonic() - down_at

    # 3. The bootstrap returns at the same address; a new node joins through it alone.
    second = start_bootstrap_at(swarm, port)
    assert second["peer_id"] == first["peer_id"] and second["maddrs"] == first["maddrs"]
    back_at = time.monotonic()
    swarm.write_node_config(NEW, 2)
    swarm.start_node(NEW)
    new_id = swarm.wait(lambda: (swarm.status(NEW) or {}).get("peer_id"), "the new node's API")
    names = [*OLD, NEW]
    peers = [ids[n] for n in OLD]
    joined = swarm.wait_statuses(
        lambda s: (
            all(groups_from(s[NEW], p) > 0 for p in peers) and all(groups_from(s[a], new_id) > 0 for a in OLD)
        ),
        "the old nodes and the new one to exchange groups through the returned bootstrap",
        timeout=240,
    )
    rejoined_s = time.monotonic() - back_at
    # The bootstrap knows every node again (the old ones re-dialled it).
    dht_peers = wait_until(
        lambda: n if (n := bootstrap_dht_peers(second)) >= 3 else None, 60, "the bootstrap's peers"
    )
    for name in names:
        assert set(joined[name]["admission"]) <= {"accepted"}, (name, joined[name]["admission"])
    print(
        json.dumps(
            {
                "bootstrap_down_s": round(down_s, 1),
                "rounds_while_down": {a: during[a]["rounds"] - at_kill[a]["rounds"] for a in OLD},
                "groups_while_down": {
                    a: groups_from(during[a], ids[b]) - groups_from(at_kill[a], ids[b])
                    for a in OLD
                    for b in OLD
                    if a != b
                },
                "new_node_exchanging_after_s": round(rejoined_s, 1),
                "bootstrap_dht_peers": dht_peers,
            }
        )
    )
