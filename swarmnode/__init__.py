"""swarmnode: a decentralized peer-to-peer swarm training node for RL of language models."""

__version__ = "0.1.0"
