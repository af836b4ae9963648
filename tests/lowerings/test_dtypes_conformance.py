"""Non-float32 dtypes against CPU PyTorch: half/bfloat16 computed in float32 like CPU's kernels
("opmath"), integer pow/gcd/lcm semantics, bool variants, dtype-specific kernels CPU runs
(adaptive_avg_pool3d's half accumulation, layer norm's half statistics), complex logaddexp.
Every test runs with TORCHNEURON_STRICT=1 (no CPU fallback).
"""

from __future__ import annotations

import pytest
import torch
from half_reference import (
    FLOAT32_ROUNDING,
    ambiguous,
    assert_matches_reference,
    assert_rounded_once,
    round_to,
)
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


def _f32(value: float) -> float:
    """A Python scalar as CPU's opmath kernels hold it: rounded to float32."""
    return torch.tensor(value, dtype=torch.float32).item()


@pytest.mark.parametrize("dtype", HALF)
def test_half_composites_round_once_from_float32(dtype):
    # CPU's vectorized kernels compute half inputs in float32 ("opmath"), keep Python scalars
    # in float32 and round the result once; so must the device. The reference is the float64
    # value rounded once, not CPU's half result: that depends on the kernel CPU dispatches to
    # (its DEFAULT capability rounds the scalar of x * 0.3 to the half type first).
    torch.manual_seed(0)
    x, y = torch.randn(64, 64, dtype=dtype) * 4, torch.randn(64, 64, dtype=dtype)
    xd, yd = x.to(DEV), y.to(DEV)
    X, Y = x.double(), y.double()
    F = torch.nn.functional
    s = _f32(0.3)
    # noise: float32 rounding of the kernel's arithmetic, scaled by the operands (a few
    # roundings for rational ops, 16 for XLA's float32 exp/log/tanh expansions)
    rational, transcendental = 4 * FLOAT32_ROUNDING, 16 * FLOAT32_ROUNDING
    cases = {
        "hardswish": (F.hardswish(xd), F.hardswish(X), rational * F.hardswish(X).abs()),
        "hardsigmoid": (F.hardsigmoid(xd), F.hardsigmoid(X), rational * F.hardsigmoid(X)),
        "mish": (F.mish(xd), F.mish(X), transcendental * F.mish(X).abs()),
        "softplus": (F.softplus(xd), F.softplus(X), transcendental * F.softplus(X)),
        "elu": (F.elu(xd), F.elu(X), transcendental * F.elu(X).abs()),
        "silu": (F.silu(xd), F.silu(X), transcendental * F.silu(X).abs()),
        "mul": (xd * 0.3, X * s, rational * X.abs()),
        "addcmul": (torch.addcmul(xd, yd, yd, value=0.3), X + s * Y * Y,
                    rational * (X.abs() + Y * Y)),
        "lerp": (torch.lerp(xd, yd, 0.3), X + s * (Y - X), rational * (X.abs() + Y.abs())),
        "leaky_relu": (F.leaky_relu(xd, 0.3), torch.where(X > 0, X, X * s), rational * X.abs()),
    }
    for name, (got, exact, noise) in cases.items():
        assert got.dtype == dtype, name
        assert_rounded_once(got, exact, noise, max_unsure=0.05)
    # The check can fail: the scalar rounded to the half type first is another result.
    with pytest.raises(AssertionError, match="differ from the reference"):
        assert_rounded_once(x * torch.tensor(0.3, dtype=dtype), X * s, rational * X.abs())
    torch.testing.assert_close((xd * 0.3).cpu(), x * 0.3)  # CPU, to the dtype's tolerance
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
    # CPU's kernel is the same on every host here: additions in a fixed order and divisions,
    # each rounded to the half type, with no multiply-add a compiler could fuse (its DEFAULT,
    # AVX2 and AVX512 builds agree bit for bit, and so did a host with native float16).
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


