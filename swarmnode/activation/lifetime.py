"""How long a signed PeerRecord is taken as current: shared by the DHT records and the direct offers.

Owns: the two figures, so the sans-IO offer table (``offers``) needs nothing from the module that
talks to the DHT (``records``).
Must not: do I/O or read a clock.
"""

from __future__ import annotations

# One lifetime of a PeerRecord: publishers refresh every 5-10 s with a 30-60 s TTL.
RECORD_MAX_AGE = 60.0
MAX_CLOCK_AHEAD = 10.0  # a record "sent" further in the future than this is refused
