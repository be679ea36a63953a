"""Errors a user can act on.

Each message names the thing that is wrong and how to fix it. Rejections of
peer input are *not* exceptions: they are values (see ``swarmnode.admit``).
"""

from __future__ import annotations


class SwarmError(Exception):
    """Base class for every error swarmnode reports to a user."""


class ConfigError(SwarmError):
    """A configuration value is missing or invalid (CLI exit code 2)."""


class IdentityError(SwarmError):
    """The node key is missing, unreadable or insecure."""


class CheckpointError(SwarmError):
    """No usable checkpoint could be read."""


class TaskError(SwarmError):
    """A task id cannot be regenerated (unknown dataset, bad config, ...)."""


class ModelError(SwarmError):
    """A model or tokenizer cannot be loaded or saved."""


class EngineUnavailable(SwarmError):
    """A rollout engine was chosen that cannot run on this machine."""
