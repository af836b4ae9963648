"""Non-float32 dtypes against CPU PyTorch: half/bfloat16 computed in float32 like CPU's kernels
("opmath"), integer pow/gcd/lcm semantics, bool variants, dtype-specific kernels CPU runs
(adaptive_avg_pool3d's half accumulation, layer norm's half statistics), complex logaddexp.
Every test runs with TORCHNEURON_STRICT=1 (no CPU fallback).
"""

from __future__ import annotations

import pytest
import torch
from lowering_checks import assert_native

import torchneuron

DEV = "neuron"
HALF = [torch.float16, torch.bfloat16]
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
pytestmark = pytest.mark.usefixtures("strict")  # tests/lowerings/conftest.py


def _every_half(dtype: torch.dtype) -> torch.Tensor:
    """Every finite, normal value of a 16-bit float type (XLA's CPU flushes float32
    subnormals, which bfloat16 subnormals become, to zero)."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    values = bits.view(dtype)
    magnitude = values.float().abs()
    return values[torch.isfinite(magnitude) & (magnitude >= torch.finfo(dtype).tiny)]


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", ["expm1", "log2", "sigmoid", "asinh", "sinc"])
def test_half_unary_rounds_once(name, dtype):
    # XLA computes these in the half type with less accurate expansions; CPU rounds the float32
    # result once. On every value they must agree to within the OpInfo tolerance.
    x = _every_half(dtype)
    fn = getattr(torch, name)
    torch.testing.assert_close(fn(x.to(DEV)).cpu(), fn(x), equal_nan=True)


@pytest.mark.parametrize("dtype", HALF)
def test_half_composites_match_cpu_exactly(dtype):
    torch.manual_seed(0)
    x, y = torch.randn(64, 64, dtype=dtype) * 4, torch.randn(64, 64, dtype=dtype)
    xd, yd = x.to(DEV), y.to(DEV)
    F = torch.nn.functional
    for fn in (F.hardswish, F.hardsigmoid, F.mish, F.softplus, F.elu, F.silu):
        assert torch.equal(fn(xd).cpu(), fn(x)), fn
    # Scalars stay in float32 in CPU's kernels (add/sub, which round alpha and a Python
    # number to the half type first, are still an ulp off here: within the tolerance)
    assert torch.equal((xd * 0.3).cpu(), x * 0.3)
    assert torch.equal(torch.addcmul(xd, yd, yd, value=0.3).cpu(), torch.addcmul(x, y, y, value=0.3))
    assert torch.equal(torch.lerp(xd, yd, 0.3).cpu(), torch.lerp(x, y, 0.3))
    assert torch.equal(F.leaky_relu(xd, 0.3).cpu(), F.leaky_relu(x, 0.3))
    assert_native("aten.hardswish.default", "aten.mul.Tensor")


@pytest.mark.parametrize("dtype", INTS)
def test_integer_pow_negative_and_wrapping_exponents(dtype):
    lo = 0 if dtype == torch.uint8 else -5
    base = torch.arange(lo, 8, dtype=torch.int64).to(dtype)
    exps = torch.tensor([0, 1, 2, 3, 5, 7, 31, 62, 63, 100], dtype=torch.int64)
    if dtype != torch.uint8:
        exps = torch.cat([torch.tensor([-3, -2, -1]), exps])
    exps = exps.to(dtype)
    b, e = torch.broadcast_tensors(base[:, None], exps[None, :])
    assert torch.equal((b.to(DEV) ** e.to(DEV)).cpu(), b ** e)
    assert torch.equal((3 ** e.to(DEV)).cpu(), 3 ** e)  # __rpow__
    assert torch.equal((b.to(DEV) ** 5).cpu(), b ** 5)
    assert_native("aten.pow.Tensor_Tensor")


@pytest.mark.parametrize("dtype", INTS)
def test_gcd_lcm(dtype):
    info = torch.iinfo(dtype)
    values = [0, 1, 2, 3, 7, 12, 18, 100, info.max]
    if info.min < 0:
        values += [-1, -2, -5, -18, -128]
    v = torch.tensor(values, dtype=torch.int64).to(dtype)
    a, b = torch.broadcast_tensors(v[:, None], v[None, :])
    assert torch.equal(torch.gcd(a.to(DEV), b.to(DEV)).cpu(), torch.gcd(a, b))
    # 8/16-bit lcm is computed in int (C++ promotion) and wraps when stored
    assert torch.equal(torch.lcm(a.to(DEV), b.to(DEV)).cpu(), torch.lcm(a, b))
    assert_native("aten.gcd.default", "aten.lcm.default")


def test_gcd_int_min_terminates():
    a = torch.tensor([-(2**31), -(2**31), 12], dtype=torch.int32)
    b = torch.tensor([12, -(2**31), 0], dtype=torch.int32)
    assert torch.equal(torch.gcd(a.to(DEV), b.to(DEV)).cpu(), torch.gcd(a, b))


def test_bool_sign_sgn_scatter_add():
    x = torch.tensor([True, False, True])
    assert torch.equal(torch.sgn(x.to(DEV)).cpu(), torch.sgn(x))
    assert torch.equal(torch.sign(x.to(DEV)).cpu(), torch.sign(x))
    torch.manual_seed(0)
    target = torch.zeros(10, 5, dtype=torch.bool)
    index = torch.randint(0, 10, (5, 5))
    src = torch.rand(5, 5) > 0.5
    got = torch.scatter_add(target.to(DEV), 0, index.to(DEV), src.to(DEV)).cpu()
    assert torch.equal(got, torch.scatter_add(target, 0, index, src))
    ones = torch.ones(10, 5, dtype=torch.bool)
    got = ones.to(DEV).scatter(0, index.to(DEV), src.to(DEV), reduce="multiply").cpu()
    assert torch.equal(got, ones.scatter(0, index, src, reduce="multiply"))


@pytest.mark.parametrize("dtype", HALF)
def test_layer_norm_half_statistics_dtype(dtype):
    torch.manual_seed(0)
    x, w = torch.randn(3, 8, dtype=dtype), torch.randn(8, dtype=dtype)
    expected = torch.ops.aten.native_layer_norm(x, [8], w, w, 1e-5)
    got = torch.ops.aten.native_layer_norm(x.to(DEV), [8], w.to(DEV), w.to(DEV), 1e-5)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g.cpu(), e)
    # float32 parameters ("mixed type"): float32 statistics
    got = torch.ops.aten.native_layer_norm(x.to(DEV), [8], w.float().to(DEV), None, 1e-5)
    assert got[1].dtype == torch.float32


@pytest.mark.parametrize("dtype", HALF)
def test_adaptive_avg_pool3d_half_matches_cpu_exactly(dtype):
    torch.manual_seed(0)
    x = torch.randn(2, 8, 8, 8, dtype=dtype) * 2
    F = torch.nn.functional
    assert torch.equal(F.adaptive_avg_pool3d(x.to(DEV), (5, 7, 4)).cpu(),
                       F.adaptive_avg_pool3d(x, (5, 7, 4)))
    assert_native("aten._adaptive_avg_pool3d.default")


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_logaddexp_branch(dtype):
    torch.manual_seed(0)
    x, y = torch.randn(40, dtype=dtype) * 3, torch.randn(40, dtype=dtype) * 3
    inf, nan = float("inf"), float("nan")
    x[0], y[0] = complex(inf, 1), complex(inf, 2)
    x[1], y[1] = complex(-inf, 1), complex(-inf, 2)
    x[2] = complex(nan, 0)
    got = torch.logaddexp(x.to(DEV), y.to(DEV)).cpu()
    torch.testing.assert_close(got, torch.logaddexp(x, y), equal_nan=True)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("eps", [None, 0.2, 1e-3])
def test_half_logit_rounds_each_step_like_cpu(dtype, eps):
    # CPU's logit kernel runs in the half type (eps, 1 - eps, 1 - x, the division and the log
    # each round to it); float32 opmath or XLA's half arithmetic differ on thousands of values.
    x = _every_half(dtype)
    x_dev = x.to(DEV)
    torch.testing.assert_close(torch.logit(x_dev, eps).cpu(), torch.logit(x, eps),
                               equal_nan=True, atol=0, rtol=0)
    y = x_dev.clone()
    y.logit_(eps)
    torch.testing.assert_close(y.cpu(), torch.logit(x, eps), equal_nan=True, atol=0, rtol=0)
    assert_native("aten.logit.default")


def test_integer_logit_inplace_raises_like_cpu(monkeypatch):
    monkeypatch.delenv("TORCHNEURON_STRICT")
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ones(3, dtype=torch.int32, device=DEV).logit_()
    torch.testing.assert_close(torch.logit(torch.arange(3, device=DEV)).cpu(),
                               torch.logit(torch.arange(3)), equal_nan=True)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", ["addmm", "baddbmm", "addbmm", "addmv"])
def test_integer_blas_truncates_alpha_beta(op, dtype):
    # CPU converts alpha/beta to the integer type (0.2 -> 0, 2.9 -> 2) and wraps the sum; a
    # float beta must not promote the computation to float32 (which saturated on the way back).
    shapes = {"addmm": ((5, 3), (5, 10), (10, 3)), "baddbmm": ((2, 5, 3), (2, 5, 10), (2, 10, 3)),
              "addbmm": ((5, 3), (2, 5, 10), (2, 10, 3)), "addmv": ((5,), (5, 10), (10,))}[op]
    torch.manual_seed(0)
    args = [torch.randint(0, 9, s, dtype=dtype) for s in shapes]
    fn = getattr(torch, op)
    for beta, alpha in ((0.2, 0.6), (1.7, 2.9), (3, -2) if dtype != torch.uint8 else (3, 2)):
        got = fn(*[a.to(DEV) for a in args], beta=beta, alpha=alpha).cpu()
        assert torch.equal(got, fn(*args, beta=beta, alpha=alpha)), (beta, alpha)
    assert_native(f"aten.{op}.default")


def test_integer_blas_out_of_range_scalar_raises_like_cpu(monkeypatch):
    monkeypatch.delenv("TORCHNEURON_STRICT")
    args = [torch.ones(s, dtype=torch.uint8, device=DEV) for s in ((5,), (5, 10), (10,))]
    with pytest.raises(RuntimeError, match="overflow"):
        torch.addmv(*args, beta=-1.5)


@pytest.mark.parametrize("dtype", HALF)
def test_half_addr_and_addbmm_round_like_cpu(dtype):
    # addr rounds alpha, beta and every step to the half type; addbmm rounds the running sum
    # after each batch (one addmm per batch).
    torch.manual_seed(0)
    s, u, v = torch.randn(50, 60, dtype=dtype), torch.randn(50, dtype=dtype), torch.randn(60, dtype=dtype)
    for beta, alpha in ((0.2, 0.6), (1.7, 2.9), (0, 1)):
        got = torch.addr(s.to(DEV), u.to(DEV), v.to(DEV), beta=beta, alpha=alpha).cpu()
        assert torch.equal(got, torch.addr(s, u, v, beta=beta, alpha=alpha)), (beta, alpha)
    b, x, y = torch.randn(5, 3, dtype=dtype), torch.randn(4, 5, 10, dtype=dtype), torch.randn(4, 10, 3, dtype=dtype)
    for beta, alpha in ((0.2, 0.6), (0, 1), (1, 1)):
        got = torch.addbmm(b.to(DEV), x.to(DEV), y.to(DEV), beta=beta, alpha=alpha).cpu()
        assert torch.equal(got, torch.addbmm(b, x, y, beta=beta, alpha=alpha)), (beta, alpha)
    assert_native("aten.addr.default", "aten.addbmm.default")


def test_uint8_bilinear_runs_cpu_kernel(monkeypatch):
    # CPU's uint8 bilinear kernel is fixed-point; the float lowering does not reproduce it, so
    # uint8 calls go to CPU (values equal), float calls stay native.
    monkeypatch.delenv("TORCHNEURON_STRICT")
    torch.manual_seed(0)
    x = torch.randint(0, 256, (2, 3, 40, 40), dtype=torch.uint8)
    F = torch.nn.functional
    for size in ((13, 17), (70, 90)):
        got = F.interpolate(x.to(DEV), size=size, mode="bilinear", align_corners=False).cpu()
        assert torch.equal(got, F.interpolate(x, size=size, mode="bilinear", align_corners=False))
        got = F.interpolate(x.to(DEV), size=size, mode="bicubic", align_corners=False).cpu()
        assert torch.equal(got, F.interpolate(x, size=size, mode="bicubic", align_corners=False))
    # CPU keeps a channels_last input's layout: so does the CPU path here
    xc = x.contiguous(memory_format=torch.channels_last)
    got = F.interpolate(xc.to(DEV), size=(13, 17), mode="bilinear")
    assert got.stride() == F.interpolate(xc, size=(13, 17), mode="bilinear").stride()
    torchneuron.reset_op_counts()
    F.interpolate(x.float().to(DEV), size=(13, 17), mode="bilinear")
    assert_native("aten.upsample_bilinear2d.default")


def test_zero_tensor_gradient():
    # sgn's derivative for real inputs is an efficient zero tensor: created natively, and a
    # CPU ZeroTensor reaching the device (no storage) is read as zeros.
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    x_dev = x.detach().to(DEV).requires_grad_()
    torch.sgn(x_dev).sum().backward()
    assert torch.equal(x_dev.grad.cpu(), torch.zeros(6, dtype=torch.float64))
    assert torch.equal(torch._efficientzerotensor(3, device="cpu").to(DEV).cpu(), torch.zeros(3))
    assert_native("aten._efficientzerotensor.default")


@pytest.mark.parametrize("dtype", HALF)
def test_half_cross_rounds_each_product(dtype):
    # CPU's cross kernel rounds both products and their difference to the half type.
    torch.manual_seed(0)
    a, b = torch.randn(3, 400, dtype=dtype), torch.randn(3, 400, dtype=dtype)
    assert torch.equal(torch.linalg.cross(a.to(DEV), b.to(DEV), dim=0).cpu(), torch.linalg.cross(a, b, dim=0))
    assert torch.equal(torch.cross(a.T.to(DEV), b.T.to(DEV), dim=1).cpu(), torch.cross(a.T, b.T, dim=1))
    assert_native("aten.linalg_cross.default")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("training", [True, False])
def test_native_batch_norm_out_like_cpu(monkeypatch, dtype, training):
    # Half types and evaluation mode (CPU leaves save_mean/save_invstd empty) take CPU's kernel.
    monkeypatch.delenv("TORCHNEURON_STRICT")
    torch.manual_seed(0)
    x = torch.randn(4, 3, 8, 8, dtype=dtype)
    w, b, rm = (torch.randn(3, dtype=dtype) for _ in range(3))
    rv = torch.rand(3, dtype=dtype)

    def run(device):
        outs = [torch.empty(0, dtype=dtype, device=device) for _ in range(3)]
        args = [t.to(device) for t in (x, w, b, rm, rv)]
        torch.ops.aten.native_batch_norm.out(*args, training, 0.1, 1e-5, out=outs[0],
                                             save_mean=outs[1], save_invstd=outs[2])
        return [o.cpu() for o in outs] + [args[3].cpu(), args[4].cpu()]

    for got, expected in zip(run(DEV), run("cpu"), strict=True):
        torch.testing.assert_close(got, expected, atol=0 if dtype != torch.float32 else None,
                                   rtol=0 if dtype != torch.float32 else None)


def test_integer_base_with_floating_exponent_is_floating_pow():
    # pow.Scalar(10, float tensor) is what logspace computes: float pow, not integer pow.
    exps = torch.tensor([0.0, 0.5, 1.5, -1.0])
    torch.testing.assert_close(torch.pow(10, exps.to("neuron")).cpu(), torch.pow(10, exps))
    torch.testing.assert_close(torch.logspace(0, 2, 5, device="neuron").cpu(), torch.logspace(0, 2, 5))
    base = torch.tensor([2, 3, -4])
    torch.testing.assert_close(torch.pow(base.to("neuron"), 2.5).cpu(), torch.pow(base, 2.5),
                               equal_nan=True)
