"""complex32 (chalf) on the device: stored as its bits, computed on CPU (visibly)."""

from __future__ import annotations

import warnings

import pytest
import torch

import torchneuron
from torchneuron.runtime import cpu_fallback

DEV = "neuron"
C32 = torch.complex32


def _values() -> torch.Tensor:
    return torch.tensor([1 + 2j, -3.5 + 0.25j, 0j, 65504 - 1j], dtype=C32)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    # complex32 has no comparison kernels on CPU: compare the bits
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.cpu().view(torch.int32), b.cpu().view(torch.int32))


def test_values_cross_to_the_device_and_back_bit_for_bit():
    x = _values()
    on_device = x.to(DEV)
    assert on_device.dtype == C32 and on_device.device.type == DEV
    assert _same(on_device.cpu(), x)
    assert _same(on_device[1:3].cpu(), x[1:3])
    assert on_device[3].item() == x[3].item()
    assert "complex32" in repr(on_device)


@pytest.mark.parametrize("view", [
    lambda t: t.conj(),
    lambda t: t._neg_view(),
    lambda t: t.view(2, 2).mH,
    lambda t: t.conj().conj(),
    lambda t: t.conj()[1:],
], ids=["conj", "neg", "mH", "conj-conj", "conj-slice"])
def test_lazy_conj_and_neg_views_read_as_on_cpu(view):
    # The device holds the bits: a conj/neg view's value flips their float16 signs, as CPU's
    # kernels do (a silent mismatch of conj, H and mH in the conformance sweep before).
    x = torch.tensor([1 + 2j, -3.5 + 0.25j, float("nan") - 0j, -0.0 + 5j], dtype=C32)
    expected = view(x).resolve_conj().resolve_neg()
    assert _same(view(x.to(DEV)).cpu(), expected)
    assert _same(view(x.to(DEV)).resolve_conj().resolve_neg().cpu(), expected)


@pytest.mark.parametrize("make", [
    lambda d: torch.zeros(2, 3, dtype=C32, device=d),
    lambda d: torch.ones(2, 3, dtype=C32, device=d),
    lambda d: torch.full((2, 3), 2 - 1j, dtype=C32, device=d),
    lambda d: torch.empty(4, dtype=C32, device=d).fill_(0.5j),
    lambda d: torch.complex(torch.tensor([1.0, 2.0], dtype=torch.half, device=d),
                            torch.tensor([-1.0, 3.0], dtype=torch.half, device=d)),
    lambda d: torch.cat([torch.ones(2, dtype=C32, device=d), _values().to(d)]),
    lambda d: _values().to(d)[torch.tensor([3, 0], device=d)],
    lambda d: _values().to(d) * 2 + _values().to(d),
    lambda d: torch.where(torch.tensor([True, False, True, False], device=d),
                          _values().to(d), torch.zeros(4, dtype=C32, device=d)),
    lambda d: torch.ones(3, dtype=torch.complex64, device=d).to(C32),
    lambda d: _values().to(d).to(torch.complex64),
    lambda d: torch.empty(4, dtype=C32, device=d).copy_(_values().to(torch.complex64).to(d)),
    lambda d: torch.empty(4, dtype=torch.complex64, device=d).copy_(_values().to(d)),
    lambda d: torch.view_as_real(_values().to(d)),
    lambda d: _values().to(d).reshape(2, 2).t().contiguous(),
], ids=["zeros", "ones", "full", "fill", "complex", "cat", "index", "arithmetic", "where",
        "from_complex64", "to_complex64", "copy_in", "copy_out", "view_as_real", "transpose"])
def test_ops_equal_cpu(make):
    # Each of these raised "dtype torch.complex32 is not supported"; indexing returned the
    # raw bits as uint32 values once the device stored them.
    expected = make("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        actual = make(DEV)
    assert actual.device.type == DEV
    assert _same(actual, expected)


def test_computing_in_complex32_is_a_visible_counted_fallback(monkeypatch):
    monkeypatch.setattr(cpu_fallback, "_warned", set())  # warned once per process otherwise
    x = _values().to(DEV)
    before = torchneuron.fallback_ops().get("aten.add.Tensor", 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = x + x
    assert _same(y, _values() + _values())
    assert torchneuron.fallback_ops().get("aten.add.Tensor", 0) == before + 1
    assert any("complex32 tensors are stored on the neuron device but computed on CPU"
               in str(w.message) for w in caught)
    monkeypatch.setenv("TORCHNEURON_STRICT", "1")
    with pytest.raises(NotImplementedError, match="complex32"):
        x + x


def test_writes_through_a_view_of_another_dtype():
    x = _values().to(DEV)
    torch.view_as_real(x)[:, 1] = 7  # imaginary parts, as float16, through the view
    expected = _values()
    torch.view_as_real(expected)[:, 1] = 7
    assert _same(x, expected)
