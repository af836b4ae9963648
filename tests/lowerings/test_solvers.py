"""Solver and LU lowerings (lowerings/solvers.py) against CPU PyTorch.

Every test runs with TORCHNEURON_STRICT=1 (a CPU fallback raises) and checks that the named
ATen overloads ran natively. Pivots and info must match exactly.
"""

from __future__ import annotations

import pytest
import torch
from lowering_checks import assert_native

DEV = "neuron"

pytestmark = pytest.mark.usefixtures("strict")  # tests/lowerings/conftest.py


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _well_conditioned(*shape, dtype=torch.float32, seed=0):
    n = shape[-1]
    return _randn(*shape, dtype=dtype, seed=seed) + n * torch.eye(n, dtype=dtype)


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return value


def _check(fn, *args, tol=1e-4, **kwargs):
    cpu = fn(*args, **kwargs)
    dev = fn(*[_to(a, DEV) for a in args], **kwargs)
    cpu = cpu if isinstance(cpu, tuple | list) else (cpu,)
    dev = dev if isinstance(dev, tuple | list) else (dev,)
    assert len(cpu) == len(dev)
    for d, c in zip(dev, cpu, strict=True):
        assert d.device.type == DEV
        assert d.shape == c.shape and d.dtype == c.dtype
        torch.testing.assert_close(d.cpu(), c, rtol=tol, atol=tol)


def _check_grad(fn, make, tol=1e-3):
    a = make().requires_grad_()
    (g,) = torch.autograd.grad(fn(a).abs().sum(), a)
    an = make().to(DEV).requires_grad_()
    (gn,) = torch.autograd.grad(fn(an).abs().sum(), an)
    torch.testing.assert_close(gn.cpu(), g, rtol=tol, atol=tol)


@pytest.mark.parametrize("upper", [True, False])
@pytest.mark.parametrize("left", [True, False])
def test_solve_triangular(upper, left):
    a = _well_conditioned(2, 4, 4)
    a = a.triu() if upper else a.tril()
    b = _randn(1, 4, 3, seed=1)  # batch broadcast
    b = b if left else b.mT
    _check(torch.linalg.solve_triangular, a, b, upper=upper, left=left)
    _check(torch.linalg.solve_triangular, a, b, upper=upper, left=left, unitriangular=True)
    assert_native("aten.linalg_solve_triangular.default")


def test_triangular_solve_transposes_without_conjugating():
    a = _well_conditioned(3, 3, dtype=torch.complex64).triu()
    b = _randn(2, 3, 2, dtype=torch.complex64, seed=1)
    _check(torch.triangular_solve, b, a, True, True)
    assert_native("aten.triangular_solve.default")


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 5), (5, 3), (0, 0), (2, 0, 3)])
def test_lu_factor_ex_pivots_and_info(shape):
    _check(torch.linalg.lu_factor_ex, _randn(*shape))
    assert_native("aten.linalg_lu_factor_ex.default")


