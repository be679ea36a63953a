"""How well the learner's token checks catch workers that do not sample what they claim (#20).

Question: a worker claims its groups come from the learner's current version v, sampled by the
keyed rule (protocol/SPEC.md 1.8) with the seed of its activation. Per spot-checked group the
learner checks 16 tokens. What share of checks catch each kind of cheater, how many spot-checked
batches does a cheater last (target: caught within 3 at a spot-check rate of 25%), and how often
is an honest worker failed (target: never, over >= 1,000 groups, at 1 and 2 threads)?

Three ways to choose the 16 positions, all from the same forward pass over the whole group:
``random`` (uniform over the group's tokens, the spot checker's draw for the log-prob check);
``uncertain`` (the 16 positions where our policy is least sure of its top token, lowest max
probability after temperature: where a sampler that is not ours most often picks another token; a
certain position tells nothing, every sampler agrees there), which a worker knowing the rule could
predict; and ``learner``, what the learner does (``admit.recompute.scan_group``): half drawn
uniformly, half without replacement with weight ``1 - p_top + 1/16``, mostly where we are unsure,
unpredictably.

Setup: the built-in tiny model warm-started on the default mixture (cached under --cache), then two
RL updates on its own groups: that is version v, the learner's. Workers, each 1 thread unless
said: honest (v, keyed, right seed); ``2 versions old`` (the warm start, keyed, right seed);
``temperature 0.7`` (v, keyed at 0.7 instead of 1.0); ``greedy`` (v, argmax); ``another model``
(a different init warm-started briefly: a cheaper model, keyed, right seed); ``unknown seed``
(v, keyed with a seed the learner never gave: replayed or precomputed completions). G = 8
completions of up to 16 tokens; reasoning-gym default-mixture prompts; honest log-probs always
(every log-prob check passes: only the tokens can tell).

    python bench/keyed_detection.py [--groups 200] [--honest-groups 1000] [--group-size 8]
        [--new-tokens 16] [--json out.json]
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import base_parser, machine, print_table, write_json

from swarmnode.admit.recompute import scan_group, tokens_at
from swarmnode.admit.spotcheck import SpotCheckConfig, SpotChecker, SpotCheckRequest, TokenRef
from swarmnode.config import load_config
from swarmnode.policy import WarmStartSettings, load_policy, warm_start
from swarmnode.policy.model import Policy
from swarmnode.rollout import SamplingParams
from swarmnode.rollout.keyed import TokenCheck
from swarmnode.rollout.sampling_keys import SamplingKeys
from swarmnode.rollout.torch_engine import TorchEngine
from swarmnode.store import CheckpointStore, Ledger
from swarmnode.tasks import default_mixture
from swarmnode.train import Trainer
from swarmnode.train.batch import completion_logits

G = 8
TOKENS = 16
WAYS = ("random", "uncertain", "learner", "all")
SEED = b"\x5a" * 32
OTHER_SEED = b"\xa5" * 32
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=16)
CHEAP = WarmStartSettings(max_steps=120, eval_every=60, eval_tasks=64, heldout_tasks=64, target_accuracy=1.0)


def learner_version(warm: Path, tmp: Path) -> Policy:
    """The warm start after two RL updates on its own groups (the learner's version v)."""
    policy = load_policy(warm)
    config = load_config(None, environ={}, overrides={"rollout.max_new_tokens": 16})
    with Ledger(tmp / "ledger.sqlite") as ledger:
        trainer = Trainer(
            config, policy, TorchEngine(policy), default_mixture(0), ledger, CheckpointStore(tmp / "c")
        )
        for r in (1, 2):
            own, _, _ = trainer.generate_groups(r)
            trainer.update(own)
    policy.model.eval()
    return policy


def positions_uncertain(logits: torch.Tensor, mask: torch.Tensor, k: int) -> list[TokenRef]:
    """The ``k`` positions of the group where our top token is least likely (after temperature)."""
    top = torch.softmax(logits / PARAMS.temperature, dim=-1).max(dim=-1).values  # (G, T)
    top = top.masked_fill(mask == 0, 2.0)  # padding never chosen
    flat = torch.argsort(top.flatten())[: min(k, int(mask.sum()))]
    width = mask.shape[1]
    return [TokenRef(i // width, i % width) for i in sorted(int(i) for i in flat)]


def run_worker(
    name: str,
    engine: TorchEngine,
    learner: Policy,
    prompts: list[tuple[str, str]],
    params: SamplingParams,
    seed: bytes | None,
    threads: int,
) -> dict[str, Any]:
    """Generate ``prompts`` as the worker does, check 16 tokens of every group two ways."""
    checker = SpotChecker(SpotCheckConfig(sample_rate=1.0, max_tokens=TOKENS, seed=7))
    caught = dict.fromkeys(WAYS, 0)
    skipped = dict.fromkeys(WAYS, 0)
    checked = dict.fromkeys(WAYS, 0)
    groups = 0
    for start in range(0, len(prompts), 8):
        batch = prompts[start : start + 8]
        torch.set_num_threads(threads)
        keys = SamplingKeys(seed, tuple(k for k, _ in batch)) if seed is not None else None
        result = engine.generate(
            [p for _, p in batch], G, params, torch.Generator().manual_seed(start), keys=keys
        )
        torch.set_num_threads(1)
        for (key, _), prompt, group in zip(batch, result.prompt_ids, result.completions, strict=True):
            completions = [c.token_ids for c in group]
            if not any(completions):
                continue
            groups += 1
            with torch.no_grad():
                logits, mask = completion_logits(
                    learner.model, [prompt] * G, completions, learner.pad_token_id
                )
            drawn = checker.select("w", key, [len(c) for c in completions])
            assert drawn is not None
            ways = {
                "random": drawn.tokens,
                "uncertain": tuple(positions_uncertain(logits, mask, TOKENS)),
                "learner": scan_group(
                    learner.model,
                    drawn,
                    prompt,
                    completions,
                    PARAMS.temperature,
                    learner.pad_token_id,
                    token_checks=TOKENS,
                    draw_seed=checker.draw_seed(),
                ).tokens.tokens,
                # every token of the group: the ceiling of any draw (a group with no token that
                # differs from what the keyed rule picks cannot be caught, and costs nothing)
                "all": tuple(TokenRef(c, t) for c, row in enumerate(completions) for t in range(len(row))),
            }
            for how, tokens in ways.items():
                request = SpotCheckRequest("w", key, tokens)
                at = logits[[t.completion for t in tokens], [t.position for t in tokens]]
                checks = tokens_at(at, request, completions, PARAMS, SEED, key)
                caught[how] += TokenCheck.MISMATCH in checks
                skipped[how] += checks.count(TokenCheck.SKIPPED)
                checked[how] += len(checks)
    out: dict[str, Any] = {"worker": name, "groups": groups, "threads": threads}
    for how in caught:
        p = caught[how] / groups if groups else 0.0
        out[how] = {
            "caught_share": p,
            "spot_checked_batches_to_catch": (1 / p) if p else None,
            "caught_within_3": 1 - (1 - p) ** 3,
            "skipped_positions_share": skipped[how] / checked[how] if checked[how] else 0.0,
            "failed_checks": caught[how],
        }
    return out


def main() -> int:
    global G, PARAMS
    parser = base_parser(__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=200, help="groups per cheater")
    parser.add_argument("--honest-groups", type=int, default=1000, help="groups per honest run")
    parser.add_argument("--cache", type=Path, default=Path("runs/bench"), help="warm-start cache")
    parser.add_argument("--group-size", type=int, default=G, help="completions per group (G)")
    parser.add_argument(
        "--new-tokens", type=int, default=PARAMS.max_new_tokens, help="tokens per completion, at most"
    )
    args = parser.parse_args()
    G, PARAMS = args.group_size, dataclasses.replace(PARAMS, max_new_tokens=args.new_tokens)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    mixture = default_mixture(0)
    warm = warm_start(args.cache, mixture, 0)
    cheap = warm_start(args.cache, mixture, 5, settings=CHEAP)
    with tempfile.TemporaryDirectory() as tmp:
        learner = learner_version(warm, Path(tmp))
    old = load_policy(warm)
    other = load_policy(cheap)
    for p in (old, other):
        p.model.eval()

    def prompts(n: int, stream: str) -> list[tuple[str, str]]:
        return [(t.id.key(), t.prompt) for t in mixture.sample(0, n, stream=stream)]

    greedy = dataclasses.replace(PARAMS, temperature=0.0)
    cold = dataclasses.replace(PARAMS, temperature=0.7)
    runs = [
        ("honest, 1 thread", TorchEngine(learner), PARAMS, SEED, 1, args.honest_groups),
        ("honest, 2 threads", TorchEngine(learner), PARAMS, SEED, 2, args.honest_groups),
        ("2 versions old", TorchEngine(old), PARAMS, SEED, 1, args.groups),
        ("temperature 0.7", TorchEngine(learner), cold, SEED, 1, args.groups),
        ("greedy", TorchEngine(learner), greedy, None, 1, args.groups),
        ("another model", TorchEngine(other), PARAMS, SEED, 1, args.groups),
        ("unknown seed", TorchEngine(learner), PARAMS, OTHER_SEED, 1, args.groups),
    ]
    results = []
    for name, engine, params, seed, threads, n in runs:
        results.append(run_worker(name, engine, learner, prompts(n, f"bench-{name}"), params, seed, threads))
        print(f"  {name}: done ({time.perf_counter() - t0:.0f} s)", flush=True)
    rows = []
    for r in results:
        row = [r["worker"], r["groups"]]
        for how in WAYS:
            f = r[how]
            batches = f["spot_checked_batches_to_catch"]
            row += [
                f"{f['caught_share']:.3f}",
                "-" if batches is None else f"{batches:.2f}",
                f"{f['caught_within_3']:.3f}",
                f"{f['skipped_positions_share']:.3f}",
            ]
        rows.append(row)
    print_table(
        f"keyed token checks, {TOKENS} tokens per spot-checked group (G = {G}, up to "
        f"{PARAMS.max_new_tokens} tokens each; all: every token of the group, the ceiling)",
        [
            "worker", "groups",
            "random: caught", "checks to catch", "within 3", "skipped",
            "uncertain: caught", "checks to catch", "within 3", "skipped",
            "learner: caught", "checks to catch", "within 3", "skipped",
            "all: caught", "checks to catch", "within 3", "skipped",
        ],
        rows,
        [
            "caught: share of spot-checked groups with a token that is not the keyed rule's choice "
            "(for honest workers: false positives); checks to catch: 1 / caught; within 3: chance "
            "a cheater is caught by its first 3 spot-checked batches; at a 25% spot-check rate a "
            "cheater lasts 4x the checks in batches. skipped: positions within the margin of a CDF "
            "boundary, neither passed nor failed."
        ],
    )  # fmt: skip
    write_json(args.json, {"machine": machine(), "results": results, "seconds": time.perf_counter() - t0})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
