"""Values in and out of the device (runtime/transfer.py)."""

from __future__ import annotations

import pytest
import torch

import torchneuron  # noqa: F401  (registers the neuron device)

DEV = "neuron"

# More dimensions than numpy holds (32, or 64 since numpy 2): PyTorch and XLA have no limit.
_MANY = [1] * 30 + [2] + [1] * 40 + [3]


@pytest.mark.parametrize("fn", [
    lambda x: x,
    lambda x: x + 1,
    lambda x: x * x,
    lambda x: x.permute(*reversed(range(x.dim()))).contiguous(),
    lambda x: x.squeeze(),
    lambda x: x.to(torch.float64),
    lambda x: x.exp(),
], ids=["copy", "add", "mul", "permute", "squeeze", "to_double", "exp"])
def test_tensors_of_more_dims_than_numpy_holds(fn):
    x = torch.arange(6.0).reshape(_MANY)
    expected, result = fn(x), fn(x.to(DEV))
    assert result.device.type == DEV
    assert (result.shape, result.stride()) == (expected.shape, expected.stride())
    # (torch.testing compares at most 64 dims)
    torch.testing.assert_close(result.cpu().reshape(-1), expected.reshape(-1))


def test_factory_of_65_dims():
    z = torch.zeros([1] * 65, device=DEV)
    assert z.dim() == 65
    assert z.cpu().shape == (1,) * 65 and z.cpu().reshape(-1).tolist() == [0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.complex64,
                                   torch.int64])
def test_reading_views_to_the_host_compiles_nothing(dtype, xla_compilations):
    # On the CPU platform a buffer is host memory: `.cpu()`, `.item()` and `.tolist()` of any
    # view read it through numpy's strides, where a gather compiled a program per view shape
    # (PyTorch's test_view_ops spent most of its time so).
    base = torch.arange(120).reshape(4, 5, 6).to(dtype)
    views = [lambda t: t[1], lambda t: t[:, 2], lambda t: t.transpose(0, 2),
             lambda t: t[::2, 1:, ::3], lambda t: t[2, 3, 4], lambda t: t.as_strided((3, 2), (7, 0), 5),
             lambda t: t[:, :0], lambda t: t.unsqueeze(1).expand(4, 3, 5, 6)]
    device = base.to(DEV)
    torch.neuron.synchronize()
    xla_compilations.clear()
    for view in views:
        expected, got = view(base), view(device).cpu()
        assert (got.shape, got.stride()) == (expected.shape, torch.ops.aten._to_copy(expected).stride())
        assert torch.equal(got, expected)
    assert view(device).tolist() == view(base).tolist()
    assert views[4](device).item() == views[4](base).item()
    assert xla_compilations == []


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_strided_views_of_float8_read_to_the_host(dtype):
    # numpy cannot rebuild float8_e5m2 from the array interface that strided host reads went
    # through ("data type '<f1' not understood"): _scaled_mm's noncontiguous samples failed.
    base = (torch.arange(24.0).reshape(4, 6) / 3).to(dtype)
    for view in (lambda t: t.t(), lambda t: t[:, 1::2], lambda t: t[2]):
        got = view(base.to(DEV)).cpu()
        assert got.dtype == dtype and got.shape == view(base).shape
        assert torch.equal(got.view(torch.uint8), view(base).contiguous().view(torch.uint8))


def test_a_host_copy_does_not_alias_the_device_buffer():
    t = torch.arange(6.0).to(DEV)
    host = t[1:4].cpu()
    host.fill_(-1)
    t.add_(1)
    assert t.cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert host.tolist() == [-1.0, -1.0, -1.0]


def test_moving_to_the_device_compiles_nothing(xla_compilations):
    # A CPU tensor is laid out in memory order on the host (a transposed or channels_last
    # one keeps its strides, as CPU's .to does): no program per new shape on the device.
    torch.ones(1).to(DEV)
    xla_compilations.clear()
    for n in range(3, 7):
        x = torch.randn(2, n, 4, 5)
        for view in (x, x.transpose(1, 3), x.to(memory_format=torch.channels_last), x[:, ::2]):
            for dtype in (None, torch.float64):
                got = view.to(DEV, dtype)
                expected = torch.ops.aten._to_copy(view, dtype=dtype)
                assert got.stride() == expected.stride()
                assert torch.equal(got.cpu(), expected)
    assert xla_compilations == []
