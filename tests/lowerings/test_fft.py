"""FFT lowerings (lowerings/fft.py) against CPU PyTorch: values for every norm mode, n/s
that crop or zero-pad, onesided r2c, c2r's last-dimension size, CPU's (permuted) output
layouts, out=, and gradients. Every test runs with TORCHNEURON_STRICT=1 (no CPU fallback).
"""

from __future__ import annotations

import pytest
import torch
from lowering_checks import assert_native

DEV = "neuron"
NORMS = ("backward", "forward", "ortho")

pytestmark = pytest.mark.usefixtures("strict")  # tests/lowerings/conftest.py


def _data(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    if dtype.is_complex:
        x = x + 1j * torch.randn(shape, generator=g, dtype=torch.float64)
    return x.to(dtype)


def _on_device(x):
    """A neuron copy of `x` with `x`'s strides."""
    return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=DEV).copy_(x)


def _relevant_strides(t):
    return tuple(s for n, s in zip(t.shape, t.stride()) if n > 1)


def _assert_same(dev, cpu):
    assert dev.device.type == DEV and dev.dtype == cpu.dtype
    exact = cpu.dtype in (torch.float64, torch.complex128)
    tol = {"rtol": 1e-10, "atol": 1e-10} if exact else {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(dev.cpu(), cpu, **tol)
    assert _relevant_strides(dev) == _relevant_strides(cpu), (dev.stride(), cpu.stride())


# (function, input is complex, keyword arguments)
CASES = [
    (torch.fft.fft, False, {"n": 10, "dim": 1}),
    (torch.fft.fft, True, {"n": 4, "dim": 0}),
    (torch.fft.ifft, True, {"n": 9, "dim": -1}),
    (torch.fft.ifft, False, {"n": 3, "dim": 1}),
    (torch.fft.rfft, False, {"n": 10, "dim": 1}),
    (torch.fft.irfft, True, {"n": 7, "dim": 1}),
    (torch.fft.irfft, True, {}),
    (torch.fft.hfft, True, {"n": 10, "dim": 1}),
    (torch.fft.ihfft, False, {"n": 5, "dim": 0}),
    (torch.fft.fft2, True, {"dim": (0, 2)}),
    (torch.fft.fft2, False, {"s": (3, 9)}),
    (torch.fft.ifft2, True, {"dim": (0,)}),
    (torch.fft.rfft2, False, {"dim": (2, 0)}),
    (torch.fft.irfft2, True, {"s": (4, 9)}),
    (torch.fft.hfft2, True, {"dim": (0,)}),
    (torch.fft.ihfft2, False, {"s": (4, 8)}),
    (torch.fft.fftn, True, {"dim": (-2,)}),
    (torch.fft.ifftn, False, {"s": (6, 4, 8)}),
    (torch.fft.rfftn, False, {"dim": (-2,)}),
    (torch.fft.irfftn, True, {"dim": (0, 1)}),
    (torch.fft.hfftn, True, {"s": (3, 5)}),
    (torch.fft.ihfftn, False, {"dim": (1, 2)}),
]


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_fft_functions(case, norm):
    fn, is_complex, kwargs = CASES[case]
    for dtype in ((torch.complex64, torch.complex128) if is_complex else (torch.float32, torch.float64)):
        x = _data((5, 6, 7), dtype, seed=case)
        _assert_same(fn(_on_device(x), norm=norm, **kwargs), fn(x, norm=norm, **kwargs))


@pytest.mark.parametrize("perm", [(0, 1, 2), (2, 0, 1), (1, 2, 0), (2, 1, 0)])
def test_primitives_layouts(perm):
    """CPU's output strides follow the input's layout; the lowering's meta kernel must too."""
    aten = torch.ops.aten
    base = _data((5, 6, 7), torch.complex128)
    x = base.permute(perm)
    dims_list = ([0], [2], [0, 1], [2, 0], [1, 2, 0])
    for dims in dims_list:
        _assert_same(aten._fft_c2c(_on_device(x), dims, 1, True), aten._fft_c2c(x, dims, 1, True))
        for onesided in (True, False):
            r = x.real.clone()  # clone keeps the permuted (dense) layout
            _assert_same(aten._fft_r2c(_on_device(r), dims, 2, onesided), aten._fft_r2c(r, dims, 2, onesided))
        last = 2 * (x.shape[dims[-1]] - 1)
        _assert_same(aten._fft_c2r(_on_device(x), dims, 0, last), aten._fft_c2r(x, dims, 0, last))
    assert_native("aten._fft_c2c.default", "aten._fft_r2c.default", "aten._fft_c2r.default")


def test_c2r_non_hermitian_input():
    """c2r ignores the imaginary parts of the DC (and Nyquist) terms, as CPU does."""
    x = _data((4, 6), torch.complex64, seed=3)
    for n in (10, 11):
        _assert_same(torch.fft.irfft(_on_device(x), n=n), torch.fft.irfft(x, n=n))
        _assert_same(torch.fft.irfftn(_on_device(x), s=(4, n)), torch.fft.irfftn(x, s=(4, n)))


def test_out_variants():
    x = _data((5, 6, 7), torch.float32)
    xc = _data((5, 6, 7), torch.complex64)
    for fn, inp, dtype in ((torch.fft.rfft, x, torch.complex64), (torch.fft.fft2, xc, torch.complex64),
                           (torch.fft.irfftn, xc, torch.float32)):
        out = torch.empty(0, dtype=dtype, device=DEV)
        ref = fn(inp, norm="ortho", out=torch.empty(0, dtype=dtype))
        res = fn(_on_device(inp), norm="ortho", out=out)
        assert res is out
        _assert_same(out, ref)


@pytest.mark.parametrize("fn,is_complex,kwargs", [
    (torch.fft.rfft, False, {"n": 9, "dim": 1}),
    (torch.fft.irfft, True, {"n": 7}),
    (torch.fft.fft2, True, {"s": (3, 9), "norm": "ortho"}),
    (torch.fft.hfftn, True, {"dim": (0, 1), "norm": "forward"}),
    (torch.fft.ihfft2, False, {}),
])
def test_gradients(fn, is_complex, kwargs):
    x = _data((4, 5, 6), torch.complex64 if is_complex else torch.float32, seed=1)
    xc = x.clone().requires_grad_()
    xd = _on_device(x).requires_grad_()
    yc, yd = fn(xc, **kwargs), fn(xd, **kwargs)
    g = _data(yc.shape, yc.dtype, seed=2)
    (yc * g).real.sum().backward() if yc.is_complex() else (yc * g).sum().backward()
    gd = _on_device(g)
    (yd * gd).real.sum().backward() if yd.is_complex() else (yd * gd).sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)


