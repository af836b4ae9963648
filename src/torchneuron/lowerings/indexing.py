"""Indexing: advanced indexing, gather/scatter, index_* ops, masked ops, nonzero, take/put.

JAX clamps out-of-range indices silently, so every op here checks its indices:

- `index.Tensor` and `index_put` run on concrete arrays (`jit=False`): boolean masks turn
  into integer indices on the host (data-dependent shapes), and a bad index raises PyTorch's
  own message ("index 5 is out of bounds for dimension 0 with size 3"). The gather/scatter
  itself still runs as one cached `jax.jit` executable per structure.
- Everything else is traced and reports out-of-range indices through `index_error=`.

Negative indices wrap where PyTorch wraps them (advanced indexing, `index_fill`, `take`,
`put`) and are errors where PyTorch rejects them (`gather`, `scatter*`, `index_select`,
`index_add`, `index_copy`).
"""

from __future__ import annotations

import functools
import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .dtypes import scalar_type_name
from .registry import at_call, eager_form, graph_form, lowers

aten = torch.ops.aten
INDEX = jnp.int64


# ---- helpers ---------------------------------------------------------------------------


def _out_of_range(idx, size, wrap: bool):
    """True where `idx` is out of range for a dimension of `size`."""
    low = -size if wrap else 0
    return (idx < low) | (idx >= size)


def _any_out_of_range(idx, size, wrap: bool):
    if idx.size == 0:
        return jnp.zeros((), bool)
    return jnp.any(_out_of_range(idx, size, wrap))


def _wrap(idx, size):
    return jnp.where(idx < 0, idx + size, idx)


def _at_least_1d(x):
    return x.reshape(1) if x.ndim == 0 else x


def _is_concrete(x) -> bool:
    return not isinstance(x, jax.core.Tracer)


# CPU's kernels check these; PyTorch's meta kernels do not (so JAX would broadcast or cast).


def _check_same_dtype(x, source, message: str) -> None:
    """`message` with {self} and {source} (PyTorch's dtype names) when the dtypes differ."""
    if hasattr(source, "dtype") and source.dtype != x.dtype:
        raise RuntimeError(message.format(self=scalar_type_name(x.dtype),
                                          source=scalar_type_name(source.dtype)))


def _check_source_shape(x, dim: int, source) -> None:
    """index_add/index_reduce: `source` has self's shape except along `dim`."""
    same = x.ndim == source.ndim
    if same and x.ndim:
        axis = dim % x.ndim
        same = all(a == b for d, (a, b) in enumerate(zip(x.shape, source.shape)) if d != axis)
    if not same:
        raise RuntimeError(
            "source tensor shape must match self tensor shape, excluding the specified "
            f"dimension. Got self.shape = {list(x.shape)} source.shape = {list(source.shape)}")


def _check_index_vector(name: str, index) -> None:
    if index.ndim > 1:
        raise IndexError(f"{name}(): Index is supposed to be a vector")


# ---- advanced indexing: index.Tensor / index_put ---------------------------------------


def _expand_indices(x, indices, concrete: bool):
    """PyTorch's index list -> (x, positions, int index arrays).

    `positions[k]` is the dimension indexed by `arrays[k]`; boolean masks become one integer
    array per masked dimension (their `nonzero`), which needs concrete values.
    """
    positions: list[int] = []
    arrays: list = []
    dim = 0
    for n, idx in enumerate(indices):
        if idx is None:
            dim += 1
            continue
        idx = jnp.asarray(idx)
        if idx.dtype in (jnp.bool_, jnp.uint8):
            if idx.ndim == 0:  # x[True]: a new unit dimension, selected or not
                x = jnp.expand_dims(x, dim)
                idx = idx.reshape(1)
            k = idx.ndim
            if dim + k > x.ndim:
                raise IndexError(f"too many indices for tensor of dimension {x.ndim}")
            if tuple(idx.shape) != tuple(x.shape[dim : dim + k]):
                for j in range(k):
                    if idx.shape[j] != x.shape[dim + j]:
                        raise IndexError(
                            f"The shape of the mask {list(idx.shape)} at index {j} does not "
                            f"match the shape of the indexed tensor {list(x.shape)} at index "
                            f"{dim + j}"
                        )
            if not concrete:
                raise NotImplementedError(
                    "torchneuron: boolean-mask indexing needs concrete values (data-dependent shape)"
                )
            for j, nz in enumerate(np.nonzero(np.asarray(idx))):
                positions.append(dim + j)
                arrays.append(jnp.asarray(nz, INDEX))
            dim += k
        elif idx.dtype in (jnp.int32, jnp.int64):  # CPU rejects int8/int16/unsigned indices
            if dim >= x.ndim:
                raise IndexError(f"too many indices for tensor of dimension {x.ndim}")
            positions.append(dim)
            arrays.append(idx)
            dim += 1
        else:
            raise IndexError(
                f"tensors used as indices must be long, int, byte or bool tensors (index {n} "
                f"has dtype {idx.dtype})"
            )
    if dim > x.ndim:
        raise IndexError(f"too many indices for tensor of dimension {x.ndim}")
    shapes = [tuple(a.shape) for a in arrays]
    try:
        np.broadcast_shapes(*shapes)
    except ValueError:
        raise IndexError(
            "shape mismatch: indexing tensors could not be broadcast together with shapes "
            + ", ".join(str(list(s)) for s in shapes)
        ) from None
    return x, tuple(positions), arrays


