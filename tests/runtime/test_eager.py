"""Eager executables (runtime/eager.py): cached per argument signature and per everything
else that changes their result."""

from __future__ import annotations

import pytest
import torch

import torchneuron  # noqa: F401  (registers the neuron device)
from torchneuron.runtime import _native, fastpath, fusion


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


@pytest.mark.skipif(_native.fastpath() is None, reason="the C++ library could not be built")
def test_repeated_scalar_arguments_keep_their_values_and_types():
    # Calls run one by one pass a scalar seen before as a cached device array; the results
    # must be those of Python numbers: weak types, -0.0, nan, complex and bool values.
    native = _native.fastpath()
    ints = torch.tensor([1, -2, 3])
    floats = torch.tensor([1.5, -0.0, 2.0])
    cases = [
        lambda t, f: t + 3,
        lambda t, f: t + (2**40 + 1),
        lambda t, f: f.double() * 0.1,
        lambda t, f: f.double().add(f.double(), alpha=0.1),
        lambda t, f: f.half() * 70000.0,
        lambda t, f: t * 2.5,
        lambda t, f: f * -0.0,
        lambda t, f: f * float("nan"),
        lambda t, f: f * 1j,
        lambda t, f: f.add(f, alpha=2),
        lambda t, f: t.add(t, alpha=-7),
        lambda t, f: f.pow(2),
    ]
    before = fusion.recording()
    fusion.set_enabled(False)
    try:
        count = native.scalar_array_count()
        ints_d, floats_d = ints.to("neuron"), floats.to("neuron")
        for case in cases:
            expected = case(ints, floats)
            for _ in range(3):  # the first call learns, the third passes the cached array
                result = case(ints_d, floats_d)
                assert result.dtype == expected.dtype
                torch.testing.assert_close(result.cpu(), expected, equal_nan=True)
                assert torch.equal(result.cpu().real.signbit(), expected.real.signbit())
        if fastpath.scalar_arrays_apply():
            assert native.scalar_array_count() > count
    finally:
        fusion.set_enabled(before)


def test_executables_of_other_sizes_do_not_trace_again_to_learn_their_results(
        tmp_path, monkeypatch):
    # Which results of an executable are None follows from its op and argument kinds: a
    # sequence one longer at every call traces its executables' results once, not per size.
    import jax

    monkeypatch.setenv("TORCHNEURON_CACHE_DIR", str(tmp_path))  # nothing learnt on disk
    traced = []
    real = jax.eval_shape
    monkeypatch.setattr(jax, "eval_shape", lambda *a, **k: traced.append(1) or real(*a, **k))
    for n in range(50, 56):
        x = torch.ones(n, 2, device="neuron")
        got = torch.cumsum(x * 3, 0).cpu()
        assert torch.equal(got, torch.cumsum(torch.ones(n, 2) * 3, 0))
    assert len(traced) <= 3  # full, mul and cumsum at their first size at most (18 before)
    # an op whose results do depend on the call: a masked output of another mask is traced
    w = torch.randn(3, 4, requires_grad=True)
    for mask in ((True, True, True), (True, False, False)):
        grads = torch.ops.aten.native_layer_norm_backward(
            torch.ones(2, 4), torch.randn(2, 4), [4], torch.zeros(2, 1), torch.ones(2, 1),
            w[0].detach(), w[1].detach(), list(mask))
        on_device = torch.ops.aten.native_layer_norm_backward(
            torch.ones(2, 4, device="neuron"), torch.randn(2, 4, device="neuron"), [4],
            torch.zeros(2, 1, device="neuron"), torch.ones(2, 1, device="neuron"),
            w[0].detach().to("neuron"), w[1].detach().to("neuron"), list(mask))
        assert [g is None for g in on_device] == [g is None for g in grads]
