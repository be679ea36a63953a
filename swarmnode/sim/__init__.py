"""The swarm simulator (``swarmnode simulate``).

Owns
    Network mode: the node's real sans-IO cores (``swarmnode.gossip.core``,
    ``swarmnode.broadcast.core``, ``swarmnode.activation.core``) driven by trio on a virtual
    clock (``trio.testing.MockClock``) over a modelled network with churn, heterogeneity and
    adversaries (``engine``, ``network``, ``world``, ``gossip``, ``broadcast``, ``activation``);
    scenario files (``scenario``); results and plots (``run``, ``plots``); the CLI (``cli``).
    Learning mode lives in ``learning`` (real tiny-model learners).

Must not
    Re-implement protocol logic: a simulated result speaks for the real node only because the
    same cores decide. Be imported by the node: trio and matplotlib come with the ``sim`` extra
    (``pip install 'swarmnode[sim]'``), not with the node, and are imported only on the paths
    that use them (network mode's ``engine``, ``plots``).
"""

from __future__ import annotations

from swarmnode.errors import SwarmError

SIM_EXTRA = "pip install 'swarmnode[sim]'"


def sim_extra_missing(package: str) -> SwarmError:
    """The error for a simulator path that needs ``package`` where the ``sim`` extra is not installed."""
    return SwarmError(
        f"the simulator needs {package}, which comes with the 'sim' extra, not with the node: "
        f"{SIM_EXTRA} (scripts/setup-env installs it)"
    )
