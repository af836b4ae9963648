"""Convolution lowerings (lowerings/convolution.py): the bad parameters CPU refuses."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

DEV = "neuron"

pytestmark = pytest.mark.usefixtures("strict")  # tests/lowerings/conftest.py


def _ones(*shape, device):
    return torch.ones(shape, device=device)


@pytest.mark.parametrize("fn, message", [
    (lambda d: F.conv3d(_ones(1, 1, 4, 4, 4, device=d), _ones(1, 1, 2, 2, 2, device=d),
                        _ones(1, device=d), padding=(-1,)), "negative padding"),
    (lambda d: F.conv2d(_ones(1, 1, 4, 4, device=d), _ones(1, 1, 2, 2, device=d), padding=(-1, 0)),
     "negative padding"),
    (lambda d: F.conv_transpose2d(_ones(1, 1, 4, 4, device=d), _ones(1, 1, 2, 2, device=d),
                                  padding=-1), "negative padding"),
    (lambda d: F.conv_transpose2d(_ones(1, 1, 4, 4, device=d), _ones(1, 1, 2, 2, device=d),
                                  stride=-1), None),  # PyTorch's meta kernel objects first
    (lambda d: torch.ops.aten.convolution(_ones(1, 1, 4, 4, device=d), _ones(1, 1, 2, 2, device=d),
                                          None, [2, 2], [0, 0], [1, 1], True, [-1, 0], 1),
     "negative output_padding"),
], ids=["conv3d_padding", "conv2d_padding", "transposed_padding", "transposed_stride",
        "output_padding"])
def test_bad_parameters_raise_as_on_cpu(fn, message):
    with pytest.raises(RuntimeError):
        fn("cpu")
    with pytest.raises(RuntimeError, match=message):
        fn(DEV)
