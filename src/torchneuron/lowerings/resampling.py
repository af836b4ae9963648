"""Resampling: nearest, bilinear (plain and antialiased) and bicubic upsampling, and grid
sampling, forward and backward.

Interpolation weights are computed with numpy in the input's precision (float32 for
float32/half inputs, float64 for float64), in the order PyTorch's CPU kernels compute them, so
that index choices at rounding boundaries agree with CPU's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .dtypes import not_implemented_for
from .registry import cpu_kernel_unless, lowers, upcast_half

aten = torch.ops.aten

HIGHEST = lax.Precision.HIGHEST


# ---- up- and downsampling -----------------------------------------------------------


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


# CPU's upsampling kernels are dispatched over the floating types (and, for nearest and
# for bilinear and bicubic on 4-d images, uint8); other integer and bool images are refused.
def _floating(a: dict) -> bool:
    return a["self"].dtype.is_floating_point


def _floating_or_uint8(a: dict) -> bool:
    return a["self"].dtype.is_floating_point or a["self"].dtype == torch.uint8


def _refuse_integers(x, kernel: str, uint8_too: bool = True) -> None:
    if not jnp.issubdtype(x.dtype, jnp.floating) and (uint8_too or x.dtype != jnp.uint8):
        raise not_implemented_for(kernel, x.dtype)


def _upsample_nearest(x, output_size, scales):
    kernel = "upsample_nearest2d_channels_last" if len(output_size) == 2 else \
        "compute_indices_weights_nearest"
    _refuse_integers(x, kernel, uint8_too=False)
    mats = _nearest_mats(x.shape[-len(output_size):], output_size, scales)
    return _apply_axis_matrices(upcast_half(x), mats)


def _upsample_nearest_backward(grad_output, output_size, input_size, scales):
    mats = _nearest_mats(input_size[-len(output_size):], output_size, scales)
    return _apply_axis_matrices(upcast_half(grad_output), mats, transpose=True)


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


def _not_uint8(a: dict) -> bool:
    return a["self"].dtype != torch.uint8


# uint8 images: CPU runs a separate fixed-point kernel (integer weights, its own rounding) that
# the float interpolation does not reproduce; those calls run on CPU.
@lowers(aten.upsample_bilinear2d.default, static=("scales_h", "scales_w"), only_when=_not_uint8)
def upsample_bilinear2d(self, output_size, align_corners, scales_h=None, scales_w=None):
    _refuse_integers(self, "upsample_bilinear2d_channels_last")
    mats = _linear_mats(self.shape[-2:], list(output_size), align_corners,
                        [scales_h, scales_w], _ftype(self))
    return _apply_axis_matrices(upcast_half(self), mats)


# uint8 bicubic: CPU's fixed-point kernel (its decomposition's uint8 branch fails on a
# Python-int shift), as for bilinear above. PyTorch's decompositions of these compute any
# dtype: the calls CPU refuses go to CPU's kernel, which raises.
cpu_kernel_unless(_floating, aten.upsample_bicubic2d.default, aten.upsample_bicubic2d.out,
                  aten.upsample_linear1d.default, aten.upsample_linear1d.out,
                  aten.upsample_trilinear3d.default, aten.upsample_trilinear3d.out)
cpu_kernel_unless(_floating_or_uint8, *(getattr(aten, f"_upsample_nearest_exact{n}d").default
                                        for n in (1, 2, 3)),
                  *(getattr(aten, f"_upsample_nearest_exact{n}d").out for n in (1, 2, 3)))


@lowers(aten.upsample_bilinear2d_backward.default, static=("scales_h", "scales_w"))
def upsample_bilinear2d_backward(grad_output, output_size, input_size, align_corners,
                                 scales_h=None, scales_w=None):
    mats = _linear_mats(list(input_size)[-2:], list(output_size), align_corners,
                        [scales_h, scales_w], _ftype(grad_output))
    return _apply_axis_matrices(upcast_half(grad_output), mats, transpose=True)

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
    g = upcast_half(grad_output)
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


# uint8 input takes CPU's int16 fixed-point path, with its own rounding: left on CPU
@lowers(aten._upsample_bilinear2d_aa.default, static=("scales_h", "scales_w"),
        only_when=lambda a: a["self"].is_floating_point())
def upsample_bilinear2d_aa(self, output_size, align_corners, scales_h=None, scales_w=None):
    x = upcast_half(self)
    mh, mw = _aa_mats(self.shape[-2:], list(output_size), align_corners, scales_h, scales_w,
                      _ftype(x))
    # CPU resamples the width first, then the height
    return _contract(_contract(x, mw, -1), mh, -2)


@lowers(aten._upsample_bilinear2d_aa_backward.default, static=("scales_h", "scales_w"))
def upsample_bilinear2d_aa_backward(grad_output, output_size, input_size, align_corners,
                                    scales_h=None, scales_w=None):
    g = upcast_half(grad_output)
    mh, mw = _aa_mats(list(input_size)[-2:], list(output_size), align_corners, scales_h,
                      scales_w, _ftype(g))
    return _contract(_contract(g, mw, -1, transpose=True), mh, -2, transpose=True)

# ---- grid sampling --------------------------------------------------------------------------
# CPU's GridSampler.h, written for 2-D and 3-D at once. Gradients are jax.vjp of the forward:
# the clip and reflection helpers below are written with `where` so that their derivatives
# are CPU's (0 outside or on the border, sign flips where reflected).


def _unnormalize(coord, size: int, align_corners: bool):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _clip(coord, size: int):
    return jnp.where(coord <= 0, jnp.zeros_like(coord),
                     jnp.where(coord >= size - 1, jnp.full_like(coord, size - 1), coord))


def _reflect(coord, twice_low: int, twice_high: int):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    lo = twice_low / 2
    span = (twice_high - twice_low) / 2
    c = coord - lo
    c = jnp.where(c < 0, -c, c)
    extra = jnp.fmod(c, span)
    flips = lax.stop_gradient(jnp.floor(c / span))
    even = jnp.fmod(flips, 2) == 0
    return jnp.where(even, extra + lo, span - extra + lo)


def _pad_coordinates(coord, size: int, padding_mode: int, align_corners: bool):
    if padding_mode == 1:  # border
        return _clip(coord, size)
    if padding_mode == 2:  # reflection
        if align_corners:
            coord = _reflect(coord, 0, 2 * (size - 1))
        else:
            coord = _reflect(coord, -1, 2 * size - 1)
        return _clip(coord, size)
    return coord


def _gather_taps(x, idx, sizes):
    """x (N, C, *sizes), idx: list of integer coordinate arrays (N, *out) per spatial axis
    (x first, i.e. reversed axis order): values (N, C, *out), zero where out of bounds."""
    n, c = x.shape[:2]
    inside = jnp.ones(idx[0].shape, bool)
    flat = jnp.zeros(idx[0].shape, jnp.int64)
    for axis, size in enumerate(sizes):
        i = idx[len(sizes) - 1 - axis]
        inside = inside & (i >= 0) & (i < size)
        flat = flat * size + jnp.clip(i, 0, size - 1)
    out_shape = idx[0].shape[1:]
    vals = jnp.take_along_axis(x.reshape(n, c, -1), flat.reshape(n, 1, -1), axis=2)
    vals = vals.reshape(n, c, *out_shape)
    return jnp.where(inside[:, None], vals, jnp.zeros((), x.dtype))


def _grid_sample(x, grid, interpolation_mode: int, padding_mode: int, align_corners: bool):
    sizes = x.shape[2:]  # (D,) H, W
    nd = len(sizes)
    # grid[..., 0] indexes the last axis (W), grid[..., 1] H, grid[..., 2] D
    dims = [sizes[nd - 1 - k] for k in range(nd)]
    coords = [_unnormalize(grid[..., k], dims[k], align_corners) for k in range(nd)]
    if interpolation_mode == 2:  # bicubic (2-D only)
        base = [lax.stop_gradient(jnp.floor(c)) for c in coords]
        coeffs = [_cubic_weights(c - b) for c, b in zip(coords, base, strict=True)]
        out = None
        for iy in range(4):
            row = None
            for ix in range(4):
                taps = []
                for k, off in enumerate((ix, iy)):
                    t = _pad_coordinates(base[k] - 1 + off, dims[k], padding_mode, align_corners)
                    taps.append(lax.stop_gradient(t).astype(jnp.int64))
                v = _gather_taps(x, taps, sizes) * coeffs[0][ix][:, None]
                row = v if row is None else row + v
            v = row * coeffs[1][iy][:, None]
            out = v if out is None else out + v
        return out
    coords = [_pad_coordinates(c, d, padding_mode, align_corners)
              for c, d in zip(coords, dims, strict=True)]
    if interpolation_mode == 1:  # nearest, ties to even as nearbyint
        taps = [lax.stop_gradient(jnp.round(c)).astype(jnp.int64) for c in coords]
        return _gather_taps(x, taps, sizes)
    lo = [lax.stop_gradient(jnp.floor(c)) for c in coords]
    out = None
    # corners summed in CPU's order, x offset fastest: nw, ne, sw, se (2-D), tnw .. bse (3-D)
    for corner in range(2 ** nd):
        offs = [(corner >> k) & 1 for k in range(nd)]
        w = None
        for k in range(nd):
            # weight of a low corner is (high - coord), of a high corner (coord - low)
            wk = (lo[k] + 1 - coords[k]) if offs[k] == 0 else (coords[k] - lo[k])
            w = wk if w is None else w * wk
        taps = [(lo[k] + offs[k]).astype(jnp.int64) for k in range(nd)]
        v = _gather_taps(x, taps, sizes) * w[:, None]
        out = v if out is None else out + v
    return out


def _cubic_weights(t):
    a = -0.75

    def conv1(v):
        return ((a + 2) * v - (a + 3)) * v * v + 1

    def conv2(v):
        return ((a * v - 5 * a) * v + 8 * a) * v - 4 * a

    return [conv2(t + 1), conv1(t), conv1(1 - t), conv2(2 - t)]


def _grid_sample_lowering(input, grid, interpolation_mode, padding_mode, align_corners):
    dtype = input.dtype
    out = _grid_sample(upcast_half(input), upcast_half(grid), interpolation_mode, padding_mode,
                       align_corners)
    return out.astype(dtype)


def _grid_sample_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                          align_corners, output_mask):
    x, g = upcast_half(input), upcast_half(grid)

    def fwd(x_, g_):
        return _grid_sample(x_, g_, interpolation_mode, padding_mode, align_corners)

    _, vjp = jax.vjp(fwd, x, g)
    gx, gg = vjp(upcast_half(grad_output).astype(x.dtype))
    return (gx if output_mask[0] else None), gg


# CPU computes half/bfloat16 grid sampling in the half type, rounding every step; computed in
# float32 here they differ beyond tolerance, so those stay on CPU
def _full_precision(a: dict) -> bool:
    return a["input"].dtype in (torch.float32, torch.float64)


@lowers(aten.grid_sampler_3d.default, only_when=_full_precision)
def grid_sampler_3d(input, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample_lowering(input, grid, interpolation_mode, padding_mode, align_corners)


@lowers(aten.grid_sampler_3d_backward.default, only_when=_full_precision)
def grid_sampler_3d_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                             align_corners, output_mask):
    return _grid_sample_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                                 align_corners, output_mask)


@lowers(aten.grid_sampler_2d_backward.default, only_when=_full_precision)
def grid_sampler_2d_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                             align_corners, output_mask):
    return _grid_sample_backward(grad_output, input, grid, interpolation_mode, padding_mode,
                                 align_corners, output_mask)
