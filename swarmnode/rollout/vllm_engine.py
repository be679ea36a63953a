"""The ``vllm`` rollout engine: batched sampling on a CUDA GPU through vLLM.

Owns: one in-process ``vllm.LLM`` started on a saved copy of the policy, sampling
``n`` completions per prompt from token ids (each prompt is prefilled once and
its KV blocks shared by the n samples: vLLM's parallel sampling), per-token
log-probs, and loading new weights into the running engine in place after each
learner step or received broadcast version, without restarting it.
Must not: score, train, or touch the network.

Written against vLLM 0.22 (the V1 engine), the API checked in its documentation:
``LLM(logprobs_mode=, generation_config=, skip_tokenizer_init=)``, ``LLM.collective_rpc``
with a callable, ``LLM.reset_prefix_cache``, ``SamplingParams(logprobs=0)``, token-id
prompts. Not yet run on a GPU (PyPI had vLLM 0.33 at the time): ``bench/vllm_smoke.py``
checks an install there.

Log-prob convention (``rollout.types``): ``log_softmax(logits / T)`` of the sampled
token, before top-p truncation. The engine starts vLLM with
``logprobs_mode="processed_logprobs"``: log-probs after temperature *and* top-k/top-p.
With ``top_p == 1`` (the default) that is exactly the convention; with ``top_p < 1``
vLLM's value is the truncated, renormalized distribution's, so the engine re-scores
the sampled tokens with the policy model (one teacher-forced forward pass).

Weight updates: ``update_weights`` hands the policy's state dict to the worker's
``model.load_weights`` (HF parameter names; vLLM fuses q/k/v and gate/up itself) via
``collective_rpc``, then drops the prefix cache, whose KV blocks were computed with
the old weights. vLLM's EngineCore runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here unless the caller set it), so the
tensors are not serialized; with multiprocessing on they are sent as CPU tensors.
Tensor parallelism is not supported (one GPU per engine): ``load_weights`` expects
full, unsharded tensors.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from swarmnode.errors import EngineUnavailable
from swarmnode.policy.lora import merged_state_dict
from swarmnode.policy.model import Policy, save_policy
from swarmnode.rollout.keyed import SamplingKeys
from swarmnode.rollout.types import (
    GenerationResult,
    SamplingParams,
    encode_prompts,
    group_completions,
    sequence_logprobs,
)

log = logging.getLogger(__name__)

#: vLLM's switch for running EngineCore in a separate process (V1 engine).
MULTIPROCESSING_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"
_SEED_RANGE = 2**31 - 1


def require_vllm() -> Any:
    """Import vllm, or raise ``EngineUnavailable`` saying what is missing (vllm, CUDA)."""
    # find_spec first: importing vllm is slow and pulls CUDA libraries.
    if importlib.util.find_spec("vllm") is None:
        raise EngineUnavailable(
            "engine 'vllm' needs the vllm package and a CUDA GPU: install with "
            "pip install 'swarmnode[vllm]' on a GPU machine (or use docker/Dockerfile.gpu), "
            "or choose engine 'torch'"
        )
    if not torch.cuda.is_available():
        raise EngineUnavailable(
            "engine 'vllm' needs a CUDA GPU and torch sees none (torch "
            f"{torch.__version__}, CUDA build {torch.version.cuda}); choose engine 'torch'"
        )
    try:
        import vllm
    except (ImportError, OSError, RuntimeError) as exc:  # broken CUDA libraries, ABI mismatch
        raise EngineUnavailable(f"vllm is installed but does not import here: {exc}") from exc
    return vllm


def _weights_key(model: nn.Module) -> tuple[int, ...]:
    # Optimizer steps and load_state_dict bump each tensor's version counter: the key
    # changes exactly when the weights vLLM holds went stale (same rule as the torch engine).
    return (id(model), *(p._version for p in model.parameters()), *(id(p) for p in model.parameters()))


def _load_weights_into_worker(worker: Any, weights: Sequence[tuple[str, torch.Tensor]]) -> int:
    """Runs on vLLM's GPU worker (``collective_rpc``): load HF-named tensors into its model."""
    target = getattr(worker, "worker", worker)  # a WorkerWrapperBase wraps the worker in some versions
    runner = target.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    loaded = model.load_weights(weights)
    return len(loaded) if loaded is not None else len(weights)


