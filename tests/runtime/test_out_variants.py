"""out= variants computed by their functional op (runtime/eager.py, executable.py): the
dtype they compute in when `out` has another dtype than the functional result."""

from __future__ import annotations

import pytest
import torch

import torchneuron  # noqa: F401  (registers the neuron device)

# Values whose half-precision sums and products round differently from float32's.
_HALF = torch.tensor([1.0009765625, 1e-3, 3.1, 0.7002, 2.5, 1e-4], dtype=torch.half)
_LONG = torch.tensor([1, 2, 3, 4, 5, 6])


def _out(shape, dtype):
    return torch.empty(shape, dtype=dtype)


@pytest.mark.parametrize(
    "fn",
    [
        # elementwise ops compute in the inputs' dtype (half), then cast to out's
        lambda x: torch.add(x, x * 1e-3, out=_out(6, torch.float32).to(x.device)),
        lambda x: torch.exp(x, out=_out(6, torch.float32).to(x.device)),
        lambda x: torch.mul(x, x, out=_out(6, torch.float64).to(x.device)),
        # reductions with a dtype= argument compute in out's dtype
        lambda x: torch.sum(x, 0, out=_out((), torch.float32).to(x.device)),
        lambda x: torch.mean(x, 0, out=_out((), torch.float32).to(x.device)),
        lambda x: torch.cumsum(x, 0, out=_out(6, torch.float32).to(x.device)),
        # integer inputs with a Python scalar (reaches fmod.Tensor_out with other=4)
        lambda x: torch.fmod(_LONG.to(x.device), 4, out=_out(6, torch.float32).to(x.device)),
        lambda x: torch.div(_LONG.to(x.device), 7, out=_out(6, torch.float64).to(x.device)),
    ],
    ids=["add", "exp", "mul", "sum", "mean", "cumsum", "fmod_scalar", "div_int"],
)
def test_out_of_another_dtype_computes_as_cpu(fn) -> None:
    expected = fn(_HALF)
    result = fn(_HALF.to("neuron"))
    assert result.dtype == expected.dtype
    torch.testing.assert_close(result.cpu(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("op", [torch.add, torch.sub, torch.mul])
def test_an_integer_op_into_a_float_out_computes_in_the_integer_type(op):
    # CPU computes in the operands' type (uint8 wraps around) and only then casts to out's
    a = torch.tensor([5, 200], dtype=torch.uint8)
    b = torch.tensor([8, 100], dtype=torch.uint8)
    expected = op(a, b, out=torch.empty(2, dtype=torch.float64))
    out = torch.empty(2, dtype=torch.float64, device="neuron")
    op(a.to("neuron"), b.to("neuron"), out=out)
    assert torch.equal(out.cpu(), expected)


def test_an_out_of_another_dtype_after_recorded_ops():
    # CPU's check of the out= dtype reads the arguments, which runs the recorded trace first
    x = torch.tensor([1.001, 1e-3, 3.1], dtype=torch.half)
    out = torch.empty(3).to("neuron")
    torch.add(x.to("neuron"), x.to("neuron") * 1e-3, out=out)
    assert torch.equal(out.cpu(), torch.add(x, x * 1e-3, out=torch.empty(3)))