def _key(ndim, positions, arrays):
    key: list = [slice(None)] * ndim
    for p, a in zip(positions, arrays, strict=True):
        key[p] = a
    return tuple(key)


def _bad_flags(x, positions, arrays):
    if not arrays:
        return jnp.zeros((0,), bool)
    return jnp.stack([_any_out_of_range(a, x.shape[p], True) for p, a in zip(positions, arrays, strict=True)])


@functools.partial(jax.jit, static_argnames=("positions",))
def _gather_nd(x, arrays, positions):
    # jnp indexing wraps negative indices and places the advanced dimensions as PyTorch does
    # (at the first advanced index when they are adjacent, in front otherwise).
    return x[_key(x.ndim, positions, arrays)], _bad_flags(x, positions, arrays)


def _indexed_values(target_shape, values, dtype, same_dtype: bool = False):
    # The values broadcast to the indexed part, as any operand: index_put raises for values
    # of more dimensions, unit ones included. (`x[i] = v` strips v's leading unit dimensions
    # in PyTorch's Python binding, before index_put_ is called.) With `same_dtype`, values of
    # another dtype raise, after the shape check as in CPU's make_index_put_iterator.
    values = jnp.asarray(values)
    try:
        np.broadcast_shapes(values.shape, tuple(target_shape))
        ok = values.ndim <= len(target_shape)
    except ValueError:
        ok = False
    if not ok:
        raise RuntimeError(
            f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to "
            f"indexing result of shape {list(target_shape)}")
    if same_dtype:
        _check_same_dtype(jax.ShapeDtypeStruct((), dtype), values,
                          "Index put requires the source and destination dtypes match, "
                          "got {self} for the destination and {source} for the source.")
    return jnp.broadcast_to(values.astype(dtype), target_shape)


def _scatter_nd_impl(x, arrays, values, positions, accumulate, same_dtype=False):
    key = _key(x.ndim, positions, arrays)
    target_shape = jax.eval_shape(lambda v: v[key], x).shape
    values = _indexed_values(target_shape, values, x.dtype, same_dtype)
    if not accumulate:
        out = x.at[key].set(values)
    elif x.dtype == jnp.bool_:
        out = x.astype(jnp.int32).at[key].add(values.astype(jnp.int32)) != 0
    else:
        out = x.at[key].add(values)
    return out, _bad_flags(x, positions, arrays)


_scatter_nd = jax.jit(_scatter_nd_impl, static_argnames=("positions", "accumulate",
                                                         "same_dtype"))


def _raise_first_bad(x, positions, arrays, bad) -> None:
    bad = np.asarray(bad)
    if not bad.any():
        return
    k = int(np.argmax(bad))
    dim, size = positions[k], x.shape[positions[k]]
    values = np.asarray(arrays[k]).reshape(-1)
    value = values[(values < -size) | (values >= size)][0]
    raise IndexError(f"index {value} is out of bounds for dimension {dim} with size {size}")


