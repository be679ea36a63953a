"""Fixtures for fault tests: the swarm tests' warm-started model and self-cleaning local swarms."""

from __future__ import annotations

from tests.swarm.conftest import local_swarm, swarm_model

__all__ = ["local_swarm", "swarm_model"]