def rows_from_outputs(outputs: Sequence[Any], n: int) -> tuple[list[list[int]], list[list[float]]]:
    """vLLM ``RequestOutput``s (one per prompt) -> token and log-prob rows, row = prompt * n + sample.

    Each completion's ``logprobs`` is a list (one entry per generated token) of
    mappings token id -> ``Logprob``; with ``SamplingParams(logprobs=0)`` the entry
    holds the sampled token only. vLLM keeps the EOS / stop token in ``token_ids``.
    """
    tokens: list[list[int]] = []
    logprobs: list[list[float]] = []
    for request in outputs:
        samples = sorted(request.outputs, key=lambda c: c.index)
        if len(samples) != n:
            raise EngineUnavailable(f"vllm returned {len(samples)} samples for a prompt, expected {n}")
        for sample in samples:
            ids = [int(t) for t in sample.token_ids]
            if sample.logprobs is None or len(sample.logprobs) < len(ids):
                raise EngineUnavailable("vllm returned no log-probs; was SamplingParams(logprobs=0) dropped?")
            tokens.append(ids)
            logprobs.append([float(sample.logprobs[i][token].logprob) for i, token in enumerate(ids)])
    return tokens, logprobs


class VLLMEngine:
    """``RolloutEngine`` on vLLM; see the module docstring.

    ``llm``: an already-started ``vllm.LLM`` serving this policy's architecture (it must
    have been built with ``logprobs_mode="processed_logprobs"``); when None the engine
    saves the policy to a private temporary directory and starts one there.
    ``gpu_memory_utilization``: vLLM's share of GPU memory (weights + KV cache); leave
    room for the learner when it shares the GPU. ``dtype``: None = the policy's.
    """

    name = "vllm"

    def __init__(
        self,
        policy: Policy,
        *,
        gpu_memory_utilization: float = 0.4,
        dtype: str | None = None,
        enforce_eager: bool = False,
        max_model_len: int | None = None,
        seed: int = 0,
        llm: Any | None = None,
        sampling_params_cls: Callable[..., Any] | None = None,
    ) -> None:
        self._policy = policy
        self._model_dir: Path | None = None
        if llm is None:
            vllm = require_vllm()
            llm = self._start(vllm, policy, gpu_memory_utilization, dtype, enforce_eager, max_model_len, seed)
            sampling_params_cls = sampling_params_cls or vllm.SamplingParams
        elif sampling_params_cls is None:
            sampling_params_cls = require_vllm().SamplingParams
        self._llm = llm
        self._sampling_params_cls = sampling_params_cls
        self._weights_key = _weights_key(policy.model)

    def _start(
        self,
        vllm: Any,
        policy: Policy,
        gpu_memory_utilization: float,
        dtype: str | None,
        enforce_eager: bool,
        max_model_len: int | None,
        seed: int,
    ) -> Any:
        # vLLM loads models from disk: give it a private copy of the current weights.
        root = Path(tempfile.mkdtemp(prefix="swarmnode-vllm-"))
        self._model_dir = root / "model"
        weakref.finalize(self, shutil.rmtree, root, True)
        save_policy(policy, self._model_dir)
        if os.environ.setdefault(MULTIPROCESSING_ENV, "0") != "0":
            log.warning(
                "%s is set: weight updates will be pickled to vLLM's EngineCore process", MULTIPROCESSING_ENV
            )
        param_dtype = next(policy.model.parameters()).dtype
        try:
            return vllm.LLM(
                model=str(self._model_dir),
                # Prompts arrive as token ids and completions are decoded by the policy's
                # tokenizer: vLLM needs none (EOS comes from stop_token_ids).
                skip_tokenizer_init=True,
                dtype=dtype or str(param_dtype).removeprefix("torch."),
                gpu_memory_utilization=gpu_memory_utilization,
                enforce_eager=enforce_eager,
                max_model_len=max_model_len,
                seed=seed,
                # Log-probs after temperature (see the module docstring).
                logprobs_mode="processed_logprobs",
                # Only our SamplingParams apply, never the checkpoint's generation_config.json
                # defaults (Qwen's top_k=20, repetition_penalty=1.05 would change the distribution).
                generation_config="vllm",
                enable_prefix_caching=True,
            )
        except TypeError as exc:  # an argument this vLLM does not know: too old
            raise EngineUnavailable(
                f"vllm {getattr(vllm, '__version__', '?')} lacks an option this engine needs ({exc}); "
                "install vllm >= 0.10.2"
            ) from exc

    @property
    def policy(self) -> Policy:
        return self._policy

    # ------------------------------------------------------------------ weights

    def update_weights(self, policy: Policy) -> None:
        """Load ``policy``'s weights into the running engine, in place (no restart)."""
        # Merged weights under the base architecture's names (LoRA adapters folded in).
        weights: list[tuple[str, torch.Tensor]] = list(merged_state_dict(policy.model).items())
        if os.environ.get(MULTIPROCESSING_ENV, "0") != "0":
            weights = [(name, tensor.cpu()) for name, tensor in weights]
        self._llm.collective_rpc(_load_weights_into_worker, args=(weights,))
        # Cached prefixes hold KV computed with the old weights.
        self._llm.reset_prefix_cache()
        self._policy = policy
        self._weights_key = _weights_key(policy.model)

    # ------------------------------------------------------------------ sampling

    def _vllm_params(self, params: SamplingParams, n: int, seed: int | None) -> Any:
        return self._sampling_params_cls(
            n=n,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            logprobs=0,  # the sampled token's log-prob only
            seed=seed,
            stop_token_ids=[self._policy.eos_token_id],
            detokenize=False,  # the policy's tokenizer decodes (decode_completion)
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
                "vLLM workers cannot be verified this way yet"
            )
        started = time.perf_counter()
        if _weights_key(self._policy.model) != self._weights_key:
            self.update_weights(self._policy)  # changed in place since the last push
        policy = self._policy
        prompt_ids = encode_prompts(policy, prompts, n)
        if not prompt_ids:
            return GenerationResult([], [], policy.version, 0, time.perf_counter() - started)
        # One seed per call from the caller's generator, one per prompt from it: reproducible runs.
        base = None
        if generator is not None:
            base = int(torch.randint(0, _SEED_RANGE, (1,), generator=generator, device=generator.device))
        requests = [{"prompt_token_ids": ids} for ids in prompt_ids]
        per_prompt = [
            self._vllm_params(params, n, None if base is None else (base + i) % _SEED_RANGE)
            for i in range(len(prompt_ids))
        ]
        outputs = self._llm.generate(requests, per_prompt, use_tqdm=False)
        tokens, logprobs = rows_from_outputs(outputs, n)
        if params.top_p < 1.0 and not params.greedy:
            logprobs = self.rescore(prompt_ids, tokens, n, params)
        completions, generated = group_completions(policy, tokens, logprobs, n)
        return GenerationResult(
            prompt_ids=prompt_ids,
            completions=completions,
            policy_version=policy.version,
            tokens_generated=generated,
            seconds=time.perf_counter() - started,
        )

    def rescore(
        self, prompt_ids: list[list[int]], token_rows: list[list[int]], n: int, params: SamplingParams
    ) -> list[list[float]]:
        """Log-probs of ``token_rows`` under the policy by the convention (teacher-forced forward)."""
        model = self._policy.model
        device = next(model.parameters()).device
        pad = self._policy.pad_token_id
        rows = [prompt_ids[i // n] + tokens for i, tokens in enumerate(token_rows)]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
        mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask).logits
        out: list[list[float]] = []
        for i, tokens in enumerate(token_rows):
            start = len(prompt_ids[i // n])
            if not tokens:
                out.append([])
                continue
            scores = logits[i, start - 1 : start - 1 + len(tokens)]
            picked = torch.tensor(tokens, dtype=torch.long, device=device)
            out.append(sequence_logprobs(scores, picked, params).tolist())
        return out