# Inside compiled graphs the shapes are static: integer indices gather and scatter traced,
# with their range check reported through `index_error` (the eager forms raise PyTorch's
# message naming the bad index; a graph knows only that one was out of range).
_GRAPH_INDEX_ERROR = "index out of range in an advanced index of a compiled graph"


def _is_mask(t) -> bool:
    return t is not None and t.dtype in (torch.bool, torch.uint8)


def _integer_indices(arguments: dict) -> bool:
    return not any(_is_mask(t) for t in arguments["indices"])


def _index_in_graph(x, indices):
    x, positions, arrays = _expand_indices(x, indices, concrete=False)
    out, bad = _gather_nd(x, arrays, positions)
    return out, jnp.any(bad)


_BYTE_MASK_WARNING = ("indexing with dtype torch.uint8 is now deprecated, please use a dtype "
                      "torch.bool instead.")


def _index_meta(x, indices):
    # PyTorch's meta kernel admits int8 masks where CPU's kernel admits uint8 ("byte") ones
    # (meta_index_Tensor), so it rejected x[byte_mask]. A uint8 index is a mask, as bool.
    indices = [i.to(torch.bool) if i is not None and i.dtype == torch.uint8 else i
               for i in indices]
    return aten.index.Tensor(x, indices)


def _warn_byte_masks(indices) -> None:
    # CPU's kernels warn for each byte mask of each call (test_indexing counts them).
    for i in indices:
        if i is not None and jnp.asarray(i).dtype == jnp.uint8:
            warnings.warn(_BYTE_MASK_WARNING, UserWarning, stacklevel=3)


@lowers(aten.index.Tensor, jit=False, meta=_index_meta, graph_form=graph_form(
    _index_in_graph, index_error=_GRAPH_INDEX_ERROR, only_when=_integer_indices))
def index(x, indices):
    _warn_byte_masks(indices)
    x, positions, arrays = _expand_indices(x, indices, concrete=True)
    out, bad = _gather_nd(x, arrays, positions)
    _raise_first_bad(x, positions, arrays, bad)
    return out


@lowers(aten._unsafe_index.Tensor)
def unsafe_index(x, indices):
    x, positions, arrays = _expand_indices(x, indices, concrete=_is_concrete(x))
    return x[_key(x.ndim, positions, arrays)]


def _index_put_in_graph_accepts(arguments: dict) -> bool:
    # Integer indices, or one boolean mask written with a single value (`x[mask] = 0`).
    indices = [t for t in arguments["indices"] if t is not None]
    masks = [t for t in indices if _is_mask(t)]
    if not masks:
        return True
    values = arguments["values"]
    return len(indices) == 1 and values is not None and values.numel() == 1


def _fill_mask(x, dim: int, mask, values, accumulate):
    """`x[..., mask] = value` (`accumulate`: `+=`): the mask covers the dimensions from `dim`."""
    mask = jnp.asarray(mask).astype(bool)
    mask = mask.reshape((1,) * dim + mask.shape + (1,) * (x.ndim - dim - mask.ndim))
    value = jnp.asarray(values).reshape(()).astype(x.dtype)
    if not accumulate:
        return jnp.where(mask, value, x)
    if x.dtype == jnp.bool_:
        return x | (mask & value)
    return x + jnp.where(mask, value, jnp.zeros((), x.dtype))


def _index_put_in_graph(x, indices, values, accumulate=False):
    mask_at = [i for i, t in enumerate(indices) if t is not None and t.dtype in (jnp.bool_, jnp.uint8)]
    if mask_at:
        # The mask's dimensions follow the `None`s before it; the value fills where it is set.
        return _fill_mask(x, mask_at[0], indices[mask_at[0]], values, accumulate), jnp.zeros((), bool)
    x0 = x
    x, positions, arrays = _expand_indices(x, indices, concrete=False)
    out, bad = _scatter_nd(x, arrays, values, positions, bool(accumulate))
    return out.reshape(x0.shape), jnp.any(bad)


_INDEX_PUT_IN_GRAPHS = graph_form(_index_put_in_graph, index_error=_GRAPH_INDEX_ERROR,
                                  only_when=_index_put_in_graph_accepts)


