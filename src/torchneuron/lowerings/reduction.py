"""Reductions, scans and sorts.

Conventions shared by this module:

- `dim` arguments arrive as concrete ints or lists; PyTorch's meta kernel has already
  rejected bad dims, so they only need wrapping. `None` or `[]` reduces every dimension.
- Results are cast by the runtime to the dtype the meta kernel reports; these functions pick
  the dtype to *accumulate* in (int64 for integer sums, float32 for half floats, the `dtype=`
  argument when given) so that the cast only rounds the finished value.
- NaN ordering follows PyTorch: NaN compares largest in sorts and propagates through
  max/min; index results point at the first occurrence unless PyTorch documents otherwise.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .dtypes import float_or_default, to_jax_dtype
from .registry import Promotion, lowers, upcast_half

aten = torch.ops.aten
INDEX = jnp.int64
_HALF = (jnp.float16, jnp.bfloat16)


# ---- helpers ---------------------------------------------------------------------------


def _check_dim(x, dim: int) -> int:
    """PyTorch's dim wrapping (a 0-d tensor accepts 0 and -1), with its IndexError."""
    n = max(x.ndim, 1)
    if not -n <= dim < n:
        raise IndexError(
            f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})"
        )
    return dim % n


def _axes(x, dim) -> tuple[int, ...]:
    """Normalized reduction axes; `None`/`[]` means all of them; a 0-d tensor has none."""
    if dim is None or (isinstance(dim, list | tuple) and len(dim) == 0):
        return tuple(range(x.ndim))
    if isinstance(dim, int):
        dim = [dim]
    axes = {_check_dim(x, d) for d in dim}
    return () if x.ndim == 0 else tuple(sorted(axes))


def _axis(x, dim: int) -> int | None:
    """One normalized axis, or None for a 0-d tensor (where dims 0 and -1 are accepted)."""
    axis = _check_dim(x, dim)
    return None if x.ndim == 0 else axis


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def _accumulate(x, dtype=None):
    """Cast to the dtype a sum/prod/cumsum accumulates in, as PyTorch does."""
    if dtype is not None:
        x = x.astype(to_jax_dtype(dtype))
    elif x.dtype == jnp.bool_ or jnp.issubdtype(x.dtype, jnp.integer):
        x = x.astype(jnp.int64)
    if x.dtype in _HALF:
        x = x.astype(jnp.float32)
    return x


def _reduced_shape(x, axes, keepdim):
    return tuple(1 if i in axes else s for i, s in enumerate(x.shape) if keepdim or i not in axes)


def _isnan(x):
    return jnp.isnan(x) if _is_float(x) else jnp.zeros(x.shape, bool)


def _keep(value, axis, keepdim):
    return jnp.expand_dims(value, axis) if keepdim else value


# ---- sums and means --------------------------------------------------------------------


@lowers(aten.sum.dim_IntList)
def sum_dim(x, dim, keepdim=False, *, dtype=None):
    return jnp.sum(_accumulate(x, dtype), axis=_axes(x, dim), keepdims=keepdim)


@lowers(aten.sum.default)
def sum_all(x, *, dtype=None):
    return jnp.sum(_accumulate(x, dtype))


@lowers(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, *, dtype=None):
    x = _accumulate(x, dtype)
    if _is_float(x):
        x = jnp.where(jnp.isnan(x), jnp.zeros((), x.dtype), x)
    return jnp.sum(x, axis=_axes(x, dim), keepdims=keepdim)


