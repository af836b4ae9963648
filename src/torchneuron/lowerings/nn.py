"""Neural-network ops: convolution, normalization, softmax, pooling, embedding, losses and
the fused recurrent cells, forward and backward.

Conventions (see docs/LOWERINGS.md): tensors arrive as `jax.Array`s of their logical shape,
the runtime casts results to the dtype PyTorch's meta kernel reports. Backward ops with an
`output_mask` return `None` for the gradients that were not asked for, as PyTorch does.
Half-precision inputs are computed in float32 ("opmath") like PyTorch's CPU kernels.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .dtypes import to_jax_dtype
from .reduction import _vector_norm
from .registry import lowered_only_when, lowers

aten = torch.ops.aten

HIGHEST = lax.Precision.HIGHEST


def _opmath(x):
    """Half and bfloat16 are computed in float32, as PyTorch's CPU kernels do."""
    if x is not None and x.dtype in (jnp.float16, jnp.bfloat16):
        return x.astype(jnp.float32)
    return x


def _lowest(dtype):
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(-jnp.inf, dtype)
    if dtype == jnp.bool_:
        return jnp.array(False)
    return jnp.array(jnp.iinfo(dtype).min, dtype)


def _channel_shape(ndim: int, axis: int = 1) -> tuple[int, ...]:
    """Broadcast shape of a per-channel vector against an `ndim`-d input."""
    return tuple(-1 if i == axis else 1 for i in range(ndim))


# ---- convolution -----------------------------------------------------------------------


def _dimension_numbers(nspatial: int):
    spatial = "DHW"[3 - nspatial:] if nspatial <= 3 else None
    if spatial is None:
        raise RuntimeError(f"torchneuron: {nspatial}-d convolution is not supported")
    return ("NC" + spatial, "OI" + spatial, "NC" + spatial)


def _expand(values, n):
    values = [values] if isinstance(values, int) else list(values)
    return values * n if len(values) == 1 else values


