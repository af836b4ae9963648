"""Eager executables (runtime/eager.py): cached per argument signature and per everything
else that changes their result."""

from __future__ import annotations

import pytest
import torch

import torchneuron  # noqa: F401  (registers the neuron device)


@pytest.fixture
def default_dtype():
    saved = torch.get_default_dtype()
    yield
    torch.set_default_dtype(saved)


@pytest.mark.parametrize("fn", [
    lambda d: torch.div(torch.tensor([1, 2], device=d), torch.tensor([3, 4], device=d)),
    lambda d: torch.sqrt(torch.tensor([2, 3], device=d)),
    lambda d: torch.full((2,), 1.5, device=d),
    lambda d: torch.arange(0.0, 1.0, 0.25, device=d),
    lambda d: torch.tensor([1, 2], device=d) * 0.1,
], ids=["int_div", "int_sqrt", "full", "arange", "int_times_float"])
def test_executables_follow_the_default_dtype(default_dtype, fn):
    for dtype in (torch.float32, torch.float64, torch.float32):
        torch.set_default_dtype(dtype)
        expected, result = fn("cpu"), fn("neuron")
        assert result.dtype == expected.dtype == dtype
        torch.testing.assert_close(result.cpu(), expected)
