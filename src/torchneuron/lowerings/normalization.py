"""Batch, layer and group normalization, forward and backward.

Half and bfloat16 are computed in float32 like CPU's kernels, except where CPU rounds its saved
statistics to the half type (reproduced with `lax.reduce_precision`)."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from .convolution import channel_shape
from .registry import cpu_kernel_unless, decomposes, lowers, upcast_half

aten = torch.ops.aten

HIGHEST = lax.Precision.HIGHEST


# ---- batch norm ------------------------------------------------------------------------


def _bn_axes(x):
    return (0,) + tuple(range(2, x.ndim))


def _bn_train(input, weight, bias, running_mean, running_var, momentum, eps):
    x = upcast_half(input)
    axes = _bn_axes(x)
    shape = channel_shape(x.ndim)
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
        out = out * upcast_half(weight).reshape(shape)
    if bias is not None:
        out = out + upcast_half(bias).reshape(shape)
    count = x.size // x.shape[1]
    new_mean = new_var = None
    if running_mean is not None:
        new_mean = (1 - momentum) * running_mean + momentum * mean
    if running_var is not None:
        unbiased = var * (count / (count - 1)) if count > 1 else var * jnp.inf
        new_var = (1 - momentum) * running_var + momentum * unbiased
    return out, mean, invstd, new_mean, new_var


def _bn_eval(input, weight, bias, running_mean, running_var, eps):
    x = upcast_half(input)
    shape = channel_shape(x.ndim)
    mean = upcast_half(running_mean)
    invstd = lax.rsqrt(upcast_half(running_var) + eps)
    out = (x - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        out = out * upcast_half(weight).reshape(shape)
    if bias is not None:
        out = out + upcast_half(bias).reshape(shape)
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


def _empty_when_evaluating(op):
    """CPU's kernel leaves save_mean/save_invstd empty in evaluation mode; PyTorch's meta
    kernel reports (C,) (CUDA's choice). Training keeps `_bn_stats_meta`'s dtypes."""
    training_meta = _bn_stats_meta(op)

    def meta(input, weight, bias, running_mean, running_var, training, momentum, eps):
        outs = training_meta(input, weight, bias, running_mean, running_var, training, momentum, eps)
        if training:
            return outs
        empty = input.new_empty((0,), dtype=outs[0].dtype)
        return (outs[0], empty, empty.clone(), *outs[3:])

    return meta


def _empty_stats(out):
    return jnp.zeros((0,), out.dtype), jnp.zeros((0,), out.dtype)


@lowers(aten.native_batch_norm.default, writes=("running_mean", "running_var"),
        meta=_empty_when_evaluating(aten.native_batch_norm.default))
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    # The running statistics are updated in place although the schema does not say so.
    if training:
        return _bn_train(input, weight, bias, running_mean, running_var, momentum, eps)
    out, _, _ = _bn_eval(input, weight, bias, running_mean, running_var, eps)
    return (out, *_empty_stats(out), None, None)


@lowers(aten._native_batch_norm_legit.default,
        meta=_empty_when_evaluating(aten._native_batch_norm_legit.default))
def native_batch_norm_legit(input, weight, bias, running_mean, running_var, training,
                            momentum, eps):
    if training:
        return _bn_train(input, weight, bias, running_mean, running_var, momentum, eps)
    out, _, _ = _bn_eval(input, weight, bias, running_mean, running_var, eps)
    return (out, *_empty_stats(out), running_mean, running_var)


@decomposes(aten._native_batch_norm_legit.out)
def native_batch_norm_legit_out(input, weight, bias, running_mean, running_var, training,
                                momentum, eps, *, out, save_mean, save_invstd):
    # No functional twin to derive it from (`.default` mutates the running statistics too):
    # compute, then resize and fill the outputs as CPU's kernel does (empty statistics in
    # evaluation mode).
    results = aten._native_batch_norm_legit.default(
        input, weight, bias, running_mean, running_var, training, momentum, eps)
    for dst, value in zip((out, save_mean, save_invstd), results):
        if dst.shape != value.shape:
            dst.resize_(value.shape)
        dst.copy_(value)
    return out, save_mean, save_invstd


# AOTAutograd's functionalization introduces this functional variant; PyTorch decomposes it
# into ops lowered here but does not list it among the core-ATen decompositions.
decomposes(aten._native_batch_norm_legit_functional.default, in_graphs=True)(
    torch._decomp.decomposition_table[aten._native_batch_norm_legit_functional.default])


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
cpu_kernel_unless(lambda a: a["training"] and a["input"].dtype in (torch.float32, torch.float64),
                  aten.native_batch_norm.out)


def _bn_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd,
                 train, eps, output_mask):
    g, x = upcast_half(grad_out), upcast_half(input)
    axes = _bn_axes(x)
    shape = channel_shape(x.ndim)
    if train:
        mean, invstd = upcast_half(save_mean), upcast_half(save_invstd)
    else:
        mean, invstd = upcast_half(running_mean), lax.rsqrt(upcast_half(running_var) + eps)
    xhat = (x - mean.reshape(shape)) * invstd.reshape(shape)
    w = jnp.ones((), x.dtype) if weight is None else upcast_half(weight).reshape(shape)
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
    x = upcast_half(input)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * upcast_half(weight)
    if bias is not None:
        out = out + upcast_half(bias)
    return out, mean, rstd


@lowers(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias,
                               output_mask):
    g, x = upcast_half(grad_out), upcast_half(input)
    nd = len(normalized_shape)
    axes = tuple(range(x.ndim - nd, x.ndim))
    outer = tuple(range(x.ndim - nd))
    mean, rstd = upcast_half(mean), upcast_half(rstd)
    xhat = (x - mean) * rstd
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        gx = g if weight is None else g * upcast_half(weight)
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
    x = upcast_half(input)
    group_size = C // group * HxW  # explicit: -1 cannot be inferred for an empty batch
    xg = x.reshape(N, group, group_size)
    mean = jnp.mean(xg, axis=2)
    var = jnp.mean(jnp.square(xg - mean[..., None]), axis=2)
    rstd = lax.rsqrt(var + eps)
    out = ((xg - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    shape = channel_shape(x.ndim)
    if weight is not None:
        out = out * upcast_half(weight).reshape(shape)
    if bias is not None:
        out = out + upcast_half(bias).reshape(shape)
    return out, mean, rstd


@lowers(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, input, mean, rstd, weight, N, C, HxW, group,
                               output_mask):
    g, x = upcast_half(grad_out), upcast_half(input)
    mean, rstd = upcast_half(mean), upcast_half(rstd)
    g3 = g.reshape(N, C, HxW)
    x3 = x.reshape(N, C, HxW)
    cpg = C // group
    mean_c = jnp.repeat(mean, cpg, axis=1)[..., None]
    rstd_c = jnp.repeat(rstd, cpg, axis=1)[..., None]
    xhat = (x3 - mean_c) * rstd_c
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        gx = g3 if weight is None else g3 * upcast_half(weight)[None, :, None]
        gxg = gx.reshape(N, group, cpg * HxW)
        xhg = xhat.reshape(N, group, cpg * HxW)
        a = jnp.mean(gxg, axis=2, keepdims=True)
        b = jnp.mean(gxg * xhg, axis=2, keepdims=True)
        gi = (gxg - a - xhg * b) * rstd[..., None]
        grad_input = gi.reshape(x.shape)
    if output_mask[1]:
        grad_weight = jnp.sum(g3 * xhat, axis=(0, 2))
    if output_mask[2]:
        grad_bias = jnp.sum(g3, axis=(0, 2))
    return grad_input, grad_weight, grad_bias