def _check_conv_shapes(x, w, transposed, groups):
    if x.ndim != w.ndim:
        raise RuntimeError(
            f"Expected {w.ndim}-dimensional input for {w.ndim}-dimensional weight "
            f"{list(w.shape)}, but got {x.ndim}-dimensional input of size {list(x.shape)} instead"
        )
    if groups <= 0:
        raise RuntimeError("non-positive groups is not supported")
    if not transposed:
        if w.shape[0] % groups != 0:
            raise RuntimeError(
                f"Given groups={groups}, expected weight to be divisible by {groups} at "
                f"dimension 0, but got weight of size {list(w.shape)} instead"
            )
        if x.shape[1] != w.shape[1] * groups:
            raise RuntimeError(
                f"Given groups={groups}, weight of size {list(w.shape)}, expected "
                f"input{list(x.shape)} to have {w.shape[1] * groups} channels, but got "
                f"{x.shape[1]} channels instead"
            )
    elif x.shape[1] != w.shape[0]:
        raise RuntimeError(
            f"Given transposed=1, weight of size {list(w.shape)}, expected input{list(x.shape)} "
            f"to have {w.shape[0]} channels, but got {x.shape[1]} channels instead"
        )


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    n = x.ndim - 2
    stride = _expand(stride, n)
    padding = _expand(padding, n)
    dilation = _expand(dilation, n)
    output_padding = _expand(output_padding, n) if output_padding else [0] * n
    dn = _dimension_numbers(n)
    if not transposed:
        return lax.conv_general_dilated(
            x, w, window_strides=stride, padding=[(p, p) for p in padding],
            rhs_dilation=dilation, dimension_numbers=dn, feature_group_count=groups,
            precision=HIGHEST,
        )
    # A transposed convolution is the input-gradient of a convolution: dilate the input by
    # the stride, pad by the kernel's reach minus the padding, convolve with the flipped,
    # in/out-swapped kernel.
    c_in, c_out_g = w.shape[0], w.shape[1]
    kernel = w.shape[2:]
    w = w.reshape((groups, c_in // groups, c_out_g) + kernel)
    w = jnp.swapaxes(w, 1, 2).reshape((groups * c_out_g, c_in // groups) + kernel)
    w = jnp.flip(w, axis=tuple(range(2, 2 + n)))
    pads = []
    for k, p, d, op in zip(kernel, padding, dilation, output_padding, strict=True):
        reach = d * (k - 1)
        pads.append((reach - p, reach - p + op))
    return lax.conv_general_dilated(
        x, w, window_strides=[1] * n, padding=pads, lhs_dilation=stride,
        rhs_dilation=dilation, dimension_numbers=dn, feature_group_count=groups,
        precision=HIGHEST,
    )


@lowers(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                groups):
    _check_conv_shapes(input, weight, transposed, groups)
    x, w = _opmath(input), _opmath(weight)
    out = _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + _opmath(bias).reshape(_channel_shape(out.ndim))
    return out


@lowers(aten.convolution_backward.default)
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask):
    g, x, w = _opmath(grad_output), _opmath(input), _opmath(weight)

    def forward(x_, w_):
        return _conv(x_, w_, stride, padding, dilation, transposed, output_padding, groups)

    grad_input = grad_weight = grad_bias = None
    if output_mask[0] or output_mask[1]:
        _, vjp = jax.vjp(forward, x, w)
        gx, gw = vjp(g)
        grad_input = gx if output_mask[0] else None
        grad_weight = gw if output_mask[1] else None
    if output_mask[2]:
        grad_bias = jnp.sum(g, axis=(0,) + tuple(range(2, g.ndim)))
    return grad_input, grad_weight, grad_bias


# ---- batch norm ------------------------------------------------------------------------


def _bn_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _bn_train(input, weight, bias, running_mean, running_var, momentum, eps):
    x = _opmath(input)
    axes = _bn_axes(x)
    shape = _channel_shape(x.ndim)
    mean = jnp.mean(x, axis=axes)
    var = jnp.mean(jnp.square(x - mean.reshape(shape)), axis=axes)
    invstd = lax.rsqrt(var + eps)
    if input.dtype in (jnp.float16, jnp.bfloat16) and (weight is None or weight.dtype == input.dtype):
        # CPU stores mean/invstd in the half type (its saved outputs) and normalizes with
        # those rounded values; reduce_precision keeps that rounding (XLA drops cast pairs).
        info = jnp.finfo(input.dtype)
        mean = lax.reduce_precision(mean, info.nexp, info.nmant)
        invstd = lax.reduce_precision(invstd, info.nexp, info.nmant)
    out = (x - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        out = out * _opmath(weight).reshape(shape)
    if bias is not None:
        out = out + _opmath(bias).reshape(shape)
    count = x.size // x.shape[1]
    new_mean = new_var = None
    if running_mean is not None:
        new_mean = (1 - momentum) * running_mean + momentum * mean
    if running_var is not None:
        unbiased = var * (count / (count - 1)) if count > 1 else var * jnp.inf
        new_var = (1 - momentum) * running_var + momentum * unbiased
    return out, mean, invstd, new_mean, new_var


def _bn_eval(input, weight, bias, running_mean, running_var, eps):
    x = _opmath(input)
    shape = _channel_shape(x.ndim)
    mean = _opmath(running_mean)
    invstd = lax.rsqrt(_opmath(running_var) + eps)
    out = (x - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        out = out * _opmath(weight).reshape(shape)
    if bias is not None:
        out = out + _opmath(bias).reshape(shape)
    return out, mean, invstd


def _bn_stats_meta(op):
    """PyTorch's meta kernel reports float32 saved mean/invstd for half inputs (CUDA's
    choice); CPU keeps them in the input dtype unless the parameters are float32."""

    def meta(input, weight, bias, *rest):
        outs = list(op(input, weight, bias, *rest))
        params = [t for t in (weight, bias) if t is not None]
        dtype = params[0].dtype if params and params[0].dtype != input.dtype else input.dtype
        outs[1], outs[2] = outs[1].to(dtype), outs[2].to(dtype)
        return tuple(outs)

    return meta


@lowers(aten._native_batch_norm_legit.default,
        meta=_bn_stats_meta(aten._native_batch_norm_legit.default))
def native_batch_norm_legit(input, weight, bias, running_mean, running_var, training,
                            momentum, eps):
    if training:
        out, mean, invstd, new_mean, new_var = _bn_train(
            input, weight, bias, running_mean, running_var, momentum, eps)
        return out, mean, invstd, new_mean, new_var
    out, mean, invstd = _bn_eval(input, weight, bias, running_mean, running_var, eps)
    return out, mean, invstd, running_mean, running_var


@lowers(aten._batch_norm_with_update.default,
        meta=_bn_stats_meta(aten._batch_norm_with_update.default))
def batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    out, mean, invstd, new_mean, new_var = _bn_train(
        input, weight, bias, running_mean, running_var, momentum, eps)
    reserve = jnp.zeros((0,), jnp.uint8)
    return out, mean, invstd, reserve, new_mean, new_var


@lowers(aten._native_batch_norm_legit.no_stats,
        meta=_bn_stats_meta(aten._native_batch_norm_legit.no_stats))
def native_batch_norm_legit_no_stats(input, weight, bias, training, momentum, eps):
    out, mean, invstd, _, _ = _bn_train(input, weight, bias, None, None, momentum, eps)
    return out, mean, invstd


@lowers(aten._native_batch_norm_legit_no_training.default)
def native_batch_norm_legit_no_training(input, weight, bias, running_mean, running_var,
                                        momentum, eps):
    return _bn_eval(input, weight, bias, running_mean, running_var, eps)


# native_batch_norm.out runs its decomposition, which neither rounds half/bfloat16 as CPU's
# kernel does nor leaves save_mean/save_invstd empty in evaluation mode as CPU does: those
# calls run CPU's kernel.
lowered_only_when(lambda a: a["training"] and a["input"].dtype in (torch.float32, torch.float64),
                  aten.native_batch_norm.out)


def _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
                 train, eps, output_mask):
    g, x = _opmath(grad_out), _opmath(input)
    axes = _bn_axes(x)
    shape = _channel_shape(x.ndim)
    if train:
        mean, invstd = _opmath(save_mean), _opmath(save_invstd)
    else:
        mean, invstd = _opmath(running_mean), lax.rsqrt(_opmath(running_var) + eps)
    xhat = (x - mean.reshape(shape)) * invstd.reshape(shape)
    w = jnp.ones((), x.dtype) if weight is None else _opmath(weight).reshape(shape)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        if train:
            g_mean = jnp.mean(g, axis=axes, keepdims=True)
            gx_mean = jnp.mean(g * xhat, axis=axes, keepdims=True)
            grad_input = (g - g_mean - xhat * gx_mean) * invstd.reshape(shape) * w
        else:
            grad_input = g * invstd.reshape(shape) * w
    if output_mask[1]:
        grad_weight = jnp.sum(g * xhat, axis=axes)
    if output_mask[2]:
        grad_bias = jnp.sum(g, axis=axes)
    return grad_input, grad_weight, grad_bias


@lowers(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                               save_invstd, train, eps, output_mask):
    return _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                        save_invstd, train, eps, output_mask)


@lowers(aten.batch_norm_backward.default)
def batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                        save_var, update, eps, output_mask, reserve):
    # `save_var` holds the saved inverse standard deviation, as in native_batch_norm.
    return _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean,
                        save_var, update, eps, output_mask)


# ---- layer norm / group norm -----------------------------------------------------------


def _layer_norm_meta(input, normalized_shape, weight, bias, eps):
    # PyTorch's meta kernel reports float32 mean/rstd for half inputs (CUDA's choice); CPU
    # keeps them in the input dtype unless weight/bias are float32 ("mixed type").
    out, mean, rstd = aten.native_layer_norm.default(input, normalized_shape, weight, bias, eps)
    params = [t for t in (weight, bias) if t is not None]
    dtype = params[0].dtype if params and params[0].dtype != input.dtype else input.dtype
    return out, mean.to(dtype), rstd.to(dtype)


@lowers(aten.native_layer_norm.default, meta=_layer_norm_meta)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    x = _opmath(input)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * _opmath(weight)
    if bias is not None:
        out = out + _opmath(bias)
    return out, mean, rstd


@lowers(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
                               output_mask):
    g, x = _opmath(grad_out), _opmath(input)
    nd = len(normalized_shape)
    axes = tuple(range(x.ndim - nd, x.ndim))
    outer = tuple(range(x.ndim - nd))
    mean, rstd = _opmath(mean), _opmath(rstd)
    xhat = (x - mean) * rstd
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        gx = g if weight is None else g * _opmath(weight)
        a = jnp.mean(gx, axis=axes, keepdims=True)
        b = jnp.mean(gx * xhat, axis=axes, keepdims=True)
        grad_input = (gx - a - xhat * b) * rstd
    if output_mask[1] and weight is not None:
        grad_weight = jnp.sum(g * xhat, axis=outer)
    if output_mask[2] and bias is not None:
        grad_bias = jnp.sum(g, axis=outer)
    return grad_input, grad_weight, grad_bias


@lowers(aten.native_group_norm.default)
def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    x = _opmath(input)
    xg = x.reshape(N, group, -1)
    mean = jnp.mean(xg, axis=2)
    var = jnp.mean(jnp.square(xg - mean[..., None]), axis=2)
    rstd = lax.rsqrt(var + eps)
    out = ((xg - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    shape = _channel_shape(x.ndim)
    if weight is not None:
        out = out * _opmath(weight).reshape(shape)
    if bias is not None:
        out = out + _opmath(bias).reshape(shape)
    return out, mean, rstd


@lowers(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
                               output_mask):
    g, x = _opmath(grad_out), _opmath(input)
    mean, rstd = _opmath(mean), _opmath(rstd)
    g3 = g.reshape(N, C, -1)
    x3 = x.reshape(N, C, -1)
    cpg = C // group
    mean_c = jnp.repeat(mean, cpg, axis=1)[..., None]
    rstd_c = jnp.repeat(rstd, cpg, axis=1)[..., None]
    xhat = (x3 - mean_c) * rstd_c
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        gx = g3 if weight is None else g3 * _opmath(weight)[None, :, None]
        gxg = gx.reshape(N, group, -1)
        xhg = xhat.reshape(N, group, -1)
        a = jnp.mean(gxg, axis=2, keepdims=True)
        b = jnp.mean(gxg * xhg, axis=2, keepdims=True)
        gi = (gxg - a - xhg * b) * rstd[..., None]
        grad_input = gi.reshape(x.shape)
    if output_mask[1]:
        grad_weight = jnp.sum(g3 * xhat, axis=(0, 2))
    if output_mask[2]:
        grad_bias = jnp.sum(g3, axis=(0, 2))
    return grad_input, grad_weight, grad_bias


# ---- softmax ---------------------------------------------------------------------------


def _softmax_impl(x, dim, log):
    x = _opmath(x)
    if x.ndim == 0:
        return jnp.zeros_like(x) if log else jnp.ones_like(x)
    return jax.nn.log_softmax(x, axis=dim) if log else jax.nn.softmax(x, axis=dim)


@lowers(aten._softmax.default)
def softmax(self, dim, half_to_float):
    return _softmax_impl(self, dim, log=False)


@lowers(aten._log_softmax.default)
def log_softmax(self, dim, half_to_float):
    return _softmax_impl(self, dim, log=True)


@lowers(aten._safe_softmax.default)
def safe_softmax(self, dim, dtype=None):
    # Like softmax, but a slice that is entirely -inf gives zeros instead of NaN.
    x = _opmath(self if dtype is None else self.astype(to_jax_dtype(dtype)))
    if x.ndim == 0:
        return jnp.where(jnp.isneginf(x), 0.0, 1.0).astype(x.dtype)
    out = jax.nn.softmax(x, axis=dim)
    masked = jnp.all(jnp.isneginf(x), axis=dim, keepdims=True)
    return jnp.where(masked, jnp.zeros((), out.dtype), out)


@lowers(aten._softmax_backward_data.default)
def softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _opmath(grad_output), _opmath(output)
    if y.ndim == 0:
        return jnp.zeros_like(g)
    return y * (g - jnp.sum(g * y, axis=dim, keepdims=True))


@lowers(aten._log_softmax_backward_data.default)
def log_softmax_backward_data(grad_output, output, dim, input_dtype):
    g, y = _opmath(grad_output), _opmath(output)
    if y.ndim == 0:
        return jnp.zeros_like(g)
    return g - jnp.exp(y) * jnp.sum(g, axis=dim, keepdims=True)


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


def _window_slices(xp, spatial_in, outs, kernel, stride, dilation):
    """For each kernel offset: (offset tuple, the strided slice of the padded input)."""
    n = len(kernel)
    lead = xp.ndim - n
    for offset in np.ndindex(*kernel):
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
        needed = (out - 1) * s + d * (k - 1) + 1
        pads.append((p, max(needed - size - p, 0)))
    return jnp.pad(x, pads, constant_values=fill)


def _max_pool(self, nspatial, kernel_size, stride, padding, dilation, ceil_mode):
    kernel, stride, padding, dilation = _pool_params(self, nspatial, kernel_size, stride,
                                                     padding, dilation)
    spatial_in = self.shape[-nspatial:]
    outs = [_pool_out_size(size, k, s, p, d, ceil_mode)
            for size, k, s, p, d in zip(spatial_in, kernel, stride, padding, dilation, strict=True)]
    lowest = _lowest(self.dtype)
    xp = _pad_for_windows(self, lowest, spatial_in, outs, kernel, stride, padding, dilation)
    # Coordinates of each output window's origin in the unpadded input.
    origin = [np.arange(out) * s - p for out, s, p in zip(outs, stride, padding, strict=True)]
    best = jnp.full(self.shape[:-nspatial] + tuple(outs), lowest, self.dtype)
    best_idx = jnp.full(best.shape, -1, jnp.int64)
    is_float = jnp.issubdtype(self.dtype, jnp.floating)
    for offset, window in _window_slices(xp, spatial_in, outs, kernel, stride, dilation):
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
    x = _opmath(self)
    spatial_in = x.shape[-nspatial:]
    outs = [_pool_out_size(size, k, s, p, 1, ceil_mode)
            for size, k, s, p in zip(spatial_in, kernel, stride, padding, strict=True)]
    xp = _pad_for_windows(x, 0, spatial_in, outs, kernel, stride, padding, dilation)
    total = None
    for _, window in _window_slices(xp, spatial_in, outs, kernel, stride, dilation):
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


@lowers(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override):
    _, vjp = jax.vjp(lambda x: _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode,
                                         count_include_pad, divisor_override), _opmath(self))
    return vjp(_opmath(grad_output))[0]


@lowers(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(grad_output, self, kernel_size, stride, padding, ceil_mode,
                        count_include_pad, divisor_override):
    _, vjp = jax.vjp(lambda x: _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode,
                                         count_include_pad, divisor_override), _opmath(self))
    return vjp(_opmath(grad_output))[0]


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
    x = _opmath(self)
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
    _, vjp = jax.vjp(lambda x: _adaptive_avg_pool(x, list(size)), _opmath(self))
    return vjp(_opmath(grad_output))[0]


@lowers(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad_output, self):
    size = grad_output.shape[-3:]
    _, vjp = jax.vjp(lambda x: _adaptive_avg_pool(x, list(size)), _opmath(self))
    return vjp(_opmath(grad_output))[0]


# ---- embedding -------------------------------------------------------------------------

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
    g = _opmath(grad_output).reshape(idx.shape[0], -1)
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
    norms = _vector_norm(_opmath(weight), norm_type, -1, False, None).astype(weight.dtype).astype(jnp.float64)
    scale = (max_norm / (norms + 1e-7)).astype(weight.dtype)
    renorm = chosen & (norms > max_norm)
    return jnp.where(renorm[:, None], weight * scale[:, None], weight), bad


def _wrap_index(idx, size):
    return jnp.where(idx < 0, idx + size, idx)


# ---- losses ----------------------------------------------------------------------------

# reduction enum: 0 none, 1 mean, 2 sum
NONE, MEAN, SUM = 0, 1, 2
TARGET_ERROR = "Target is out of bounds."


def _nll_parts(self, target, weight, ignore_index):
    """Per-element picked log-probabilities, weights, and the out-of-range flag."""
    class_axis = 0 if self.ndim == 1 else 1
    n_classes = self.shape[class_axis]
    ignored = target == ignore_index
    bad = jnp.any(~ignored & ((target < 0) | (target >= n_classes)))
    safe = jnp.where(ignored, 0, target).astype(jnp.int64)
    x = _opmath(self)
    picked = jnp.take_along_axis(x, jnp.expand_dims(safe, class_axis), axis=class_axis)
    picked = jnp.squeeze(picked, class_axis)
    if weight is None:
        w = jnp.ones(target.shape, x.dtype)
    else:
        w = jnp.take(_opmath(weight), safe, mode="clip").astype(x.dtype)
    w = jnp.where(ignored, jnp.zeros((), x.dtype), w)
    return picked, w, safe, class_axis, bad


def _nll_forward(self, target, weight, reduction, ignore_index):
    picked, w, _, _, bad = _nll_parts(self, target, weight, ignore_index)
    losses = -picked * w
    total_weight = jnp.sum(w)
    if reduction == NONE:
        return (losses, jnp.zeros((), w.dtype)), bad
    if reduction == SUM:
        return (jnp.sum(losses), total_weight), bad
    return (jnp.sum(losses) / total_weight, total_weight), bad


def _nll_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    _, w, safe, class_axis, bad = _nll_parts(self, target, weight, ignore_index)
    g = _opmath(grad_output)
    if reduction == MEAN:
        g = g / _opmath(total_weight)
    contrib = -w * g  # broadcasts a scalar grad; elementwise for reduction='none'
    onehot = jax.nn.one_hot(safe, self.shape[class_axis], dtype=contrib.dtype,
                            axis=class_axis)
    return onehot * jnp.expand_dims(contrib, class_axis), bad


@lowers(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default,
        index_error=TARGET_ERROR)
def nll_loss_forward(self, target, weight, reduction, ignore_index):
    return _nll_forward(self, target, weight, reduction, ignore_index)


@lowers(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default,
        index_error=TARGET_ERROR)
def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index,
                      total_weight):
    return _nll_backward(grad_output, self, target, weight, reduction, ignore_index,
                         total_weight)


def _reduce(loss, reduction):
    if reduction == MEAN:
        return jnp.mean(loss)
    if reduction == SUM:
        return jnp.sum(loss)
    return loss


@lowers(aten.mse_loss.default, promote="DEFAULT")
def mse_loss(self, target, reduction=MEAN):
    return _reduce(jnp.square(_opmath(self) - _opmath(target)), reduction)


@lowers(aten.mse_loss_backward.default, promote="DEFAULT")
def mse_loss_backward(grad_output, self, target, reduction):
    diff = _opmath(self) - _opmath(target)
    g = _opmath(grad_output)
    if reduction == MEAN:
        g = g / diff.size
    return 2 * diff * g


@lowers(aten.binary_cross_entropy.default)
def binary_cross_entropy(self, target, weight=None, reduction=MEAN):
    x, t = _opmath(self), _opmath(target)
    log_x = jnp.maximum(jnp.log(x), -100.0)
    log_1mx = jnp.maximum(jnp.log1p(-x), -100.0)
    loss = -(t * log_x + (1 - t) * log_1mx)
    if weight is not None:
        loss = loss * _opmath(weight)
    return _reduce(loss, reduction)


@lowers(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, self, target, weight=None, reduction=MEAN):
    x, t, g = _opmath(self), _opmath(target), _opmath(grad_output)
    eps = 1e-12
    grad = g * (x - t) / jnp.maximum((1 - x) * x, eps)
    if weight is not None:
        grad = grad * _opmath(weight)
    if reduction == MEAN:
        grad = grad / x.size
    return grad


@lowers(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(self, target, weight=None, pos_weight=None,
                                     reduction=MEAN):
    x, t = _opmath(self), _opmath(target)
    log_sig = jax.nn.log_sigmoid(x)
    log_sig_neg = jax.nn.log_sigmoid(-x)
    if pos_weight is not None:
        loss = -(_opmath(pos_weight) * t * log_sig + (1 - t) * log_sig_neg)
    else:
        loss = -(t * log_sig + (1 - t) * log_sig_neg)
    if weight is not None:
        loss = loss * _opmath(weight)
    return _reduce(loss, reduction)


# ---- fused recurrent cells (what nn.LSTM / nn.GRU reach on a non-CPU device) -----------


def _sigmoid(x):
    return jax.nn.sigmoid(x)


@lowers(aten._thnn_fused_lstm_cell.default)
def thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    gates = _opmath(input_gates) + _opmath(hidden_gates)
    if input_bias is not None:
        gates = gates + _opmath(input_bias)
    if hidden_bias is not None:
        gates = gates + _opmath(hidden_bias)
    i, f, g, o = jnp.split(gates, 4, axis=1)
    i, f, g, o = _sigmoid(i), _sigmoid(f), jnp.tanh(g), _sigmoid(o)
    cy = f * _opmath(cx) + i * g
    hy = o * jnp.tanh(cy)
    # The workspace keeps the activated gates, in PyTorch's (i, f, g, o) order.
    return hy, cy, jnp.concatenate([i, f, g, o], axis=1)


@lowers(aten._thnn_fused_lstm_cell_backward_impl.default)
def thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    ws = _opmath(workspace)
    i, f, g, o = jnp.split(ws, 4, axis=1)
    cx, cy = _opmath(cx), _opmath(cy)
    tanh_cy = jnp.tanh(cy)
    gh = jnp.zeros_like(cy) if grad_hy is None else _opmath(grad_hy)
    gc = jnp.zeros_like(cy) if grad_cy is None else _opmath(grad_cy)
    gc_total = gh * o * (1 - tanh_cy * tanh_cy) + gc
    d_o = gh * tanh_cy * o * (1 - o)
    d_i = gc_total * g * i * (1 - i)
    d_f = gc_total * cx * f * (1 - f)
    d_g = gc_total * i * (1 - g * g)
    grad_gates = jnp.concatenate([d_i, d_f, d_g, d_o], axis=1)
    grad_cx = gc_total * f
    grad_bias = jnp.sum(grad_gates, axis=0) if has_bias else None
    return grad_gates, grad_cx, grad_bias


@lowers(aten._thnn_fused_gru_cell.default)
def thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    ig, hg, h = _opmath(input_gates), _opmath(hidden_gates), _opmath(hx)
    if input_bias is not None:
        ig = ig + _opmath(input_bias)
    if hidden_bias is not None:
        hg = hg + _opmath(hidden_bias)
    ir, iz, in_ = jnp.split(ig, 3, axis=1)
    hr, hz, hn = jnp.split(hg, 3, axis=1)
    r = _sigmoid(ir + hr)
    z = _sigmoid(iz + hz)
    n = jnp.tanh(in_ + r * hn)
    hy = n + z * (h - n)
    # Workspace: reset gate, update gate, new gate, hidden n-part, hx (5 * hidden wide).
    return hy, jnp.concatenate([r, z, n, hn, h], axis=1)


@lowers(aten._thnn_fused_gru_cell_backward.default)
def thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias):
    ws = _opmath(workspace)
    r, z, n, hn, h = jnp.split(ws, 5, axis=1)
    g = _opmath(grad_hy)
    grad_hx = g * z
    d_z = g * (h - n) * z * (1 - z)
    d_n = g * (1 - z) * (1 - n * n)
    d_r = d_n * hn * r * (1 - r)
    grad_input_gates = jnp.concatenate([d_r, d_z, d_n], axis=1)
    grad_hidden_gates = jnp.concatenate([d_r, d_z, d_n * r], axis=1)
    if has_bias:
        return (grad_input_gates, grad_hidden_gates, grad_hx,
                jnp.sum(grad_input_gates, axis=0), jnp.sum(grad_hidden_gates, axis=0))
    return grad_input_gates, grad_hidden_gates, grad_hx, None, None



# ---- resampling and adaptive max pooling -------------------------------------------


def _apply_axis_matrices(x, mats, transpose=False):
    """Contract each of the last len(mats) axes of x with its (out, in) matrix."""
    n = len(mats)
    for axis, m in enumerate(mats):
        ax = x.ndim - n + axis
        m = jnp.asarray(m, x.dtype)
        m = m if transpose else m.T
        x = jnp.moveaxis(jnp.tensordot(jnp.moveaxis(x, ax, -1), m, axes=1, precision=HIGHEST),
                         -1, ax)
    return x


def _scale_value(scale, in_size, out_size, ftype):
    """PyTorch's compute_scales_value: 1/scale when given, else in/out."""
    if scale is not None and scale > 0:
        return ftype(1.0 / scale)
    return ftype(in_size) / ftype(out_size)


def _nearest_matrix(in_size, out_size, scale):
    m = np.zeros((out_size, in_size), np.float64)
    if out_size == in_size:
        src = np.arange(out_size)
    elif out_size == 2 * in_size:
        src = np.arange(out_size) >> 1
    else:
        s = _scale_value(scale, in_size, out_size, np.float32)
        src = np.minimum(np.floor(np.arange(out_size, dtype=np.float32) * s).astype(np.int64),
                         in_size - 1)
    m[np.arange(out_size), src] = 1.0
    return m


def _linear_matrix(in_size, out_size, align_corners, scale, ftype):
    if align_corners:
        s = ftype(in_size - 1) / ftype(out_size - 1) if out_size > 1 else ftype(0)
        src = np.arange(out_size, dtype=ftype) * s
    else:
        s = _scale_value(scale, in_size, out_size, ftype)
        src = np.maximum(s * (np.arange(out_size, dtype=ftype) + ftype(0.5)) - ftype(0.5), 0)
    i0 = src.astype(np.int64)
    i1 = np.where(i0 < in_size - 1, i0 + 1, i0)
    lam1 = np.clip(src - i0, 0, 1).astype(np.float64)
    m = np.zeros((out_size, in_size), np.float64)
    rows = np.arange(out_size)
    np.add.at(m, (rows, i0), 1.0 - lam1)
    np.add.at(m, (rows, i1), lam1)
    return m


def _ftype(x):
    return np.float64 if x.dtype == jnp.float64 else np.float32


def _nearest_mats(in_sizes, out_sizes, scales):
    return [_nearest_matrix(i, o, s) for i, o, s in zip(in_sizes, out_sizes, scales, strict=True)]


def _upsample_nearest(x, output_size, scales):
    mats = _nearest_mats(x.shape[-len(output_size):], output_size, scales)
    return _apply_axis_matrices(_opmath(x), mats)


def _upsample_nearest_backward(grad_output, output_size, input_size, scales):
    mats = _nearest_mats(input_size[-len(output_size):], output_size, scales)
    return _apply_axis_matrices(_opmath(grad_output), mats, transpose=True)


@lowers(aten.upsample_nearest1d.default, static=("scales",))
def upsample_nearest1d(self, output_size, scales=None):
    return _upsample_nearest(self, list(output_size), [scales])


@lowers(aten.upsample_nearest2d.default, static=("scales_h", "scales_w"))
def upsample_nearest2d(self, output_size, scales_h=None, scales_w=None):
    return _upsample_nearest(self, list(output_size), [scales_h, scales_w])


@lowers(aten.upsample_nearest3d.default, static=("scales_d", "scales_h", "scales_w"))
def upsample_nearest3d(self, output_size, scales_d=None, scales_h=None, scales_w=None):
    return _upsample_nearest(self, list(output_size), [scales_d, scales_h, scales_w])


@lowers(aten.upsample_nearest1d_backward.default, static=("scales",))
def upsample_nearest1d_backward(grad_output, output_size, input_size, scales=None):
    return _upsample_nearest_backward(grad_output, list(output_size), list(input_size),
                                      [scales])


@lowers(aten.upsample_nearest2d_backward.default, static=("scales_h", "scales_w"))
def upsample_nearest2d_backward(grad_output, output_size, input_size, scales_h=None,
                                scales_w=None):
    return _upsample_nearest_backward(grad_output, list(output_size), list(input_size),
                                      [scales_h, scales_w])


@lowers(aten.upsample_nearest3d_backward.default, static=("scales_d", "scales_h", "scales_w"))
def upsample_nearest3d_backward(grad_output, output_size, input_size, scales_d=None,
                                scales_h=None, scales_w=None):
    return _upsample_nearest_backward(grad_output, list(output_size), list(input_size),
                                      [scales_d, scales_h, scales_w])


def _linear_mats(in_sizes, out_sizes, align_corners, scales, ftype):
    return [_linear_matrix(i, o, align_corners, s, ftype)
            for i, o, s in zip(in_sizes, out_sizes, scales, strict=True)]


@lowers(aten.upsample_bilinear2d.default, static=("scales_h", "scales_w"))
def upsample_bilinear2d(self, output_size, align_corners, scales_h=None, scales_w=None):
    mats = _linear_mats(self.shape[-2:], list(output_size), align_corners,
                        [scales_h, scales_w], _ftype(self))
    return _apply_axis_matrices(_opmath(self), mats)


# uint8 images: CPU runs a separate fixed-point kernel (integer weights, its own rounding) that
# the float interpolation above does not reproduce; those calls run on CPU.
lowered_only_when(lambda a: a["self"].dtype != torch.uint8, aten.upsample_bilinear2d.default)
# Likewise bicubic (not lowered: its decomposition's uint8 branch fails on a Python-int shift).
lowered_only_when(lambda a: a["self"].dtype != torch.uint8, aten.upsample_bicubic2d.default,
                  aten.upsample_bicubic2d.out)


@lowers(aten.upsample_bilinear2d_backward.default, static=("scales_h", "scales_w"))
def upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners,
                                 scales_h=None, scales_w=None):
    mats = _linear_mats(list(input_size)[-2:], list(output_size), align_corners,
                        [scales_h, scales_w], _ftype(grad_output))
    return _apply_axis_matrices(_opmath(grad_output), mats, transpose=True)


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
    lowest = _lowest(self.dtype)
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


