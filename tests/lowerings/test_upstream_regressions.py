"""Regression tests for bugs found by PyTorch's own test files (make upstream-tests,
docs/COVERAGE.md): each compares the neuron result with CPU PyTorch's."""

from __future__ import annotations

import torch

import torchneuron  # noqa: F401

DEV = "neuron"


def test_flip_of_a_zero_dim_tensor_is_the_identity():
    # test_shape_ops test_flip: jnp.flip raised ValueError for dim 0 of a 0-d tensor.
    x = torch.tensor(3.5)
    for dims in ((0,), (-1,), ()):
        out = x.to(DEV).flip(dims)
        assert out.shape == ()
        torch.testing.assert_close(out.cpu(), x.flip(dims))
