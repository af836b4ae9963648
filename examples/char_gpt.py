"""A character-level GPT trained on a few of Shakespeare's sonnets (examples/data/sonnets.txt).

Token and position embeddings, two pre-LayerNorm transformer blocks with causal self-attention
(`F.scaled_dot_product_attention(is_causal=True)`) and a GELU MLP, AdamW, cross entropy.

    python examples/char_gpt.py --device neuron --steps 30
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

try:
    from example_utils import log_step, main
except ImportError:  # imported as examples.char_gpt
    from .example_utils import log_step, main

DATA = Path(__file__).resolve().parent / "data" / "sonnets.txt"


@dataclass(frozen=True)
class Config:
    vocab_size: int
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 64
    batch_size: int = 16
    lr: float = 3e-3
    weight_decay: float = 0.1


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model),
            nn.GELU(),
            nn.Linear(4 * cfg.d_model, cfg.d_model),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CharGPT(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
        return logits, loss


def load_text() -> tuple[torch.Tensor, list[str]]:
    """The corpus as a 1-D int64 tensor of character ids, and the id -> character table."""
    text = DATA.read_text(encoding="utf-8")
    chars = sorted(set(text))
    lookup = {c: i for i, c in enumerate(chars)}
    return torch.tensor([lookup[c] for c in text], dtype=torch.long), chars


def get_batch(
    data: torch.Tensor, cfg: Config, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of the corpus, drawn on the CPU so every device sees the same batches."""
    starts = torch.randint(0, len(data) - cfg.block_size - 1, (cfg.batch_size,), generator=gen)
    x = torch.stack([data[s : s + cfg.block_size] for s in starts.tolist()])
    y = torch.stack([data[s + 1 : s + 1 + cfg.block_size] for s in starts.tolist()])
    return x, y


def train(
    device: str | torch.device, steps: int, seed: int = 0, log: bool = False, **overrides
) -> list[float]:
    """Train from a seeded CPU initialisation on `device`; return the loss of every step.

    `overrides` change `Config` fields (the tests use a smaller model).
    """
    data, chars = load_text()
    cfg = Config(vocab_size=len(chars), **overrides)
    torch.manual_seed(seed)
    model = CharGPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        x, y = get_batch(data, cfg, gen)
        _, loss = model(x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if log:
            log_step(step, losses[-1])
    return losses


if __name__ == "__main__":
    main(train, __doc__.splitlines()[0], default_steps=30)
