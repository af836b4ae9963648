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