def _one_mask_filled(arguments: dict) -> bool:
    # `x[mask] = v` eagerly: one boolean mask, of the shape of the dimensions it covers, and
    # one value of x's dtype that fits the indexed part (else the concrete form raises CPU's
    # error). Everything here is in the call's signature.
    x, values = arguments["self"], arguments["values"]
    present = [(dim, t) for dim, t in enumerate(arguments["indices"]) if t is not None]
    if len(present) != 1 or values is None or values.numel() != 1 or values.dtype != x.dtype:
        return False
    dim, mask = present[0]
    return (mask.dtype == torch.bool and mask.dim() > 0
            and tuple(mask.shape) == tuple(x.shape[dim:dim + mask.dim()])
            and values.dim() <= x.dim() - mask.dim() + 1)


def _index_put_one_mask(x, indices, values, accumulate=False):
    dim = next(d for d, t in enumerate(indices) if t is not None)
    return _fill_mask(x, dim, indices[dim], values, accumulate)


def _index_put_impl_one_mask(x, indices, values, accumulate=False, unsafe=False):
    return _index_put_one_mask(x, indices, values, accumulate)


@lowers(aten.index_put.default, jit=False, graph_form=_INDEX_PUT_IN_GRAPHS,
        eager_form=eager_form(_index_put_one_mask, only_when=_one_mask_filled))
def index_put(x, indices, values, accumulate=False):
    _warn_byte_masks(indices)
    x0 = x
    x, positions, arrays = _expand_indices(x, indices, concrete=True)
    out, bad = _scatter_nd(x, arrays, values, positions, bool(accumulate), same_dtype=True)
    _raise_first_bad(x, positions, arrays, bad)
    return out.reshape(x0.shape)


def _index_put_impl_in_graph(x, indices, values, accumulate=False, unsafe=False):
    return _index_put_in_graph(x, indices, values, accumulate)


@lowers(aten._index_put_impl.default, jit=False, graph_form=graph_form(
    _index_put_impl_in_graph, index_error=_GRAPH_INDEX_ERROR,
    only_when=_index_put_in_graph_accepts),
    eager_form=eager_form(_index_put_impl_one_mask, only_when=_one_mask_filled))
def index_put_impl(x, indices, values, accumulate=False, unsafe=False):
    return index_put(x, indices, values, accumulate)


# ---- gather / scatter ------------------------------------------------------------------


def _along(index, axis):
    """Full coordinates for an element-wise scatter: iota everywhere but `axis`."""
    coords = [lax.broadcasted_iota(INDEX, index.shape, d) for d in range(index.ndim)]
    coords[axis] = index
    return tuple(coords)


def _prefix(t, shape):
    """`t[:shape[0], :shape[1], ...]`: the part of `src`/`self` an index of `shape` uses."""
    return t[tuple(slice(0, s) for s in shape)]


# CPU raises RuntimeError (not IndexError) for out-of-range gather/scatter indices.
_GATHER_ERROR = (RuntimeError, "gather(): index out of bounds for the dimension being indexed")
_SCATTER_ERROR = (RuntimeError, "scatter(): index out of bounds for the dimension being indexed")


@lowers(aten.gather.default, index_error=_GATHER_ERROR)
def gather(x, dim, index, *, sparse_grad=False):
    shape = index.shape
    if index.size == 0:  # CPU checks no ranks for an empty index: (5,) gathered by (2, 0) is (2, 0)
        return jnp.zeros(shape, x.dtype), jnp.zeros((), bool)
    x, index = _at_least_1d(x), _at_least_1d(index)
    axis = dim % x.ndim
    bad = _any_out_of_range(index, x.shape[axis], False)
    sliced = _prefix(x, tuple(s if d != axis else x.shape[axis] for d, s in enumerate(index.shape)))
    out = jnp.take_along_axis(sliced, index, axis=axis, mode="clip")
    return out.reshape(shape), bad


