"""HACPO (arXiv 2603.02604): learn from rollouts of heterogeneous agents on the same prompts.

Owns: capability tracking, the capability-aware baseline, the discrepancy coefficient, exponential
importance sampling with stepwise clipping, and the HACPO loss. Must not: re-tokenize text, score
completions, talk to peers, or do any I/O (the node feeds in rewards, agent ids and mean log-probs).

Notation: learner k trains on a joint group of responses to one prompt from n agents; j is the agent that
generated a response; R its verified reward (re-scored by k); P(k) agent k's capability.
Equations as numbered in the official code's docstrings (zzx-peter/HACRL-code,
``recipe/hacpo/hacpo_core_algos.py``: advantages Eqs. 5-6, loss Eq. 59, clipping schedule Appendix E
Eqs. 56-57)::

    P_hat(k)    = mean of agent k's per-step batch reward mean over the last K = 5 steps
    w(k, j)     = clamp(P_hat(k) / P_hat(j), 0.1, 10)                              capability ratio
    mu(k)       = 1/N * sum_{responses y} w(k, j(y)) * R(y)                        capability-aware baseline
    A_k(y)      = (R(y) - mu(k)) / (std of all N rewards + eps)
    s(y)        = exp(mean_t logp_theta_k(y) - mean_t logp_old_j(y))           each mean over its own tokens
    clip_m(s)   = clamp(s, 1 - delta + m * delta_step, 1)                          m = updates made this step
    own y:      o(y) = min(s A_k, clip(s, 1 - eps_low, 1 + eps_high) A_k)           (GSPO)
    foreign y:  o(y) = clip_m(s) * sg[clip_m(s)]^alpha * w(j, k) * A_k(y)           (exp. IS + discrepancy)
    loss        = -1/B * sum_y o(y)  (+ beta * KL on own responses)

Guards (official code, kept): a group whose rewards are all equal uses the plain mean as baseline (so all
its advantages are 0: capability weights must not invent a signal); if ``mu(k) > 1`` (impossible for 0/1
rewards unless weights inflate it) the baseline falls back to the learner's own responses' mean.

Choices where paper and official code differ, or where a swarm differs from their two-agent setup:

- Capability is the mean reward (paper; what peers share). The official tracker defaults to the positive
  rate ``mean(R > 0)``; identical for 0/1 rewards.
- An agent with no history yet gets ratio 1 against anyone (neutral). The official tracker gives it
  capability 1.0, which never matters there because every agent reports every step; in a swarm peers join.
- Groups need not have G responses from every agent (official code requires equal counts).
- ``|log s| <= max_log_ratio`` (10) as in our GSPO; the official default applies no clamp.
- The KL (official: 0.001, verl ``low_var_kl`` = k3 clamped to [-10, 10]) is taken on own responses only
  and averaged seq-mean-token-mean over them, as the official ``hacpo_ppo_loss`` does.
Defaults follow the official run scripts: eps 3e-4 / 4e-4, delta 0.2, delta_step 0.025, alpha 1, K 5.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from swarmnode.learn.advantages import zero_advantage
from swarmnode.learn.aggregate import aggregate
from swarmnode.learn.grpo import k3_kl
from swarmnode.learn.gspo import EPS_HIGH, EPS_LOW


class CapabilityTracker:
    """Rolling capability P_hat per agent (mean of its last ``window`` batch reward means) and ratios w.

    Bounded: ``window`` floats per agent, and at most ``max_agents`` agents: past that, the one
    updated least recently is forgotten (signers are free: every one that sent a group stayed, in
    memory and in each checkpoint, 92,160 of them in a day at admission's 64 new signers a minute,
    red team rt61 F2; a forgotten agent's ratio is 1 again, as for any new one). Call ``forget``
    when a peer leaves. Not thread-safe (one trainer).
    """

    def __init__(
        self,
        window: int = 5,
        *,
        ratio_min: float = 0.1,
        ratio_max: float = 10.0,
        floor: float = 1e-8,
        max_agents: int = 4096,
    ) -> None:
        if window <= 0:
            raise ValueError(f"window must be positive, got {window}")
        if max_agents <= 0:
            raise ValueError(f"max_agents must be positive, got {max_agents}")
        if not 0 < ratio_min <= ratio_max:
            raise ValueError(f"need 0 < ratio_min <= ratio_max, got {ratio_min}, {ratio_max}")
        if not floor > 0:
            raise ValueError(f"floor must be positive, got {floor}")
        self.window = window
        self.ratio_min = ratio_min
        self.ratio_max = ratio_max
        self.floor = floor
        self.max_agents = max_agents
        self._history: OrderedDict[str, deque[float]] = OrderedDict()  # least recently updated first

    def update(self, agent_id: str, batch_reward_mean: float) -> None:
        """Record agent ``agent_id``'s mean reward over its batch of one training step."""
        if not math.isfinite(batch_reward_mean):
            raise ValueError(f"batch reward mean of {agent_id!r} must be finite, got {batch_reward_mean}")
        history = self._history.pop(agent_id, None) or deque(maxlen=self.window)
        history.append(float(batch_reward_mean))
        self._history[agent_id] = history
        if len(self._history) > self.max_agents:
            self._history.popitem(last=False)

    def capability(self, agent_id: str) -> float | None:
        """P_hat(agent): mean of its recorded values, floored at ``floor``; None if none recorded."""
        history = self._history.get(agent_id)
        if not history:
            return None
        return max(sum(history) / len(history), self.floor)

    def ratio(self, numerator: str, denominator: str) -> float:
        """``w(numerator, denominator) = clamp(P_hat(numerator) / P_hat(denominator), ratio_min, ratio_max)``.

        1.0 when either agent has no history yet.
        """
        top, bottom = self.capability(numerator), self.capability(denominator)
        if top is None or bottom is None:
            return 1.0
        return min(max(top / bottom, self.ratio_min), self.ratio_max)

    def forget(self, agent_id: str) -> None:
        self._history.pop(agent_id, None)

    def agents(self) -> list[str]:
        return sorted(self._history)

    def state_dict(self) -> dict[str, list[float]]:
        return {agent: list(values) for agent, values in self._history.items()}

    def load_state_dict(self, state: Mapping[str, Sequence[float]]) -> None:
        self._history = OrderedDict()
        for agent, values in state.items():
            for value in list(values)[-self.window :]:
                self.update(agent, float(value))


def capability_advantages(
    rewards: Tensor,
    sources: Sequence[str],
    learner: str,
    tracker: CapabilityTracker,
    *,
    eps: float = 1e-6,
    binary_guard: bool = True,
) -> Tensor:
    """A_k (N,) for one prompt's joint group: ``rewards`` (N,) of responses generated by ``sources[i]``.

    Baseline ``mu = mean_i w(learner, sources[i]) * rewards[i]`` with the guards in the module doc (when the
    guard fires and the learner has no response in the group, the plain mean); the scale is the unbiased
    std of all N rewards (1 when N == 1).
    """
    if rewards.dim() != 1 or rewards.shape[0] != len(sources):
        raise ValueError(
            f"rewards must be (N,) with N = len(sources) = {len(sources)}, got {tuple(rewards.shape)}"
        )
    rewards = rewards.detach().to(torch.float32) if not rewards.is_floating_point() else rewards.detach()
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards must all be finite")
    if rewards.numel() == 0:
        return rewards.clone()
    if zero_advantage(rewards.tolist()):
        return torch.zeros_like(rewards)
    weights = rewards.new_tensor([tracker.ratio(learner, source) for source in sources])
    baseline = (weights * rewards).mean()
    if binary_guard and float(baseline) > 1.0:
        own = [i for i, source in enumerate(sources) if source == learner]
        # The official code raises when the learner has no own response here; a swarm node may train on a
        # prompt it did not answer, so use the plain group mean instead.
        baseline = rewards[own].mean() if own else rewards.mean()
    scale = rewards.std(correction=1) if rewards.numel() > 1 else rewards.new_tensor(1.0)
    return (rewards - baseline) / (scale + eps)


def discrepancy_coefficients(sources: Sequence[str], learner: str, tracker: CapabilityTracker) -> Tensor:
    """(N,) ``w(source, learner)`` per response: > 1 amplifies a stronger source, < 1 damps a weaker one."""
    return torch.tensor([tracker.ratio(source, learner) for source in sources], dtype=torch.float32)


def sequence_mean_logp(logp: Tensor, mask: Tensor) -> Tensor:
    """(B,) mean token log-prob of each completion: what a sharing agent sends with each response."""
    mask = mask.to(logp.dtype)
    return (logp * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def exponential_is(ratio: Tensor, alpha: float) -> Tensor:
    """``s * sg[s]^alpha``: value ``s^(1+alpha)``, gradient ``sg[s]^alpha * grad s``."""
    return ratio * ratio.detach().pow(alpha)


def stepwise_clip_lower(update_index: int, *, delta: float = 0.2, delta_step: float = 0.025) -> float:
    """Lower clip bound ``min(1, 1 - delta + m * delta_step)``, m = updates already made this step."""
    if update_index < 0:
        raise ValueError(f"update_index must be >= 0, got {update_index}")
    return min(1.0, 1.0 - delta + update_index * delta_step)


def _check(logp: Tensor, mask: Tensor, vectors: Mapping[str, Tensor]) -> None:
    if logp.dim() != 2 or logp.shape != mask.shape:
        raise ValueError(
            f"logp and mask must both be (B, T); got {tuple(logp.shape)} and {tuple(mask.shape)}"
        )
    for name, value in vectors.items():
        if value.shape != (logp.shape[0],):
            raise ValueError(f"{name} must be (B,) = ({logp.shape[0]},), got {tuple(value.shape)}")


def _hete_objective(
    log_s: Tensor, advantages: Tensor, capability_ratio: Tensor, lower: float, alpha: float
) -> Tensor:
    s_clipped = torch.exp(log_s).clamp(lower, 1.0)
    return exponential_is(s_clipped, alpha) * capability_ratio * advantages


def hacpo_loss(
    logp: Tensor,
    mask: Tensor,
    old_mean_logp: Tensor,
    advantages: Tensor,
    capability_ratio: Tensor,
    is_self: Tensor,
    *,
    update_index: int,
    eps_low: float = EPS_LOW,
    eps_high: float = EPS_HIGH,
    alpha: float = 1.0,
    delta: float = 0.2,
    delta_step: float = 0.025,
    beta: float = 0.0,
    ref_logp: Tensor | None = None,
    max_log_ratio: float = 10.0,
) -> tuple[Tensor, dict[str, float]]:
    """Full HACPO loss ``-(J_homo + J_hete)`` over a mixed batch, as the official ``compute_hacpo_loss``.

    ``old_mean_logp`` (B,): for own responses the mean log-prob under the generating (old) policy, for
    foreign ones the sender's mean log-prob. ``is_self`` (B,) bool. ``capability_ratio`` is ignored on own
    rows. Every response weighs 1/B; ``beta`` adds a k3 KL (clamped at 10, verl's ``low_var_kl``) on own rows.
    """
    _check(
        logp,
        mask,
        {
            "old_mean_logp": old_mean_logp,
            "advantages": advantages,
            "capability_ratio": capability_ratio,
            "is_self": is_self,
        },
    )
    mask = mask.to(logp.dtype)
    own = is_self.to(torch.bool)
    adv = advantages.to(logp.dtype)
    has_tokens = (mask.sum(-1) > 0).to(logp.dtype)
    log_s = (sequence_mean_logp(logp, mask) - old_mean_logp.to(logp.dtype)).clamp(
        -max_log_ratio, max_log_ratio
    )
    s = torch.exp(log_s)

    homo = torch.min(s * adv, s.clamp(1.0 - eps_low, 1.0 + eps_high) * adv)
    lower = stepwise_clip_lower(update_index, delta=delta, delta_step=delta_step)
    # Own rows never use the ratio; neutralise it so a junk value there cannot leak NaN into the gradient.
    ratio_w = torch.where(own, torch.ones_like(adv), capability_ratio.to(logp.dtype))
    hete = _hete_objective(log_s, adv, ratio_w, lower, alpha)
    objective = torch.where(own, homo, hete) * has_tokens
    loss = -objective.mean()

    stats: dict[str, float] = {}
    if beta != 0.0 and bool(own.any()):
        if ref_logp is None:
            raise ValueError("beta != 0 needs ref_logp")
        kl = k3_kl(logp[own], ref_logp.detach()[own]).clamp(max=10.0)
        kl_term = aggregate(kl, mask[own], "seq-mean-token-mean")
        loss = loss + beta * kl_term
        stats["kl"] = float(kl_term.detach())

    with torch.no_grad():
        foreign = ~own
        stats["loss"] = float(loss)
        stats["self_frac"] = float(own.float().mean())
        stats["self_seq_ratio_mean"] = float(s[own].mean()) if bool(own.any()) else 1.0
        stats["cross_seq_ratio_mean"] = float(s[foreign].mean()) if bool(foreign.any()) else 1.0
        stats["clip_lower"] = lower
        stats["cross_clip_lower_frac"] = (
            float((s[foreign] < lower).float().mean()) if bool(foreign.any()) else 0.0
        )
        stats["cross_clip_upper_frac"] = (
            float((s[foreign] > 1.0).float().mean()) if bool(foreign.any()) else 0.0
        )
    return loss, stats
