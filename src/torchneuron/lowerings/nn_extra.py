"""Less common NN ops that used to run on CPU: antialiased and bicubic resampling backward,
grid sampling, embedding bags, histograms, tensor hashing.

Conventions (see docs/LOWERINGS.md): tensors arrive as `jax.Array`s of their logical shape and
results are cast to the meta kernel's dtype by the runtime. Interpolation weights are computed
with numpy in the input's precision (float32 for float32/half inputs, float64 for float64), in
the order PyTorch's CPU kernels compute them, so that index choices at rounding boundaries
agree with CPU's.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .nn import _opmath, _scale_value
from .registry import lowered_only_when, lowers

aten = torch.ops.aten

HIGHEST = lax.Precision.HIGHEST


def _ftype(x) -> type:
    return np.float64 if x.dtype == jnp.float64 else np.float32


def _area_scale(in_size: int, out_size: int, align_corners: bool, scale, ftype) -> np.floating:
    """PyTorch's area_pixel_compute_scale."""
    if align_corners:
        return ftype(in_size - 1) / ftype(out_size - 1) if out_size > 1 else ftype(0)
    return _scale_value(scale, in_size, out_size, ftype)


def _contract(x, mat: np.ndarray, axis: int, transpose: bool = False):
    """Contract axis `axis` of x with the (out, in) matrix `mat` (its transpose for backward)."""
    m = jnp.asarray(mat, x.dtype)
    m = m if transpose else m.T
    moved = jnp.moveaxis(x, axis, -1)
    return jnp.moveaxis(jnp.tensordot(moved, m, axes=1, precision=HIGHEST), -1, axis)


# ---- bicubic upsampling backward ------------------------------------------------------------


def _cubic_coefficients(t: np.ndarray, ftype) -> list[np.ndarray]:
    """PyTorch's get_cubic_upsample_coefficients (A = -0.75), in the input's precision."""
    a = ftype(-0.75)
    one = ftype(1)

    def conv1(x):  # |x| <= 1
        return ((a + ftype(2)) * x - (a + ftype(3))) * x * x + one

    def conv2(x):  # 1 < |x| < 2
        return ((a * x - ftype(5) * a) * x + ftype(8) * a) * x - ftype(4) * a

    u = one - t
    return [conv2(t + one), conv1(t), conv1(u), conv2(u + one)]


def _bicubic_matrix(in_size: int, out_size: int, align_corners: bool, scale, ftype) -> np.ndarray:
    s = _area_scale(in_size, out_size, align_corners, scale, ftype)
    dst = np.arange(out_size, dtype=ftype)
    real = s * dst if align_corners else s * (dst + ftype(0.5)) - ftype(0.5)
    # guard_index_and_lambda: the floor index is kept below in_size, lambda clamped to [0, 1]
    idx = np.minimum(np.floor(real).astype(np.int64), in_size - 1)
    t = np.clip(real - idx.astype(ftype), 0, 1).astype(ftype)
    m = np.zeros((out_size, in_size), np.float64)
    rows = np.arange(out_size)
    for k, w in enumerate(_cubic_coefficients(t, ftype)):
        np.add.at(m, (rows, np.clip(idx - 1 + k, 0, in_size - 1)), w.astype(np.float64))
    return m


@lowers(aten.upsample_bicubic2d_backward.default, static=("scales_h", "scales_w"))
def upsample_bicubic2d_backward(grad_output, output_size, input_size, align_corners,
                                scales_h=None, scales_w=None):
    g = _opmath(grad_output)
    ftype = _ftype(g)
    (oh, ow), (ih, iw) = list(output_size), list(input_size)[-2:]
    g = _contract(g, _bicubic_matrix(iw, ow, align_corners, scales_w, ftype), -1, transpose=True)
    return _contract(g, _bicubic_matrix(ih, oh, align_corners, scales_h, ftype), -2, transpose=True)


# ---- antialiased bilinear resampling --------------------------------------------------------


def _aa_linear_matrix(in_size: int, out_size: int, align_corners: bool, scale, ftype) -> np.ndarray:
    """Weights of CPU's separable antialiased kernel (_compute_indices_min_size_weights_aa with
    the triangle filter): the support widens with the downscaling factor, each output's taps
    are normalised to sum to one. align_corners only changes the scale."""
    s = _area_scale(in_size, out_size, align_corners, scale, ftype)
    support = ftype(s) if s >= 1 else ftype(1.0)  # interp_size / 2 = 1 for bilinear
    max_taps = int(np.ceil(support)) * 2 + 1
    invscale = ftype(1.0) / s if s >= 1 else ftype(1.0)
    m = np.zeros((out_size, in_size), np.float64)
    for i in range(out_size):
        center = s * ftype(i + 0.5)
        xmin = max(int(center - support + ftype(0.5)), 0)
        xsize = min(int(center + support + ftype(0.5)), in_size) - xmin
        xsize = min(max(xsize, 0), max_taps)
        j = np.arange(xsize)
        x = (ftype(1) * (j + xmin) - center + ftype(0.5)) * invscale
        w = np.maximum(ftype(1) - np.abs(x).astype(ftype), ftype(0)).astype(ftype)
        total = ftype(0)
        for v in w:  # sequential sum, as CPU
            total = ftype(total + v)
        if total != 0:
            w = (w / total).astype(ftype)
        m[i, xmin:xmin + xsize] = w
    return m


def _aa_mats(in_hw, out_hw, align_corners, scales_h, scales_w, ftype):
    return (_aa_linear_matrix(in_hw[0], out_hw[0], align_corners, scales_h, ftype),
            _aa_linear_matrix(in_hw[1], out_hw[1], align_corners, scales_w, ftype))


@lowers(aten._upsample_bilinear2d_aa.default, static=("scales_h", "scales_w"))
def upsample_bilinear2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
    x = _opmath(self)
    mh, mw = _aa_mats(self.shape[-2:], list(output_size), align_corners, scales_h, scales_w,
                      _ftype(x))
    # CPU resamples the width first, then the height
    return _contract(_contract(x, mw, -1), mh, -2)


# uint8 input takes CPU's int16 fixed-point path, with its own rounding: left on CPU
lowered_only_when(lambda a: a["self"].is_floating_point(), aten._upsample_bilinear2d_aa.default)


@lowers(aten._upsample_bilinear2d_aa_backward.default, static=("scales_h", "scales_w"))
def upsample_bilinear2d_aa_backward(grad_output, output_size, input_size, align_corners,
                                    scales_h=None, scales_w=None):
    g = _opmath(grad_output)
    mh, mw = _aa_mats(list(input_size)[-2:], list(output_size), align_corners, scales_h,
                      scales_w, _ftype(g))
    return _contract(_contract(g, mw, -1, transpose=True), mh, -2, transpose=True)


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
    dims = tuple(d % self.ndim for d in dim) if dim else tuple(range(self.ndim))
    out = lax.reduce(bits, np.uint64(0), lax.bitwise_xor, dims)
    if keepdim:
        out = jnp.expand_dims(out, dims)
    return out
