"""A small transformer trained with custom kernels, against the same model on built-in ops.

Pre-norm decoder blocks: RMSNorm, causal self-attention (`F.scaled_dot_product_attention`),
RMSNorm, GELU MLP; character-level data from examples/data/sonnets.txt; AdamW. With
`--kernels` (the default) the norms are the fused JAX kernel `kernels::rms_norm` and the
attention runs the Pallas kernel `kernels::flash_attention`, through
`torchneuron.library.override` of SDPA; the script trains both variants from the same
initialisation and prints their losses side by side.

    python examples/kernels/transformer.py --device neuron --steps 20
    python examples/kernels/transformer.py --device neuron --steps 20 --compile
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

try:
    from .flash_attention import sdpa_override
    from .rms_norm import RMSNorm
except ImportError:  # run as a script
    from flash_attention import sdpa_override
    from rms_norm import RMSNorm

DATA = Path(__file__).resolve().parent.parent / "data" / "sonnets.txt"


class Block(nn.Module):
    def __init__(self, d: int, heads: int, norm) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = norm(d), norm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Transformer(nn.Module):
    def __init__(self, vocab: int, seq: int, d: int = 32, heads: int = 2, layers: int = 2,
                 kernels: bool = True) -> None:
        super().__init__()

        def norm(dim):
            return RMSNorm(dim) if kernels else nn.RMSNorm(dim, eps=1e-6)

        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, norm) for _ in range(layers))
        self.norm = norm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _batches(seq: int, batch: int, seed: int):
    text = DATA.read_text()
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    g = torch.Generator().manual_seed(seed)
    while True:
        starts = torch.randint(0, len(data) - seq - 1, (batch,), generator=g)
        x = torch.stack([data[s : s + seq] for s in starts])
        y = torch.stack([data[s + 1 : s + seq + 1] for s in starts])
        yield x, y, len(chars)


def train(device: str, steps: int, seed: int = 0, *, kernels: bool = True, compile: bool = False,
          seq: int = 32, batch: int = 8, log: bool = False) -> list[float]:
    """Losses of `steps` AdamW steps; the same seed gives the same data and initialisation."""
    batches = _batches(seq, batch, seed)
    _, _, vocab = next(_batches(seq, 1, seed))
    torch.manual_seed(seed)
    model = Transformer(vocab, seq, kernels=kernels).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    forward = torch.compile(model, backend="neuron") if compile else model
    scope = sdpa_override() if kernels else contextlib.nullcontext()
    losses = []
    with scope:
        for i in range(steps):
            x, y, _ = next(batches)
            opt.zero_grad()
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(forward(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if log:
                print(f"step {i} loss {losses[-1]:.6f}", flush=True)
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="neuron")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compile", action="store_true", help="torch.compile(backend='neuron')")
    args = parser.parse_args()
    if args.device == "neuron":
        import torchneuron  # noqa: F401
    custom = train(args.device, args.steps, args.seed, kernels=True, compile=args.compile)
    builtin = train(args.device, args.steps, args.seed, kernels=False, compile=args.compile)
    print(f"device {args.device}{' (compiled)' if args.compile else ''}")
    print("step  custom kernels  built-in ops")
    for i, (a, b) in enumerate(zip(custom, builtin)):
        print(f"{i:4d}  {a:14.6f}  {b:12.6f}")
    worst = max(abs(a - b) / abs(b) for a, b in zip(custom, builtin))
    print(f"largest relative difference: {worst:.2e}")


if __name__ == "__main__":
    main()
