"""Strided access to flat storage buffers, inside traced JAX code.

A tensor argument reaches a compiled op as its storage's flat buffer plus a static `ViewSpec`
(and a traced storage offset when not zero), so view reads and in-place writes through views
fuse into the op's executable instead of costing separate eager steps.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import lax

FULL = 0  # contiguous and exactly covers its storage: a reshape
SLICE = 1  # contiguous at an offset: a dynamic slice
STRIDED = 2  # anything else: a gather by computed indices


class ViewSpec(NamedTuple):
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    mode: int


def spec_of(tensor, storage_numel: int) -> ViewSpec:
    shape = tuple(tensor.shape)
    if tensor.is_contiguous():
        if tensor.storage_offset() == 0 and tensor.numel() == storage_numel:
            return ViewSpec(shape, tensor.stride(), FULL)
        return ViewSpec(shape, tensor.stride(), SLICE)
    return ViewSpec(shape, tensor.stride(), STRIDED)


def canonical(spec: ViewSpec) -> ViewSpec:
    """`spec` with the stride of each size-1 dimension set to its contiguous value. Such a
    dimension steps over no element, so the two specs read and write the same elements:
    `ids[:, -1:]` of a (1, L) buffer has stride (L, 1), a new stride at every L."""
    if 1 not in spec.shape:
        return spec
    stride = list(spec.stride)
    contiguous = 1
    for d in range(len(spec.shape) - 1, -1, -1):
        if spec.shape[d] == 1:
            stride[d] = contiguous
        contiguous *= spec.shape[d]
    stride = tuple(stride)
    return spec if stride == spec.stride else ViewSpec(spec.shape, stride, spec.mode)


def canonical_layout(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    """`stride` with the size-1 dimensions' strides made contiguous (as `canonical`)."""
    return canonical(ViewSpec(tuple(shape), tuple(stride), FULL)).stride


def span(spec: ViewSpec) -> int:
    """How many elements of the flat buffer, from the view's offset on, the view reaches."""
    if 0 in spec.shape:
        return 0
    return 1 + sum((size - 1) * step for size, step in zip(spec.shape, spec.stride))


def _element_indices(shape, stride, offset):
    idx = offset
    for dim, (size, step) in enumerate(zip(shape, stride)):
        if size != 1 and step != 0:
            idx = idx + lax.broadcasted_iota(jnp.int64, shape, dim) * step
    return jnp.broadcast_to(idx, shape)


def gather(buf, offset, spec: ViewSpec):
    """The view's value from its storage's flat buffer."""
    shape = spec.shape
    if spec.mode == FULL:
        return buf.reshape(shape)
    numel = 1
    for s in shape:
        numel *= s
    if numel == 0:
        return jnp.zeros(shape, buf.dtype)
    if spec.mode == SLICE:
        return lax.dynamic_slice(buf, (offset,), (numel,)).reshape(shape)
    perm = dense_permutation(shape, spec.stride)
    if perm is not None:
        # A dense permuted view (a transpose saved between forward and backward, a
        # channels_last tensor): a slice and a transpose, which XLA folds into the consumer's
        # layout, instead of a gather by computed indices.
        flat = buf if numel == buf.shape[0] else lax.dynamic_slice(buf, (offset,), (numel,))
        stored = flat.reshape(tuple(shape[d] for d in perm))
        inverse = [0] * len(perm)
        for position, d in enumerate(perm):
            inverse[d] = position
        return jnp.transpose(stored, inverse)
    return buf[_element_indices(shape, spec.stride, offset)]


def scatter(buf, offset, value, spec: ViewSpec):
    """The new flat buffer after writing `value` (already of the view's shape) into the view."""
    if spec.mode == FULL:
        return value.reshape(-1)
    if value.size == 0:
        return buf
    if spec.mode == SLICE:
        return lax.dynamic_update_slice(buf, value.reshape(-1), (offset,))
    return buf.at[_element_indices(spec.shape, spec.stride, offset)].set(value)


def dense_permutation(shape, stride) -> tuple[int, ...] | None:
    """Axis order (outermost first) if the strides describe a dense, non-overlapping layout."""
    order = sorted(range(len(shape)), key=lambda d: (-stride[d], -d))
    expected = 1
    for d in reversed(order):
        if shape[d] != 1 and stride[d] != expected:
            return None
        expected *= shape[d]
    return tuple(order)


def to_memory_order(value, stride):
    """Flatten `value` so that element i sits where the given (dense) strides put it."""
    if value.ndim <= 1:
        return value.reshape(-1)
    perm = dense_permutation(value.shape, stride)
    if perm is None or perm == tuple(range(value.ndim)):
        return value.reshape(-1)
    return jnp.transpose(value, perm).reshape(-1)


def apply_bits(value, conj: bool, neg: bool):
    """A lazy conjugate/negative view's logical value from its stored one (and the stored
    value from a logical one: both maps are involutions)."""
    if conj and jnp.iscomplexobj(value):
        value = jnp.conj(value)
    if neg:
        value = -value
    return value
