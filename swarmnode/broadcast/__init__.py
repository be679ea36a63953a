"""Pipelined weight broadcast: a publisher's signed manifest, chunks fetched from any peer that has them.

``core``: the sans-IO state machine (which chunk from whom, leases, blame for bad chunks).
``driver``: its I/O over the data plane, the manifest and blob codecs (``BroadcastNode``).
``weights``: the learner's publisher and the worker's receiver of policy versions.
"""
