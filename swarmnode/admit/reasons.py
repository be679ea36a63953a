"""Rejection reasons, the admission step each belongs to, and who is charged for it.

Owns: ``RejectReason`` (the names that appear in counters, the ledger and logs)
and the attribution rule. Must not: decide anything at run time; the pipeline
reads these tables.

Attribution (protocol/SPEC.md "Admission"): a rejection lowers the score of the
peer responsible for it, and only that peer.

- Before the signature is checked, the claimed sender is unauthenticated:
  anyone can put anyone's key in an envelope. Such failures are charged to
  the transport peer that delivered the bytes (``via``), if the driver knows it.
- A replayed envelope, or one that arrives too late, carries a valid signature
  by its original sender, but anyone can re-send a signed envelope; charging
  the signer would let a third party get an honest peer banned. Charged to ``via``.
- ``BANNED``, ``NOT_ALLOWLISTED``, ``NEW_IDENTITY_LIMIT``, ``CPU_BUDGET`` and
  ``REPLAY_CACHE_FULL`` charge nobody: the first is already banned, and the
  others must not create per-peer state for identities we refuse to track.
- ``STALE_POLICY``, ``TASK_NOT_ALLOWED``, ``SYSTEM_PROMPT_MISMATCH`` and ``COMPLETION_TOO_LONG``
  charge nobody: they depend on the receiver's own settings (the versions it knows, the families
  it trains, the system prompt it asks with, the tokens it generates), so an honest signer's
  valid envelope, handed by anyone to a receiver set up otherwise (or held until the receiver's
  version moved on), must not get the signer banned (red team: 20 such envelopes banned it).
  What judging them cost is still charged to the signer and the delivering peer through the CPU
  budget.
- Everything else is signed content and charged to the signer.
"""

from __future__ import annotations

from enum import StrEnum


class RejectReason(StrEnum):
    # step 1: size
    TOO_LARGE = "too_large"
    # step 2: envelope decode
    MALFORMED = "malformed"
    UNSUPPORTED_VERSION = "unsupported_version"
    UNKNOWN_KIND = "unknown_kind"
    # step 3: signature
    BAD_SIGNATURE = "bad_signature"
    # step 4: sender (ban, allowlist, rate)
    BANNED = "banned"
    NOT_ALLOWLISTED = "not_allowlisted"
    NEW_IDENTITY_LIMIT = "new_identity_limit"
    RATE_LIMITED = "rate_limited"
    CPU_BUDGET = "cpu_budget"  # the signer or the delivering peer has spent its admission CPU
    # step 5: payload decode and per-kind checks
    INVALID_PAYLOAD = "invalid_payload"
    LIMIT_EXCEEDED = "limit_exceeded"
    SENDER_MISMATCH = "sender_mismatch"
    BAD_MANIFEST_SIGNATURE = "bad_manifest_signature"
    UNTRUSTED_PUBLISHER = "untrusted_publisher"
    WRONG_RECIPIENT = "wrong_recipient"
    # step 6: replay / duplicate
    REPLAY = "replay"
    DUPLICATE = "duplicate"
    REPLAY_CACHE_FULL = "replay_cache_full"
    REPLAY_QUOTA_SIGNER = "replay_quota_signer"  # the signer already holds its share of the cache
    REPLAY_QUOTA_VIA = "replay_quota_via"  # the delivering peer already holds its share
    # step 7: freshness
    TOO_OLD = "too_old"
    FROM_FUTURE = "from_future"
    STALE_POLICY = "stale_policy"
    # step 8: task re-derivation
    TASK_NOT_ALLOWED = "task_not_allowed"
    TASK_INVALID = "task_invalid"
    PROMPT_MISMATCH = "prompt_mismatch"
    SYSTEM_PROMPT_MISMATCH = "system_prompt_mismatch"  # chat or bare, or another system turn, than ours
    # step 9: local re-scoring
    COMPLETION_TOO_LONG = "completion_too_long"  # more tokens than this node would generate and train
    COMPLETION_UNTRAINABLE = "completion_untrainable"  # spells special tokens or <unk> under our tokenizer
    VERIFIER_TIMEOUT = "verifier_timeout"  # scoring ran past the boundary's CPU or wall limit
    VERIFIER_FAILED = "verifier_failed"  # the scorer raised, or its sandboxed worker died


