"""A network partition between two groups of nodes: both sides keep training (and exchanging
within their side); once it heals, rollouts flow across again.

Group A (namespace A): the bootstrap peer and nodes a0, a1. Group B (namespace B): b0, b1. The
namespaces share a bridge (``tests/fault/netns.py``); the partition drops every packet between
A and B while the test still reads each node's /status. Measured from outside, per node, with
``external_by_sender`` (groups admitted from each signer).

Needs root (network namespaces). There is no loopback fallback: without namespaces the test
fails, saying why, rather than skip (see tests/fault/README.md).
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from swarmnode.errors import SwarmError
from swarmnode.testing import START_TIMEOUT, LocalSwarm, Proc

from .netns import NetnsUnavailable, Partitionable

pytestmark = [pytest.mark.network, pytest.mark.fault, pytest.mark.timeout(1200)]

ROUND_SECONDS = 3.0
GROUPS = {"a0": "A", "a1": "A", "b0": "B", "b1": "B"}
SETTLE_ROUNDS = 3  # after the cut, pulls already in flight fail within this
PARTITION_ROUNDS = 8


class NetnsSwarm(LocalSwarm):
    """``LocalSwarm`` whose processes run in the namespaces of ``net``; APIs on the group's address."""

    def __init__(self, root: Path, model: Path, net: Partitionable) -> None:
        super().__init__(root, model, round_seconds=ROUND_SECONDS)
        self.net = net

    def spawn(
        self,
        name: str,
        args: Sequence[str],
        log: Path,
        *,
        env: Mapping[str, str] | None = None,
        prefix: Sequence[str] = (),
        ready_file: Path | None = None,
    ) -> Proc:
        """Every process in its group's namespace (the bootstrap in A's)."""
        group = GROUPS.get(name, "A")
        exec_prefix = [*self.net.exec_prefix(group), *prefix]
        return super().spawn(name, args, log, env=env, prefix=exec_prefix, ready_file=ready_file)

    def start_bootstrap(self, *, listen: str = "", timeout: float = START_TIMEOUT) -> list[str]:
        return super().start_bootstrap(listen=f"/ip4/{self.net.address['A']}/tcp/0", timeout=timeout)

    def add_node(self, name: str, seed: int) -> None:
        address = self.net.address[GROUPS[name]]
        self.write_node_config(
            name, seed, **{"swarm.host_maddrs": [f"/ip4/{address}/tcp/0"], "api.host": address}
        )

    def status(self, name: str) -> dict[str, Any] | None:
        port_file = self.homes[name].root / "api.port"
        if not self.procs[name].alive() or not port_file.exists():
            return None
        url = f"http://{self.net.address[GROUPS[name]]}:{port_file.read_text().strip()}/status"
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                doc: dict[str, Any] = json.loads(response.read())
                return doc
        except (OSError, ValueError, SwarmError):
            return None


@pytest.fixture
def net() -> Iterator[Partitionable]:
    try:
        namespaces = Partitionable().open()
    except NetnsUnavailable as exc:
        pytest.fail(
            f"the partition test needs Linux network namespaces (root + iproute2): {exc}. "
            "It does not skip: run it as root, or in a container started with --privileged."
        )
    try:
        yield namespaces
    finally:
        namespaces.close()


def groups_from(status: dict[str, Any], sender: str) -> int:
    return int(status["external_by_sender"].get(sender, {}).get("groups", 0))


def test_both_sides_of_a_partition_keep_training_and_exchange_again_once_it_heals(
    net: Partitionable, swarm_model: Path, tmp_path: Path
) -> None:
    swarm = NetnsSwarm(tmp_path / "swarm", swarm_model, net)
    try:
        run_partition_trial(swarm, net)
    finally:
        swarm.close()


def run_partition_trial(swarm: NetnsSwarm, net: Partitionable) -> None:
    swarm.start_bootstrap()
    for seed, name in enumerate(GROUPS):
        swarm.add_node(name, seed)
        swarm.start_node(name)
    names = list(GROUPS)
    up = swarm.wait_statuses(lambda s: True, "every node's API")
    ids = {n: up[n]["peer_id"] for n in names}
    same = {n: [m for m in names if m != n and GROUPS[m] == GROUPS[n]] for n in names}
    other = {n: [m for m in names if GROUPS[m] != GROUPS[n]] for n in names}

    def cross(s: dict[str, dict[str, Any]], n: str) -> int:
        return sum(groups_from(s[n], ids[m]) for m in other[n])

    swarm.wait_statuses(
        lambda s: all(groups_from(s[n], ids[m]) > 0 for n in names for m in names if m != n),
        "every node to admit every other node's groups",
        timeout=300,
    )

    # 1. Cut A from B. Let pulls already in flight finish or fail, then watch both sides.
    net.partition()
    cut_at = time.time()
    swarm.wait(lambda: time.time() >= cut_at + SETTLE_ROUNDS * ROUND_SECONDS, "the partition to settle")
    settled = swarm.wait_statuses(lambda s: True, "the nodes after the cut")
    during = swarm.wait_statuses(
        lambda s: all(
            s[n]["rounds"] >= settled[n]["rounds"] + PARTITION_ROUNDS
            and all(groups_from(s[n], ids[m]) > groups_from(settled[n], ids[m]) for m in same[n])
            for n in names
        ),
        "both sides to keep training and exchanging within their side",
        timeout=300,
    )
    # Nothing crossed the partition once in-flight pulls were done.
    crossed_during = {n: cross(during, n) - cross(settled, n) for n in names}
    assert all(v == 0 for v in crossed_during.values()), crossed_during

    # 2. Heal: every node admits groups from both nodes of the other side again.
    net.heal()
    healed_at = time.time()
    after = swarm.wait_statuses(
        lambda s: all(
            groups_from(s[n], ids[m]) > groups_from(during[n], ids[m]) for n in names for m in other[n]
        ),
        "rollouts to flow across the healed partition",
        timeout=300,
    )
    flowing_after = time.time() - healed_at
    for n in names:
        refused = {k: v for k, v in after[n]["admission"].items() if k != "accepted"}
        assert refused == {}, (n, refused)
    print(
        json.dumps(
            {
                "partition_s": round(healed_at - cut_at, 1),
                "rounds_during_partition": {n: during[n]["rounds"] - settled[n]["rounds"] for n in names},
                "same_side_groups_during": {
                    n: sum(groups_from(during[n], ids[m]) - groups_from(settled[n], ids[m]) for m in same[n])
                    for n in names
                },
                "cross_groups_during": crossed_during,
                "cross_flowing_after_heal_s": round(flowing_after, 1),
                "cross_groups_after_heal": {n: cross(after, n) - cross(during, n) for n in names},
            }
        )
    )
