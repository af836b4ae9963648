"""Max, average, adaptive and fractional pooling, forward and backward."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .convolution import _expand
from .dtypes import lowest_value
from .registry import lowers, upcast_half

aten = torch.ops.aten

HIGHEST = lax.Precision.HIGHEST


# ---- pooling ---------------------------------------------------------------------------


def _pool_out_size(size, k, s, p, d, ceil_mode):
    """PyTorch's pooling_output_shape."""
    numerator = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = numerator // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_params(x, nspatial, kernel_size, stride, padding, dilation):
    kernel = _expand(kernel_size, nspatial)
    stride = _expand(stride, nspatial) if stride else list(kernel)
    padding = _expand(padding, nspatial)
    dilation = _expand(dilation, nspatial)
    return kernel, stride, padding, dilation


def _useful_offsets(size, out, k, s, p, d):
    """Kernel offsets along one axis at which some output window reads a real input element.
    The others read only padding, which adds nothing to a sum and never wins a max; skipping
    them keeps a window larger than its input (EfficientNet's AvgPool2d(1280, ceil_mode=True)
    on a 1x1 map) from unrolling k*k slices of a k*k-padded input."""
    pos = (np.arange(out) * s - p)[:, None] + np.arange(k)[None, :] * d
    useful = np.flatnonzero(((pos >= 0) & (pos < size)).any(axis=0))
    return [int(o) for o in useful] or [0]


def _window_slices(xp, spatial_in, outs, kernel, stride, dilation, padding):
    """For each useful kernel offset: (offset tuple, the strided slice of the padded input)."""
    n = len(kernel)
    lead = xp.ndim - n
    useful = [_useful_offsets(*args)
              for args in zip(spatial_in, outs, kernel, stride, padding, dilation, strict=True)]
    for offset in itertools.product(*useful):
        starts = [0] * lead + [o * d for o, d in zip(offset, dilation, strict=True)]
        limits = list(xp.shape[:lead]) + [
            o * d + (out - 1) * s + 1 for o, d, out, s in zip(offset, dilation, outs, stride, strict=True)
        ]
        strides = [1] * lead + list(stride)
        yield offset, lax.slice(xp, starts, limits, strides)


def _pad_for_windows(x, fill, spatial_in, outs, kernel, stride, padding, dilation):
    n = len(kernel)
    pads = [(0, 0)] * (x.ndim - n)
    for size, out, k, s, p, d in zip(spatial_in, outs, kernel, stride, padding, dilation, strict=True):
        last = _useful_offsets(size, out, k, s, p, d)[-1]
        needed = (out - 1) * s + d * last + 1
        pads.append((p, max(needed - size - p, 0)))
    return jnp.pad(x, pads, constant_values=fill)


def _max_pool(self, nspatial, kernel_size, stride, padding, dilation, ceil_mode):
    kernel, stride, padding, dilation = _pool_params(self, nspatial, kernel_size, stride,
                                                     padding, dilation)
    spatial_in = self.shape[-nspatial:]
    outs = [_pool_out_size(size, k, s, p, d, ceil_mode)
            for size, k, s, p, d in zip(spatial_in, kernel, stride, padding, dilation, strict=True)]
    lowest = lowest_value(self.dtype)
    xp = _pad_for_windows(self, lowest, spatial_in, outs, kernel, stride, padding, dilation)
    # Coordinates of each output window's origin in the unpadded input.
    origin = [np.arange(out) * s - p for out, s, p in zip(outs, stride, padding, strict=True)]
    best = jnp.full(self.shape[:-nspatial] + tuple(outs), lowest, self.dtype)
    best_idx = jnp.full(best.shape, -1, jnp.int64)
    is_float = jnp.issubdtype(self.dtype, jnp.floating)
    for offset, window in _window_slices(xp, spatial_in, outs, kernel, stride, dilation, padding):
        # Flat index within the plane and validity of this kernel position, per output.
        flat = np.zeros(outs, np.int64)
        valid = np.ones(outs, bool)
        for axis, (orig, o, d, size) in enumerate(zip(origin, offset, dilation, spatial_in, strict=True)):
            pos = orig + o * d
            shape = [1] * nspatial
            shape[axis] = -1
            pos = pos.reshape(shape)
            flat = flat * size + pos
            valid = valid & (pos >= 0) & (pos < size)
        flat_j = jnp.asarray(flat)
        take = valid & ((window > best) | (best_idx < 0))
        if is_float:
            take = take | (valid & jnp.isnan(window))
        best = jnp.where(take, window, best)
        best_idx = jnp.where(take, flat_j, best_idx)
    return best, best_idx


