"""Factory lowerings and their out= variants (lowerings/factory.py) against CPU PyTorch."""

from __future__ import annotations

import pytest
import torch

import torchneuron

DEV = "neuron"

pytestmark = pytest.mark.usefixtures("strict")  # tests/lowerings/conftest.py


def _grid(device):
    return torch.zeros(3, 4, device=device)


# CPU keeps an out= tensor that has the right number of elements, whatever its shape and
# strides, and fills it in its logical order; one of another size is resized to 1-D.
@pytest.mark.parametrize("fill", [
    lambda out: torch.arange(6.0, out=out),
    lambda out: torch.arange(1, 7, out=out),
    lambda out: torch.linspace(0, 5, 6, out=out),
    lambda out: torch.linspace(torch.tensor(0.0), 5, 6, out=out),
    lambda out: torch.logspace(0, 5, 6, base=2, out=out),
    lambda out: torch.logspace(torch.tensor(0.0), torch.tensor(5.0), 6, base=2, out=out),
], ids=["arange", "arange_start", "linspace", "linspace_tensor", "logspace", "logspace_tensors"])
@pytest.mark.parametrize("view", [
    lambda x: x[:, 1:3],  # non-contiguous, 6 elements
    lambda x: x[:2, :3].t(),  # transposed, 6 elements
    lambda x: x[:, ::2],  # strided, 6 elements
    lambda x: x[1:, 1:2],  # 2 elements: resized to 1-D (6 elements from offset 5)
    lambda x: x.view(-1)[8:10],  # 2 elements at the end: resized past the storage's end
], ids=["narrow", "transposed", "strided", "resized", "resized_grows_storage"])
def test_out_view_is_filled_as_on_cpu(fill, view):
    expected_base, base = _grid("cpu"), _grid(DEV)
    expected_out, out = view(expected_base), view(base)
    expected = fill(expected_out)
    result = fill(out)
    assert result is out
    assert (result.shape, result.stride(), result.storage_offset()) == (
        expected.shape, expected.stride(), expected.storage_offset())
    torch.testing.assert_close(result.cpu(), expected)
    # the base sees what CPU's base sees, including writes through a grown storage
    assert base.untyped_storage().nbytes() == expected_base.untyped_storage().nbytes()
    torch.testing.assert_close(base.cpu(), expected_base)
    assert not torchneuron.op_counts()["fallback"]