class Charge(StrEnum):
    """Whose score a rejection lowers."""

    VIA = "via"  # the transport peer that delivered the bytes
    SIGNER = "signer"  # the authenticated sender
    NOBODY = "nobody"


STEPS: dict[str, tuple[RejectReason, ...]] = {
    "size": (RejectReason.TOO_LARGE,),
    "decode": (RejectReason.MALFORMED, RejectReason.UNSUPPORTED_VERSION, RejectReason.UNKNOWN_KIND),
    "signature": (RejectReason.BAD_SIGNATURE,),
    "sender": (
        RejectReason.BANNED,
        RejectReason.NOT_ALLOWLISTED,
        RejectReason.NEW_IDENTITY_LIMIT,
        RejectReason.RATE_LIMITED,
        RejectReason.CPU_BUDGET,
    ),
    "payload": (
        RejectReason.INVALID_PAYLOAD,
        RejectReason.LIMIT_EXCEEDED,
        RejectReason.SENDER_MISMATCH,
        RejectReason.BAD_MANIFEST_SIGNATURE,
        RejectReason.UNTRUSTED_PUBLISHER,
        RejectReason.WRONG_RECIPIENT,
    ),
    "replay": (
        RejectReason.REPLAY,
        RejectReason.DUPLICATE,
        RejectReason.REPLAY_CACHE_FULL,
        RejectReason.REPLAY_QUOTA_SIGNER,
        RejectReason.REPLAY_QUOTA_VIA,
    ),
    "freshness": (RejectReason.TOO_OLD, RejectReason.FROM_FUTURE, RejectReason.STALE_POLICY),
    "rederive": (
        RejectReason.TASK_NOT_ALLOWED,
        RejectReason.SYSTEM_PROMPT_MISMATCH,
        RejectReason.TASK_INVALID,
        RejectReason.PROMPT_MISMATCH,
    ),
    "rescore": (
        RejectReason.COMPLETION_TOO_LONG,
        RejectReason.COMPLETION_UNTRAINABLE,
        RejectReason.VERIFIER_TIMEOUT,
        RejectReason.VERIFIER_FAILED,
    ),
}

CHARGE: dict[RejectReason, Charge] = {
    RejectReason.TOO_LARGE: Charge.VIA,
    RejectReason.MALFORMED: Charge.VIA,
    RejectReason.UNSUPPORTED_VERSION: Charge.VIA,
    RejectReason.UNKNOWN_KIND: Charge.VIA,
    RejectReason.BAD_SIGNATURE: Charge.VIA,
    RejectReason.BANNED: Charge.NOBODY,
    RejectReason.NOT_ALLOWLISTED: Charge.NOBODY,
    RejectReason.NEW_IDENTITY_LIMIT: Charge.NOBODY,
    RejectReason.RATE_LIMITED: Charge.SIGNER,
    RejectReason.INVALID_PAYLOAD: Charge.SIGNER,
    RejectReason.LIMIT_EXCEEDED: Charge.SIGNER,
    RejectReason.SENDER_MISMATCH: Charge.SIGNER,
    RejectReason.BAD_MANIFEST_SIGNATURE: Charge.SIGNER,
    RejectReason.UNTRUSTED_PUBLISHER: Charge.SIGNER,
    RejectReason.WRONG_RECIPIENT: Charge.VIA,  # a signed control message re-sent to someone else
    RejectReason.REPLAY: Charge.VIA,
    RejectReason.DUPLICATE: Charge.SIGNER,  # same rollouts in a *new* envelope: only the signer can do that
    RejectReason.REPLAY_CACHE_FULL: Charge.NOBODY,
    RejectReason.TOO_OLD: Charge.VIA,
    RejectReason.FROM_FUTURE: Charge.SIGNER,
    RejectReason.STALE_POLICY: Charge.NOBODY,  # depends on the receiver (module docstring)
    RejectReason.TASK_NOT_ALLOWED: Charge.NOBODY,  # receiver-dependent
    RejectReason.TASK_INVALID: Charge.SIGNER,
    RejectReason.PROMPT_MISMATCH: Charge.SIGNER,
    RejectReason.SYSTEM_PROMPT_MISMATCH: Charge.NOBODY,  # receiver-dependent
    RejectReason.CPU_BUDGET: Charge.NOBODY,  # the budget itself is the consequence
    RejectReason.REPLAY_QUOTA_SIGNER: Charge.SIGNER,
    RejectReason.REPLAY_QUOTA_VIA: Charge.VIA,
    RejectReason.COMPLETION_TOO_LONG: Charge.NOBODY,  # receiver-dependent
    RejectReason.COMPLETION_UNTRAINABLE: Charge.SIGNER,
    RejectReason.VERIFIER_TIMEOUT: Charge.SIGNER,
    RejectReason.VERIFIER_FAILED: Charge.SIGNER,
}

