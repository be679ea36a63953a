"""Rollout admission: every byte from a peer is checked here before anything uses it.

Owns: the ordered checks (size, decode, signature, sender ban/allowlist/rate,
payload schema, replay, freshness, task re-derivation, local re-scoring), the
rejection reasons, per-reason counters, peer scores and bans. Must not: read a
clock, touch the network, raise on peer input, or use a reward a peer claims.

    pipeline = AdmissionPipeline(AdmissionConfig(allowed_tasks=task_families(mixture)),
                                 now=time.time(), ledger=ledger)
    verdict = pipeline.admit(data, now=time.time(), via=transport_peer_id)
    if verdict.accepted:
        for g in verdict.groups: ...   # g.rewards are our own scores
    else:
        log.debug("rejected %s: %s", verdict.reason, verdict.detail)
"""

from swarmnode.admit.limits import ReplayCache
from swarmnode.admit.peers import BanLedger, PeerBook, ScoreRule
from swarmnode.admit.pipeline import AdmissionConfig, AdmissionPipeline, TaskFamily, task_families
from swarmnode.admit.reasons import CHARGE, DEFAULT_PENALTIES, STEPS, Charge, RejectReason
from swarmnode.admit.verdict import Accepted, AdmittedGroup, Rejected, Verdict

__all__ = [
    "CHARGE",
    "DEFAULT_PENALTIES",
    "STEPS",
    "Accepted",
    "AdmissionConfig",
    "AdmissionPipeline",
    "AdmittedGroup",
    "BanLedger",
    "Charge",
    "PeerBook",
    "RejectReason",
    "Rejected",
    "ReplayCache",
    "ScoreRule",
    "TaskFamily",
    "Verdict",
    "task_families",
]