@lowers(aten.mean.dim)
def mean_dim(x, dim, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = x.astype(to_jax_dtype(dtype))
    return jnp.mean(upcast_half(x), axis=_axes(x, dim), keepdims=keepdim)


@lowers(aten.mean.default)
def mean_all(x, *, dtype=None):
    return mean_dim(x, None, dtype=dtype)


@lowers(aten.prod.default)
def prod_all(x, *, dtype=None):
    return jnp.prod(_accumulate(x, dtype))


@lowers(aten.prod.dim_int)
def prod_dim(x, dim, keepdim=False, *, dtype=None):
    return jnp.prod(_accumulate(x, dtype), axis=_axis(x, dim), keepdims=keepdim)


@lowers(aten.count_nonzero.dim_IntList)
def count_nonzero_dims(x, dim):
    return jnp.sum(x != 0, axis=_axes(x, dim), dtype=INDEX)


@lowers(aten.count_nonzero.default)
def count_nonzero(x, dim=None):
    return count_nonzero_dims(x, dim)


# ---- variance --------------------------------------------------------------------------


def _var_mean(x, dim, correction, keepdim):
    x = upcast_half(x)
    axes = _axes(x, dim)
    n = math.prod(x.shape[a] for a in axes)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    diff = x - mean
    sq = jnp.real(diff * jnp.conj(diff)) if jnp.iscomplexobj(diff) else diff * diff
    correction = 1 if correction is None else correction
    var = jnp.sum(sq, axis=axes, keepdims=keepdim) / jnp.maximum(n - correction, 0)
    if not keepdim:
        mean = jnp.squeeze(mean, axes)
    return var, mean


@lowers(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)[0]


@lowers(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var_mean(x, dim, correction, keepdim)[0])


@lowers(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)


@lowers(aten.std_mean.correction)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    v, m = _var_mean(x, dim, correction, keepdim)
    return jnp.sqrt(v), m


# ---- max / min -------------------------------------------------------------------------


@lowers(aten.amax.default)
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=_axes(x, dim), keepdims=keepdim)


@lowers(aten.amin.default)
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=_axes(x, dim), keepdims=keepdim)


@lowers(aten.aminmax.default)
def aminmax(x, *, dim=None, keepdim=False):
    axes = _axes(x, dim)
    return jnp.min(x, axis=axes, keepdims=keepdim), jnp.max(x, axis=axes, keepdims=keepdim)


def _full_reduction(name, reduce):
    def lower(x):
        if x.size == 0:
            raise RuntimeError(
                f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                "Specify the reduction dim with the 'dim' argument."
            )
        return reduce(x)

    return lower


lowers(aten.max.default)(_full_reduction("max", jnp.max))
lowers(aten.min.default)(_full_reduction("min", jnp.min))


def _dim_reduction(name, reduce, arg_reduce):
    def lower(x, dim, keepdim=False):
        axis = _axis(x, dim)
        if axis is None:
            return x, jnp.zeros((), INDEX)
        if x.shape[axis] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {dim} to have non-zero size.")
        return (reduce(x, axis=axis, keepdims=keepdim),
                arg_reduce(x, axis=axis, keepdims=keepdim).astype(INDEX))

    return lower


lowers(aten.max.dim)(_dim_reduction("max", jnp.max, jnp.argmax))
lowers(aten.min.dim)(_dim_reduction("min", jnp.min, jnp.argmin))


def _arg_reduction(name, arg_reduce):
    def lower(x, dim=None, keepdim=False):
        if x.dtype == jnp.bool_:
            raise RuntimeError(f"{name}(): does not support bool input")
        if dim is None:
            idx = arg_reduce(x.reshape(-1)).astype(INDEX)
            return idx.reshape((1,) * x.ndim) if keepdim else idx
        axis = _axis(x, dim)
        if axis is None:
            return jnp.zeros((), INDEX)
        return arg_reduce(x, axis=axis, keepdims=keepdim).astype(INDEX)

    return lower


lowers(aten.argmax.default)(_arg_reduction("argmax", jnp.argmax))
lowers(aten.argmin.default)(_arg_reduction("argmin", jnp.argmin))


# ---- all / any -------------------------------------------------------------------------


def _truthy(x):
    return x if x.dtype == jnp.bool_ else x != 0


@lowers(aten.all.default)
def all_(x):
    return jnp.all(_truthy(x))


@lowers(aten.all.dim, aten.all.dims)
def all_dims(x, dim=None, keepdim=False):
    return jnp.all(_truthy(x), axis=_axes(x, dim), keepdims=keepdim)


@lowers(aten.any.default)
def any_(x):
    return jnp.any(_truthy(x))


@lowers(aten.any.dim, aten.any.dims)
def any_dims(x, dim=None, keepdim=False):
    return jnp.any(_truthy(x), axis=_axes(x, dim), keepdims=keepdim)


# ---- logsumexp and norms ---------------------------------------------------------------


