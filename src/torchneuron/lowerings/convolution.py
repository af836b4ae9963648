"""Convolution forward and backward (any number of spatial dimensions, transposed, grouped)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from . import host_kernels
from .registry import lowers, upcast_half

aten = torch.ops.aten

HIGHEST = lax.Precision.HIGHEST


def channel_shape(ndim: int, axis: int = 1) -> tuple[int, ...]:
    """Broadcast shape of a per-channel vector against an `ndim`-d input."""
    return tuple(-1 if i == axis else 1 for i in range(ndim))


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


def _check_conv_params(stride, padding, output_padding) -> None:
    # CPU's checks that PyTorch's meta kernel lacks (lax would pad negatively, i.e. crop).
    if any(p < 0 for p in _expand(padding, 1)):
        raise RuntimeError("negative padding is not supported")
    if output_padding and any(p < 0 for p in _expand(output_padding, 1)):
        raise RuntimeError("negative output_padding is not supported")
    if any(s <= 0 for s in _expand(stride, 1)):
        raise RuntimeError("non-positive stride is not supported")


def _per_dimension(n, stride, padding, dilation, output_padding):
    """The window parameters as one value per spatial dimension (of `n`)."""
    return (_expand(stride, n), _expand(padding, n), _expand(dilation, n),
            _expand(output_padding, n) if output_padding else [0] * n)


def _conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    n = x.ndim - 2
    stride, padding, dilation, output_padding = _per_dimension(n, stride, padding, dilation,
                                                               output_padding)
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


def _host_attributes(ndim, stride, padding, dilation, transposed, output_padding, groups):
    ints = host_kernels.ints
    stride, padding, dilation, output_padding = _per_dimension(ndim - 2, stride, padding,
                                                               dilation, output_padding)
    return dict(stride=ints(stride), padding=ints(padding), dilation=ints(dilation),
                transposed=bool(transposed), output_padding=ints(output_padding),
                groups=np.int64(groups))


@lowers(aten.convolution.default)
def convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                groups):
    _check_conv_shapes(input, weight, transposed, groups)
    _check_conv_params(stride, padding, output_padding)
    arrays = (input, weight) if bias is None else (input, weight, bias)
    if host_kernels.runs("convolution", *arrays):
        out = jax.eval_shape(lambda x, w: _conv(x, w, stride, padding, dilation, transposed,
                                                output_padding, groups), input, weight)
        return host_kernels.call("convolution", out, *arrays, **_host_attributes(
            input.ndim, stride, padding, dilation, transposed, output_padding, groups))
    x, w = upcast_half(input), upcast_half(weight)
    out = _conv(x, w, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + upcast_half(bias).reshape(channel_shape(out.ndim))
    return out


@lowers(aten.convolution_backward.default)
def convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask):
    if any(output_mask) and host_kernels.runs("convolution_backward", grad_output, input, weight):
        wanted = [jax.ShapeDtypeStruct(shape, grad_output.dtype) for shape, keep in zip(
            (input.shape, weight.shape, (grad_output.shape[1],)), output_mask, strict=True) if keep]
        grads = iter(host_kernels.call(
            "convolution_backward", wanted, grad_output, input, weight,
            grad_input=bool(output_mask[0]), grad_weight=bool(output_mask[1]),
            grad_bias=bool(output_mask[2]), **_host_attributes(
                input.ndim, stride, padding, dilation, transposed, output_padding, groups)))
        return tuple(next(grads) if keep else None for keep in output_mask)
    g, x, w = upcast_half(grad_output), upcast_half(input), upcast_half(weight)

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
