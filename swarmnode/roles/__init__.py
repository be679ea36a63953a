"""One module per role a process can run: ``solo`` (train alone), ``trainer`` (a SAPO swarm node),
``learner`` and ``worker`` (a learner recruiting rollout workers), ``bootstrap`` (a DHT entry point).
``common``: what every role shares; ``convert``: rollout groups between the wire and the trainer;
``run``: ``swarmnode run --role learner|worker``.
"""
