"""Embedding lookups: forward, dense backward and max-norm renormalization."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from .reduction import _vector_norm
from .registry import lowers, upcast_half

aten = torch.ops.aten

HIGHEST = lax.Precision.HIGHEST


EMBEDDING_INDEX_ERROR = "index out of range in self"


@lowers(aten.embedding.default, index_error=EMBEDDING_INDEX_ERROR)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    num = weight.shape[0]
    bad = jnp.any((indices < 0) | (indices >= num))
    return jnp.take(weight, indices, axis=0, mode="clip"), bad


@lowers(aten.embedding_dense_backward.default, index_error=EMBEDDING_INDEX_ERROR)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
                             scale_grad_by_freq):
    idx = indices.reshape(-1)
    bad = jnp.any((idx < 0) | (idx >= num_weights))
    g = upcast_half(grad_output).reshape(idx.shape[0], -1)
    keep = idx != padding_idx
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[idx].add(1, mode="drop")
        g = g / jnp.take(counts, idx, mode="clip")[:, None]
    g = jnp.where(keep[:, None], g, jnp.zeros((), g.dtype))
    out = jnp.zeros((num_weights, g.shape[1]), g.dtype).at[idx].add(g, mode="drop")
    return out, bad


@lowers(aten.embedding_renorm.default, static=("norm_type",),
        index_error="embedding_renorm_: index out of range")
def embedding_renorm(weight, indices, max_norm, norm_type):
    """Rows named by `indices` (each once) whose norm exceeds max_norm are scaled by
    max_norm / (norm + 1e-7); CPU computes that scale in double and multiplies in the
    weight's dtype. Negative indices wrap, as CPU's `self[i]` does."""
    num = weight.shape[0]
    idx = indices.reshape(-1)
    bad = jnp.any((idx < -num) | (idx >= num))
    chosen = jnp.zeros((num,), bool).at[_wrap_index(idx, num)].set(True, mode="drop")
    # CPU's norm (in the weight's opmath dtype, rounded to its dtype) is read as a double;
    # its summation order is its own, so a norm may differ by an ulp.
    norms = _vector_norm(upcast_half(weight), norm_type, -1, False, None).astype(weight.dtype).astype(jnp.float64)
    scale = (max_norm / (norms + 1e-7)).astype(weight.dtype)
    renorm = chosen & (norms > max_norm)
    return jnp.where(renorm[:, None], weight * scale[:, None], weight), bad


def _wrap_index(idx, size):
    return jnp.where(idx < 0, idx + size, idx)
