"""Chat-format prompts: what an instruction-tuned model is asked, in the format it was trained on.

Owns
    The prompt rule for a tokenizer that has a chat template (``render_chat_prompt``): a system
    turn (``rollout.system_prompt``, whose default asks for the final answer inside the
    ``<answer>`` tag that ``extract_answer`` reads), the task's question as the user turn, and the
    generation prompt; and building a byte-level BPE tokenizer with a ChatML template (Qwen2's
    format, ``<|im_end|>`` as EOS) trained locally on task text.
Must not
    Know about weights, sampling or peers. Peer text never goes through a template: the user
    turn is the question the node derives itself from a task id.
"""

from __future__ import annotations

import datetime as _datetime
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import jinja2
import transformers.utils.chat_template_utils as _template_utils
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from swarmnode.config import DEFAULT_SYSTEM_PROMPT
from swarmnode.errors import ModelError
from swarmnode.wire import system_prompt_id

__all__ = [
    "CHATML_TEMPLATE",
    "DEFAULT_SYSTEM_PROMPT",
    "build_chat_tokenizer",
    "check_chat_template",
    "render_chat_prompt",
    "system_prompt_id",
]

END_OF_TEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
#: The built-in chat tokenizer's special tokens, ids 0, 1, 2 (Qwen2's names).
CHAT_SPECIAL_TOKENS: tuple[str, ...] = (END_OF_TEXT, IM_START, IM_END)

#: ChatML, as Qwen2-Instruct renders it (without tools): each turn is
#: ``<|im_start|>ROLE\nCONTENT<|im_end|>\n``; the generation prompt opens the assistant turn.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


#: What a template's ``date_string`` is (Llama 3.x templates print "Today Date: <date_string>" in
#: the system turn and fall back to the clock only when it is undefined): the date Llama 3.1's own
#: template defaults to. A prompt must not depend on the day or the time zone it is rendered in:
#: peers whose groups name the same system prompt must have asked the same system turn (SPEC 1.3).
PINNED_DATE_STRING = "26 Jul 2024"
#: Anything a foreign template can raise while rendering (it is code shipped with a model).
_TEMPLATE_ERRORS = (
    jinja2.TemplateError,
    ArithmeticError,  # 1 / 0, the sandbox's "range too big" (OverflowError)
    LookupError,
    ValueError,
    TypeError,
    AttributeError,
    RecursionError,
    MemoryError,
)


def has_chat_template(tokenizer: PreTrainedTokenizerBase) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def chat_messages(question: str, system_prompt: str) -> list[dict[str, str]]:
    """The conversation a prompt renders: a system turn (omitted when ``system_prompt`` is empty)
    and the question as the user turn."""
    turns = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*turns, {"role": "user", "content": question}]


def render_chat_prompt(
    tokenizer: PreTrainedTokenizerBase, question: str, system_prompt: str, *, model_id: str = "?"
) -> str:
    """The prompt text for ``question`` through ``tokenizer``'s own chat template, ending with
    the generation prompt (the assistant turn opened). Raises ``ModelError`` naming the model
    when the template fails (a broken template, or one that refuses a system turn)."""
    try:
        text = tokenizer.apply_chat_template(
            chat_messages(question, system_prompt),
            add_generation_prompt=True,
            tokenize=False,
            date_string=PINNED_DATE_STRING,
        )
    except _TEMPLATE_ERRORS as exc:
        hint = ' (set rollout.system_prompt = "" if it takes no system turn)' if system_prompt else ""
        raise ModelError(f"the chat template of model {model_id!r} failed: {exc}{hint}") from exc
    if not isinstance(text, str) or not text:
        raise ModelError(f"the chat template of model {model_id!r} rendered no text")
    return text


@contextmanager
def _clock_at(moment: _datetime.datetime) -> Iterator[None]:
    """transformers' ``strftime_now`` (the one clock a template can read) reading ``moment``."""

    class Fixed(_datetime.datetime):
        @classmethod
        def now(cls, tz: object = None) -> _datetime.datetime:  # type: ignore[override]
            return moment

    saved = getattr(_template_utils, "datetime", None)
    if saved is None:  # another transformers: nothing of ours to pin
        yield
        return
    _template_utils.datetime = Fixed  # type: ignore[misc]
    try:
        yield
    finally:
        _template_utils.datetime = saved  # type: ignore[misc]


def check_chat_template(
    tokenizer: PreTrainedTokenizerBase, system_prompt: str, *, model_id: str = "?"
) -> None:
    """Start-up check of a model's template: it renders, and it renders the same on any day at any
    hour. Raises ``ModelError`` naming the model otherwise (a template that calls ``strftime_now``
    without honouring ``date_string`` would ask each node, and each day, a different system turn
    under one ``system_prompt_sha256``)."""
    question = "1+1="
    with _clock_at(_datetime.datetime(2001, 1, 1, 0, 0, 1)):
        first = render_chat_prompt(tokenizer, question, system_prompt, model_id=model_id)
    with _clock_at(_datetime.datetime(2002, 2, 2, 13, 34, 56)):
        second = render_chat_prompt(tokenizer, question, system_prompt, model_id=model_id)
    if first != second:
        raise ModelError(
            f"the chat template of model {model_id!r} renders the clock (strftime_now) into prompts; "
            "nodes would ask different prompts by day and time zone"
        )


def build_chat_tokenizer(corpus: Iterable[str], vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 / Qwen2 style: every byte has a token, so any text
    encodes and decodes exactly; digits one per token) trained on ``corpus``, with ChatML's special tokens
    (``<|endoftext|>`` = 0 as padding, ``<|im_start|>`` = 1, ``<|im_end|>`` = 2 as EOS), no BOS,
    and ``CHATML_TEMPLATE``."""
    if vocab_size < 256 + len(CHAT_SPECIAL_TOKENS):
        raise ModelError(f"a byte-level tokenizer needs vocab_size >= 259, got {vocab_size}")
    backend = Tokenizer(models.BPE())
    # Digits one by one (as Qwen2 splits them): arithmetic stays learnable, "84" is never a token.
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(CHAT_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        chat_template=CHATML_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=1_000_000,
    )