def _max_pool_backward(grad_output, self, indices, nspatial):
    lead = self.shape[:-nspatial]
    plane = int(np.prod(self.shape[-nspatial:]))
    planes = int(np.prod(lead)) if lead else 1
    g = grad_output.reshape(planes, -1)
    idx = indices.reshape(planes, -1)
    bad = jnp.any((idx < 0) | (idx >= plane))
    rows = jnp.arange(planes)[:, None]
    out = jnp.zeros((planes, plane), grad_output.dtype).at[rows, idx].add(g, mode="drop")
    return out.reshape(self.shape), bad


@lowers(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1,
                            ceil_mode=False):
    return _max_pool(self, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lowers(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(self, kernel_size, stride=(), padding=0, dilation=1,
                            ceil_mode=False):
    return _max_pool(self, 3, kernel_size, stride, padding, dilation, ceil_mode)


@lowers(aten.max_pool2d_with_indices_backward.default,
        index_error="max_pool2d_with_indices_backward: index out of range")
def max_pool2d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation,
                                     ceil_mode, indices):
    return _max_pool_backward(grad_output, self, indices, 2)


@lowers(aten.max_pool3d_with_indices_backward.default,
        index_error="max_pool3d_with_indices_backward: index out of range")
def max_pool3d_with_indices_backward(grad_output, self, kernel_size, stride, padding, dilation,
                                     ceil_mode, indices):
    return _max_pool_backward(grad_output, self, indices, 3)


def _avg_pool(self, nspatial, kernel_size, stride, padding, ceil_mode, count_include_pad,
              divisor_override):
    kernel, stride, padding, _ = _pool_params(self, nspatial, kernel_size, stride, padding, 1)
    dilation = [1] * nspatial
    x = upcast_half(self)
    spatial_in = x.shape[-nspatial:]
    outs = [_pool_out_size(size, k, s, p, 1, ceil_mode)
            for size, k, s, p in zip(spatial_in, kernel, stride, padding, strict=True)]
    xp = _pad_for_windows(x, 0, spatial_in, outs, kernel, stride, padding, dilation)
    total = None
    for _, window in _window_slices(xp, spatial_in, outs, kernel, stride, dilation, padding):
        total = window if total is None else total + window
    # The divisor of each output window, from PyTorch's rules (static shapes: NumPy).
    divisor = np.ones(outs, np.float64)
    empty = np.zeros(outs, bool)
    for axis, (out, k, s, p, size) in enumerate(zip(outs, kernel, stride, padding, spatial_in, strict=True)):
        start = np.arange(out) * s - p
        end = np.minimum(start + k, size + p)
        padded_len = end - start
        start_c = np.maximum(start, 0)
        end_c = np.minimum(end, size)
        length = end_c - start_c
        shape = [1] * nspatial
        shape[axis] = -1
        if divisor_override:
            factor = np.ones(out)
        elif count_include_pad:
            factor = padded_len
        else:
            factor = length
        divisor = divisor * factor.reshape(shape)
        empty = empty | (length <= 0).reshape(shape)
    if divisor_override:
        divisor = np.full(outs, float(divisor_override))
    divisor = np.where(empty | (divisor == 0), 1.0, divisor)
    out = total / jnp.asarray(divisor, x.dtype)
    return jnp.where(jnp.asarray(empty), jnp.zeros((), x.dtype), out)


@lowers(aten.avg_pool2d.default)
def avg_pool2d(self, kernel_size, stride=(), padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    return _avg_pool(self, 2, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


@lowers(aten.avg_pool3d.default)
def avg_pool3d(self, kernel_size, stride=(), padding=0, ceil_mode=False,
               count_include_pad=True, divisor_override=None):
    return _avg_pool(self, 3, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override)


def _avg_pool_backward(grad_output, self, n, kernel_size, stride, padding, ceil_mode,
                       count_include_pad, divisor_override):
    _, vjp = jax.vjp(lambda x: _avg_pool(x, n, kernel_size, stride, padding, ceil_mode,
                                         count_include_pad, divisor_override), upcast_half(self))
    return vjp(upcast_half(grad_output))[0]


@lowers(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override):
    return _avg_pool_backward(grad_output, self, 2, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override)


@lowers(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override):
    return _avg_pool_backward(grad_output, self, 3, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override)


def _adaptive_matrix(size, out):
    """0/1 matrix (out, size) selecting each adaptive window, and the window lengths."""
    m = np.zeros((out, size), np.float64)
    for i in range(out):
        start = (i * size) // out
        end = -((-(i + 1) * size) // out)
        m[i, start:end] = 1.0
    return m, m.sum(axis=1)


def _adaptive_avg_pool(self, output_size):
    n = len(output_size)
    x = upcast_half(self)
    spatial = x.shape[-n:]
    out = x
    counts = np.ones((), np.float64)
    for axis, (size, o) in enumerate(zip(spatial, output_size, strict=True)):
        m, lengths = _adaptive_matrix(size, o)
        ax = x.ndim - n + axis
        out = jnp.moveaxis(
            jnp.tensordot(jnp.moveaxis(out, ax, -1), jnp.asarray(m, x.dtype).T, axes=1,
                          precision=HIGHEST), -1, ax)
        shape = [1] * n
        shape[axis] = -1
        counts = counts * lengths.reshape(shape)
    return out / jnp.asarray(counts, x.dtype)


@lowers(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(self, output_size):
    return _adaptive_avg_pool(self, list(output_size))


def _adaptive_avg_pool3d_half(x, output_size):
    """CPU's 3-d kernel for half/bfloat16: each window summed in the half type, element by
    element in (d, h, w) order, then divided by kd, kh and kw in turn, rounding every step.
    Summing in float32 would round once and differ by an ulp."""
    axes = []
    for size, o in zip(x.shape[-3:], output_size, strict=True):
        starts = np.array([(i * size) // o for i in range(o)])
        ends = np.array([-((-(i + 1) * size) // o) for i in range(o)])
        axes.append((starts, ends - starts))
    (sd, kd), (sh, kh), (sw, kw) = axes
    total = jnp.zeros(x.shape[:-3] + tuple(output_size), x.dtype)
    zero = jnp.zeros((), x.dtype)
    info = jnp.finfo(x.dtype)

    def rounded(v):
        # XLA's CPU compiler computes chains of half ops in float32 and drops the
        # intermediate conversions; reduce_precision keeps each step's rounding.
        return lax.reduce_precision(v, exponent_bits=info.nexp, mantissa_bits=info.nmant)

    for a in range(int(kd.max())):
        for b in range(int(kh.max())):
            for c in range(int(kw.max())):
                inside = ((a < kd)[:, None, None] & (b < kh)[None, :, None]
                          & (c < kw)[None, None, :])
                d = np.minimum(sd + a, x.shape[-3] - 1)
                h = np.minimum(sh + b, x.shape[-2] - 1)
                w = np.minimum(sw + c, x.shape[-1] - 1)
                window = x[..., d[:, None, None], h[None, :, None], w[None, None, :]]
                # adding an exact zero outside the window leaves the running sum unchanged
                total = rounded(total + jnp.where(inside, window, zero))
    for k, shape in ((kd, (-1, 1, 1)), (kh, (1, -1, 1)), (kw, (1, 1, -1))):
        # XLA turns a division by a half constant into a multiplication by its (rounded)
        # reciprocal; in float32 the quotient still rounds to the correctly rounded half.
        k = jnp.asarray(k.reshape(shape), jnp.float32)
        total = rounded(total.astype(jnp.float32) / k).astype(x.dtype)
    return total


@lowers(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(self, output_size):
    if self.dtype in (jnp.float16, jnp.bfloat16):
        return _adaptive_avg_pool3d_half(self, list(output_size))
    return _adaptive_avg_pool(self, list(output_size))


@lowers(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad_output, self):
    size = grad_output.shape[-2:]
    _, vjp = jax.vjp(lambda x: _adaptive_avg_pool(x, list(size)), upcast_half(self))
    return vjp(upcast_half(grad_output))[0]


@lowers(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad_output, self):
    size = grad_output.shape[-3:]
    _, vjp = jax.vjp(lambda x: _adaptive_avg_pool(x, list(size)), upcast_half(self))
    return vjp(upcast_half(grad_output))[0]

# ---- adaptive max pooling ---------------------------------------------------------------


@lowers(aten.adaptive_max_pool2d_backward.default,
        index_error="adaptive_max_pool2d_backward: index out of range")
def adaptive_max_pool2d_backward(grad_output, self, indices):
    return _max_pool_backward(grad_output, self, indices, 2)


@lowers(aten.adaptive_max_pool3d_backward.default,
        index_error="adaptive_max_pool3d_backward: index out of range")
def adaptive_max_pool3d_backward(grad_output, self, indices):
    return _max_pool_backward(grad_output, self, indices, 3)


def _adaptive_bounds(size, out):
    starts = (np.arange(out) * size) // out
    ends = -((-(np.arange(out) + 1) * size) // out)
    return starts, ends


def _adaptive_max_pool(self, output_size):
    n = len(output_size)
    spatial = self.shape[-n:]
    bounds = [_adaptive_bounds(s, o) for s, o in zip(spatial, output_size, strict=True)]
    widths = [int((e - s).max()) for s, e in bounds]
    lowest = lowest_value(self.dtype)
    best = jnp.full(self.shape[:-n] + tuple(output_size), lowest, self.dtype)
    best_idx = jnp.full(best.shape, -1, jnp.int64)
    is_float = jnp.issubdtype(self.dtype, jnp.floating)
    for offset in np.ndindex(*widths):
        index, flat = [], np.zeros(tuple(output_size), np.int64)
        valid = np.ones(tuple(output_size), bool)
        for axis, ((starts, ends), o, size) in enumerate(
                zip(bounds, offset, spatial, strict=True)):
            pos = starts + o
            shape = [1] * n
            shape[axis] = -1
            index.append(np.minimum(pos, size - 1).reshape(shape))
            flat = flat * size + pos.reshape(shape)
            valid = valid & (pos < ends).reshape(shape)
        window = self[(Ellipsis, *index)]
        take = valid & ((window > best) | (best_idx < 0))
        if is_float:
            take = take | (valid & jnp.isnan(window))
        best = jnp.where(take, window, best)
        best_idx = jnp.where(take, jnp.asarray(flat), best_idx)
    return best, best_idx


@lowers(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(self, output_size):
    return _adaptive_max_pool(self, list(output_size))


@lowers(aten.adaptive_max_pool3d.default)
def adaptive_max_pool3d(self, output_size):
    return _adaptive_max_pool(self, list(output_size))

# ---- fractional max pooling -----------------------------------------------------------------


def _fractional_starts(sample, in_size: int, out_size: int, pool: int):
    """CPU's generate_intervals: window starts from one uniform sample per plane, computed in
    the input's precision and truncated to int like CPU. sample: (planes,) -> (planes, out)."""
    if out_size <= 1:
        return jnp.full(sample.shape + (out_size,), in_size - pool, jnp.int64)
    alpha = (jnp.asarray(in_size - pool, sample.dtype) / jnp.asarray(out_size - 1, sample.dtype))
    i = jnp.arange(out_size - 1, dtype=sample.dtype)
    starts = (((i + sample[:, None]) * alpha).astype(jnp.int32)
              - (sample[:, None] * alpha).astype(jnp.int32)).astype(jnp.int64)
    last = jnp.full(sample.shape + (1,), in_size - pool, jnp.int64)
    return jnp.concatenate([starts, last], axis=1)


def _fractional_max_pool(x, kernel_size, output_size, random_samples):
    """Max over the windows CPU picks; index = last NaN of a window, else its first maximum
    (CPU's `val > max || isnan(val)` scan), flattened over the plane."""
    nd = len(kernel_size)
    batched = x.ndim == nd + 2
    xb = x if batched else x[None]
    n, c = xb.shape[:2]
    sizes = xb.shape[2:]
    planes = n * c
    # which sample drives which axis, as in CPU: (W, H) in 2-D, (T, H, W) in 3-D
    order = [1, 0] if nd == 2 else [0, 1, 2]
    samples = random_samples.reshape(planes, nd).astype(x.dtype)
    flat = jnp.zeros((planes,) + tuple(output_size) + tuple(kernel_size), jnp.int64)
    for k in range(nd):
        starts = _fractional_starts(samples[:, order[k]], sizes[k], output_size[k], kernel_size[k])
        pos = starts[:, :, None] + jnp.arange(kernel_size[k])  # (planes, out_k, kernel_k)
        shape = [planes] + [1] * (2 * nd)
        shape[1 + k], shape[1 + nd + k] = output_size[k], kernel_size[k]
        flat = flat * sizes[k] + pos.reshape(shape)
    window = int(np.prod(kernel_size))
    flat = flat.reshape(planes, -1, window)
    vals = jnp.take_along_axis(xb.reshape(planes, -1), flat.reshape(planes, -1), axis=1)
    vals = vals.reshape(flat.shape)
    nan = jnp.isnan(vals) if jnp.issubdtype(vals.dtype, jnp.floating) else jnp.zeros(vals.shape, bool)
    last_nan = window - 1 - jnp.argmax(nan[..., ::-1], axis=-1)
    first_max = jnp.argmax(jnp.where(nan, jnp.zeros((), vals.dtype), vals), axis=-1)
    pick = jnp.where(jnp.any(nan, axis=-1), last_nan, first_max)[..., None]
    out = jnp.take_along_axis(vals, pick, axis=-1)[..., 0]
    idx = jnp.take_along_axis(flat, pick, axis=-1)[..., 0]
    shape = xb.shape[:2] + tuple(output_size)
    out, idx = out.reshape(shape), idx.reshape(shape)
    return (out, idx) if batched else (out[0], idx[0])


def _fractional_dtype_ok(a: dict) -> bool:
    # CPU computes the window starts in the input's dtype; half/bfloat16 arithmetic is not
    # reproduced here, so those run on CPU
    return a["self"].dtype in (torch.float32, torch.float64)


@lowers(aten.fractional_max_pool2d.default, only_when=_fractional_dtype_ok)
def fractional_max_pool2d(self, kernel_size, output_size, random_samples):
    return _fractional_max_pool(self, list(kernel_size), list(output_size), random_samples)


@lowers(aten.fractional_max_pool3d.default, only_when=_fractional_dtype_ok)
def fractional_max_pool3d(self, kernel_size, output_size, random_samples):
    # PyTorch has no meta kernel for the 3-D op: its shape checks are made here
    if self.ndim not in (4, 5) or any(d == 0 for d in self.shape[-4:]):
        raise RuntimeError("fractional_max_pool3d: expected non-empty 4D or 5D input")
    for size, k, o in zip(self.shape[-3:], kernel_size, output_size, strict=True):
        if o + k - 1 >= size:
            raise RuntimeError("fractional_max_pool3d_out(): pool too large relative to input")
    return _fractional_max_pool(self, list(kernel_size), list(output_size), random_samples)


@lowers(aten.fractional_max_pool2d_backward.default,
        index_error="fractional_max_pool2d_backward: index out of range")
def fractional_max_pool2d_backward(grad_output, self, kernel_size, output_size, indices):
    return _max_pool_backward(grad_output, self, indices, 2)


@lowers(aten.fractional_max_pool3d_backward.default,
        index_error="fractional_max_pool3d_backward: index out of range")
def fractional_max_pool3d_backward(grad_output, self, kernel_size, output_size, indices):
    return _max_pool_backward(grad_output, self, indices, 3)
