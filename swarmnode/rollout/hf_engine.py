"""Reference rollout engine: transformers' ``model.generate``.

Owns: the ``hf`` engine, used as the correctness and speed reference for the
torch engine and as the fallback for architectures the torch engine does not
run. Same contract and log-prob convention (``rollout.types``). ``generate``
draws from torch's global RNG, so a given ``generator`` is turned into a seed
for a forked global RNG: same generator state, same output, and the caller's
global RNG is left untouched. Must not: train, score, or mutate the model.
"""

from __future__ import annotations

import time

import torch
from transformers import GenerationConfig

from swarmnode.errors import EngineUnavailable
from swarmnode.policy.model import Policy
from swarmnode.rollout.keyed import SamplingKeys
from swarmnode.rollout.types import (
    GenerationResult,
    SamplingParams,
    encode_prompts,
    group_completions,
    sequence_logprobs,
)


class HFEngine:
    """Batched sampling with ``model.generate`` (left padding, each prompt repeated ``n`` times)."""

    name = "hf"

    def __init__(self, policy: Policy) -> None:
        self._policy = policy

    @property
    def policy(self) -> Policy:
        return self._policy

    def update_weights(self, policy: Policy) -> None:
        self._policy = policy

    def _generation_config(self, params: SamplingParams) -> GenerationConfig:
        policy = self._policy
        sampling: dict[str, object] = (
            {"do_sample": False, "temperature": 1.0, "top_p": 1.0}
            if params.greedy
            else {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p}
        )
        if getattr(getattr(policy.model, "generation_config", None), "min_p", None) is not None:
            sampling["min_p"] = 0.0  # only override when the model sets one (0.0 still adds a warper)
        return GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            min_new_tokens=0,
            # generate() fills every unset (None) field from the model's own
            # generation_config and then from global defaults (top_k=50!): spell out
            # the neutral value of every logits processor so only T and top-p act.
            top_k=0,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            num_beams=1,
            eos_token_id=policy.eos_token_id,
            pad_token_id=policy.pad_token_id,
            bos_token_id=policy.bos_token_id,
            return_dict_in_generate=True,
            output_logits=True,
            **sampling,
        )

    def generate(
        self,
        prompts: list[str],
        n: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
        *,
        keys: SamplingKeys | None = None,
    ) -> GenerationResult:
        if keys is not None:
            raise EngineUnavailable(
                "keyed sampling (SPEC.md, checkable by a learner) is implemented by the torch engine only; "
                "the hf engine samples with transformers' generate"
            )
        started = time.perf_counter()
        policy = self._policy
        prompt_ids = encode_prompts(policy, prompts, n)
        if not prompt_ids:
            return GenerationResult([], [], policy.version, 0, time.perf_counter() - started)
        device = policy.device
        width = max(len(ids) for ids in prompt_ids)
        input_ids = torch.full((len(prompt_ids), width), policy.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
        for row, ids in enumerate(prompt_ids):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        # Rows p*n .. p*n+n-1 are prompt p (what num_return_sequences does, but greedy allows it too).
        input_ids = input_ids.repeat_interleave(n, dim=0)
        attention_mask = attention_mask.repeat_interleave(n, dim=0)
        seed = None
        if generator is not None:
            seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
        devices = [device] if device.type == "cuda" else []
        with torch.inference_mode(), torch.random.fork_rng(devices=devices):
            if seed is not None:
                torch.manual_seed(seed)
            output = policy.model.generate(  # type: ignore[operator]
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                generation_config=self._generation_config(params),
            )
            new_tokens = output.sequences[:, width:]
            scores = torch.stack(output.logits, dim=1)  # (P*n, steps, vocab), raw logits
            logprobs = sequence_logprobs(scores, new_tokens, params)
        completions, generated = group_completions(policy, new_tokens.tolist(), logprobs.tolist(), n)
        return GenerationResult(
            prompt_ids, completions, policy.version, generated, time.perf_counter() - started
        )
