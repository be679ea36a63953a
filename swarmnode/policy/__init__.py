"""The policy: HF-format model + tokenizer, the built-in tiny model, and its warm start.

Owns: loading/saving any local Hugging Face causal LM (safetensors, atomic
writes), the char tokenizer and ~1 M-parameter Llama of the built-in tiny
model, its cached supervised warm start, and accuracy evaluation on tasks.
Must not: run RL updates (``swarmnode.learn``) or sample on its own
(``swarmnode.rollout`` engines do that).
"""

from swarmnode.policy.evaluate import evaluate_accuracy, task_scores
from swarmnode.policy.model import (
    TINY_MODEL_ID,
    Policy,
    build_tiny_policy,
    load_policy,
    save_policy,
    tiny_config_dict,
)
from swarmnode.policy.tokenizer import DEFAULT_ALPHABET, build_char_tokenizer
from swarmnode.policy.warmstart import (
    WarmStartSettings,
    is_hard,
    load_warm_started,
    read_warm_start_info,
    warm_start,
    warm_start_dir,
)

__all__ = [
    "DEFAULT_ALPHABET",
    "TINY_MODEL_ID",
    "Policy",
    "WarmStartSettings",
    "build_char_tokenizer",
    "build_tiny_policy",
    "evaluate_accuracy",
    "is_hard",
    "load_policy",
    "load_warm_started",
    "read_warm_start_info",
    "save_policy",
    "task_scores",
    "tiny_config_dict",
    "warm_start",
    "warm_start_dir",
]