def _logit_every_step(x: torch.Tensor, eps: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU's logit kernel for half types, in float64: eps and 1 - eps (the clamp bounds), 1 - x
    and the division each rounded to x's dtype, then the log of the ratio. Returns the
    float64 log and where its float32 computation can round either way."""
    dtype = x.dtype
    ratio_in = x.double()
    if eps is not None:
        lo = round_to(torch.tensor(eps, dtype=torch.float64), dtype)
        ratio_in = ratio_in.clamp(lo, round_to(1 - lo, dtype))
    ratio = round_to(ratio_in / round_to(1 - ratio_in, dtype), dtype)
    log = ratio.log()
    return log, ambiguous(log, 4 * FLOAT32_ROUNDING * log.abs(), dtype)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("eps", [None, 0.2, 1e-3])
def test_half_logit_rounds_each_step_like_cpu(dtype, eps):
    # CPU's logit kernel runs in the half type (eps, 1 - eps, 1 - x, the division and the log
    # each round to it); float32 opmath or XLA's half arithmetic differ on thousands of values.
    # Reference: those steps emulated in float64 (CPU's own result depends on its kernel: the
    # AVX2 and AVX512 builds differ on a few values).
    x = _every_half(dtype)
    x_dev = x.to(DEV)
    log, unsure = _logit_every_step(x, eps)
    expected = log.to(dtype)
    assert_matches_reference(torch.logit(x_dev, eps), expected, unsure, max_unsure=0.01)
    y = x_dev.clone()
    y.logit_(eps)
    assert_matches_reference(y, expected, unsure, max_unsure=0.01)
    # The check can fail: rounding once from float64 is another result.
    once = torch.logit(x.double(), eps).to(dtype)
    assert ((once != expected) & ~unsure & ~once.isnan()).sum() > 100
    torch.testing.assert_close(torch.logit(x_dev, eps).cpu(), torch.logit(x, eps), equal_nan=True)
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


def _addr_every_step(s, u, v, beta, alpha):
    """CPU's addr kernel for half types, in float64: alpha and beta rounded to the half type,
    then alpha*u, (alpha*u)*v, beta*self and the sum, each rounded (one exact or correctly
    rounded operation on two half values per step)."""
    dtype = s.dtype

    def r(t):
        return round_to(t, dtype)

    a, b = r(torch.tensor(alpha, dtype=torch.float64)), r(torch.tensor(beta, dtype=torch.float64))
    product = r(r(a * u.double())[:, None] * v.double()[None, :])
    return product if beta == 0 else r(r(b * s.double()) + product)


def _addbmm_every_batch(bias, x, y, beta, alpha):
    """CPU's addbmm for half types, in float64: one addmm per batch (a float32 matrix product,
    scaled by the float32 alpha and added to beta * the running sum), the running sum rounded
    to the half type after each batch. Returns the float64 sum and where float32 rounding in
    some batch could have rounded it the other way."""
    dtype = bias.dtype
    a = _f32(alpha)
    total = bias.double()
    unsure = torch.zeros(bias.shape, dtype=torch.bool)
    for i in range(x.shape[0]):
        xi, yi = x[i].double(), y[i].double()
        b = _f32(beta) if i == 0 else 1.0
        scaled_total = b * total if b != 0 else torch.zeros_like(total)
        exact = scaled_total + a * (xi @ yi)
        # the float32 dot of length K is off by at most K roundings of sum |x||y|, plus the
        # scaling and the addition
        k = xi.shape[-1]
        noise = FLOAT32_ROUNDING * ((k + 2) * abs(a) * (xi.abs() @ yi.abs()) + 2 * scaled_total.abs())
        unsure |= ambiguous(exact, noise, dtype)
        total = round_to(exact, dtype)
    return total, unsure


@pytest.mark.parametrize("dtype", HALF)
def test_half_addr_and_addbmm_round_like_cpu(dtype):
    # addr rounds alpha, beta and every step to the half type; addbmm rounds the running sum
    # after each batch (one addmm per batch). Reference: those steps emulated in float64. CPU's
    # own half result depends on the host (its DEFAULT build associates addr differently, and
    # processors with native float16 arithmetic fuse its multiply-adds), so CPU is compared to
    # the dtype's tolerance only.
    torch.manual_seed(0)
    s, u, v = torch.randn(50, 60, dtype=dtype), torch.randn(50, dtype=dtype), torch.randn(60, dtype=dtype)
    none = torch.zeros(s.shape, dtype=torch.bool)
    for beta, alpha in ((0.2, 0.6), (1.7, 2.9), (0, 1)):
        got = torch.addr(s.to(DEV), u.to(DEV), v.to(DEV), beta=beta, alpha=alpha)
        expected = _addr_every_step(s, u, v, beta, alpha)
        assert_matches_reference(got, expected.to(dtype), none)
        torch.testing.assert_close(got.cpu(), torch.addr(s, u, v, beta=beta, alpha=alpha))
        if beta != 0:  # the check can fail: rounding once is another result
            once = (beta * s.double() + alpha * torch.outer(u.double(), v.double())).to(dtype)
            assert (once != expected.to(dtype)).sum() > 50, (beta, alpha)
    b, x, y = torch.randn(5, 3, dtype=dtype), torch.randn(4, 5, 10, dtype=dtype), torch.randn(4, 10, 3, dtype=dtype)
    for beta, alpha in ((0.2, 0.6), (0, 1), (1, 1)):
        got = torch.addbmm(b.to(DEV), x.to(DEV), y.to(DEV), beta=beta, alpha=alpha)
        expected, unsure = _addbmm_every_batch(b, x, y, beta, alpha)
        assert_matches_reference(got, expected.to(dtype), unsure, max_unsure=0.1)
        torch.testing.assert_close(got.cpu(), torch.addbmm(b, x, y, beta=beta, alpha=alpha))
        # the check can fail: one rounding after the whole sum is another result
        once = (beta * b.double() + alpha * (x.double() @ y.double()).sum(0)).to(dtype)
        assert (once != expected.to(dtype)).sum() >= 3, (beta, alpha)
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


def _cross_every_step(a: torch.Tensor, b: torch.Tensor, dim: int) -> torch.Tensor:
    """CPU's cross kernel for half types, in float64: both products and their difference
    rounded to the half type (each an exact or correctly rounded operation on half values)."""
    dtype = a.dtype
    a, b = a.double().movedim(dim, -1), b.double().movedim(dim, -1)
    i, j = [1, 2, 0], [2, 0, 1]
    first, second = round_to(a[..., i] * b[..., j], dtype), round_to(a[..., j] * b[..., i], dtype)
    return round_to(first - second, dtype).movedim(-1, dim)


@pytest.mark.parametrize("dtype", HALF)
def test_half_cross_rounds_each_product(dtype):
    # CPU's cross kernel rounds both products and their difference to the half type. The
    # reference emulates that in float64: CPU's own float16 result differs on processors with
    # native float16 arithmetic (a few elements an ulp apart), so CPU is compared to the
    # dtype's tolerance only.
    torch.manual_seed(0)
    a, b = torch.randn(3, 400, dtype=dtype), torch.randn(3, 400, dtype=dtype)
    none = torch.zeros(a.shape, dtype=torch.bool)
    expected = _cross_every_step(a, b, 0).to(dtype)
    assert_matches_reference(torch.linalg.cross(a.to(DEV), b.to(DEV), dim=0), expected, none)
    assert_matches_reference(torch.cross(a.T.to(DEV), b.T.to(DEV), dim=1), expected.T, none.T)
    # the check can fail: the difference of the unrounded products is another result
    once = torch.linalg.cross(a.double(), b.double(), dim=0).to(dtype)
    assert (once != expected).sum() > 20
    torch.testing.assert_close(torch.linalg.cross(a.to(DEV), b.to(DEV), dim=0).cpu(),
                               torch.linalg.cross(a, b, dim=0))
    assert_native("aten.linalg_cross.default")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("training", [True, False])
def test_native_batch_norm_out_like_cpu(monkeypatch, dtype, training):
    # Half types and evaluation mode (CPU leaves save_mean/save_invstd empty) take CPU's kernel
    # on the device too, so the bit equality below compares CPU's kernel with itself on one host.
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
