"""The swarm simulator (``swarmnode simulate``).

Owns
    Network mode: the node's real sans-IO cores (``swarmnode.core.gossip``,
    ``swarmnode.core.broadcast``, ``swarmnode.core.activation``) driven by trio on a virtual
    clock (``trio.testing.MockClock``) over a modelled network with churn, heterogeneity and
    adversaries (``engine``, ``network``, ``world``, ``gossip``, ``broadcast``, ``activation``);
    scenario files (``scenario``); results and plots (``run``, ``plots``); the CLI (``cli``).
    Learning mode lives in ``learning`` (real tiny-model learners).

Must not
    Re-implement protocol logic: a simulated result speaks for the real node only because the
    same cores decide.
"""
