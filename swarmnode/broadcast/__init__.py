"""Pipelined weight broadcast: a publisher's signed manifest, chunks fetched from any peer that has them.

``core``: the sans-IO state machine (which chunk from whom, leases, blame for bad chunks).
``driver``: its I/O over the data plane, the manifest and blob codecs (``BroadcastNode``).
``receiver``: the sans-IO state machine of a worker's receiver (which version to fetch, abandon,
install); the node's ``weights.WeightReceiver`` and the simulator drive it.
``weights``: the learner's publisher and the worker's receiver of policy versions (``receiver``'s
asyncio driver).
``adapter``: versions of a learner that trains LoRA adapters, sent as the adapter alone: the base
model's hash, the adapter's layout rule, installing a version (whole or adapter) exactly.
"""