def test_lu_factor_ex_singular_info():
    a = torch.tensor([[[1.0, 2.0], [2.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]])
    _check(torch.linalg.lu_factor_ex, a)


def test_lu_without_pivoting_raises_like_cpu():
    with pytest.raises(RuntimeError):
        torch.linalg.lu_factor(_randn(3, 3), pivot=False)
    with pytest.raises(RuntimeError):
        torch.linalg.lu_factor(_randn(3, 3).to(DEV), pivot=False)


@pytest.mark.parametrize("shape", [(4, 4), (2, 3, 5), (5, 3)])
def test_linalg_lu_and_unpack(shape):
    a = _randn(*shape)
    _check(torch.linalg.lu, a)
    lu, pivots = torch.linalg.lu_factor(a)
    _check(torch.lu_unpack, lu, pivots)
    _check(torch.lu_unpack, lu, pivots, False, True)
    _check(torch.lu_unpack, lu, pivots, True, False)
    assert_native("aten.linalg_lu.default", "aten.lu_unpack.default")


def test_lu_unpack_bad_pivots_raise():
    lu = _randn(3, 3).to(DEV)
    with pytest.raises(RuntimeError, match="pivots passed to lu_unpack"):
        torch.lu_unpack(lu, torch.tensor([5, 1, 1], dtype=torch.int32, device=DEV))


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("adjoint", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
def test_lu_solve(left, adjoint, dtype):
    lu, pivots = torch.linalg.lu_factor(_randn(2, 4, 4, dtype=dtype))
    b = _randn(4, 3, dtype=dtype, seed=1)
    _check(torch.linalg.lu_solve, lu, pivots, b if left else b.mT, left=left, adjoint=adjoint)
    assert_native("aten.linalg_lu_solve.default")


def test_inv_solve_det_slogdet():
    a = _randn(2, 4, 4)
    _check(torch.linalg.inv, a)
    _check(torch.linalg.inv_ex, a)
    _check(torch.linalg.solve, a, _randn(2, 4, 3, seed=1))
    _check(torch.linalg.solve, a, _randn(4, seed=1))  # vector right-hand side
    _check(torch.linalg.solve, a, _randn(3, 4, seed=1), left=False)
    _check(torch.linalg.det, a)
    _check(torch.linalg.det, a.mT)
    _check(torch.linalg.slogdet, a)
    _check(torch.linalg.inv, torch.empty(0, 0))
    _check(torch.linalg.det, torch.empty(2, 0, 0))
    assert_native("aten.linalg_inv_ex.default", "aten._linalg_solve_ex.default",
                  "aten._linalg_det.default", "aten._linalg_slogdet.default")


def test_det_and_slogdet_of_singular_and_complex():
    singular = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    _check(torch.linalg.det, singular)
    _check(torch.linalg.slogdet, singular)
    c = _randn(3, 3, 3, dtype=torch.complex128)
    _check(torch.linalg.det, c, tol=1e-10)
    _check(torch.linalg.slogdet, c, tol=1e-10)


def test_inverse_of_singular_raises_like_cpu():
    with pytest.raises(RuntimeError, match="singular"):
        torch.linalg.inv(torch.zeros(3, 3, device=DEV))
    with pytest.raises(RuntimeError, match="singular"):
        torch.linalg.solve(torch.zeros(3, 3, device=DEV), torch.ones(3, device=DEV))
    inverse, info = torch.linalg.inv_ex(torch.zeros(2, 3, 3, device=DEV))
    assert info.tolist() == [1, 1]


@pytest.mark.parametrize("contiguous", [True, False])
def test_det_slogdet_solve_gradients(contiguous):
    # det/slogdet factor A^T for a contiguous real A and their backward relies on it.
    def make():
        a = _randn(4, 4, seed=3)
        return a if contiguous else a.mT

    _check_grad(torch.linalg.det, make)
    _check_grad(lambda a: torch.linalg.slogdet(a)[1], make)
    _check_grad(lambda a: torch.linalg.solve(a, torch.ones(4, 2, device=a.device)), make)
    _check_grad(torch.linalg.inv, make)
    _check_grad(lambda a: torch.linalg.lu_factor(a)[0], make)
    assert_native("aten._linalg_det.default", "aten.linalg_lu_solve.default")


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky_solve_and_inverse(upper):
    a = _randn(2, 4, 4)
    factor = torch.linalg.cholesky(a @ a.mT + torch.eye(4))
    factor = factor.mH.contiguous() if upper else factor
    _check(torch.cholesky_solve, _randn(2, 4, 3, seed=1), factor, upper)
    _check(torch.cholesky_inverse, factor[0], upper)
    assert_native("aten._cholesky_solve_helper.default", "aten.cholesky_inverse.default")


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_matrix_exp(dtype):
    # large norms take scaling and squaring; float32 runs on CPU (see solvers.py)
    for scale in (1e-3, 0.5, 30.0):
        _check(torch.linalg.matrix_exp, _randn(2, 4, 4, dtype=dtype) * scale, tol=1e-10)
    _check(torch.linalg.matrix_exp, _randn(3, 1, 1, dtype=dtype))
    _check_grad(torch.linalg.matrix_exp, lambda: _randn(3, 3, dtype=dtype) / 2, tol=1e-10)
    assert_native("aten.linalg_matrix_exp.default")


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64])
@pytest.mark.parametrize("shape", [(5, 5), (3, 6, 6), (0, 0)])
def test_ldl_factor_and_solve(dtype, shape):
    a = _randn(*shape, dtype=dtype)
    _check(torch.linalg.ldl_factor_ex, a)
    ld, pivots, _ = torch.linalg.ldl_factor_ex(a)
    b = _randn(*shape[:-1], 3, dtype=dtype, seed=1)
    _check(torch.linalg.ldl_solve, ld, pivots, b)
    assert_native("aten.linalg_ldl_factor_ex.default", "aten.linalg_ldl_solve.default")


def test_ldl_pivots_2x2_blocks_and_singular():
    s = torch.zeros(4, 4)
    s[0, 1] = s[1, 0] = 1.0
    s[2, 3] = s[3, 2] = 2.0
    _check(torch.linalg.ldl_factor_ex, s)  # two 2x2 pivots
    _check(torch.linalg.ldl_factor_ex, torch.zeros(3, 3))  # info = 1
    _check(torch.linalg.ldl_factor_ex, _randn(4, 4), hermitian=True)


def test_lu_out_keeps_column_major_out_strides():
    # torch.lu(out=) resizes each out with resize_as_: same sizes keep the strides, as CPU.
    a = _randn(3, 5)
    lu_cpu = torch.zeros(5, 3).mT
    torch.lu(a, True, True, out=(lu_cpu, torch.zeros(3, dtype=torch.int32), torch.zeros((), dtype=torch.int32)))
    lu_dev = torch.zeros(5, 3).mT.to(DEV)
    out = (lu_dev, torch.zeros(3, dtype=torch.int32, device=DEV), torch.zeros((), dtype=torch.int32, device=DEV))
    torch.lu(a.to(DEV), True, True, out=out)
    assert lu_dev.stride() == lu_cpu.stride() == (1, 3)
    torch.testing.assert_close(lu_dev.cpu(), lu_cpu)
