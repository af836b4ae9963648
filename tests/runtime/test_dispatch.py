"""The boxed fallback: device checks, CPU fallback visibility, strict mode, op outputs."""

from __future__ import annotations

import warnings

import pytest
import torch

import torchneuron
from torchneuron.runtime import cpu_fallback, plan

DEV = "neuron"

# An op only CPU implements (tests/conftest.py): it must run on CPU, visibly.
UNLOWERED = torch.ops.tn_test.cpu_only_scale.default


def _unlowered_call():
    a = torch.randn(3, 2)
    cpu = UNLOWERED(a, 2.0)
    dev = UNLOWERED(a.to(DEV), 2.0)
    return cpu, dev


def test_mixed_devices_raise_like_pytorch():
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device=DEV) + torch.ones(3)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.mm(torch.ones(2, 2, device=DEV), torch.ones(2, 2))


def test_zero_dim_cpu_tensor_mixes_like_pytorch():
    x = torch.arange(3.0, device=DEV)
    out = x * torch.tensor(2.0)
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), torch.arange(3.0) * 2)


def test_fallback_refuses_cpu_tensors_as_cuda_does(monkeypatch):
    # CPU's kernel would take the CPU tensor without a word; CUDA refuses it.
    monkeypatch.delenv("TORCHNEURON_STRICT", raising=False)
    mix = torch.ops.tn_test.cpu_only_mix.default
    x = torch.arange(3.0, device=DEV)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            mix(x, torch.ones(3))
        with pytest.raises(RuntimeError, match="be on the same device"):
            torch.linalg.lstsq(torch.rand(2, 3, 3, device=DEV), torch.rand(2, 3, 1))
        out = mix(x, torch.tensor(1.0))  # a 0-dim CPU tensor is a scalar, legal as on CUDA
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), torch.arange(3.0) * 2 + 1)


def test_fallback_runs_on_cpu_warns_once_and_counts(monkeypatch):
    monkeypatch.delenv("TORCHNEURON_STRICT", raising=False)
    cpu_fallback._warned.discard((str(UNLOWERED), None))  # (op, reason): warned once
    before = torchneuron.fallback_ops().get(str(UNLOWERED), 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cpu, dev = _unlowered_call()
        _unlowered_call()
    ours = [w for w in caught if "cpu_only_scale" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert dev.device.type == "neuron"
    torch.testing.assert_close(dev.cpu(), cpu)
    assert torchneuron.fallback_ops()[str(UNLOWERED)] == before + 2


def test_strict_mode_raises_instead_of_falling_back(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_STRICT", "1")
    with pytest.raises(NotImplementedError, match="cpu_only_scale"):
        _unlowered_call()


def test_fallback_of_inplace_op_writes_back_through_view(monkeypatch):
    monkeypatch.delenv("TORCHNEURON_STRICT", raising=False)
    base = torch.zeros(3, 4, device=DEV)
    cpu = torch.zeros(3, 4)
    op = torch.ops.tn_test.cpu_only_scale_.default  # CPU-only in-place op (conftest.py)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op(base[:, 1].fill_(0.5), 3.0)
    op(cpu[:, 1].fill_(0.5), 3.0)
    torch.testing.assert_close(base.cpu(), cpu)


def test_multiple_outputs_and_in_place_return_identity():
    x = torch.randn(4, 5)
    values, indices = torch.ops.aten.max.dim(x.to(DEV), 1)
    v_cpu, i_cpu = torch.ops.aten.max.dim(x, 1)
    torch.testing.assert_close(values.cpu(), v_cpu)
    assert torch.equal(indices.cpu(), i_cpu)
    d = x.to(DEV)
    assert d.add_(1) is d
    assert d.clamp_(min=0) is d


def test_scalar_arguments_do_not_recompile():
    x = torch.ones(8, device=DEV)
    mul_plan = plan.plan_for(torch.ops.aten.mul.Tensor)
    x * 0.5
    n = len(mul_plan.cache)
    for lr in (0.1, 0.2, 0.3, 0.4):
        x * lr
    assert len(mul_plan.cache) == n


def test_dtype_promotion_matches_cpu():
    cases = [
        (torch.tensor([1, 2, 3]), 2.5),
        (torch.tensor([1, 2, 3], dtype=torch.int32), torch.tensor([1.5, 2.0, 3.0])),
        (torch.tensor([1.0, 2.0], dtype=torch.float16), torch.tensor(3.0, dtype=torch.float64)),
        (torch.tensor([True, False]), 3),
        (torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([1, 2], dtype=torch.int8)),
    ]
    for a, b in cases:
        b_dev = b.to(DEV) if isinstance(b, torch.Tensor) and b.dim() else b
        for op in (torch.add, torch.mul, torch.div, torch.sub if a.dtype != torch.bool else torch.add):
            expected = op(a, b)
            got = op(a.to(DEV), b_dev)
            assert got.dtype == expected.dtype, (op, a.dtype, b)
            torch.testing.assert_close(got.cpu(), expected)


def test_float64_and_int64_stay_exact():
    big = torch.tensor([2**53 + 1, -(2**62)], dtype=torch.int64)
    assert torch.equal((big.to(DEV) + 0).cpu(), big)
    x = torch.tensor([1.0 + 1e-15], dtype=torch.float64)
    assert ((x.to(DEV) - 1.0).cpu() == x - 1.0).all()


def test_nan_rules():
    x = torch.tensor([float("nan"), 1.0, -1.0])
    torch.testing.assert_close(torch.maximum(x.to(DEV), torch.zeros(3, device=DEV)).cpu(),
                               torch.maximum(x, torch.zeros(3)), equal_nan=True)
    torch.testing.assert_close(x.to(DEV).clamp(min=0).cpu(), x.clamp(min=0), equal_nan=True)
    torch.testing.assert_close(torch.relu(x.to(DEV)).cpu(), torch.relu(x), equal_nan=True)


def test_shape_mismatch_error_is_pytorchs():
    with pytest.raises(RuntimeError, match="must match the size|broadcast"):
        torch.ones(3, device=DEV) + torch.ones(4, device=DEV)
    with pytest.raises(RuntimeError):
        torch.mm(torch.ones(2, 3, device=DEV), torch.ones(2, 3, device=DEV))


@pytest.mark.parametrize("view", ["sliced", "restrided", "unsqueezed"])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_fallback_input_keeps_its_layout_order(view, mode):
    # uint8 upsampling runs CPU's kernel. CPU lays its result out as its input (channels_last
    # stays channels_last, even through a slice), and its bicubic kernel asserts when the
    # input and the out= tensor (laid out from the real input) disagree.
    results = {}
    for device in ("cpu", "neuron"):
        torch.manual_seed(0)
        image = torch.randint(0, 256, (1 if view == "unsqueezed" else 2, 3, 20, 20),
                              dtype=torch.uint8).to(device)
        image = image.contiguous(memory_format=torch.channels_last)
        x = {"sliced": lambda t: t[:, :, 1:-1, 1:-1], "restrided": lambda t: t[:, :, ::2, ::2],
             "unsqueezed": lambda t: t[0][None]}[view](image)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fallback's own warning
            results[device] = torch.nn.functional.interpolate(x, size=(6, 6), mode=mode)
    assert results["neuron"].stride() == results["cpu"].stride()
    assert torch.equal(results["neuron"].cpu(), results["cpu"])
