"""Factory lowerings and their out= variants (lowerings/factory.py) against CPU PyTorch."""

from __future__ import annotations

import re
import warnings

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


@pytest.mark.parametrize("out_shape", [(1, 49), (0,), (5, 10)],
                         ids=["resized", "empty", "same_count"])
def test_arange_out_warns_as_cpu_when_it_resizes(out_shape):
    # A float step that rounds to one element more than the out= tensor holds: CPU warns
    # that it resizes (49 -> 50); an empty out= or one of the right count gets no warning.
    warned = {}
    for device in ("cpu", DEV):
        out = torch.zeros(out_shape, device=device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.arange(-1, 1, 2.0 / 49, dtype=torch.float32, out=out)
        warned[device] = [str(w.message).split(" (Triggered internally")[0] for w in caught
                          if "out tensor will be resized" in str(w.message)]
        assert out.shape == (torch.Size([50]) if out_shape != (5, 10) else torch.Size(out_shape))
    assert warned[DEV] == warned["cpu"]


@pytest.mark.parametrize("factory", [torch.linspace, torch.logspace])
def test_complex_bounds_with_a_real_dtype_raise_cpus_error(factory):
    # PyTorch's meta kernel words this check apart from CPU's kernel ("linspace():" against
    # "torch.linspace():"); the device raises CPU's error, which PyTorch's own tests match.
    messages = []
    for device in ("cpu", DEV):
        with pytest.raises(RuntimeError) as caught:
            factory(0, 1j, 5, device=device, dtype=torch.float32)
        messages.append(str(caught.value))
    assert messages[1] == messages[0]
    assert messages[0].startswith(f"torch.{factory.__name__}(): inferred dtype")


@pytest.mark.parametrize("bounds", [
    (-5, float("nan")), (0, float("-inf"), -1), (float("inf"),), (0, 5, -1), (0, 5, 0),
    (1.175494351e-38, 3.402823466e+38),
], ids=["nan_end", "minus_inf_end", "inf_end", "wrong_step_sign", "zero_step", "overflow"])
def test_arange_refuses_the_ranges_cpu_refuses(bounds):
    with pytest.raises(RuntimeError) as on_cpu:
        torch.arange(*bounds)
    with pytest.raises(RuntimeError) as on_device:
        torch.arange(*bounds, device=DEV)
    assert str(on_device.value) == str(on_cpu.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_kaiser_window_equals_cpu(dtype):
    # PyTorch's composite kernel computes in a DispatchStub that only CPU and CUDA have: it
    # raised an internal assert on the device. Half and bfloat16 windows are exact, which
    # needs their positions rounded as CPU rounds them (past 256 for bfloat16).
    for length, periodic, beta in [(0, True, 3.0), (1, False, 3.0), (2, True, 0.5),
                                   (5, False, 12.0), (1024, True, 7.0), (2047, False, 29.0)]:
        expected = torch.kaiser_window(length, periodic, beta, dtype=dtype)
        actual = torch.kaiser_window(length, periodic, beta, dtype=dtype, device=DEV)
        if dtype.itemsize == 2:
            assert torch.equal(actual.cpu(), expected)
        else:
            torch.testing.assert_close(actual.cpu(), expected)
    # the overloads without beta, and without periodic
    torch.testing.assert_close(torch.kaiser_window(6, device=DEV).cpu(), torch.kaiser_window(6))
    torch.testing.assert_close(torch.kaiser_window(6, False, device=DEV).cpu(),
                               torch.kaiser_window(6, False))


@pytest.mark.parametrize("bad", [dict(window_length=-1), dict(dtype=torch.int64),
                                 dict(layout=torch.sparse_coo)], ids=["negative", "int", "sparse"])
def test_kaiser_window_refuses_what_cpu_refuses(bad):
    kwargs = dict(window_length=3, periodic=True, beta=2.0) | bad
    length, periodic, beta = kwargs.pop("window_length"), kwargs.pop("periodic"), kwargs.pop("beta")
    messages = []
    for device in ("cpu", DEV):
        with pytest.raises(RuntimeError) as caught:
            torch.kaiser_window(length, periodic, beta, device=device, **kwargs)
        messages.append(re.sub(r"device=neuron(:0)?", "device=cpu", str(caught.value)))
    assert messages[1] == messages[0]


_OUT_OF_RANGE = [3.4e38, -3.4e38, float("nan"), float("inf"), -float("inf"), 3e9, -3e9, 70000.0,
                 -70000.0, 300.0, -300.0, 200.5, -1.5, 2.0**31, -(2.0**31), 1e19, 2.0**63, -0.0]


@pytest.mark.parametrize("source", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("target", [torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32,
                                    torch.int64, torch.bool])
def test_float_to_integer_casts_give_cpus_values(source, target):
    # Out of range, C++ leaves the result undefined; CPU gives its instruction's (x86: the
    # type's minimum, narrow types through int32's low bits), which XLA's saturating
    # conversion did not (PyTorch's test_float_to_int_conversion_finite).
    values = torch.tensor(_OUT_OF_RANGE, dtype=source)
    expected = values.to(target)
    on_device = values.to(DEV)
    assert torch.equal(on_device.to(target).cpu(), expected)
    into = torch.empty(len(_OUT_OF_RANGE), dtype=target, device=DEV)
    assert torch.equal(into.copy_(on_device).cpu(), expected)
    compiled = torch.compile(lambda x: (x * 1).to(target), backend="neuron", dynamic=False)
    assert torch.equal(compiled(on_device).cpu(), expected)


def test_ones_like_is_lowered_and_keeps_what_the_composite_kernel_gives():
    from torchneuron.runtime import dispatch

    x = torch.randn(4, 6).t()  # a transposed layout: preserve_format keeps it
    d = x.to(DEV)
    decomposed = dispatch.COUNTS[dispatch.Route.DECOMPOSED]["aten.ones_like.default"]
    for kwargs in ({}, {"dtype": torch.int16}, {"memory_format": torch.contiguous_format},
                   {"dtype": torch.bool, "device": DEV}):
        got = torch.ones_like(d, **kwargs)
        want = torch.ones_like(x, **{k: v for k, v in kwargs.items() if k != "device"})
        assert got.device.type == DEV and got.stride() == want.stride()
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
    assert dispatch.COUNTS[dispatch.Route.DECOMPOSED]["aten.ones_like.default"] == decomposed
    # Another device (or layout) is made the composite way, on that device.
    elsewhere = torch.ones_like(d, device="cpu")
    assert elsewhere.device.type == "cpu" and torch.equal(elsewhere, torch.ones_like(x))
    assert dispatch.COUNTS[dispatch.Route.DECOMPOSED]["aten.ones_like.default"] == decomposed + 1