#: Score lost per rejection (a peer starts at 0 and is banned at ``ban_threshold``, -10 by
#: default). Forged or fabricated content costs the most; what an honest but slow,
#: outdated or busy peer can trigger costs little.
DEFAULT_PENALTIES: dict[RejectReason, float] = {
    RejectReason.TOO_LARGE: 2.0,
    RejectReason.MALFORMED: 2.0,
    RejectReason.UNSUPPORTED_VERSION: 0.1,
    RejectReason.UNKNOWN_KIND: 0.1,
    RejectReason.BAD_SIGNATURE: 5.0,
    RejectReason.BANNED: 0.0,
    RejectReason.NOT_ALLOWLISTED: 0.0,
    RejectReason.NEW_IDENTITY_LIMIT: 0.0,
    RejectReason.RATE_LIMITED: 0.2,
    RejectReason.INVALID_PAYLOAD: 5.0,
    RejectReason.LIMIT_EXCEEDED: 5.0,
    RejectReason.SENDER_MISMATCH: 10.0,
    RejectReason.BAD_MANIFEST_SIGNATURE: 10.0,
    RejectReason.UNTRUSTED_PUBLISHER: 1.0,
    RejectReason.WRONG_RECIPIENT: 1.0,
    RejectReason.REPLAY: 0.5,
    RejectReason.DUPLICATE: 2.0,
    RejectReason.REPLAY_CACHE_FULL: 0.0,
    RejectReason.TOO_OLD: 0.5,
    RejectReason.FROM_FUTURE: 1.0,
    RejectReason.STALE_POLICY: 0.5,
    RejectReason.TASK_NOT_ALLOWED: 0.5,
    RejectReason.TASK_INVALID: 5.0,
    RejectReason.PROMPT_MISMATCH: 10.0,
    RejectReason.SYSTEM_PROMPT_MISMATCH: 0.5,  # charged to nobody (CHARGE), as TASK_NOT_ALLOWED
    RejectReason.CPU_BUDGET: 0.0,
    # Valid work past a quota: cheap each time, but a party that keeps flooding is banned.
    RejectReason.REPLAY_QUOTA_SIGNER: 0.5,
    RejectReason.REPLAY_QUOTA_VIA: 0.5,
    RejectReason.COMPLETION_TOO_LONG: 0.5,  # a peer generating longer than we do: not forged
    RejectReason.COMPLETION_UNTRAINABLE: 0.5,  # another tokenizer can spell what ours cannot
    RejectReason.VERIFIER_TIMEOUT: 5.0,  # honest answers score in microseconds
    RejectReason.VERIFIER_FAILED: 5.0,
}

assert set(CHARGE) == set(RejectReason) == set(DEFAULT_PENALTIES)
assert sorted(r for rs in STEPS.values() for r in rs) == sorted(RejectReason)
