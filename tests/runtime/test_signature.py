"""Arguments of other devices (runtime/signature.py): CUDA's rules. CPU index tensors (and
masks) of advanced indexing are moved to the device; 0-dim CPU tensors are scalars
everywhere; any other CPU tensor among a device op's arguments is refused."""

from __future__ import annotations

import pytest
import torch

import torchneuron  # noqa: F401  (registers the neuron device)
from torchneuron.runtime import _native, fusion, signature, storage
from torchneuron.runtime.plan import is_default, plan_for

DEV = "neuron"
_IDX = torch.tensor([0, 2, 2])
_MASK = torch.tensor([True, False, True, False, True])


def _same_as_cpu(fn) -> None:
    expected = fn(torch.arange(5.0))
    result = fn(torch.arange(5.0, device=DEV))
    assert result.device.type == DEV
    torch.testing.assert_close(result.cpu(), expected)


@pytest.mark.parametrize("fn", [
    lambda x: x[_IDX],
    lambda x: x[_MASK],
    lambda x: x.reshape(5, 1)[_IDX, torch.tensor([0])],
    lambda x: x.__setitem__(_IDX, 7.0) or x,
    lambda x: x.__setitem__(_MASK, torch.tensor(7.0)) or x,
    lambda x: x.index_put_((_IDX,), torch.tensor(5.0), accumulate=True),
    lambda x: x.index_put_((_IDX,), torch.tensor([1.0, 2.0, 3.0], device=x.device)),
    lambda x: x.__setitem__(_IDX, x[_IDX] + 1) or x,
], ids=["index", "mask", "two_indices", "setitem", "setitem_mask", "index_put_accumulate",
        "index_put_values_on_device", "getitem_setitem"])
def test_cpu_index_tensors_are_accepted(fn):
    _same_as_cpu(fn)


def test_cpu_index_tensors_in_backward():
    x, xd = torch.arange(5.0, requires_grad=True), torch.arange(5.0, device=DEV, requires_grad=True)
    x[_IDX].sum().backward()
    xd[_IDX].sum().backward()
    torch.testing.assert_close(xd.grad.cpu(), x.grad)


@pytest.mark.parametrize("fn", [
    lambda x: x + torch.tensor(2.0),
    lambda x: torch.tensor(2.0) < x,
    lambda x: torch.where(x > 1, x, torch.tensor(0.0)),
    lambda x: x.masked_fill(x > 2, torch.tensor(9.0)),
    lambda x: x.clamp(torch.tensor(1.0), torch.tensor(3.0)),
    lambda x: torch.lerp(x, x * 2, torch.tensor(0.5)),
    lambda x: x.fill_(torch.tensor(3.0)),
    lambda x: x[torch.tensor(1)],
], ids=["add", "lt", "where", "masked_fill", "clamp", "lerp", "fill_", "index_0d"])
def test_cpu_scalars_are_accepted(fn):
    _same_as_cpu(fn)


@pytest.mark.parametrize("fn", [
    lambda x: x.index_put_((_IDX,), torch.tensor([1.0, 2.0, 3.0])),  # CPU values
    lambda x: x.index_select(0, _IDX),
    lambda x: x.gather(0, _IDX),
    lambda x: x + torch.ones(5),
], ids=["index_put_cpu_values", "index_select", "gather", "add"])
def test_other_cpu_tensors_are_refused_as_on_cuda(fn):
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        fn(torch.arange(5.0, device=DEV))


def test_a_0dim_cpu_tensor_promotes_apart_from_a_python_number():
    # test_binary_ufuncs test_type_promotion: after `x * 1.0` (a wrapped number, float64 in
    # C++), `x * torch.tensor(2.0, dtype=float64)` hit the same fast-path executable and
    # came back float32 instead of float64.
    for op in (torch.mul, torch.floor_divide):
        x = torch.ones(5, dtype=torch.int64)
        others = [lambda: 1.0, lambda: torch.tensor(2.0),
                  lambda: torch.tensor(2.0, dtype=torch.float64)] * 2
        for other in others:
            expected = op(x, other())
            result = op(x.to(DEV), other())
            assert result.dtype == expected.dtype
            torch.testing.assert_close(result.cpu(), expected)


def _views() -> dict:
    base = torch.arange(24.0, device=DEV).reshape(4, 6)
    return {
        "whole": base,
        "slice": base[1:3],
        "strided": base.t(),
        "int64 whole": torch.arange(5, device=DEV),
        "bool": torch.ones(3, dtype=torch.bool, device=DEV),
        "bfloat16": torch.ones(2, 3, dtype=torch.bfloat16, device=DEV),
        "0-dim device": torch.tensor(2.5, device=DEV),
        "cpu step counter": torch.tensor(3.0),
        "cpu int": torch.tensor(7),
        "cpu bool": torch.tensor(True),
        "reinterpreted": base.view(torch.int32),
    }


@pytest.mark.skipif(signature.plain_tensor_key is signature._python_plain_tensor_key,
                    reason="the C++ library is not built in this process")
