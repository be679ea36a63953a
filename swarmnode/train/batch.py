"""Scored groups and the log-prob forward pass used by every loss."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from swarmnode.tasks import Task
from swarmnode.train import split_attention


@dataclass
class ScoredGroup:
    """One prompt's G completions, re-scored by this node's verifier.

    ``behaviour_logprobs`` are per-token log-probs under the policy that
    generated the text (own groups) or re-computed under ours (external text
    re-tokenized by our tokenizer, SAPO §2 step 5). ``source`` is "local" or the
    sender's peer id; ``source_mean_logprobs`` / ``source_reward_mean`` carry what
    a sender reported (HACPO needs them), never used as rewards.
    """

    task: Task
    prompt_ids: list[int]
    completion_ids: list[list[int]]
    behaviour_logprobs: list[list[float]]
    texts: list[str]
    rewards: list[float]
    policy_version: int
    source: str = "local"
    source_mean_logprobs: list[float] = field(default_factory=list)
    source_reward_mean: float | None = None

    @property
    def size(self) -> int:
        return len(self.completion_ids)

    def first(self, n: int) -> ScoredGroup:
        """This group with its first ``n`` completions only (itself when it has no more)."""
        if self.size <= n:
            return self
        return replace(
            self,
            completion_ids=self.completion_ids[:n],
            behaviour_logprobs=self.behaviour_logprobs[:n],
            texts=self.texts[:n],
            rewards=self.rewards[:n],
            source_mean_logprobs=self.source_mean_logprobs[:n],
        )


def pad_right(rows: Sequence[Sequence[float]], value: float, dtype: torch.dtype) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), max(width, 1)), value, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def completion_mask(completion_ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """The (B, T) mask ``completion_logprobs`` returns with its log-probs: 1 at each row's
    completion tokens, T the longest completion (at least 1)."""
    width = max(max((len(c) for c in completion_ids), default=1), 1)
    lengths = torch.tensor([len(c) for c in completion_ids])
    return (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).float()


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    temperature: float = 1.0,
    pad_token_id: int = 0,
    *,
    shared_prefix: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of each completion token under ``model``: (B, T) values and (B, T) mask.

    Rows are ``prompt + completion`` right-padded, so position ids are the plain
    0..n-1 a causal LM expects; the completion token at position p is scored by
    the logits at p-1. Logits are divided by the sampling temperature, the same
    rule the rollout engines use (TRL's convention).

    ``shared_prefix``: rows that repeat the previous row's prompt (a group's G
    completions) are scored in one packed sequence, the prompt once
    (``shared_prefix_logprobs``); the same values up to float rounding.
    """
    if shared_prefix and supports_packed_attention(model):
        return shared_prefix_logprobs(model, prompt_ids, completion_ids, temperature, pad_token_id)
    input_ids, attention, index, mask = _unpacked(prompt_ids, completion_ids, pad_token_id)
    targets = input_ids[:, 1:].gather(1, index)
    heads = _decoder_and_head(model)
    if heads is None:  # a model whose logits are not lm_head(hidden): every position's logits
        logits = model(input_ids=input_ids, attention_mask=attention).logits.float()
        rows = torch.arange(len(prompt_ids)).unsqueeze(1)
        return _logprobs_of(logits[rows, index], targets, temperature) * mask, mask
    decoder, head = heads
    hidden = decoder(input_ids=input_ids, attention_mask=attention).last_hidden_state
    rows = torch.arange(len(prompt_ids)).unsqueeze(1)
    return token_logprobs(head, hidden[rows, index], targets, temperature) * mask, mask


