"""Special-function lowerings (lowerings/special.py) against CPU PyTorch, float32 and float64,
over ordinary arguments and the edges CPU special-cases (zeros, poles, infinities, NaN, the
ends of the polynomials' intervals, non-integer and negative degrees). Every test runs with
TORCHNEURON_STRICT=1 (no CPU fallback).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from lowering_checks import assert_native

DEV = "neuron"
S = torch.special
pytestmark = pytest.mark.usefixtures("strict")  # tests/lowerings/conftest.py

INF, NAN = float("inf"), float("nan")
EDGES = [0.0, -0.0, 1e-6, -1e-6, 1.0, -1.0, 2.0, 2.09, -2.09, 4.99, 5.01, 8.0, 8.33, 26.6,
         -6.1, -26.7, 104.0, 700.0, -700.0, 1e5, INF, -INF, NAN]


def _grid(lo: float, hi: float, dtype: torch.dtype) -> torch.Tensor:
    return torch.cat([torch.linspace(lo, hi, 401, dtype=torch.float64),
                      torch.tensor(EDGES, dtype=torch.float64)]).to(dtype)


def _tols(dtype):
    return (1.3e-6, 1e-5) if dtype == torch.float32 else (1e-9, 1e-9)


def _check(fn, *args, dtype=torch.float64):
    expected = fn(*args)
    actual = fn(*[a.to(DEV) if isinstance(a, torch.Tensor) else a for a in args])
    rtol, atol = _tols(expected.dtype if expected.dtype.is_floating_point else dtype)
    torch.testing.assert_close(actual.cpu(), expected, rtol=rtol, atol=atol, equal_nan=True)


UNARY = [S.bessel_j0, S.bessel_j1, S.bessel_y0, S.bessel_y1, S.modified_bessel_i0,
         S.modified_bessel_i1, S.modified_bessel_k0, S.modified_bessel_k1,
         S.scaled_modified_bessel_k0, S.scaled_modified_bessel_k1, S.airy_ai,
         S.spherical_bessel_j0, S.i0e, S.i1, S.i1e, S.erfcx, S.log_ndtr, torch.digamma]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fn", UNARY, ids=lambda f: f.__name__)
def test_unary(fn, dtype):
    _check(fn, _grid(-120.0, 120.0, dtype))
    _check(fn, _grid(-6.0, 6.0, dtype))
    assert_native(f"aten.{fn.__name__}.default")


def test_unary_int_promotes():
    x = torch.arange(-20, 21)
    for fn in (S.bessel_j0, S.modified_bessel_k1, S.airy_ai, S.i1e, S.erfcx):
        _check(fn, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ndtri(dtype):
    g = torch.Generator().manual_seed(0)
    p = torch.cat([torch.rand(500, generator=g, dtype=dtype),
                   torch.tensor([0.0, 1.0, -0.1, 1.1, 1e-30, 0.5, NAN], dtype=dtype)])
    _check(S.ndtri, p)


POLYS = ["chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
         "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t",
         "shifted_chebyshev_polynomial_u", "shifted_chebyshev_polynomial_v",
         "shifted_chebyshev_polynomial_w", "hermite_polynomial_h", "hermite_polynomial_he",
         "laguerre_polynomial_l", "legendre_polynomial_p"]
XS = [-9.5, -3.0, -1.5, -1.0, -0.999, -0.7, -0.5, 0.0, 0.2, 0.5, 0.9999, 1.0, 1.3, 7.7, INF, -INF,
      NAN]
NS = [-3.0, -0.5, 0.0, 0.7, 1.0, 1.9, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 13.0, 60.0,
      130.0, NAN, INF]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", POLYS)
def test_polynomial(name, dtype):
    fn = getattr(S, name)
    # float32 recurrences over hundreds of steps drift ~1e-5 from CPU's (FMA contraction
    # differs); the large degrees are checked in float64.
    ns = NS if dtype == torch.float64 else [v for v in NS if not 13 < v < INF]
    x = torch.tensor([a for a, _ in itertools.product(XS, ns)], dtype=dtype)
    n = torch.tensor([b for _, b in itertools.product(XS, ns)], dtype=dtype)
    _check(fn, x, n)
    _check(fn, x[:40], 11)  # n_scalar
    _check(fn, 0.3, n[:20])  # x_scalar
    _check(fn, torch.arange(-4, 5), torch.arange(0, 9))  # integers promote to float32
    assert_native(f"aten.special_{name}.default")


@pytest.mark.parametrize("n", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_polygamma(n, dtype):
    x = torch.cat([torch.linspace(-30, 30, 601, dtype=torch.float64) + 1e-3,
                   torch.tensor([0.0, -0.0, -1.0, -2.0, 1.0, 1e-8, 1e5, -100.5, INF, -INF, NAN],
                                dtype=torch.float64)]).to(dtype)
    _check(lambda t: torch.polygamma(n, t), x)
    assert_native("aten.polygamma.default")


def test_polygamma_and_digamma_grad():
    x = torch.linspace(-3.3, 5.1, 50, dtype=torch.float64)
    for fn in (torch.digamma, lambda t: torch.polygamma(2, t)):
        a = x.clone().requires_grad_()
        b = x.to(DEV).requires_grad_()
        fn(a).sum().backward()
        fn(b).sum().backward()
        torch.testing.assert_close(b.grad.cpu(), a.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zeta(dtype):
    qs = [-3.0, -2.5, -1.0, -0.5, 0.0, 0.3, 1.0, 2.0, 3.5, 10.0, 100.0, NAN, INF]
    xs = [-1.0, 0.0, 0.5, 1.0, 1.0001, 1.5, 2.0, 3.0, 4.5, 10.0, 30.0, NAN, INF]
    x = torch.tensor([a for a, _ in itertools.product(xs, qs)], dtype=dtype)
    q = torch.tensor([b for _, b in itertools.product(xs, qs)], dtype=dtype)
    _check(S.zeta, x, q)
    _check(S.zeta, 2.0, q)
    _check(S.zeta, x, 3.0)
    _check(S.zeta, torch.arange(5), torch.arange(1, 6))


@pytest.mark.parametrize("fn", [torch.igamma, torch.igammac], ids=["igamma", "igammac"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_igamma(fn, dtype):
    vals = [-1.0, 0.0, 1e-3, 0.5, 1.0, 2.5, 20.0, 150.0, 1e4, INF, NAN]
    a = torch.tensor([u for u, _ in itertools.product(vals, vals)], dtype=dtype)
    x = torch.tensor([v for _, v in itertools.product(vals, vals)], dtype=dtype)
    g = torch.Generator().manual_seed(0)
    a = torch.cat([a, torch.rand(300, generator=g, dtype=dtype) * 20])
    x = torch.cat([x, torch.rand(300, generator=g, dtype=dtype) * 20])
    _check(fn, a, x)
    with pytest.raises(NotImplementedError):
        fn(torch.arange(1, 4, device=DEV), torch.arange(3, device=DEV))


def test_out_and_inplace():
    x = torch.linspace(0.1, 9, 24).reshape(4, 6)
    out = torch.empty(4, 6, device=DEV)
    S.bessel_j0(x.to(DEV).t(), out=out.t())
    torch.testing.assert_close(out.cpu().t(), S.bessel_j0(x.t()))
    y = x.to(DEV)
    y.polygamma_(1)
    torch.testing.assert_close(y.cpu(), x.polygamma(1))


@pytest.mark.parametrize("fn", [S.i0e, S.i1, S.i1e, S.erfcx, S.log_ndtr, S.ndtri],
                         ids=lambda f: f.__name__)
def test_grad(fn):
    g = torch.Generator().manual_seed(1)
    x = torch.rand(40, generator=g, dtype=torch.float32)
    x = x if fn is S.ndtri else x * 8 - 4
    a = x.clone().requires_grad_()
    b = x.to(DEV).requires_grad_()
    fn(a).sum().backward()
    fn(b).sum().backward()
    torch.testing.assert_close(b.grad.cpu(), a.grad)
