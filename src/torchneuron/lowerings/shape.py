"""Joining, padding, flipping and other ops that move elements around (views are the runtime's)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .registry import lowers

aten = torch.ops.aten


@lowers(aten.cat.default)
def cat(tensors, dim=0):
    # PyTorch skips 1-D empty tensors (legacy behaviour) and promotes across inputs.
    parts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not parts:
        return tensors[0]
    dtype = jnp.result_type(*parts)
    ndim = parts[0].ndim
    return jnp.concatenate([p.astype(dtype) for p in parts], axis=dim % ndim if ndim else 0)


@lowers(aten.stack.default)
def stack(tensors, dim=0):
    dtype = jnp.result_type(*tensors)
    return jnp.stack([t.astype(dtype) for t in tensors], axis=dim)


@lowers(aten.constant_pad_nd.default, static=("pad",))
def constant_pad_nd(x, pad, value=0):
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    lo_hi_interior = [(lo, hi, 0) for lo, hi in widths]
    from jax import lax

    return lax.pad(x, jnp.asarray(value, x.dtype), lo_hi_interior)


@lowers(aten.flip.default)
def flip(x, dims):
    # A 0-d tensor takes dim 0 or -1, as if it were 1-d (the meta kernel checks the range);
    # flipping it is the identity, and jnp.flip rejects the axis.
    return jnp.flip(x, axis=tuple(dims)) if dims and x.ndim else x


@lowers(aten.roll.default)
def roll(x, shifts, dims=()):
    if not dims:
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), axis=tuple(dims))


@lowers(aten.repeat.default)
def repeat(x, repeats):
    extra = len(repeats) - x.ndim
    x = x.reshape((1,) * extra + x.shape)
    return jnp.tile(x, tuple(repeats))


@lowers(aten.reflection_pad1d.default, aten.reflection_pad2d.default,
        aten.reflection_pad3d.default)
def reflection_pad(x, padding):
    return _pad_mode(x, padding, "reflect")


@lowers(aten.replication_pad1d.default, aten.replication_pad2d.default,
        aten.replication_pad3d.default)
def replication_pad(x, padding):
    # Output position o reads clamp(o - left, 0, n - 1): this also covers negative padding,
    # which crops (jnp.pad rejects negative widths).
    for i in range(len(padding) // 2):
        axis = x.ndim - 1 - i
        left, right = padding[2 * i], padding[2 * i + 1]
        n = x.shape[axis]
        source = jnp.clip(jnp.arange(n + left + right) - left, 0, n - 1)
        x = jnp.take(x, source, axis=axis)
    return x


@lowers(aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
        aten.replication_pad3d_backward.default)
def replication_pad_backward(grad_output, x, padding):
    _, pullback = jax.vjp(lambda t: replication_pad(t, padding), x)
    return pullback(grad_output)[0]


def _pad_mode(x, padding, mode):
    widths = [(0, 0)] * x.ndim
    for i in range(len(padding) // 2):
        widths[x.ndim - 1 - i] = (padding[2 * i], padding[2 * i + 1])
    return jnp.pad(x, widths, mode=mode)


@lowers(aten.diag_embed.default)
def diag_embed(x, offset=0, dim1=-2, dim2=-1):
    n = x.shape[-1] + abs(offset)
    eye = jnp.eye(n, k=offset, dtype=x.dtype)
    idx = jnp.arange(x.shape[-1])
    rows = idx + max(-offset, 0)
    cols = idx + max(offset, 0)
    out = jnp.zeros(x.shape[:-1] + (n, n), x.dtype).at[..., rows, cols].set(x)
    del eye
    ndim = out.ndim
    d1, d2 = dim1 % ndim, dim2 % ndim
    rest = [d for d in range(ndim) if d not in (d1, d2)]
    perm = [0] * ndim
    for src, dst in zip(range(ndim - 2), rest):
        perm[dst] = src
    perm[d1], perm[d2] = ndim - 2, ndim - 1
    return jnp.transpose(out, perm)
