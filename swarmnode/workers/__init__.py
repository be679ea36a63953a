"""Learner and rollout workers (issue: learner/workers): one learner recruits workers across the
swarm, keeps them on a fresh enough policy through the weight broadcast, and activates only the
cheapest set that keeps it busy. ``run_role`` is the entry point of ``swarmnode run --role``."""