def test_stft_istft():
    """stft pads with reflection (its backward is reflection_pad1d_backward's out overload)."""
    window = torch.hann_window(10, dtype=torch.float64)
    x = _data((2, 60), torch.float64, seed=4)
    xc, xd = x.clone().requires_grad_(), _on_device(x).requires_grad_()
    yc = torch.stft(xc, n_fft=10, window=window, return_complex=True)
    yd = torch.stft(xd, n_fft=10, window=_on_device(window), return_complex=True)
    _assert_same(yd, yc)
    yc.abs().sum().backward()
    yd.abs().sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=1e-10, atol=1e-10)
    zc = torch.istft(yc.detach(), n_fft=10, window=window, length=60)
    zd = torch.istft(yd.detach(), n_fft=10, window=_on_device(window), length=60)
    _assert_same(zd, zc)


def test_expanded_input_layouts():
    """Ties between stride-0 batch dimensions are ordered as CPU's std::partition leaves them."""
    aten = torch.ops.aten
    base = _data((7, 1, 1), torch.complex128)
    x, xd = base.expand(7, 4, 5), _on_device(base).expand(7, 4, 5)
    _assert_same(aten._fft_c2c(xd, [0], 0, True), aten._fft_c2c(x, [0], 0, True))
    base = _data((1, 4, 1, 1), torch.float64)
    x, xd = base.expand(3, 4, 5, 6), _on_device(base).expand(3, 4, 5, 6)
    _assert_same(aten._fft_r2c(xd, [1], 0, True), aten._fft_r2c(x, [1], 0, True))
    _assert_same(aten._fft_c2r(xd.to(torch.complex128), [3, 1], 0, 6),
                 aten._fft_c2r(x.to(torch.complex128), [3, 1], 0, 6))


def test_empty_input_raises_like_cpu():
    """CPU (MKL) refuses to transform an empty batch; a clone for no dimensions is fine."""
    aten = torch.ops.aten
    x = torch.empty(0, 6, dtype=torch.complex64)
    with pytest.raises(RuntimeError):
        aten._fft_c2c(x, [1], 0, True)
    with pytest.raises(RuntimeError):
        aten._fft_c2c(x.to(DEV), [1], 0, True)
    with pytest.raises(RuntimeError):
        torch.fft.rfft(torch.empty(0, 6, device=DEV))
    assert aten._fft_c2c(x.to(DEV), [], 0, True).shape == (0, 6)