def _unpacked(
    prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows ``prompt + completion`` right-padded: (B, L) input ids and attention mask, and the
    (B, T) positions whose logits score each completion token and the (B, T) mask."""
    full = [p + c for p, c in zip(prompt_ids, completion_ids, strict=True)]
    input_ids = pad_right(full, pad_token_id, torch.long)
    attention = pad_right([[1] * len(r) for r in full], 0, torch.long)
    index, mask = _completion_window(prompt_ids, completion_ids, input_ids.shape[1] - 1)
    return input_ids, attention, index, mask


def _completion_window(
    prompt_ids: list[list[int]], completion_ids: list[list[int]], positions: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """In unshared rows ``prompt + completion``, the (B, T) positions whose logits score each
    completion token (``len(prompt) - 1 + t``, clamped to ``positions - 1``) and the (B, T) mask."""
    width = max(max((len(c) for c in completion_ids), default=1), 1)
    starts = torch.tensor([len(p) - 1 for p in prompt_ids])
    index = (starts.unsqueeze(1) + torch.arange(width).unsqueeze(0)).clamp(max=positions - 1)
    return index, completion_mask(completion_ids)


# ---------------------------------------------------------------------------------------------
# Shared-prefix scoring (Prefix Grouper, arXiv 2506.05433; verl's ``use_prefix_grouper``).
#
# A group's G rows share their prompt exactly, so the unshared path runs the prompt's P tokens G
# times, forward and backward. Packed, a group is one sequence
#
#     prompt (P tokens) | completion 1 | completion 2 | ... | completion G
#
# under a mask in which a prompt token attends causally within the prompt and a completion token
# attends to the whole prompt and causally within its own completion (never to another one), with
# position ids P, P+1, ... restarted for each completion. Every completion token then sees exactly
# the keys, values and positions it sees in its own unshared row, so each logit is the same
# function of the weights; the prompt's gradient is the sum of its G uses, as in the unshared
# sum. A completion's first token is scored by the logits at the prompt's last token (shared).

#: Attention implementations that take a custom additive 4D mask as given (FlashAttention does not).
_PACKED_ATTENTION = ("sdpa", "eager")

#: The longest packed sequence, in tokens. Attention over a pack of L tokens costs O(L^2) time and
#: its 4D mask L^2 memory, so one pack per group would cost (P + G*T)^2: a worker that runs all G
#: completions to the length limit (G = 8, T = 2,048 on the tiny model: 14.9 s and 2.4 GB per
#: forward) could make a spot check or a training step quadratic in the group. A group longer than
#: this is split into several packs, each repeating the prompt (a single row longer than it is a
#: pack of its own, as it would be unpacked), so the cost stays linear in G: at most the unpacked
#: rows' G * (P + T)^2. Groups of short completions (the usual case) still share one prompt.
MAX_PACK_TOKENS = 2048


def supports_packed_attention(model: torch.nn.Module) -> bool:
    """Can ``model`` run a packed group (a custom 4D mask and per-token position ids)?"""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) in _PACKED_ATTENTION


@dataclass
class _Pack:
    """One packed sequence: a prompt, the rows (indices into the batch) that share it, and its
    length in tokens (the prompt once, then every row's completion)."""

    prompt: list[int]
    rows: list[int]
    length: int


def _packs(
    prompt_ids: list[list[int]], completion_ids: list[list[int]], limit: int = MAX_PACK_TOKENS
) -> list[_Pack]:
    """Consecutive rows with equal prompts, packed while the pack stays within ``limit`` tokens."""
    packs: list[_Pack] = []
    for i, prompt in enumerate(prompt_ids):
        n = len(completion_ids[i])
        if packs and packs[-1].prompt == prompt and packs[-1].length + n <= limit:
            packs[-1].rows.append(i)
            packs[-1].length += n
        else:
            packs.append(_Pack(list(prompt), [i], len(prompt) + n))
    return packs


#: Short packs share a forward sequence up to this many tokens. A batch is padded to its longest
#: sequence, so one sequence per pack pays for the difference between every group and the
#: longest: 37% of the tokens of a specialists update (groups of 21 to 53 tokens). Binned into
#: sequences of 128 tokens, a specialists agent-round took 9% less CPU (0.077 -> 0.070 s,
#: anchored, 150 rounds, alone on this 2-core machine). Attention's work grows with the sequence
#: (a token attends over the whole masked sequence), about L / (8 x hidden size) of the linear
#: layers' per token, and the 4D mask's adds and softmax grow with it: at 64 tokens a replay
#: update took 9-10% less CPU than at 128 (specialists, 40 rounds, three alternated pairs:
#: 18.9 / 16.0 / 16.4 s against 20.6 / 17.8 / 18.4 s), the groups (21 to 53 tokens) still
#: binned. A longer pack (real models' long completions, or a peer's group) has a sequence of
#: its own, in a forward of sequences of about its length (``_forwards``).
SEQUENCE_TOKENS = 64

#: Sequences (one pack each) longer than this run their attention split (``split_attention``).
#: Measured alone, forward + backward of 8 groups x 8 completions, 2 threads, split vs masked:
#: tiny model, 69 + 8 x 16 = 197-token packs 0.105 vs 0.097 s (the gathers cost more than they
#: save); 69 + 8 x 64 = 581 tokens 0.30 vs 0.38 s; the chat model, 100 + 8 x 105 = 940 tokens
#: 0.55 vs 0.77 s.
SPLIT_ATTENTION_TOKENS = 256


def _sequences(packs: Sequence[_Pack]) -> list[list[int]]:
    """The packs (indices) each packed forward sequence holds, several short packs to a sequence.

    First-fit decreasing into sequences of ``SEQUENCE_TOKENS`` tokens; a longer pack is a sequence
    of its own. Packs in one sequence never attend to each other (the mask's ``owner`` term) and
    each restarts its positions, so every token sees what it saw in a sequence of its own."""
    order = sorted(range(len(packs)), key=lambda k: -packs[k].length)  # stable: ties in batch order
    sequences: list[list[int]] = []
    free: list[int] = []
    for k in order:
        slot = next((s for s, room in enumerate(free) if room >= packs[k].length), None)
        if slot is None:
            sequences.append([k])
            free.append(max(SEQUENCE_TOKENS - packs[k].length, 0))
        else:
            sequences[slot].append(k)
            free[slot] -= packs[k].length
    return sequences


def _forwards(packs: Sequence[_Pack], completion_ids: Sequence[Sequence[int]]) -> list[list[list[int]]]:
    """The sequences (``_sequences``) each forward pass runs, shortest first: those of one class
    side by side. A class is the sequence's length (``SEQUENCE_TOKENS`` or the power of two a
    longer one rounds up to) and, under split attention, its longest completion's and its longest
    prompt's (the powers of two they round up to).

    A forward pads every sequence to its longest, and attention's work per token grows with it,
    so one long pack in one forward with the short ones made every honest group pay for its
    length: one admitted 2,048-token group made 64 short groups' update cost 2.8x (red team rt23
    F3). Split attention pads every completion of a forward to the longest one there, so one
    long completion in a pack of the honest packs' length made their update 4-6x dearer (red
    team rt26). Within a class both are padded by less than their own length."""
    classes: dict[tuple[int, int, int], list[list[int]]] = {}
    for sequence in _sequences(packs):
        length = sum(packs[k].length for k in sequence)
        longest = max((len(completion_ids[row]) for k in sequence for row in packs[k].rows), default=0)
        width = max(SEQUENCE_TOKENS, 1 << (length - 1).bit_length())
        # Completions pad each other only under split attention; a masked forward pads sequences
        # alone, so short ones of any completion length share one forward (replay's updates ran
        # three where one does, at ~3 ms of fixed cost each on the tiny model).
        split = width > SPLIT_ATTENTION_TOKENS
        # Split attention also pads every prompt of a forward to the longest there: one admitted
        # 441-token prompt among honest 67-token ones made their update 1.9x dearer (red team
        # rt68 F1). Under it, packs are classed by their longest prompt too.
        prompt = max(len(packs[k].prompt) for k in sequence)
        key = (
            width,
            1 << max(longest - 1, 0).bit_length() if split else 0,
            1 << max(prompt - 1, 0).bit_length() if split else 0,
        )
        classes.setdefault(key, []).append(sequence)
    return [classes[key] for key in sorted(classes)]


def pack_rows(
    prompt_ids: list[list[int]], completion_ids: list[list[int]], limit: int = MAX_PACK_TOKENS
) -> list[list[int]]:
    """The rows (batch indices) of each packed sequence, in order: what one forward of a pack scores."""
    return [pack.rows for pack in _packs(prompt_ids, completion_ids, limit)]


def micro_batches(
    prompt_ids: list[list[int]], completion_ids: list[list[int]], tokens: int
) -> list[list[int]]:
    """The rows (batch indices, in order) of each micro-batch of an update that runs at most
    ``tokens`` tokens through the model at a time (``learn.micro_batch_tokens``): consecutive packs
    (rows sharing a prompt) joined while they fit; a group longer than ``tokens`` is split. 0: one
    micro-batch of every row."""
    if tokens <= 0:
        return [list(range(len(prompt_ids)))]
    batches: list[list[int]] = []
    size = 0
    for pack in _packs(prompt_ids, completion_ids, min(tokens, MAX_PACK_TOKENS)):
        if batches and size + pack.length <= tokens:
            batches[-1].extend(pack.rows)
            size += pack.length
        else:
            batches.append(list(pack.rows))
            size = pack.length
    return batches


def shared_prefix_logprobs(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    temperature: float = 1.0,
    pad_token_id: int = 0,
    pack_tokens: int = MAX_PACK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``completion_logprobs`` with each run of rows that share a prompt packed into one sequence.

    Same (B, T) values and mask as the unshared path (float rounding aside), in the same row order;
    consecutive rows with equal prompts form a pack (split past ``pack_tokens``), so a batch
    ordered by group shares each prompt.
    """
    heads = _decoder_and_head(model)
    scorer = model if heads is None else heads[0]
    tokens, targets, mask = _packed_outputs(scorer, prompt_ids, completion_ids, pad_token_id, pack_tokens)
    # Outputs at the completions' tokens only, never at (B, T) padding: with one long group in the
    # batch, T is its length for every row (red teams rt23 F3, rt24 F7).
    scored = mask.bool()
    logprobs = torch.zeros(mask.shape, dtype=torch.float32)
    if heads is None:
        logprobs[scored] = _logprobs_of(tokens, targets[scored], temperature)
    else:
        logprobs[scored] = token_logprobs(heads[1], tokens, targets[scored], temperature)
    return logprobs, mask


def completion_logits(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    pad_token_id: int = 0,
    pack_tokens: int = MAX_PACK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits that score each completion token (float32, before temperature): (B, T, V), and
    the (B, T) mask. Packed when the model allows (``shared_prefix_logprobs``'s forward: the
    learner's spot check takes both its log-probs and its keyed-sampling token checks from it),
    in packs of at most ``pack_tokens`` (``MAX_PACK_TOKENS``; a bench passes more to measure one
    pack per group)."""
    heads = _decoder_and_head(model)
    if supports_packed_attention(model):
        scorer = model if heads is None else heads[0]  # the head on the scoring tokens only
        tokens, _, mask = _packed_outputs(scorer, prompt_ids, completion_ids, pad_token_id, pack_tokens)
        logits = (tokens if heads is None else heads[1](tokens)).float()
        out = logits.new_zeros((*mask.shape, logits.shape[-1]))
        out[mask.bool()] = logits
        return out, mask
    input_ids, attention, index, mask = _unpacked(prompt_ids, completion_ids, pad_token_id)
    logits = model(input_ids=input_ids, attention_mask=attention).logits.float()
    rows = torch.arange(len(prompt_ids)).unsqueeze(1)
    return logits[rows, index], mask


def _packed_outputs(
    model: torch.nn.Module,
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    pad_token_id: int = 0,
    pack_tokens: int = MAX_PACK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed forwards of ``model`` (a causal LM: its logits; its decoder: its hidden states):
    (N, ...) outputs at the positions that score each completion token, row by row in batch order
    (``mask.bool()``'s order: N tokens in all), the (B, T) target tokens, and the (B, T) mask."""
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts for {len(completion_ids)} completions")
    if not prompt_ids:
        raise ValueError("no completions to score")
    packs = _packs(prompt_ids, completion_ids, pack_tokens)
    width = max(max((len(c) for c in completion_ids), default=1), 1)
    targets = torch.tensor(
        [[*tokens, *[pad_token_id] * (width - len(tokens))] for tokens in completion_ids], dtype=torch.long
    )
    rows: list[int] = []
    pieces: list[torch.Tensor] = []
    for sequences in _forwards(packs, completion_ids):
        forward_rows, picked = _packed_forward(model, packs, sequences, completion_ids, pad_token_id)
        rows += forward_rows
        pieces.append(picked)
    picked = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    if rows != list(range(len(rows))):  # back to batch order, token by token
        offsets = [0]
        for tokens in completion_ids:
            offsets.append(offsets[-1] + len(tokens))
        order = [t for row in rows for t in range(offsets[row], offsets[row + 1])]
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
        picked = picked[inverse]
    return picked, targets, completion_mask(completion_ids)


def _packed_forward(
    model: torch.nn.Module,
    packs: Sequence[_Pack],
    sequences: list[list[int]],
    completion_ids: list[list[int]],
    pad_token_id: int,
) -> tuple[list[int], torch.Tensor]:
    """One forward of ``sequences`` (lists of pack indices), side by side: the rows they hold, in
    order, and the (tokens, ...) outputs at the positions that score their tokens, row by row."""
    length = max(sum(packs[k].length for k in seq) for seq in sequences)
    n = len(sequences)
    # Built as Python lists and made tensors once: a tensor write per pack and row took 2.3 of the
    # 19 s a 100-round specialists replay run spent in these forwards (profiled, ~90 packs a step).
    id_rows = [[pad_token_id] * length for _ in range(n)]
    position_rows = [[0] * length for _ in range(n)]
    owner_rows = [[-1] * length for _ in range(n)]  # the pack a token belongs to; -1 padding
    segment_rows = [[-2] * length for _ in range(n)]  # -2 padding, -1 prompt, j completion j
    rows = [row for seq in sequences for k in seq for row in packs[k].rows]
    # Where each completion token is scored from: (sequence, position of the logits), row by row.
    source_seq: list[int] = []
    source_pos: list[int] = []
    for s, seq in enumerate(sequences):
        start = 0
        ids_s, positions_s, owner_s, segment_s = id_rows[s], position_rows[s], owner_rows[s], segment_rows[s]
        for k in seq:
            pack = packs[k]
            p = len(pack.prompt)
            ids_s[start : start + p] = pack.prompt
            positions_s[start : start + p] = range(p)
            owner_s[start : start + pack.length] = [k] * pack.length
            segment_s[start : start + p] = [-1] * p
            last_prompt = start + p - 1
            start += p
            for j, row in enumerate(pack.rows):
                tokens = completion_ids[row]
                m = len(tokens)
                if m:
                    ids_s[start : start + m] = tokens
                    positions_s[start : start + m] = range(p, p + m)
                    segment_s[start : start + m] = [j] * m
                    source_seq += [s] * m
                    # token 0 from the prompt's last position, token t from the completion's token t - 1
                    source_pos.append(last_prompt)
                    source_pos += range(start, start + m - 1)
                start += m
    tensors = (torch.tensor(t, dtype=torch.long) for t in (id_rows, position_rows, owner_rows, segment_rows))
    input_ids, positions, owner, segment = tensors
    query, key = segment.unsqueeze(2), segment.unsqueeze(1)  # (n, L, 1), (n, 1, L)
    same_pack = (owner.unsqueeze(2) == owner.unsqueeze(1)) & (owner.unsqueeze(1) != -1)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    allowed = causal & same_pack & ((key == -1) | (key == query))
    allowed |= torch.eye(length, dtype=torch.bool)  # padding queries see themselves: no empty softmax
    dtype = next(model.parameters()).dtype
    mask4d = torch.zeros((n, 1, length, length), dtype=dtype)
    mask4d.masked_fill_(~allowed.unsqueeze(1), torch.finfo(dtype).min)
    if length > SPLIT_ATTENTION_TOKENS and split_attention.usable(model):
        # One long pack per sequence: attention split by what each token sees (split_attention);
        # the 4D mask stays for any other attention call (split_attention falls back to it).
        spans = [_spans(packs[seq[0]], completion_ids) for seq in sequences]
        with split_attention.running(split_attention.layout(length, spans)):
            out = model(input_ids=input_ids, attention_mask=mask4d, position_ids=positions)
    else:
        out = model(input_ids=input_ids, attention_mask=mask4d, position_ids=positions)
    values = out.logits if hasattr(out, "logits") else out.last_hidden_state
    # Only the positions that score a token: no (rows, longest completion, ...) padding (red team
    # rt24 F7: one long admitted group padded every honest row to its length).
    where = (torch.tensor(source_seq, dtype=torch.long), torch.tensor(source_pos, dtype=torch.long))
    return rows, values[where]


def _spans(pack: _Pack, completion_ids: list[list[int]]) -> tuple[int, list[tuple[int, int]]]:
    """A pack's prompt length and each completion's (start, tokens) within its sequence."""
    start = len(pack.prompt)
    spans = []
    for row in pack.rows:
        spans.append((start, len(completion_ids[row])))
        start += len(completion_ids[row])
    return len(pack.prompt), spans


# ---------------------------------------------------------------------------------------------
# Log-probs from hidden states, a chunk of rows at a time.
#
# A causal LM's logits are lm_head(hidden). Computing them for every position of the batch and then
# picking the completions' (what ``model(...).logits`` does) holds a (positions x vocab) float tensor
# and its log-softmax: at Qwen2.5's vocabulary of 151,936, 8 x 8 completions of 128 tokens are
# 8,192 rows, 5 GB each, more than the whole LoRA step should take. Here the decoder's hidden states
# are gathered at the scoring positions first and the head runs on LOGIT_CHUNK_ELEMENTS worth of
# rows at a time; with gradients on, each chunk is checkpointed (its logits recomputed in the
# backward pass, one chunk alive at a time). A batch that fits one chunk (the built-in models'
# small vocabularies: always) runs as one plain expression.

#: Logit elements (rows x vocab) computed at once: 32 Mi floats, 128 MiB per tensor.
LOGIT_CHUNK_ELEMENTS = 1 << 25


def _decoder_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Linear] | None:
    """(decoder, lm_head) when ``model``'s logits are exactly ``lm_head(decoder(...).last_hidden_state)``
    (Llama, Qwen2/3, Mistral); None for anything else (the full-logits path then)."""
    get_decoder = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    config = getattr(model, "config", None)
    if get_decoder is None or get_head is None or getattr(config, "final_logit_softcapping", None):
        return None
    if getattr(config, "model_type", None) not in ("llama", "qwen2", "qwen3", "mistral"):
        return None
    decoder, head = get_decoder(), get_head()
    if not isinstance(decoder, torch.nn.Module) or not isinstance(head, torch.nn.Linear):
        return None
    return decoder, head


def _logprobs_of(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) at ``targets`` (logits in float32)."""
    logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _head_logprobs(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    return _logprobs_of(head(hidden), targets, temperature)


def token_logprobs(
    head: torch.nn.Linear, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """log_softmax(head(hidden) / T) at ``targets``: (B, T) from (B, T, H) hidden states, the
    (positions x vocab) logits never all alive at once (``LOGIT_CHUNK_ELEMENTS``)."""
    vocab = int(head.weight.shape[0])
    flat_hidden, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    rows = max(1, LOGIT_CHUNK_ELEMENTS // vocab)
    if flat_hidden.shape[0] <= rows:
        return _head_logprobs(head, flat_hidden, flat_targets, temperature).view(targets.shape)
    checkpointed = torch.is_grad_enabled() and (
        flat_hidden.requires_grad or any(p.requires_grad for p in head.parameters())
    )
    parts = []
    for start in range(0, flat_hidden.shape[0], rows):
        h, t = flat_hidden[start : start + rows], flat_targets[start : start + rows]
        if checkpointed:
            part = torch.utils.checkpoint.checkpoint(
                _head_logprobs, head, h, t, temperature, use_reentrant=False
            )
        else:
            part = _head_logprobs(head, h, t, temperature)
        parts.append(part)
    return torch.cat(parts).view(targets.shape)