# ---- inference fast paths of nn.MultiheadAttention / nn.TransformerEncoderLayer ----------
# (taken under torch.no_grad() in eval mode; training goes through the composite ops)


def _linear(x, weight, bias):
    out = jnp.matmul(x, weight.T, precision=HIGHEST)
    return out if bias is None else out + bias


def _mha(query, key, value, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias, mask,
         mask_type, need_weights, average_attn_weights):
    q_w, k_w, v_w = jnp.split(qkv_weight, 3, axis=0)
    q_b, k_b, v_b = jnp.split(qkv_bias, 3, axis=0)
    q, k, v = _linear(query, q_w, q_b), _linear(key, k_w, k_b), _linear(value, v_w, v_b)
    b, t, d = q.shape
    s = k.shape[1]
    dh = d // num_head

    def heads(x, n):
        return jnp.swapaxes(x.reshape(b, n, num_head, dh), 1, 2)

    q, k, v = heads(q, t) / math.sqrt(dh), heads(k, s), heads(v, s)
    scores = jnp.matmul(q, jnp.swapaxes(k, -1, -2), precision=HIGHEST)  # (b, h, t, s)
    masked_rows = None
    if mask is not None:
        if mask_type == 1:  # key padding mask (b, s)
            mask = mask[:, None, None, :]
        if mask.dtype == jnp.bool_:
            scores = jnp.where(mask, -jnp.inf, scores)
            masked_rows = jnp.all(jnp.broadcast_to(mask, scores.shape), axis=-1, keepdims=True)
        else:
            scores = scores + mask
    attn = jax.nn.softmax(scores, axis=-1)
    if masked_rows is not None:  # PyTorch's masked softmax: a fully masked row gives zeros
        attn = jnp.where(masked_rows, jnp.zeros((), attn.dtype), attn)
    out = jnp.matmul(attn, v, precision=HIGHEST)
    out = _linear(jnp.swapaxes(out, 1, 2).reshape(b, t, d), proj_weight, proj_bias)
    weights = None
    if need_weights:
        weights = jnp.mean(attn, axis=1) if average_attn_weights else attn
    return out, weights