def _scatter(x, dim, index, src, mode):
    """Element-wise scatter of `src` (array or scalar) into `x` along `dim`."""
    shape = x.shape
    x, index = _at_least_1d(x), _at_least_1d(index)
    axis = dim % x.ndim
    bad = _any_out_of_range(index, x.shape[axis], False)
    if isinstance(src, jax.Array) and src.ndim > 0:
        src = _prefix(src, index.shape)
    else:
        src = jnp.broadcast_to(jnp.asarray(src), index.shape)
    src = src.astype(x.dtype)
    if x.dtype == jnp.bool_ and mode != "set":
        # bool add/multiply are logical or/and (CPU): count in int32, then test for nonzero.
        out, bad = _scatter(x.astype(jnp.int32), dim, index, src.astype(jnp.int32), mode)
        return (out != 0).reshape(shape), bad
    ref = x.at[_along(index, axis)]
    if mode == "set":
        out = ref.set(src, mode="drop")
    elif mode == "add":
        out = ref.add(src, mode="drop")
    elif mode == "multiply":
        out = ref.multiply(src, mode="drop")
    else:
        raise RuntimeError(f"reduce argument must be either add or multiply, got {mode}")
    return out.reshape(shape), bad


@lowers(aten.scatter.src, aten.scatter.value, index_error=_SCATTER_ERROR)
def scatter(x, dim, index, src=None, value=None):
    return _scatter(x, dim, index, src if value is None else value, "set")


@lowers(aten.scatter.reduce, aten.scatter.value_reduce, index_error=_SCATTER_ERROR,
        static=("reduce",))
def scatter_reduce_legacy(x, dim, index, src=None, value=None, *, reduce):
    return _scatter(x, dim, index, src if value is None else value, reduce)


@lowers(aten.scatter_add.default, index_error=_SCATTER_ERROR)
def scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "add")


def _identity(dtype, reduce):
    if reduce == "prod":
        return jnp.ones((), dtype)
    if reduce in ("sum", "mean"):
        return jnp.zeros((), dtype)
    if dtype == jnp.bool_:
        return jnp.asarray(reduce == "amin")
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.asarray(-jnp.inf if reduce == "amax" else jnp.inf, dtype)
    info = jnp.iinfo(dtype)
    return jnp.asarray(info.min if reduce == "amax" else info.max, dtype)


def _scatter_reduce(x, coords, src, reduce, include_self):
    """`x` with `src` reduced into `x[coords]` (PyTorch's scatter_reduce semantics)."""
    src = src.astype(x.dtype)
    if x.dtype == jnp.bool_ and reduce in ("sum", "prod"):
        # bool sum/prod are logical or/and (CPU); JAX's scatter-add/multiply reject bool:
        # reduce 0/1 in int32 (a product of 0/1 cannot overflow), then test for nonzero.
        wide = _scatter_reduce(x.astype(jnp.int32), coords, src.astype(jnp.int32), reduce,
                               include_self)
        return wide != 0
    base = x if include_self else x.at[coords].set(_identity(x.dtype, reduce), mode="drop")
    ref = base.at[coords]
    if reduce in ("sum", "mean"):
        out = ref.add(src, mode="drop")
    elif reduce == "prod":
        out = ref.multiply(src, mode="drop")
    elif reduce == "amax":
        out = ref.max(src, mode="drop")
    elif reduce == "amin":
        out = ref.min(src, mode="drop")
    else:
        raise RuntimeError(
            f"reduce argument must be either sum, prod, mean, amax or amin, got {reduce}"
        )
    if reduce == "mean":
        count = jnp.ones(x.shape, INDEX) if include_self else jnp.zeros(x.shape, INDEX)
        count = count.at[coords].add(jnp.ones(src.shape, INDEX), mode="drop")
        count = jnp.maximum(count, 1)
        if jnp.issubdtype(x.dtype, jnp.inexact):
            out = out / count.astype(x.dtype)
        else:
            out = jnp.floor_divide(out, count.astype(x.dtype))
    return out


@lowers(aten.scatter_reduce.two, index_error=_SCATTER_ERROR, static=("reduce",))
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    shape = x.shape
    x, index, src = _at_least_1d(x), _at_least_1d(index), _at_least_1d(src)
    axis = dim % x.ndim
    bad = _any_out_of_range(index, x.shape[axis], False)
    out = _scatter_reduce(x, _along(index, axis), _prefix(src, index.shape), reduce, include_self)
    return out.reshape(shape), bad


# ---- index_select / index_add / index_copy / index_fill / index_reduce ------------------

_INDEX_ERROR = "index out of range in self"


def _dim_key(axis, index):
    return (slice(None),) * axis + (index,)