@lowers(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    x = upcast_half(float_or_default(x))
    axes = _axes(x, dim)
    if any(x.shape[a] == 0 for a in axes):
        return jnp.full(_reduced_shape(x, axes, keepdim), -jnp.inf, x.dtype)
    return jax.scipy.special.logsumexp(x, axis=axes, keepdims=keepdim)


def _vector_norm(x, ord, dim, keepdim, dtype):
    if dtype is not None:
        x = x.astype(to_jax_dtype(dtype))
    a = upcast_half(jnp.abs(float_or_default(x)))
    axes = _axes(a, dim)
    ord = float(ord)
    if ord == math.inf:
        return jnp.max(a, axis=axes, keepdims=keepdim)
    if ord == -math.inf:
        return jnp.min(a, axis=axes, keepdims=keepdim)
    if ord == 0:
        return jnp.sum(a != 0, axis=axes, keepdims=keepdim).astype(a.dtype)
    if ord == 1:
        return jnp.sum(a, axis=axes, keepdims=keepdim)
    if ord == 2:
        return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    return jnp.sum(a ** ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


@lowers(aten.linalg_vector_norm.default, static=("ord",))
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    return _vector_norm(x, ord, dim, keepdim, dtype)


@lowers(aten.norm.Scalar, static=("p",))
def norm_scalar(x, p=2):
    return _vector_norm(x, 2 if p is None else p, None, False, None)


@lowers(aten.norm.ScalarOpt_dim, static=("p",))
def norm_dim(x, p, dim, keepdim=False):
    return _vector_norm(x, 2 if p is None else p, dim, keepdim, None)


@lowers(aten.norm.ScalarOpt_dim_dtype, static=("p",))
def norm_dim_dtype(x, p, dim, keepdim, *, dtype):
    return _vector_norm(x, 2 if p is None else p, dim, keepdim, dtype)


@lowers(aten.norm.ScalarOpt_dtype, static=("p",))
def norm_dtype(x, p, *, dtype):
    return _vector_norm(x, 2 if p is None else p, None, False, dtype)


# ---- scans -----------------------------------------------------------------------------


@lowers(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    x = _accumulate(x, dtype)
    axis = _axis(x, dim)
    return x if axis is None else jnp.cumsum(x, axis=axis)


@lowers(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    x = _accumulate(x, dtype)
    axis = _axis(x, dim)
    return x if axis is None else jnp.cumprod(x, axis=axis)


@lowers(aten.logcumsumexp.default, aten._logcumsumexp.default)
def logcumsumexp(x, dim):
    x = float_or_default(x)
    # CPU accumulates float32 in double (acc_type<float, false>): with large entries
    # (|x| ~ 1e4) a float32 scan loses ~1e-3 relative, visible in the backward's exp().
    x = x.astype(jnp.float64) if x.dtype == jnp.float32 else upcast_half(x)
    axis = _axis(x, dim)
    if axis is None or x.shape[axis] == 0:
        return x
    if jnp.iscomplexobj(x):
        return _complex_logcumsumexp(x, axis)
    return lax.cumlogsumexp(x, axis=axis)


def _complex_logaddexp(x, acc):
    """CPU's _log_add_exp_helper for complex (ATen/native/cpu/LogAddExp.h): the imaginary
    part is not wrapped, so the result depends on the order, and the scan is sequential."""
    x_nan = jnp.isnan(x.real) | jnp.isnan(x.imag)
    acc_nan = jnp.isnan(acc.real) | jnp.isnan(acc.imag)
    x_smaller = x.real < acc.real
    mn = jnp.where(x_smaller, x, acc)
    mx = jnp.where(x_smaller, acc, x)
    mn = jnp.where(acc_nan, acc, jnp.where(x_nan, x, mn))
    mx = jnp.where(acc_nan, acc, jnp.where(x_nan, x, mx))
    general = jnp.log1p(jnp.exp(mn - mx)) + mx
    inf_case = ~jnp.isfinite(mn.real) & (mn.real == mx.real)
    inf_value = jnp.where(mn.real < 0, mn, jnp.log(jnp.exp(mn) + jnp.exp(mx)))
    nan = jnp.asarray(complex(jnp.nan, jnp.nan), x.dtype)
    return jnp.where(x_nan | acc_nan, nan, jnp.where(inf_case, inf_value, general))


def _complex_logcumsumexp(x, axis):
    dtype = x.dtype
    moved = jnp.moveaxis(x, axis, 0).astype(jnp.complex128)  # CPU accumulates in double

    def step(acc, v):
        acc = _complex_logaddexp(v, acc)
        return acc, acc

    init = jnp.full(moved.shape[1:], complex(-jnp.inf, 0), jnp.complex128)
    _, out = lax.scan(step, init, moved)
    return jnp.moveaxis(out.astype(dtype), 0, axis)


def _cum_extreme(better):
    """cummax/cummin: the running extreme and the index of its *latest* occurrence.

    PyTorch takes a new element when it is NaN or ties-or-beats the running value, unless
    the running value is already NaN; that choice is associative, so it scans in parallel.
    """

    def combine(a, b):
        va, ia = a
        vb, ib = b
        take_b = better(vb, va)
        if _is_float(vb):
            take_b = jnp.isnan(vb) | (~jnp.isnan(va) & take_b)
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    def lower(x, dim):
        axis = _axis(x, dim)
        if axis is None:
            return x, jnp.zeros((), INDEX)
        if x.shape[axis] == 0:
            return x, jnp.zeros(x.shape, INDEX)
        idx = lax.broadcasted_iota(INDEX, x.shape, axis)
        return lax.associative_scan(combine, (x, idx), axis=axis)

    return lower


_cummax = lowers(aten.cummax.default)(_cum_extreme(lambda new, old: new >= old))
_cummin = lowers(aten.cummin.default)(_cum_extreme(lambda new, old: new <= old))


# `cummax.out` writes through these helpers (no functional twin): they return the new values
# of the two buffers they fill.
@lowers(aten._cummax_helper.default)
def cummax_helper(x, values, indices, dim):
    return _cummax(x, dim)


@lowers(aten._cummin_helper.default)
def cummin_helper(x, values, indices, dim):
    return _cummin(x, dim)


# ---- sorting ---------------------------------------------------------------------------


def _sort(x, axis, descending):
    """Stable sort along `axis` with NaN largest: (values, int64 indices)."""
    idx = lax.broadcasted_iota(INDEX, x.shape, axis)
    if x.shape[axis] <= 1:
        return x, idx
    if not descending:
        return lax.sort((x, idx), dimension=axis, is_stable=True, num_keys=1)
    # Ascending on (value, -index) reversed: values descend, equal values keep their order.
    values, neg_idx = lax.sort((x, -idx), dimension=axis, is_stable=True, num_keys=2)
    return lax.rev(values, (axis,)), -lax.rev(neg_idx, (axis,))


@lowers(aten.sort.default, aten.sort.stable)
def sort(x, dim=-1, descending=False, *, stable=None):
    axis = _axis(x, dim)
    if axis is None:
        return x, jnp.zeros((), INDEX)
    return _sort(x, axis, descending)


@lowers(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    axis = _axis(x, dim)
    if axis is None:
        return x, jnp.zeros((), INDEX)
    values, idx = _sort(x, axis, largest)
    return lax.slice_in_dim(values, 0, k, axis=axis), lax.slice_in_dim(idx, 0, k, axis=axis)


def _select(values, idx, position, axis, keepdim):
    """Take `position` (int or array broadcastable with keepdims) along `axis`."""
    if isinstance(position, int):
        v = lax.slice_in_dim(values, position, position + 1, axis=axis)
        i = lax.slice_in_dim(idx, position, position + 1, axis=axis)
    else:
        v = jnp.take_along_axis(values, position, axis=axis)
        i = jnp.take_along_axis(idx, position, axis=axis)
    if not keepdim:
        v, i = jnp.squeeze(v, axis), jnp.squeeze(i, axis)
    return v, i


@lowers(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    axis = _axis(x, dim)
    if axis is None:
        return x, jnp.zeros((), INDEX)
    values, idx = _sort(x, axis, False)
    return _select(values, idx, k - 1, axis, keepdim)


def _median(x, axis, keepdim, ignore_nan):
    values, idx = _sort(x, axis, False)
    n = x.shape[axis]
    nan = _isnan(x)
    if ignore_nan:
        count = n - jnp.sum(nan, axis=axis, keepdims=True)
        position = jnp.maximum((count - 1) // 2, 0).astype(INDEX)
        return _select(values, idx, position, axis, keepdim)
    v, i = _select(values, idx, (n - 1) // 2, axis, keepdim)
    if _is_float(x):
        # Any NaN makes the median NaN, reported at the first NaN.
        has_nan = jnp.any(nan, axis=axis, keepdims=keepdim)
        first_nan = jnp.argmax(nan, axis=axis, keepdims=keepdim).astype(INDEX)
        v = jnp.where(has_nan, jnp.asarray(jnp.nan, x.dtype), v)
        i = jnp.where(has_nan, first_nan, i)
    return v, i


def _median_all(ignore_nan):
    def lower(x):
        flat = x.reshape(-1)
        if flat.size == 0:
            return jnp.asarray(jnp.nan, x.dtype) if _is_float(x) else jnp.zeros((), x.dtype)
        return _median(flat, 0, False, ignore_nan)[0]

    return lower


def _median_dim(ignore_nan):
    def lower(x, dim, keepdim=False):
        axis = _axis(x, dim)
        if axis is None:
            return x, jnp.zeros((), INDEX)
        return _median(x, axis, keepdim, ignore_nan)

    return lower


lowers(aten.median.default)(_median_all(False))
lowers(aten.nanmedian.default)(_median_all(True))
lowers(aten.median.dim)(_median_dim(False))
lowers(aten.nanmedian.dim)(_median_dim(True))


def _mode_1d(row):
    """Most frequent value (smallest on ties) and the index of its last occurrence."""
    n = row.shape[0]
    values, idx = _sort(row, 0, False)
    start = jnp.concatenate([jnp.ones((1,), bool), values[1:] != values[:-1]])
    run = jnp.cumsum(start) - 1
    length = jax.ops.segment_sum(jnp.ones((n,), INDEX), run, num_segments=n)
    first = jnp.argmax(length[run])  # first position of the first longest run
    last = first + length[run[first]] - 1
    return values[first], idx[last]


# mode.values' composite kernel refuses devices other than CPU/CUDA/XPU ("mode only supports
# CPU, CUDA and XPU device type"): it gets a kernel of its own, derived from this lowering.
@lowers(aten.mode.default, direct_kernels=(aten.mode.values,))
def mode(x, dim=-1, keepdim=False):
    axis = _axis(x, dim)
    if axis is None:
        return x, jnp.zeros((), INDEX)
    moved = jnp.moveaxis(x, axis, -1)
    batch = moved.shape[:-1]
    n = moved.shape[-1]
    if n == 0 or math.prod(batch) == 0:
        v = jnp.zeros(batch, x.dtype)
        i = jnp.zeros(batch, INDEX)
    else:
        v, i = jax.vmap(_mode_1d)(moved.reshape(-1, n))
        v, i = v.reshape(batch), i.reshape(batch)
    return _keep(v, axis, keepdim), _keep(i, axis, keepdim)


# ---- searching, counting, unique -------------------------------------------------------


def _searchsorted(sorted_sequence, values, right, side, sorter, out_int32):
    side = side or ("right" if right else "left")
    if sorter is not None:
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1, mode="clip")
    values = jnp.asarray(values, sorted_sequence.dtype)
    if sorted_sequence.ndim <= 1:
        out = jnp.searchsorted(sorted_sequence.reshape(-1), values, side=side)
    else:
        batch = sorted_sequence.shape[:-1]
        rows = sorted_sequence.reshape(-1, sorted_sequence.shape[-1])
        vals = values.reshape(rows.shape[0], -1)
        out = jax.vmap(lambda r, v: jnp.searchsorted(r, v, side=side))(rows, vals)
        out = out.reshape(batch + values.shape[-1:])
    return out.astype(jnp.int32 if out_int32 else INDEX)


@lowers(aten.searchsorted.Tensor, aten.searchsorted.Scalar, static=("side",))
def searchsorted(sorted_sequence, x, *, out_int32=False, right=False, side=None, sorter=None):
    return _searchsorted(sorted_sequence, x, right, side, sorter, out_int32)


@lowers(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(x, boundaries, *, out_int32=False, right=False):
    return _searchsorted(boundaries, x, right, None, None, out_int32)


@lowers(aten.bincount.default, jit=False)
def bincount(x, weights=None, minlength=0):
    if x.ndim != 1 or (x.size and int(jnp.min(x)) < 0):
        raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
    length = max(int(jnp.max(x)) + 1 if x.size else 0, minlength)
    if weights is None:
        return jnp.bincount(x, length=length).astype(INDEX)
    dtype = weights.dtype if jnp.issubdtype(weights.dtype, jnp.floating) else jnp.float64
    return jnp.bincount(x, weights.astype(jnp.float64), length=length).astype(dtype)


@jax.jit
def _unique_padded(flat):
    """Sorted unique values of a non-empty 1-d array padded to its length, with inverse,
    counts and the number of values: one executable per input shape (jnp.unique outside jit
    dispatches a dozen ops, each compiled per shape). NaN never equals NaN, as on CPU."""
    n = flat.shape[0]
    order = jnp.argsort(flat, stable=True)
    ordered = flat[order]
    starts = jnp.concatenate([jnp.ones((1,), bool), ordered[1:] != ordered[:-1]])
    group = (jnp.cumsum(starts) - 1).astype(INDEX)
    inverse = jnp.zeros((n,), INDEX).at[order].set(group)
    counts = jnp.zeros((n,), INDEX).at[group].add(1)
    values = jnp.zeros_like(ordered).at[jnp.where(starts, group, n)].set(ordered, mode="drop")
    return values, inverse, counts, group[-1] + 1


@lowers(aten._unique2.default, jit=False)
def unique2(x, sorted=True, return_inverse=False, return_counts=False):
    empty = jnp.zeros((0,), INDEX)
    if x.size == 0:
        return x.reshape(0), empty.reshape(x.shape) if return_inverse else empty, empty
    values, inverse, counts, number = _unique_padded(x.reshape(-1))
    # The prefix is cut on the host: a device slice would compile once per (length, count).
    number = int(number)
    return (
        jnp.asarray(np.asarray(values)[:number]),
        inverse.reshape(x.shape) if return_inverse else empty,
        jnp.asarray(np.asarray(counts)[:number]) if return_counts else empty,
    )


@lowers(aten.histc.default)
def histc(x, bins=100, min=0, max=0):
    x = upcast_half(x)
    lo, hi = jnp.asarray(min, x.dtype), jnp.asarray(max, x.dtype)
    if x.size:
        finite = jnp.isfinite(x)
        data_lo = jnp.min(jnp.where(finite, x, jnp.inf)).astype(x.dtype)
        data_hi = jnp.max(jnp.where(finite, x, -jnp.inf)).astype(x.dtype)
        same = lo == hi
        lo, hi = jnp.where(same, data_lo, lo), jnp.where(same, data_hi, hi)
    equal = lo == hi
    lo, hi = jnp.where(equal, lo - 1, lo), jnp.where(equal, hi + 1, hi)
    inside = (x >= lo) & (x <= hi)
    position = ((x - lo) * bins / (hi - lo)).astype(INDEX)
    position = jnp.where(position == bins, bins - 1, position)
    position = jnp.where(inside, position, bins)  # dropped below
    counts = jnp.zeros((bins,), x.dtype).at[position.reshape(-1)].add(
        jnp.ones((x.size,), x.dtype), mode="drop")
    return counts


@lowers(aten.unique_consecutive.default, jit=False)
def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    """Collapse runs of equal neighbours (NaN never equals NaN, as on CPU)."""
    if dim is None:
        flat = x.reshape(-1)
        rows = flat.reshape(-1, 1)
    else:
        axis = _check_dim(x, dim)
        moved = jnp.moveaxis(x, axis, 0)
        rows = moved.reshape(moved.shape[0], -1)
    n = rows.shape[0]
    if n == 0:
        starts = jnp.zeros((0,), bool)
    else:
        differs = jnp.any(rows[1:] != rows[:-1], axis=1)
        starts = jnp.concatenate([jnp.ones((1,), bool), differs])
    start_idx = jnp.nonzero(starts)[0]  # concrete (jit=False): data-dependent length
    group = (jnp.cumsum(starts) - 1).astype(INDEX)
    counts = jnp.diff(jnp.append(start_idx, n)).astype(INDEX)
    if dim is None:
        values = flat[start_idx]
        empty = jnp.zeros((0,), INDEX)
        inverse = group.reshape(x.shape) if return_inverse else empty
        return values, inverse, counts if return_counts else empty
    values = jnp.moveaxis(jnp.take(moved, start_idx, axis=0), 0, axis)
    return values, group, counts


@lowers(aten.equal.default, promote=Promotion.DEFAULT)
def equal(x, y):
    """torch.equal: same shape and every element equal (NaN != NaN); mixed dtypes compare
    after promotion, as CPU does."""
    if tuple(x.shape) != tuple(y.shape):
        return jnp.zeros((), bool)
    return jnp.all(x == y)


# ---- segment_reduce ------------------------------------------------------------------------


def _segment_layout(data, lengths, offsets, axis):
    """(batch, n, inner) view of `data`, per-batch segment starts/ends (batch, S), and each
    element's segment id (batch, n); elements outside every segment get id S (dropped)."""
    axis = axis % data.ndim
    outer = data.shape[:axis]
    n = data.shape[axis]
    rows = data.reshape((math.prod(outer), n, -1))
    if offsets is not None:
        bounds = offsets.reshape(rows.shape[0], -1).astype(INDEX)
        starts, ends = bounds[:, :-1], bounds[:, 1:]
    else:
        lens = lengths.reshape(rows.shape[0], -1).astype(INDEX)
        ends = jnp.cumsum(lens, axis=1)
        starts = ends - lens
    num = starts.shape[1]
    pos = jnp.arange(n, dtype=INDEX)
    seg = jax.vmap(lambda e: jnp.searchsorted(e, pos, side="right"))(ends)
    inside = pos[None, :] >= jnp.take_along_axis(starts, jnp.minimum(seg, num - 1), axis=1)
    seg = jnp.where(inside & (seg < num), seg, num)
    return rows, starts, ends, seg, (outer, num, data.shape[axis + 1:])


def _segment_scatter(rows, seg, num, reduce, fill):
    out = jnp.full((rows.shape[0], num, rows.shape[2]), fill, rows.dtype)
    b = jnp.arange(rows.shape[0])[:, None]
    at = out.at[b, seg]
    if reduce in ("sum", "mean"):
        return at.add(rows, mode="drop")
    if reduce == "prod":
        return at.multiply(rows, mode="drop")
    return (at.max if reduce == "max" else at.min)(rows, mode="drop")


_SEGMENT_IDENTITY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}


@lowers(aten.segment_reduce.default, static=("initial",))
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0,
                   unsafe=False, initial=None):
    """CPU semantics: the reduction starts from `initial` (else the identity); NaN
    propagates through max/min; a mean divides by the length, and an empty segment's mean
    is `initial` or NaN."""
    if reduce not in _SEGMENT_IDENTITY:
        raise RuntimeError(f"reduce argument must be one of sum, mean, max, min, prod: {reduce}")
    rows, starts, ends, seg, (outer, num, inner) = _segment_layout(data, lengths, offsets, axis)
    fill = _SEGMENT_IDENTITY[reduce] if initial is None else initial
    out = _segment_scatter(rows, seg, num, reduce, fill)
    if reduce in ("max", "min"):
        # XLA's scatter max/min may drop NaN; CPU keeps it.
        nan = _segment_scatter(jnp.isnan(rows).astype(rows.dtype), seg, num, "sum", 0.0) > 0
        out = jnp.where(nan, jnp.asarray(jnp.nan, out.dtype), out)
    if reduce == "mean":
        count = (ends - starts)[:, :, None].astype(out.dtype)
        empty_value = jnp.nan if initial is None else initial
        out = jnp.where(count > 0, out / jnp.where(count > 0, count, 1),
                        jnp.asarray(empty_value, out.dtype))
    return out.reshape(outer + (num,) + inner)


@lowers(aten._segment_reduce_backward.default, static=("initial",))
def segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0,
                            initial=None):
    """CPU's gradients: max/min give the gradient to every element equal to the result (and
    every NaN), shared among them only where it is positive; prod uses output / x, or the product of the others where x is
    0 or NaN."""
    rows, starts, ends, seg, (outer, num, inner) = _segment_layout(data, lengths, offsets, axis)
    batch = rows.shape[0]
    g = grad.reshape(batch, num, -1)
    o = output.reshape(batch, num, -1)
    valid = (seg < num)[:, :, None]
    pick = jnp.minimum(seg, num - 1)[:, :, None]
    g_el = jnp.take_along_axis(g, pick, axis=1)
    o_el = jnp.take_along_axis(o, pick, axis=1)
    zero = jnp.zeros((), rows.dtype)
    if reduce == "sum":
        result = g_el
    elif reduce == "mean":
        count = jnp.take_along_axis((ends - starts)[:, :, None], pick, axis=1)
        result = g_el / jnp.maximum(count, 1).astype(rows.dtype)
    elif reduce in ("max", "min"):
        hit = (rows == o_el) | jnp.isnan(rows)
        ties = _segment_scatter(hit.astype(rows.dtype), seg, num, "sum", 0.0)
        ties_el = jnp.take_along_axis(ties, pick, axis=1)
        result = jnp.where(hit, g_el, zero)
        # CPU divides among ties only the gradients that are > 0 (as its kernel does).
        result = jnp.where((ties_el >= 2) & (result > 0), result / ties_el, result)
    else:  # prod
        is_zero, is_nan = rows == 0, jnp.isnan(rows)
        plain = jnp.where(is_zero | is_nan, jnp.ones((), rows.dtype), rows)
        init = jnp.asarray(1.0 if initial is None else initial, rows.dtype)
        plain_prod = _segment_scatter(plain, seg, num, "prod", 1.0) * init
        zeros = _segment_scatter(is_zero.astype(INDEX), seg, num, "sum", 0)
        nans = _segment_scatter(is_nan.astype(INDEX), seg, num, "sum", 0)
        p_el, z_el, n_el = (jnp.take_along_axis(t, pick, axis=1) for t in (plain_prod, zeros, nans))
        # Product of the other elements of the segment, for the 0 / NaN elements.
        others_zero = (z_el - is_zero) > 0
        others_nan = (n_el - is_nan) > 0
        exclusive = jnp.where(others_zero, p_el * 0, p_el)
        exclusive = jnp.where(others_nan, jnp.asarray(jnp.nan, rows.dtype), exclusive)
        ratio = o_el / jnp.where(is_zero | is_nan, jnp.ones((), rows.dtype), rows)
        result = g_el * jnp.where(is_zero | is_nan, exclusive, ratio)
    result = jnp.where(valid, result, zero)
    return result.reshape(data.shape)


# ---- hash_tensor ----------------------------------------------------------------------------


@lowers(aten.hash_tensor.default)
def hash_tensor(self, dim=(), *, keepdim=False, mode=0):
    """xor of the elements' bits after widening to 64 bits (float64 / int64 / uint64)."""
    dt = self.dtype
    if mode != 0:
        raise RuntimeError(f"hash_tensor only supports mode=0 (xor), got {mode}")
    if jnp.issubdtype(dt, jnp.floating):
        bits = lax.bitcast_convert_type(self.astype(jnp.float64), jnp.uint64)
    elif dt == jnp.uint8:
        bits = self.astype(jnp.uint64)
    elif dt == jnp.bool_ or jnp.issubdtype(dt, jnp.signedinteger):
        bits = lax.bitcast_convert_type(self.astype(jnp.int64), jnp.uint64)
    else:
        raise NotImplementedError(f'"xor_sum_cpu" not implemented for {dt}')
    if self.ndim == 0:  # dim 0 / -1 of a scalar is the scalar itself
        return bits
    dims = tuple(d % self.ndim for d in dim) if dim else tuple(range(self.ndim))
    out = lax.reduce(bits, np.uint64(0), lax.bitwise_xor, dims)
    if keepdim:
        out = jnp.expand_dims(out, dims)
    return out
