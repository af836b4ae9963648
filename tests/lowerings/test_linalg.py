"""Decomposition lowerings (lowerings/linalg.py) against CPU PyTorch.

Values, dtypes and strides (PyTorch's linalg results are column-major) must match CPU. Ops
whose results are not unique (singular/eigen vectors) must run on CPU, never differ.
"""

from __future__ import annotations

import pytest
import torch
from lowering_checks import assert_native

import torchneuron

DEV = "neuron"

DTYPES = [torch.float32, torch.float64, torch.complex64, torch.complex128]


def _randn(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_complex:
        return torch.randn(*shape, dtype=dtype, generator=g)
    return torch.randn(*shape, generator=g).to(dtype)


def _pd(*shape, dtype=torch.float32, seed=0):
    a = _randn(*shape, dtype=dtype, seed=seed)
    return a @ a.mH + shape[-1] * torch.eye(shape[-1], dtype=dtype)


def _tol(dtype):
    return 1e-4 if dtype in (torch.float32, torch.complex64) else 1e-10


def _check(fn, *args, tol=1e-4):
    cpu = fn(*args)
    dev = fn(*[a.to(DEV) for a in args])
    cpu = cpu if isinstance(cpu, tuple | list) else (cpu,)
    dev = dev if isinstance(dev, tuple | list) else (dev,)
    for d, c in zip(dev, cpu, strict=True):
        assert d.device.type == DEV
        torch.testing.assert_close(d.cpu(), c, rtol=tol, atol=tol)
        if c.numel() > 1:
            assert d.stride() == c.stride()
    return dev


@pytest.mark.usefixtures("strict")
@pytest.mark.parametrize("dtype", DTYPES)
def test_cholesky(dtype):
    a = _pd(2, 4, 4, dtype=dtype)
    _check(torch.linalg.cholesky, a, tol=_tol(dtype))
    _check(lambda x: torch.linalg.cholesky(x, upper=True), a, tol=_tol(dtype))
    _check(torch.linalg.cholesky_ex, a, tol=_tol(dtype))
    assert_native("aten.linalg_cholesky_ex.default")


@pytest.mark.usefixtures("strict")
def test_cholesky_not_positive_definite():
    # info (the order of the failing leading minor) and the partial factor are LAPACK's.
    a = torch.tensor([[4.0, 2.0, 1.0], [2.0, 1.0, 0.0], [1.0, 0.0, 3.0]])
    _check(torch.linalg.cholesky_ex, a)
    _check(torch.linalg.cholesky_ex, torch.stack([_pd(3, 3), a]))
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky(a.to(DEV))
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky_ex(a.to(DEV), check_errors=True)


@pytest.mark.usefixtures("strict")
def test_cholesky_grad():
    a = _pd(3, 3, dtype=torch.float64)
    cpu = a.clone().requires_grad_()
    dev = a.to(DEV).requires_grad_()
    cot = _randn(3, 3, dtype=torch.float64, seed=1)
    torch.linalg.cholesky(cpu).backward(cot)
    torch.linalg.cholesky(dev).backward(cot.to(DEV))
    torch.testing.assert_close(dev.grad.cpu(), cpu.grad)


@pytest.mark.usefixtures("strict")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr(dtype, mode):
    for shape in [(5, 3), (2, 3, 5), (4, 4)]:
        _check(lambda x: torch.linalg.qr(x, mode=mode), _randn(*shape, dtype=dtype), tol=_tol(dtype))
    assert_native("aten.linalg_qr.default")


@pytest.mark.usefixtures("strict")
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex128])
def test_householder_product_and_ormqr(dtype):
    h, tau = torch.geqrf(_randn(2, 5, 3, dtype=dtype))
    tol = _tol(dtype)
    _check(torch.linalg.householder_product, h, tau, tol=tol)
    other = _randn(2, 5, 2, dtype=dtype, seed=1)
    for transpose in (False, True):
        _check(lambda a, t, o, tr=transpose: torch.ormqr(a, t, o, transpose=tr), h, tau, other, tol=tol)
    right = _randn(2, 4, 5, dtype=dtype, seed=2)
    _check(lambda a, t, o: torch.ormqr(a, t, o, left=False), h, tau, right, tol=tol)
    assert_native("aten.linalg_householder_product.default", "aten.ormqr.default")


@pytest.mark.usefixtures("strict")
@pytest.mark.parametrize("dtype", DTYPES)
def test_singular_and_eigen_values(dtype):
    tol = _tol(dtype)
    _check(torch.linalg.svdvals, _randn(2, 5, 3, dtype=dtype), tol=tol)
    _check(lambda x: torch.linalg.matrix_norm(x, "nuc"), _randn(4, 3, dtype=dtype), tol=tol)
    _check(torch.linalg.matrix_rank, _randn(3, 5, dtype=dtype), tol=tol)
    h = _pd(3, 4, 4, dtype=dtype)
    _check(torch.linalg.eigvalsh, h, tol=tol)
    _check(lambda x: torch.linalg.eigvalsh(x, UPLO="U"), h, tol=tol)
    assert_native("aten._linalg_svd.default", "aten._linalg_eigh.default")