@lowers(aten.index_select.default, index_error=_INDEX_ERROR)
def index_select(x, dim, index):
    _check_index_vector("index_select", index)
    shape = x.shape
    x = _at_least_1d(x)
    axis = dim % x.ndim
    flat = index.reshape(-1)
    bad = _any_out_of_range(flat, x.shape[axis], False)
    out = jnp.take(x, flat, axis=axis, mode="clip")
    return (out.reshape(shape) if len(shape) == 0 else out), bad


# CPU raises RuntimeError here for a multi-dimensional self (IndexError only for 1-d).
@lowers(aten.index_add.default, index_error=(RuntimeError, _INDEX_ERROR))
def index_add(x, dim, index, source, *, alpha=1):
    _check_same_dtype(x, source, "index_add_(): self ({self}) and source ({source}) must have "
                                 "the same scalar type")
    _check_source_shape(x, dim, source)
    shape = x.shape
    x, source = _at_least_1d(x), _at_least_1d(source)
    axis = dim % x.ndim
    flat = index.reshape(-1)
    bad = _any_out_of_range(flat, x.shape[axis], False)
    if x.dtype == jnp.bool_:
        out = (x.astype(jnp.int32).at[_dim_key(axis, flat)].add(source.astype(jnp.int32),
                                                                mode="drop") != 0)
    else:
        out = x.at[_dim_key(axis, flat)].add((source * alpha).astype(x.dtype), mode="drop")
    return out.reshape(shape), bad


@lowers(aten.index_copy.default,
        index_error="index_copy_(): index out of bounds for the dimension being indexed")
def index_copy(x, dim, index, source):
    _check_same_dtype(x, source, "index_copy_(): self and source expected to have the same "
                                 "dtype, but got (self) {self} and (source) {source}")
    shape = x.shape
    x, source = _at_least_1d(x), _at_least_1d(source)
    axis = dim % x.ndim
    flat = index.reshape(-1)
    bad = _any_out_of_range(flat, x.shape[axis], False)
    out = x.at[_dim_key(axis, flat)].set(source.astype(x.dtype), mode="drop")
    return out.reshape(shape), bad


@lowers(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor,
        index_error="index_fill_(): index out of bounds for the dimension being indexed")
def index_fill(x, dim, index, value):
    shape = x.shape
    x = _at_least_1d(x)
    axis = dim % x.ndim
    size = x.shape[axis]
    flat = index.reshape(-1)
    bad = _any_out_of_range(flat, size, True)
    out = x.at[_dim_key(axis, _wrap(flat, size))].set(jnp.asarray(value).astype(x.dtype),
                                                       mode="drop")
    return out.reshape(shape), bad


@lowers(aten.index_reduce.default, index_error=_INDEX_ERROR, static=("reduce",))
def index_reduce(x, dim, index, source, reduce, *, include_self=True):
    _check_same_dtype(x, source, "index_reduce_(): self ({self}) and source ({source}) must "
                                 "have the same scalar type")
    _check_source_shape(x, dim, source)
    shape = x.shape
    x, source = _at_least_1d(x), _at_least_1d(source)
    axis = dim % x.ndim
    flat = index.reshape(-1)
    bad = _any_out_of_range(flat, x.shape[axis], False)
    full = jnp.broadcast_to(
        flat.reshape((1,) * axis + (-1,) + (1,) * (source.ndim - axis - 1)), source.shape
    )
    out = _scatter_reduce(x, _along(full, axis), source, reduce, include_self)
    return out.reshape(shape), bad


# ---- masked ops, nonzero ---------------------------------------------------------------


@lowers(aten.masked_select.default, jit=False)
def masked_select(x, mask):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    x = jnp.broadcast_to(x, shape)
    mask = np.broadcast_to(np.asarray(mask, bool), shape)
    return x[mask] if x.ndim else x.reshape(1)[mask.reshape(1)]


@lowers(aten.masked_scatter.default,
        index_error=at_call(RuntimeError, "Number of elements of source < number of ones in mask"))
def masked_scatter(x, mask, source):
    if mask.dtype != jnp.bool_:
        raise RuntimeError(
            f"masked_scatter_ only supports boolean masks, but got mask with dtype {mask.dtype}")
    # The functional op broadcasts self and mask against each other (self (5,), mask (5, 5)).
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    x = jnp.broadcast_to(x, shape)
    mask = jnp.broadcast_to(mask, shape).reshape(-1)
    count = jnp.sum(mask, dtype=INDEX)
    src = source.reshape(-1).astype(x.dtype)
    if src.size == 0:
        return x, count > 0
    position = jnp.clip(jnp.cumsum(mask, dtype=INDEX) - 1, 0, src.size - 1)
    out = jnp.where(mask, src[position], x.reshape(-1))
    return out.reshape(x.shape), count > src.size


