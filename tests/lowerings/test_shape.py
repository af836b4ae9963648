"""Shape lowerings (lowerings/shape.py) against CPU PyTorch."""

from __future__ import annotations

import pytest
import torch
from lowering_checks import assert_native

DEV = "neuron"

pytestmark = pytest.mark.usefixtures("strict")  # tests/lowerings/conftest.py


@pytest.mark.parametrize("shape, dims", [((), [0]), ((), [-1]), ((), []), ((2, 3), [0, -1]),
                                         ((2, 3, 4), [1])])
def test_flip(shape, dims):
    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    result = x.to(DEV).flip(dims)
    assert result.shape == x.shape
    torch.testing.assert_close(result.cpu(), x.flip(dims))
    assert_native("aten.flip.default")


@pytest.mark.parametrize("shape, dims", [((), [1]), ((), [0, 0]), ((2, 3), [2])])
def test_flip_bad_dims_raise_as_on_cpu(shape, dims):
    with pytest.raises(Exception) as cpu:
        torch.zeros(shape).flip(dims)
    with pytest.raises(type(cpu.value)):
        torch.zeros(shape, device=DEV).flip(dims)
