"""View ops as values.

Eager mode never calls these: a view there is metadata over a shared storage (the runtime runs
PyTorch's CPU kernel for it). In a compiled graph, where AOTAutograd has made every op
functional, a view is just the value it shows, and these say what that value is.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from .registry import lowers

aten = torch.ops.aten


def _infer(shape, numel):
    shape = list(shape)
    if -1 in shape:
        known = 1
        for s in shape:
            if s != -1:
                known *= s
        shape[shape.index(-1)] = numel // known if known else 0
    return tuple(shape)


@lowers(aten.view.default, aten.reshape.default, aten._reshape_alias.default,
        aten.view_copy.default)
def view(x, size, *stride_ignored):
    return x.reshape(_infer(size, x.size))


# Composite kernels rely on `_unsafe_view` sharing its input's storage although its schema
# does not say so (`kron.out` writes its result through it).
lowers(aten._unsafe_view.default, aliases_input=True)(view)


@lowers(aten.alias.default, aten.lift_fresh_copy.default, aten.lift_fresh.default,
        aten.detach.default)
def alias(x):
    return x


@lowers(aten.copy.default, graph_only=True)
def copy(self, src, non_blocking=False):
    # A functionalized write into a view (`x[:, 1] = y`, a custom op mutating a view): `src`
    # in `self`'s shape and dtype. Compiled graphs only: eager `copy` runs PyTorch's composite
    # kernel, cross-device copies included.
    return jnp.broadcast_to(jnp.asarray(src).astype(self.dtype), self.shape)


@lowers(aten.permute.default, aten.permute_copy.default)
def permute(x, dims):
    return jnp.transpose(x, [d % x.ndim for d in dims]) if x.ndim else x


@lowers(aten.transpose.int, aten.transpose_copy.int)
def transpose(x, dim0, dim1):
    if x.ndim < 2:
        return x
    return jnp.swapaxes(x, dim0, dim1)


@lowers(aten.t.default)
def t(x):
    return x.T if x.ndim == 2 else x


@lowers(aten.expand.default, aten.expand_copy.default)
def expand(x, size, *, implicit=False):
    lead = len(size) - x.ndim
    shape = tuple(
        x.shape[i - lead] if (s == -1 and i >= lead) else s for i, s in enumerate(size)
    )
    return jnp.broadcast_to(x, shape)


@lowers(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(x, dim):
    return jnp.expand_dims(x, dim % (x.ndim + 1))


@lowers(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_copy.dims)
def squeeze(x, dim=None):
    if dim is None:
        return jnp.squeeze(x)
    dims = [dim] if isinstance(dim, int) else list(dim)
    dims = tuple(d % x.ndim for d in dims if x.ndim and x.shape[d % x.ndim] == 1)
    return jnp.squeeze(x, dims) if dims else x


@lowers(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(x, dim=0, start=None, end=None, step=1):
    if x.ndim == 0:
        return x
    dim %= x.ndim
    size = x.shape[dim]
    start, end, _ = slice(start, end, step).indices(size)
    end = max(end, start)
    index = [slice(None)] * x.ndim
    index[dim] = slice(start, end, step)
    return x[tuple(index)]


@lowers(aten.select.int, aten.select_copy.int)
def select(x, dim, index):
    dim %= x.ndim
    return lax.index_in_dim(x, index % x.shape[dim], dim, keepdims=False)


@lowers(aten.diagonal.default, aten.diagonal_copy.default)
def diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, dim1, dim2)


@lowers(aten.split.Tensor, aten.split_copy.Tensor)
def split(x, split_size, dim=0):
    dim %= x.ndim
    size = x.shape[dim]
    bounds = list(range(split_size, size, split_size)) if split_size else []
    return jnp.split(x, bounds, axis=dim) if size else [x]


@lowers(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def split_with_sizes(x, split_sizes, dim=0):
    dim %= x.ndim
    bounds = []
    acc = 0
    for s in split_sizes[:-1]:
        acc += s
        bounds.append(acc)
    return jnp.split(x, bounds, axis=dim)


@lowers(aten.unbind.int, aten.unbind_copy.int)
def unbind(x, dim=0):
    dim %= x.ndim
    return [lax.index_in_dim(x, i, dim, keepdims=False) for i in range(x.shape[dim])]


@lowers(aten.unfold.default, aten.unfold_copy.default)
def unfold(x, dimension, size, step):
    if x.ndim == 0:
        return x.reshape(1)
    dim = dimension % x.ndim
    count = (x.shape[dim] - size) // step + 1
    starts = jnp.arange(count) * step
    windows = starts[:, None] + jnp.arange(size)[None, :]
    moved = jnp.moveaxis(x, dim, -1)[..., windows]  # (..., count, size)
    return jnp.moveaxis(moved, -2, dim)


@lowers(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(x, size, stride, storage_offset=None):
    # In a functional graph the input is the storage: index its flat, contiguous values.
    return x.reshape(-1)[_strided_indices(size, stride, storage_offset)]


def _strided_indices(size, stride, storage_offset):
    """The flat storage index of each element of a strided view."""
    idx = storage_offset or 0
    for dim, (n, st) in enumerate(zip(size, stride)):
        if n != 1 and st != 0:
            idx = idx + lax.broadcasted_iota(jnp.int64, tuple(size), dim) * st
    return jnp.broadcast_to(idx, tuple(size))


@lowers(aten.as_strided_scatter.default, graph_only=True)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    # AOTAutograd writes a mutated input that shares its storage with another input through
    # its base (`b = a[:4]; a.add_(1)`): like `as_strided`, the input is the storage.
    flat = x.reshape(-1)
    idx = _strided_indices(size, stride, storage_offset)
    return flat.at[idx].set(jnp.asarray(src).astype(flat.dtype)).reshape(x.shape)


@lowers(aten.view_as_real.default)
def view_as_real(x):
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@lowers(aten.view_as_complex.default)
def view_as_complex(x):
    return lax.complex(x[..., 0], x[..., 1])


@lowers(aten.view.dtype)
def view_dtype(x, dtype):
    from .dtypes import to_jax_dtype

    target = to_jax_dtype(dtype)
    if target.itemsize == x.dtype.itemsize:
        return lax.bitcast_convert_type(x, target)
    if target.itemsize < x.dtype.itemsize:
        out = lax.bitcast_convert_type(x, target)  # (..., k)
        return out.reshape(x.shape[:-1] + (x.shape[-1] * out.shape[-1],))
    ratio = target.itemsize // x.dtype.itemsize
    grouped = x.reshape(x.shape[:-1] + (x.shape[-1] // ratio, ratio))
    return lax.bitcast_convert_type(grouped, target)


@lowers(aten._conj.default, graph_only=True)
def conj_in_graph(x):
    # Eager mode sets the lazy conjugate bit of a view; a graph computes the values.
    return jnp.conj(x)