@lowers(aten.masked_scatter_backward.default)
def masked_scatter_backward(grad_output, mask, sizes):
    numel = math.prod(sizes)
    mask = jnp.broadcast_to(mask, grad_output.shape).reshape(-1)
    position = jnp.where(mask, jnp.cumsum(mask, dtype=INDEX) - 1, numel)
    out = jnp.zeros((numel,), grad_output.dtype)
    out = out.at[position].set(grad_output.reshape(-1), mode="drop")
    return out.reshape(tuple(sizes))


# CPU's kernel fills an (ndim, n) buffer and returns its transpose: (n, ndim) with strides
# (1, n). Composites (argwhere) hand that layout on.
@lowers(aten.nonzero.default, jit=False, result_strides=lambda shape: (1, shape[0]))
def nonzero(x):
    if x.ndim == 0:
        return jnp.zeros((1 if bool(x != 0) else 0, 0), INDEX)
    return jnp.stack([jnp.asarray(a, INDEX) for a in np.nonzero(np.asarray(x))], axis=1)


@lowers(aten.nonzero_static.default)
def nonzero_static(x, *, size, fill_value=-1):
    if x.ndim == 0:
        return jnp.zeros((size, 0), INDEX)
    coords = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack([c.astype(INDEX) for c in coords], axis=1)


# ---- take / put ------------------------------------------------------------------------

_TAKE_ERROR = "out of range: tried to access an index outside the tensor's elements"


@lowers(aten.take.default, index_error=_TAKE_ERROR)
def take(x, index):
    flat = x.reshape(-1)
    n = flat.shape[0]
    bad = _any_out_of_range(index, n, True)
    if n == 0:
        return jnp.zeros(index.shape, x.dtype), bad
    return jnp.take(flat, _wrap(index, n), mode="clip"), bad


@lowers(aten.put.default, index_error=_TAKE_ERROR)
def put(x, index, source, accumulate=False):
    _check_same_dtype(x, source, "put_(): self and source expected to have the same dtype, but "
                                 "got self.dtype = {self} and source.dtype = {source}")
    flat = x.reshape(-1)
    n = flat.shape[0]
    idx = index.reshape(-1)
    bad = _any_out_of_range(idx, n, True)
    src = source.reshape(-1).astype(x.dtype)
    ref = flat.at[_wrap(idx, n)]
    if not accumulate:
        out = ref.set(src, mode="drop")
    elif x.dtype == jnp.bool_:
        out = flat.astype(jnp.int32).at[_wrap(idx, n)].add(src.astype(jnp.int32), mode="drop") != 0
    else:
        out = ref.add(src, mode="drop")
    return out.reshape(x.shape), bad


def _no_meta(*args, **kwargs):
    """Output metadata comes from the concrete result: PyTorch's meta kernel refuses
    `repeat_interleave` without `output_size`."""
    return None


@lowers(aten.repeat_interleave.Tensor, jit=False, meta=_no_meta)
def repeat_interleave(repeats, *, output_size=None):
    """`repeat_interleave(repeats)`: index i repeated repeats[i] times. The length is the sum
    of `repeats` (data-dependent), so this runs on concrete values."""
    if repeats.ndim != 1:
        raise RuntimeError("repeat_interleave only accept 1D vector as repeat")
    if not jnp.issubdtype(repeats.dtype, jnp.integer):
        raise NotImplementedError(f'"repeat_interleave" not implemented for {repeats.dtype}')
    if repeats.size and int(jnp.min(repeats)) < 0:
        raise RuntimeError("repeats can not be negative")
    total = int(jnp.sum(repeats, dtype=INDEX))
    if output_size is not None and output_size != total:
        raise RuntimeError("allocated size does not match required size")
    positions = jnp.arange(repeats.shape[0], dtype=repeats.dtype)
    return jnp.repeat(positions, repeats, total_repeat_length=total)