@pytest.mark.usefixtures("strict")
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex128])
def test_eigvals(dtype):
    a = _randn(2, 4, 4, dtype=dtype)
    _check(torch.linalg.eigvals, a, tol=_tol(dtype))
    out = torch.empty(0, dtype=torch.complex64 if dtype == torch.float32 else dtype).to(DEV)
    torch.linalg.eigvals(a.to(DEV), out=out)
    torch.testing.assert_close(out.cpu(), torch.linalg.eigvals(a), rtol=1e-4, atol=1e-4)
    assert_native("aten._linalg_eigvals.default", "aten.linalg_eigvals.out")


def test_singular_vectors_run_on_cpu():
    # JAX's LAPACK and PyTorch's pick different signs for singular/eigen vectors: those
    # calls must take the CPU path (same values as CPU), not a native one that differs.
    torchneuron.reset_op_counts()
    a = _randn(4, 3)
    _check(torch.linalg.svd, a)
    _check(torch.linalg.eigh, _pd(3, 3))
    fallback = torchneuron.op_counts()["fallback"]
    assert "aten._linalg_svd.default" in fallback and "aten._linalg_eigh.default" in fallback


@pytest.mark.usefixtures("strict")
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex128])
def test_geqrf(dtype):
    for shape in [(5, 3), (2, 3, 5), (0, 3)]:
        _check(torch.geqrf, _randn(*shape, dtype=dtype), tol=_tol(dtype))
    # out= resizes empty outs to CPU's column-major layout
    a = _randn(4, 3, dtype=dtype)
    h, tau = torch.geqrf(a)
    out = (torch.empty(0, dtype=dtype).to(DEV), torch.empty(0, dtype=dtype).to(DEV))
    torch.geqrf(a.to(DEV), out=out)
    torch.testing.assert_close(out[0].cpu(), h, rtol=_tol(dtype), atol=_tol(dtype))
    torch.testing.assert_close(out[1].cpu(), tau, rtol=_tol(dtype), atol=_tol(dtype))
    assert out[0].stride() == h.stride() == (1, 4)
    with pytest.raises(RuntimeError):
        torch.geqrf(torch.ones(3).to(DEV))
    assert_native("aten.geqrf.default", "aten.geqrf.a")


def test_linalg_out_on_cpu_fallback_resizes_and_keeps_layout():
    # A CPU-fallback out= kernel resizes its out tensors (the fallback gives them resizable
    # storage) and leaves them column-major, as on CPU.
    a = _randn(4, 4, dtype=torch.float64)
    w, v = torch.linalg.eig(a)
    out = (torch.empty(0, dtype=w.dtype).to(DEV), torch.empty(0, dtype=v.dtype).to(DEV))
    torch.linalg.eig(a.to(DEV), out=out)
    torch.testing.assert_close(out[1].cpu(), v)
    assert out[1].stride() == v.stride() == (1, 4)


def _grad(fn, x, device):
    x = x.detach().to(device).requires_grad_()
    y = fn(x)
    (g,) = torch.autograd.grad(y, (x,), torch.ones_like(y))
    return y.detach().cpu(), g.cpu()


@pytest.mark.usefixtures("strict")
@pytest.mark.parametrize("name", ["svdvals", "nuc", "cond", "pinv", "pinv_hermitian", "eigvalsh", "eigvals"])
def test_vector_free_composites_and_their_grads_run_natively(name):
    # These composites use singular/eigen vectors only internally (results and gradients do
    # not depend on their signs), so the vector modes are lowered inside them.
    a = _randn(2, 5, 4, dtype=torch.float64)
    h = _randn(4, 4, dtype=torch.float64)
    h = h + h.mT
    fn, x = {
        "svdvals": (torch.linalg.svdvals, a),
        "nuc": (lambda x: torch.linalg.matrix_norm(x, "nuc"), a),
        "cond": (torch.linalg.cond, h),
        "pinv": (torch.linalg.pinv, a),
        "pinv_hermitian": (lambda x: torch.linalg.pinv(x, hermitian=True), h),
        "eigvalsh": (torch.linalg.eigvalsh, h),
        "eigvals": (lambda x: torch.linalg.eigvals(x).real, h + torch.triu(h)),
    }[name]
    y_cpu, g_cpu = _grad(fn, x, "cpu")
    y_dev, g_dev = _grad(fn, x, DEV)
    torch.testing.assert_close(y_dev, y_cpu)
    torch.testing.assert_close(g_dev, g_cpu)
    assert not torchneuron.op_counts()["fallback"]


@pytest.mark.usefixtures("strict")
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.complex128])
@pytest.mark.parametrize(
    "fn",
    [
        torch.vdot,
        torch.dot,
        torch.inner,
        torch.linalg.vecdot,
        lambda x, y: torch.vdot(x.conj(), y),
        lambda x, y: torch.dot(x, y.conj()),
    ],
)
def test_complex_dot_products_conjugate_like_cpu(fn, dtype):
    # vdot conjugates its first argument and dot does not (vdot once shared dot's lowering).
    x, y = _randn(9, dtype=dtype, seed=1), _randn(9, dtype=dtype, seed=2)
    _check(fn, x, y, tol=_tol(dtype))
    out = torch.empty((), dtype=dtype, device=DEV)
    torch.vdot(x.to(DEV), y.to(DEV), out=out)
    torch.testing.assert_close(out.cpu(), torch.vdot(x, y), rtol=_tol(dtype), atol=_tol(dtype))
