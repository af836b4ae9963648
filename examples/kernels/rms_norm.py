"""A fused RMSNorm written in JAX, as the PyTorch operator `kernels::rms_norm`.

One function computes the whole normalization (mean of squares, rsqrt, scale) in float32 or
wider; XLA fuses it into one loop. Its gradient comes from `jax.vjp` of the same function
(the default when no backward is registered), and runs as the op `kernels::rms_norm_backward`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from torch import Tensor, nn

import torchneuron.library as tnlib


@tnlib.custom_op("kernels::rms_norm")
def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(mean(x**2, last dim) + eps) * weight."""
    wide = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    normed = wide * jax.lax.rsqrt(jnp.mean(wide * wide, axis=-1, keepdims=True) + eps)
    return (normed * weight).astype(x.dtype)


class RMSNorm(nn.Module):
    """`nn.RMSNorm(dim, eps)` (elementwise affine) computed by the fused kernel."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


__all__ = ["RMSNorm", "rms_norm"]
