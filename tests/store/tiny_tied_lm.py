"""A small real torch language model with tied embeddings, shared by the store tests and the crash child.

Not a test module: imported by tests/store/test_*.py and run inside tests/store/crash_child.py.
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256
DIM = 64
HIDDEN = 256


class TiedLM(nn.Module):
    """Embedding -> residual MLP -> LayerNorm -> output head whose weight *is* the embedding."""

    def __init__(self, vocab: int = VOCAB, dim: int = DIM, hidden: int = HIDDEN) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied, as in the tiny Llama policy

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        h = h + self.mlp(h)
        return self.head(self.norm(h))


def make_optimizer(model: nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)


def train_step(model: TiedLM, optimizer: torch.optim.Optimizer, batch: int = 16, length: int = 9) -> float:
    """One optimizer step on random next-token data drawn from torch's global RNG."""
    vocab = model.embed.num_embeddings
    ids = torch.randint(0, vocab, (batch, length))
    logits = model(ids[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.item())


def state_digest(model_state: dict[str, torch.Tensor]) -> float:
    """An exact fingerprint of a state dict, as a float that SQLite stores exactly (48 bits)."""
    h = hashlib.sha256()
    for name in sorted(model_state):
        h.update(name.encode())
        h.update(model_state[name].detach().cpu().contiguous().numpy().tobytes())
    return float(int(h.hexdigest()[:12], 16))
