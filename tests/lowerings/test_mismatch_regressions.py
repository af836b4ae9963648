"""Regression tests for silent mismatches found by the conformance sweep (docs/COVERAGE.md).

Each compares the neuron result (forward and the gradient in question) with CPU PyTorch.
Root cause of the complex ones: lazy conjugate views (`x.conj()`, which sets the conj bit and
shares storage) were read as their stored, unconjugated values by lowered ops and copies.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import torchneuron  # noqa: F401

DEV = "neuron"


def _run(fn, inputs, dev):
    ins = [x.detach().clone().to(dev).requires_grad_(x.is_floating_point()) for x in inputs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # CPU-fallback notices
        out = fn(*ins)
        flat = torch.view_as_real(out.resolve_conj()) if out.is_complex() else out
        flat.sum().backward()
    return out.detach().cpu(), [i.grad.cpu() for i in ins if i.requires_grad]


def _check(fn, inputs, **tol):
    out_cpu, grads_cpu = _run(fn, inputs, "cpu")
    out_dev, grads_dev = _run(fn, inputs, DEV)
    torch.testing.assert_close(out_dev, out_cpu, **tol)
    for g_dev, g_cpu in zip(grads_dev, grads_cpu, strict=True):
        torch.testing.assert_close(g_dev, g_cpu, **tol)


def test_conj_view_is_read_conjugated():
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    c = z.to(DEV).conj()
    assert c.is_conj()
    torch.testing.assert_close(c.cpu(), z.conj())
    torch.testing.assert_close((c * 1).cpu(), z.conj() * 1)
    torch.testing.assert_close(c.resolve_conj().cpu(), z.conj().resolve_conj())
    torch.testing.assert_close(c.imag.cpu(), z.conj().imag)  # a negative view
    torch.testing.assert_close((c.imag * 1).cpu(), z.conj().imag * 1)


def test_write_through_conj_view():
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    src = torch.tensor([5 + 1j, 2 + 2j], dtype=torch.complex64)
    w_cpu, w_dev = z.clone(), z.to(DEV)
    w_cpu.conj().copy_(src)
    w_dev.conj().copy_(src.to(DEV))
    torch.testing.assert_close(w_dev.cpu(), w_cpu)
    w_cpu.conj().mul_(2)
    w_dev.conj().mul_(2)
    torch.testing.assert_close(w_dev.cpu(), w_cpu)


def test_polar_grad():
    _check(torch.polar, [torch.tensor(2.0), torch.tensor(0.7)])


X = torch.randn(5, 6, 7, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.fft.ifft(x, n=10, dim=1, norm="ortho"),
        lambda x: torch.fft.ihfft(x, n=10, dim=1, norm="ortho"),
        lambda x: torch.fft.hfft2(x, s=(3, 10), dim=(1, 2), norm="ortho"),
        lambda x: torch.fft.hfftn(x, s=(3, 10), dim=(1, 2), norm="ortho"),
        lambda x: torch.fft.ihfftn(x, s=(8,)),
        lambda x: torch.fft.ihfft2(x, dim=0),
    ],
    ids=["ifft", "ihfft", "hfft2", "hfftn", "ihfftn", "ihfft2"],
)
def test_fft_conj_paths(fn):
    _check(fn, [X], atol=2e-4, rtol=2e-4)


def test_linalg_eigvals_grad():
    a = torch.randn(5, 5, generator=torch.Generator().manual_seed(1))
    _check(torch.linalg.eigvals, [a], atol=1e-4, rtol=1e-4)


def test_logcumsumexp_grad_large_entries():
    # op_db's sample: a leading 10000 along the scanned dim. CPU accumulates float32 in double.
    x = torch.randn(5, 5, 5, generator=torch.Generator().manual_seed(2)) * 3
    x[0] = 10000
    cot = torch.randn(5, 5, 5, generator=torch.Generator().manual_seed(3))
    grads = []
    for dev in ("cpu", DEV):
        xx = x.clone().to(dev).requires_grad_()
        out = torch.logcumsumexp(xx, 0)
        out.backward(cot.to(dev))
        torch.testing.assert_close(out.detach().cpu(), torch.logcumsumexp(x, 0))
        grads.append(xx.grad.cpu())
    torch.testing.assert_close(grads[1], grads[0])


def test_erfinv_near_one():
    x = torch.cat([
        torch.rand(2000, generator=torch.Generator().manual_seed(4)) * 2 - 1,
        torch.linspace(0.99, 0.9999999, 200),
        -torch.linspace(0.99, 0.9999999, 200),
    ])
    _check(torch.erfinv, [x])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_half_computes_in_float32(dtype, approximate):
    x = torch.randn(10, 10, generator=torch.Generator().manual_seed(5)).mul(3).to(dtype)
    cot = torch.randn(10, 10, generator=torch.Generator().manual_seed(6)).to(dtype)
    res = []
    for dev in ("cpu", DEV):
        xx = x.clone().to(dev).requires_grad_()
        out = torch.nn.functional.gelu(xx, approximate=approximate)
        out.backward(cot.to(dev))
        res.append((out.detach().cpu(), xx.grad.cpu()))
    torch.testing.assert_close(res[1][0], res[0][0])
    torch.testing.assert_close(res[1][1], res[0][1])


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_logcumsumexp_complex_matches_cpu_branch(dtype):
    # CPU's complex log-add-exp does not wrap the imaginary part: results may leave (-pi, pi].
    gen = torch.Generator().manual_seed(7)
    x = torch.complex(torch.randn(5, 5, 5, generator=gen) * 5, torch.randn(5, 5, 5, generator=gen) * 5)
    x = x.to(dtype)
    x[1, 1, 1] = complex(float("nan"), 0)
    x[2, 2, 2] = complex(-float("inf"), 1)
    for dim in (0, 1, 2):
        torch.testing.assert_close(
            torch.logcumsumexp(x.to(DEV), dim).cpu(), torch.logcumsumexp(x, dim), equal_nan=True
        )
