"""Pairwise distances: cdist and pdist, forward and backward."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .reduction import _vector_norm
from .registry import lowers

aten = torch.ops.aten

HIGHEST = lax.Precision.HIGHEST


def _p_norm_of_diffs(diff, p: float):
    """The p-norm over the last axis of pairwise differences (0 for no features, as CPU)."""
    if diff.shape[-1] == 0:
        return jnp.zeros(diff.shape[:-1], diff.dtype)
    return _vector_norm(diff, p, -1, False, None)


def _dist_grad_terms(diff, dist, p: float):
    """d dist / d x1 per pair and coordinate, with CPU's zero where the derivative is
    undefined (dist == 0, or diff == 0 for p < 1). `dist` broadcasts against `diff`."""
    zero = jnp.zeros((), diff.dtype)
    if p == 0:
        return jnp.zeros_like(diff)
    sign = jnp.sign(diff)
    if p == 1:
        return sign
    a = jnp.abs(diff)
    if math.isinf(p):
        return jnp.where(a == dist, sign, zero)
    safe_dist = jnp.where(dist == 0, 1.0, dist).astype(diff.dtype)
    if p == 2:
        return jnp.where(dist == 0, zero, diff / safe_dist)
    if p < 2:
        undefined = (dist == 0) | ((diff == 0) & (p < 1))
        safe_a = jnp.where(a == 0, 1.0, a).astype(diff.dtype)
        term = sign * safe_a ** (p - 1) / safe_dist ** (p - 1)
        return jnp.where(undefined, zero, term)
    return jnp.where(dist == 0, zero, diff * a ** (p - 2) / safe_dist ** (p - 1))


def _euclidean_dist(x1, x2):
    """CPU's matmul form of the euclidean distance (|a|^2 - 2 a.b + |b|^2, clamped at 0), used
    for large inputs unless `compute_mode` forbids it; its rounding differs from the direct
    form, so it is reproduced rather than replaced."""
    n1 = jnp.sum(x1 * x1, axis=-1, keepdims=True)
    n2 = jnp.sum(x2 * x2, axis=-1, keepdims=True)
    a = jnp.concatenate([-2 * x1, n1, jnp.ones_like(n1)], axis=-1)
    b = jnp.concatenate([x2, jnp.ones_like(n2), n2], axis=-1)
    prod = jnp.matmul(a, jnp.swapaxes(b, -1, -2), precision=lax.Precision.HIGHEST)
    return jnp.sqrt(jnp.maximum(prod, 0))


def _broadcast_batches(x1, x2):
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    return (jnp.broadcast_to(x1, batch + x1.shape[-2:]),
            jnp.broadcast_to(x2, batch + x2.shape[-2:]))


@lowers(aten._cdist_forward.default, static=("p",))
def cdist_forward(x1, x2, p, compute_mode=None):
    x1, x2 = _broadcast_batches(x1, x2)
    r1, r2 = x1.shape[-2], x2.shape[-2]
    mode = 0 if compute_mode is None else compute_mode
    if p == 2 and (mode == 1 or (mode == 0 and (r1 > 25 or r2 > 25))) and x1.shape[-1]:
        return _euclidean_dist(x1, x2)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    return _p_norm_of_diffs(diff, p)


@lowers(aten._cdist_backward.default, static=("p",))
def cdist_backward(grad, x1, x2, p, cdist):
    """Gradient for x1 in the broadcast batch shape (autograd sums it back)."""
    x1, x2 = _broadcast_batches(x1, x2)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    terms = _dist_grad_terms(diff, cdist[..., None], p)
    return jnp.sum(grad[..., None] * terms, axis=-2)


def _pdist_pairs(n: int):
    rows, cols = np.triu_indices(n, k=1)
    return jnp.asarray(rows), jnp.asarray(cols)


@lowers(aten._pdist_forward.default, static=("p",))
def pdist_forward(x, p=2.0):
    n = x.shape[0]
    if n <= 1:
        return jnp.zeros((0,), x.dtype)
    rows, cols = _pdist_pairs(n)
    return _p_norm_of_diffs(x[rows] - x[cols], p)


@lowers(aten._pdist_backward.default, static=("p",))
def pdist_backward(grad, x, p, pdist):
    n = x.shape[0]
    if n <= 1 or grad.size == 0:
        return jnp.zeros_like(x)
    rows, cols = _pdist_pairs(n)
    diff = x[rows] - x[cols]
    contrib = grad[:, None] * _dist_grad_terms(diff, pdist[:, None], p)
    return jnp.zeros_like(x).at[rows].add(contrib).at[cols].add(-contrib)