@lowers(aten._native_multi_head_attention.default)
def native_multi_head_attention(query, key, value, embed_dim, num_head, qkv_weight, qkv_bias,
                                proj_weight, proj_bias, mask=None, need_weights=True,
                                average_attn_weights=True, mask_type=None):
    dtype = query.dtype
    args = [_opmath(a) for a in (query, key, value, qkv_weight, qkv_bias, proj_weight,
                                 proj_bias)]
    out, weights = _mha(*args[:3], num_head, *args[3:], _opmath(mask), mask_type,
                        need_weights, average_attn_weights)
    out = out.astype(dtype)
    return out, (None if weights is None else weights.astype(dtype))


@lowers(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer_fwd(src, embed_dim, num_heads, qkv_weight, qkv_bias,
                                  proj_weight, proj_bias, use_gelu, norm_first, eps,
                                  norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2,
                                  ffn_weight_1, ffn_bias_1, ffn_weight_2, ffn_bias_2,
                                  mask=None, mask_type=None):
    x0 = _opmath(src)

    def norm(x, w, b):
        return native_layer_norm(x, [embed_dim], w, b, eps)[0]

    def attend(x):
        return _mha(x, x, x, num_heads, _opmath(qkv_weight), _opmath(qkv_bias),
                    _opmath(proj_weight), _opmath(proj_bias), _opmath(mask), mask_type,
                    False, True)[0]

    def ffn(x):
        h = _linear(x, _opmath(ffn_weight_1), _opmath(ffn_bias_1))
        h = jax.nn.gelu(h, approximate=False) if use_gelu else jnp.maximum(h, 0)
        return _linear(h, _opmath(ffn_weight_2), _opmath(ffn_bias_2))

    if norm_first:
        x = x0 + attend(norm(x0, norm_weight_1, norm_bias_1))
        return x + ffn(norm(x, norm_weight_2, norm_bias_2))
    x = norm(x0 + attend(x0), norm_weight_1, norm_bias_1)
    return norm(x + ffn(x), norm_weight_2, norm_bias_2)


# ---- pairwise distances: cdist / pdist ------------------------------------------------------


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


# ---- shrink backward ---------------------------------------------------------------------


@lowers(aten.softshrink_backward.default, aten.hardshrink_backward.default)
def shrink_backward(grad_out, self, lambd):
    # CPU: zero gradient inside [-lambd, lambd], the incoming gradient elsewhere (NaN inputs
    # are outside, so their gradient passes through).
    inside = (self >= -lambd) & (self <= lambd)
    return jnp.where(inside, jnp.zeros_like(grad_out), grad_out)
