"""Fast Fourier transforms: the three ATen primitives every `torch.fft` function reaches.

`torch.fft.*` (fft, rfft, hfft, fft2, ..., stft) are composites over `_fft_r2c` (real ->
complex), `_fft_c2c` (complex -> complex) and `_fft_c2r` (complex -> real); padding,
trimming, conjugation and the norm modes are done by the composites before or after them.

Layout: CPU PyTorch (the MKL kernels) returns outputs in a permuted layout (batch dimensions
outermost, transformed dimensions innermost). PyTorch's meta kernels compute that layout only
for CPU tensors: for `meta` tensors they assume CUDA and report another one, so each lowering
here carries a `meta=` kernel that runs PyTorch's meta kernel (its checks, shape, dtype) and
then lays the result out as the CPU kernel does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax.numpy as jnp
import torch

from .registry import lowers

aten = torch.ops.aten

# at::native::fft_norm_mode
_NORM_NONE, _NORM_BY_ROOT_N, _NORM_BY_N = 0, 1, 2


def _scale(x, normalization: int, signal_numel: int):
    """Apply the normalization the ATen primitives take (the transforms themselves are unscaled)."""
    if normalization == _NORM_NONE or signal_numel == 0:
        return x
    factor = 1.0 / (math.sqrt(signal_numel) if normalization == _NORM_BY_ROOT_N else signal_numel)
    return x * jnp.asarray(factor, dtype=x.real.dtype)


def _check_input(x) -> None:
    """What CPU's kernels refuse: half-precision dtypes, and empty inputs (MKL fails to plan
    a transform with a zero-sized batch or signal)."""
    if x.dtype in (jnp.float16, jnp.bfloat16):
        name = "Half" if x.dtype == jnp.float16 else "BFloat16"
        raise RuntimeError(f"MKL FFT doesn't support tensors of type: {name}")
    if x.size == 0:
        raise RuntimeError("MKL FFT error: Intel oneMKL DFTI ERROR: Inconsistent configuration parameters")


def _wrap(dim: Sequence[int], ndim: int) -> list[int]:
    return [d % ndim if ndim else d for d in dim]


# ----------------------------------------------------------------------------------------
# CPU output layouts (a port of the stride logic of _exec_fft in ATen/native/mkl/SpectralOps.cpp)


def _exec_fft_strides(in_strides: Sequence[int], out_sizes: Sequence[int], dims: Sequence[int]) -> tuple[int, ...]:
    """Strides of an MKL transform over `dims` (in that order): the batch dimensions, ordered
    by decreasing input stride, are collapsed outermost; the transformed dimensions follow
    innermost, contiguous, in the order of `dims`."""
    ndim = len(out_sizes)
    batch = _partition(list(range(ndim)), lambda d: d not in dims)
    # std::sort of so few elements is an insertion sort: stable, like Python's (ties are
    # dimensions of stride 0, e.g. expanded ones).
    batch.sort(key=lambda d: in_strides[d], reverse=True)
    order = batch + list(dims)  # outermost first
    strides = [0] * ndim
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= out_sizes[d]
    return tuple(strides)


def _partition(items: list[int], pred) -> list[int]:
    """The elements `pred` holds for, in the order libstdc++'s (unstable) std::partition
    leaves them: it swaps the first failing element from the left with the last passing one
    from the right, repeatedly."""
    first, last = 0, len(items)
    while True:
        while first != last and pred(items[first]):
            first += 1
        if first == last:
            return items[:first]
        last -= 1
        while first != last and not pred(items[last]):
            last -= 1
        if first == last:
            return items[:first]
        items[first], items[last] = items[last], items[first]
        first += 1


def _sorted_dims(in_strides: Sequence[int], dims: Sequence[int], keep_last: bool = False) -> list[int]:
    """The transform order MKL uses: by decreasing input stride (the last one fixed for r2c)."""
    dims = list(dims)
    head = dims[:-1] if keep_last else dims
    head = sorted(head, key=lambda d: in_strides[d], reverse=True)
    return head + dims[-1:] if keep_last else head


def _restride(meta: torch.Tensor, strides: Sequence[int]) -> torch.Tensor:
    return torch.empty_strided(meta.shape, tuple(strides), dtype=meta.dtype, device="meta")


def _c2c_strides(self: torch.Tensor, dim: Sequence[int]) -> tuple[int, ...]:
    dims = _sorted_dims(self.stride(), _wrap(dim, self.dim()))
    return _exec_fft_strides(self.stride(), self.shape, dims)


def _meta_c2c(self, dim, normalization, forward):
    out = aten._fft_c2c.default(self, dim, normalization, forward)
    if not dim:  # a clone
        return out
    return _restride(out, _c2c_strides(self, dim))


def _meta_r2c(self, dim, normalization, onesided):
    out = aten._fft_r2c.default(self, dim, normalization, onesided)
    dims = _sorted_dims(self.stride(), _wrap(dim, self.dim()), keep_last=True)
    return _restride(out, _exec_fft_strides(self.stride(), out.shape, dims))


def _meta_c2r(self, dim, normalization, last_dim_size):
    out = aten._fft_c2r.default(self, dim, normalization, last_dim_size)
    dims = _wrap(dim, self.dim())
    in_strides = self.stride()
    if len(dims) > 1:
        # CPU first runs a c2c transform over all but the last dimension, then a 1-D c2r
        # transform of that intermediate result (laid out as _fft_c2c lays it out).
        in_strides = _c2c_strides(self, dims[:-1])
    return _restride(out, _exec_fft_strides(in_strides, out.shape, dims[-1:]))


# ----------------------------------------------------------------------------------------
# The transforms


@lowers(aten._fft_c2c.default, meta=_meta_c2c)
def fft_c2c(self, dim: list[int], normalization: int, forward: bool):
    if not dim:  # CPU clones the input before any check
        return self
    _check_input(self)
    dims = _wrap(dim, self.ndim)
    numel = math.prod(self.shape[d] for d in dims)
    if forward:
        y = jnp.fft.fftn(self, axes=dims, norm="backward")  # unscaled
    else:
        y = jnp.fft.ifftn(self, axes=dims, norm="forward")  # unscaled
    return _scale(y, normalization, numel)


@lowers(aten._fft_r2c.default, meta=_meta_r2c)
def fft_r2c(self, dim: list[int], normalization: int, onesided: bool):
    _check_input(self)
    dims = _wrap(dim, self.ndim)
    numel = math.prod(self.shape[d] for d in dims)
    if onesided:
        y = jnp.fft.rfftn(self, axes=dims, norm="backward")
    else:
        complex_dtype = jnp.result_type(self.dtype, jnp.complex64)
        y = jnp.fft.fftn(self.astype(complex_dtype), axes=dims, norm="backward")
    return _scale(y, normalization, numel)


@lowers(aten._fft_c2r.default, meta=_meta_c2r)
def fft_c2r(self, dim: list[int], normalization: int, last_dim_size: int):
    _check_input(self)
    dims = _wrap(dim, self.ndim)
    sizes = [self.shape[d] for d in dims[:-1]] + [last_dim_size]
    # Like CPU: an inverse c2c transform over all but the last dimension, then a 1-D c2r
    # transform of the last one (which reads its first last_dim_size // 2 + 1 elements and
    # ignores the imaginary parts that a Hermitian signal would not have).
    y = self
    if len(dims) > 1:
        y = jnp.fft.ifftn(y, axes=dims[:-1], norm="forward")
    y = jnp.fft.irfft(y, n=last_dim_size, axis=dims[-1], norm="forward")
    return _scale(y, normalization, math.prod(sizes))
