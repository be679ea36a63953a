"""The policy: HF-format model + tokenizer, the built-in tiny model, and its warm start.

Owns: loading/saving any local Hugging Face causal LM (safetensors, atomic
writes), the char tokenizer and ~1 M-parameter Llama of the built-in tiny
model, its cached supervised warm start, accuracy evaluation on tasks, and the
chat-format prompt rule (``chat``) for models whose tokenizer has a chat template.
Must not: run RL updates (``swarmnode.learn``) or sample on its own
(``swarmnode.rollout`` engines do that).
"""

from swarmnode.policy.chat import DEFAULT_SYSTEM_PROMPT, build_chat_tokenizer, render_chat_prompt
from swarmnode.policy.evaluate import evaluate_accuracy, task_scores
from swarmnode.policy.model import (
    TINY_MODEL_ID,
    Policy,
    PromptFormat,
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
    "DEFAULT_SYSTEM_PROMPT",
    "TINY_MODEL_ID",
    "Policy",
    "PromptFormat",
    "WarmStartSettings",
    "build_char_tokenizer",
    "build_chat_tokenizer",
    "build_tiny_policy",
    "evaluate_accuracy",
    "is_hard",
    "load_policy",
    "load_warm_started",
    "read_warm_start_info",
    "render_chat_prompt",
    "save_policy",
    "task_scores",
    "tiny_config_dict",
    "warm_start",
    "warm_start_dir",
]