@pytest.mark.parametrize("name", list(_views()))
def test_native_key_of_a_plain_tensor_equals_pythons(name):
    # Compiled graphs key their tensor arguments with the C++ library's tensor_key; it must
    # give the key and inputs Python gives (signature.tensor_key), or leave the tensor to it.
    t = _views()[name]
    native_inputs, python_inputs = [], []
    native = signature.plain_tensor_key(t, native_inputs)
    python = signature.tensor_key(t, python_inputs)
    if native is None:
        assert native_inputs == []
        return
    assert native == python and hash(native) == hash(python)
    assert type(native[1]) is type(python[1])
    assert len(native_inputs) == len(python_inputs)
    for a, b in zip(native_inputs, python_inputs):
        assert a is b or (type(a) is type(b) and a == b)


@pytest.mark.skipif(signature.plain_tensor_key is signature._python_plain_tensor_key,
                    reason="the C++ library is not built in this process")
def test_native_key_leaves_other_arguments_to_python():
    inputs: list = []
    for value in (3, 2.0, None, torch.ones(2), torch.tensor(1 + 2j),
                  torch.ones((), requires_grad=True),
                  torch.ones(2, dtype=torch.complex64, device=DEV).conj()):
        assert signature.plain_tensor_key(value, inputs) is None, value
    assert inputs == []


@pytest.mark.skipif(signature.set_buffers is signature._python_set_buffers,
                    reason="the C++ library is not built in this process")
def test_set_buffers_swaps_storage_buffers_or_changes_nothing():
    a, b = torch.zeros(3, device=DEV), torch.zeros(2, 2, device=DEV)
    new_a, new_b = torch.arange(3.0, device=DEV), torch.ones(4, device=DEV)
    buffers = [storage.storage_buffer(t.untyped_storage(), t.dtype) for t in (new_a, new_b)]
    assert signature.set_buffers([a, b], buffers) is True
    torch.testing.assert_close(a.cpu(), torch.arange(3.0))
    torch.testing.assert_close(b.cpu(), torch.ones(2, 2))
    # A tensor without a payload (another device): nothing is written, Python takes over.
    assert signature.set_buffers([a, torch.zeros(3)], [buffers[1], buffers[0]]) is False
    torch.testing.assert_close(a.cpu(), torch.arange(3.0))


def test_a_traced_number_at_its_schema_default_is_no_input():
    # add's alpha=1 (also sub's, addmm's beta and alpha): a call run by itself gives the
    # lowering the constant, its executable one input less, and the key of an argument left
    # out. A recorded call keeps it an input: fused programs compute as they did.
    plan = plan_for(torch.ops.aten.add.Tensor)
    a, b = torch.ones(3, device=DEV), torch.ones(3, device=DEV)
    was = fusion.recording()
    try:
        fusion.set_enabled(False)
        key, inputs = signature.arguments_key(plan, plan.bind((a, b), {}))
        assert key[2] is None and len(inputs) == 2
        key, inputs = signature.arguments_key(plan, plan.bind((a, b), {"alpha": 2}))
        assert key[2] is int and len(inputs) == 3
        # Another type, or a zero of the other sign, is not the default.
        key, _ = signature.arguments_key(plan, plan.bind((a, b), {"alpha": 1.0}))
        assert key[2] is float
        if fusion._NATIVE is not None:
            fusion.set_enabled(True)
            key, inputs = signature.arguments_key(plan, plan.bind((a, b), {}))
            assert key[2] is int and len(inputs) == 3
    finally:
        fusion.set_enabled(was)
    assert is_default(0.0, 0.0) and is_default(1, 1)
    assert not is_default(-0.0, 0.0) and not is_default(True, 1) and not is_default(1.0, 1)


@pytest.mark.parametrize("fused", [False, True], ids=["op_by_op", "fused"])
def test_numbers_at_and_off_their_defaults_compute_as_on_cpu(fused):
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    calls = [
        lambda x, y: x + y,
        lambda x, y: torch.add(x, y, alpha=2),
        lambda x, y: torch.add(x, y, alpha=1.0),
        lambda x, y: torch.sub(x, y, alpha=-0.5),
        lambda x, y: torch.addmm(x, x, y),
        lambda x, y: torch.addmm(x, x, y, beta=0.5, alpha=1),
        lambda x, y: torch.nn.functional.leaky_relu(x),
        lambda x, y: torch.nn.functional.leaky_relu(x, -0.0),
        lambda x, y: x.clone().add_(y, alpha=3),
        lambda x, y: (x > 0).add(y > 0),
    ]
    was = fusion.recording()
    fusion.set_enabled(fused)
    try:
        native = _native.fastpath()
        if native is not None:
            native.reset_fast_counts()
        xd, yd = x.to(DEV), y.to(DEV)
        for _ in range(3):  # the second and later calls take the C++ fast path when it is built
            for fn in calls:
                torch.testing.assert_close(fn(xd, yd).cpu(), fn(x, y))
        if native is not None and not fused:
            assert native.fast_counts().get("aten.add.Tensor", 0) >= 4
    finally:
        fusion.set_enabled(was)
