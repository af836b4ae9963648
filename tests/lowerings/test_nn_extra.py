"""Lowerings of lowerings/nn_extra.py against CPU PyTorch: values and gradients.

Every test runs with TORCHNEURON_STRICT=1 (no CPU fallback); `assert_native` checks that the
named ops ran through their lowering.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from lowering_checks import assert_native

DEV = "neuron"

pytestmark = pytest.mark.usefixtures("strict")  # tests/lowerings/conftest.py


def _tol(dtype):
    return {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-10, "rtol": 1e-9}


def _compare(fn, *inputs, grad=(), dtype=torch.float32, exact=False):
    """fn on CPU and on neuron with the same inputs: outputs and the gradients of the inputs
    at positions `grad` (backward with a random output gradient)."""
    tol = {"atol": 0, "rtol": 0} if exact else _tol(dtype)
    cpu_in, dev_in = [], []
    for i, t in enumerate(inputs):
        if isinstance(t, torch.Tensor):
            t = t.to(dtype) if t.is_floating_point() else t
            cpu_in.append(t.detach().clone().requires_grad_(i in grad))
            dev_in.append(t.detach().clone().to(DEV).requires_grad_(i in grad))
        else:
            cpu_in.append(t)
            dev_in.append(t)
    out_c, out_d = fn(*cpu_in), fn(*dev_in)
    outs_c = out_c if isinstance(out_c, tuple) else (out_c,)
    outs_d = out_d if isinstance(out_d, tuple) else (out_d,)
    for c, d in zip(outs_c, outs_d, strict=True):
        torch.testing.assert_close(d.cpu(), c, **tol)
    if grad:
        g = torch.randn_like(outs_c[0])
        gc = torch.autograd.grad(outs_c[0], [cpu_in[i] for i in grad], g)
        gd = torch.autograd.grad(outs_d[0], [dev_in[i] for i in grad], g.to(DEV))
        for c, d in zip(gc, gd, strict=True):
            torch.testing.assert_close(d.cpu(), c, **_tol(dtype))


def _r(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---- resampling -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size,scale,align", [
    ((7, 9), None, False), ((3, 2), None, True), ((4, 11), None, True), (None, 1.7, False),
    (None, 0.6, False), ((5, 6), None, False),
])
def test_bicubic_grad(dtype, size, scale, align):
    fn = lambda x: F.interpolate(x, size=size, scale_factor=scale, mode="bicubic",  # noqa: E731
                                 align_corners=align)
    _compare(fn, _r(2, 3, 5, 6), grad=(0,), dtype=dtype)
    assert_native("aten.upsample_bicubic2d_backward.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size,scale,align", [
    ((3, 4), None, False), ((2, 9), None, True), ((13, 5), None, False), (None, 0.45, False),
    (None, 2.3, True), ((1, 1), None, False),
])
def test_bilinear_aa(dtype, size, scale, align):
    fn = lambda x: F.interpolate(x, size=size, scale_factor=scale, mode="bilinear",  # noqa: E731
                                 align_corners=align, antialias=True)
    _compare(fn, _r(2, 3, 8, 7), grad=(0,), dtype=dtype)
    assert_native("aten._upsample_bilinear2d_aa.default",
                  "aten._upsample_bilinear2d_aa_backward.default")


# ---- hash_tensor ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.int64,
                                   torch.int8, torch.uint8, torch.bool])
def test_hash_tensor(dtype):
    x = (_r(3, 4, 5) * 50).to(dtype)
    x.view(-1)[3] = 0
    _compare(torch.hash_tensor, x, exact=True)
    _compare(lambda t: torch.hash_tensor(t, [0, 2], keepdim=True), x, exact=True)
    _compare(lambda t: torch.hash_tensor(t, 1), x, exact=True)
    assert_native("aten.hash_tensor.default")


def test_hash_tensor_scalar():
    _compare(lambda t: torch.hash_tensor(t, 0, keepdim=True), torch.tensor(2.5), exact=True)
    _compare(torch.hash_tensor, torch.tensor(-7), exact=True)


def test_hash_tensor_nan():
    _compare(torch.hash_tensor, torch.tensor([float("nan"), -0.0, float("inf"), 1.5]), exact=True)


# ---- grid sampling --------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_2d_grad(mode, padding, align):
    x, grid = _r(2, 3, 5, 6), _r(2, 4, 7, 2, seed=1) * 1.4
    fn = lambda a, g: F.grid_sample(a, g, mode=mode, padding_mode=padding,  # noqa: E731
                                    align_corners=align)
    # Bicubic gradients with respect to the grid are sums of 16 terms that nearly cancel: in
    # float32 they differ from CPU's by the summation order (1e-5 on values near 0), so they
    # are compared in float64, where the order does not show.
    _compare(fn, x, grid, grad=(0, 1), dtype=torch.float64 if mode == "bicubic" else torch.float32)
    assert_native("aten.grid_sampler_2d_backward.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_3d(dtype, mode, padding, align):
    x, grid = _r(2, 3, 4, 5, 6), _r(2, 3, 4, 2, 3, seed=1) * 1.4
    fn = lambda a, g: F.grid_sample(a, g, mode=mode, padding_mode=padding,  # noqa: E731
                                    align_corners=align)
    _compare(fn, x, grid, grad=(0, 1), dtype=dtype)
    assert_native("aten.grid_sampler_3d.default", "aten.grid_sampler_3d_backward.default")


# ---- fractional max pooling (random_samples given, so CPU's result is deterministic) --------


@pytest.mark.parametrize("nd,shape,kernel,out", [
    (2, (2, 3, 9, 11), 2, 4), (2, (3, 7, 8), 3, 3), (3, (2, 2, 5, 6, 7), 2, 3), (3, (2, 6, 7, 5), 1, 4),
])
def test_fractional_max_pool(nd, shape, kernel, out):
    op = torch.ops.aten.fractional_max_pool2d if nd == 2 else torch.ops.aten.fractional_max_pool3d
    x = _r(*shape)
    x.view(-1)[::7] = float("nan")
    samples = torch.rand(shape[0] if len(shape) == nd + 2 else 1, shape[-nd - 1], nd,
                         generator=torch.Generator().manual_seed(1))
    xc, xd = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    oc, ic = op(xc, [kernel] * nd, [out] * nd, samples)
    od, idd = op(xd, [kernel] * nd, [out] * nd, samples.to(DEV))
    torch.testing.assert_close(od.cpu(), oc, equal_nan=True, atol=0, rtol=0)
    assert torch.equal(idd.cpu(), ic)
    g = torch.randn_like(oc)
    torch.testing.assert_close(torch.autograd.grad(od, xd, g.to(DEV))[0].cpu(),
                               torch.autograd.grad(oc, xc, g)[0])
    assert_native(f"aten.fractional_max_pool{nd}d.default",
                  f"aten.fractional_max_pool{nd}d_backward.default")
