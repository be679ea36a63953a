"""Worker activation: a learner recruits rollout workers and activates the cheapest set that keeps it busy.

``core``: the sans-IO ``ActivationCore`` (plans, probation, leases, measured rates).
``offers``: worker offers handed to the learner, rationed per source network.
``records``: reading and publishing signed peer records in the DHT.
``lifetime``: how long a signed peer record is current (shared by ``records`` and ``offers``).
"""
