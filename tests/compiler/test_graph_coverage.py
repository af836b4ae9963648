"""Every op eager mode runs on the device can be inside a compiled graph (issue 13, point 1).

The walk covers the lowering table, the runtime's own kernels, the project's and PyTorch's
decompositions and the core-ATen op set; the graphs below exercise the ops that eager mode
reaches through runtime kernels or composite kernels (`_to_copy`, `empty_permuted`, `copy`,
...), whose graph lowerings are their own records.
"""

from __future__ import annotations

import inspect
import math
import re
import warnings

import pytest
import torch
import torch._decomp
import torch._dynamo
from torch.utils._sympy.reference import TensorReferenceAnalysis

import torchneuron
from torchneuron.compiler import support
from torchneuron.lowerings import LOWERINGS
from torchneuron.lowerings.registry import DECOMPOSITIONS
from torchneuron.runtime.plan import HANDLERS, Route, plan_for

aten = torch.ops.aten
DEV = "neuron"


def _has_kernel(op, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)


def _candidates() -> set:
    ops = set(LOWERINGS) | set(HANDLERS) | set(DECOMPOSITIONS) | set(torch._decomp.decomposition_table)
    for name in dir(aten):
        packet = getattr(aten, name)
        if isinstance(packet, torch._ops.OpOverloadPacket):
            for overload in packet.overloads():
                op = getattr(packet, overload)
                if torch.Tag.core in op.tags:
                    ops.add(op)
    return {op for op in ops if isinstance(op, torch._ops.OpOverload) and op.namespace == "aten"}


def _can_be_in_a_graph(op) -> bool:
    """AOTAutograd's graphs are functional and below CompositeImplicitAutograd."""
    try:
        if _has_kernel(op, "CompositeImplicitAutograd"):
            return False
    except RuntimeError:  # an overload name without a registered operator
        return False
    return not any(a.alias_info and a.alias_info.is_write for a in op._schema.arguments)


def _eager_runs_on_device(op) -> bool:
    if plan_for(op).route is not Route.FALLBACK:
        return True
    # Composite kernels run on the device through other ops (copy = clone + copy_).
    return _has_kernel(op, "CompositeExplicitAutograd") or _has_kernel(
        op, "CompositeExplicitAutogradNonFunctional")


def test_every_op_eager_runs_on_the_device_can_be_in_a_graph():
    missing = []
    for op in sorted(_candidates(), key=str):
        if not _can_be_in_a_graph(op) or not _eager_runs_on_device(op):
            continue
        if op in support.NOT_IN_GRAPHS:
            continue
        reason = support.op_refusal(op)
        if reason is not None:
            missing.append(f"{op} ({plan_for(op).route.label} in eager mode): {reason}")
    assert not missing, "ops eager mode runs but graphs cannot:\n" + "\n".join(missing)
    # The walk saw the ops of the issue, and they are lowered in graphs.
    for op in (aten._to_copy.default, aten.empty_permuted.default, aten.slice_scatter.default,
               aten.index.Tensor, aten.copy.default):
        assert support.op_refusal(op) is None, op


def _symbolic_scalar_ops() -> set:
    """The ATen ops Dynamo's pass for symbolic Python floats (torch.fx.passes.
    _tensorify_python_scalars) can put into a graph after AOTAutograd's decompositions: those
    of the sympy interpreter it uses, some of them composite ops no decomposition removes."""
    source = inspect.getsource(TensorReferenceAnalysis)
    ops = set()
    for name, overload in re.findall(r"torch\.ops\.aten\.(\w+)(?:\.(\w+))?", source):
        packet = getattr(aten, name)
        for each in [overload] if overload else packet.overloads():
            op = getattr(packet, each, None)  # the source names some overloads that do not exist
            if op is None:
                continue
            if not any(a.alias_info and a.alias_info.is_write for a in op._schema.arguments):
                ops.add(op)
    ops.add(torch.ops.prims.convert_element_type.default)
    return ops


def test_ops_of_symbolic_python_scalars_can_be_in_a_graph():
    ops = _symbolic_scalar_ops()
    assert aten.true_divide.Tensor in ops and len(ops) > 30  # the walk read the interpreter
    # A lowering, not a decomposition: the pass runs after AOTAutograd has decomposed.
    missing = [str(op) for op in sorted(ops, key=str) if support.graph_lowering(op) is None]
    assert not missing, "ops of symbolic scalars that graphs cannot hold: " + ", ".join(missing)


def test_ops_graphs_cannot_hold_are_data_dependent_or_host_side():
    # The exceptions are few and each says why (a reason a user can act on).
    for op, reason in support.NOT_IN_GRAPHS.items():
        assert reason and op in _candidates() | set(support.NOT_IN_GRAPHS)
    assert support.op_refusal(aten.nonzero.default).startswith("its output shape depends")


@pytest.fixture(autouse=True)
def _fresh(fresh_compile_state):
    """A new cache directory, Dynamo state and compile counters per test (tests/conftest.py)."""


def _compiled_matches_eager(fn, *inputs, grad=False):
    def run(device, compiled):
        xs = [x.detach().clone().to(device).requires_grad_(grad and x.is_floating_point())
              for x in inputs]
        f = torch.compile(fn, backend="neuron") if compiled else fn
        out = f(*xs)
        if grad:
            out.float().sum().backward()
            return [out.detach().cpu()] + [x.grad.cpu() for x in xs if x.grad is not None]
        return [o.detach().cpu() for o in (out if isinstance(out, tuple) else (out,))]

    expected = run("cpu", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no graph runs eagerly
        got = run(DEV, True)
    for a, b in zip(expected, got):
        torch.testing.assert_close(b, a)
    stats = torchneuron.compile_stats()
    assert stats["eager_fallbacks"] == 0 and stats["xla_compilations"] >= 1


def test_dtype_casts_inside_a_graph():
    # RMSNorm's `.float()` and back, a bfloat16 round trip, an integer cast.
    # (The bfloat16 round trip is of exact input values: rounding a computed value to
    # bfloat16 can flip by one bfloat16 ulp when the float32 values differ by one ulp.)
    def f(x):
        h = x.float()
        normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return normed + h.to(torch.bfloat16).to(torch.float32) + x.to(torch.int64).to(h.dtype)

    g = torch.Generator().manual_seed(0)
    _compiled_matches_eager(f, torch.randn(4, 8, dtype=torch.float64, generator=g) * 3, grad=True)


def test_symbolic_python_floats_inside_a_graph():
    # With dynamic=True a Python float argument stays symbolic: Dynamo computes with it as
    # 0-d float64 tensors (`true_divide`, `convert_element_type`, ...), one executable for all.
    def f(x, s):
        return x * (s / 3.0) + math.sqrt(s) * x - s ** 2

    compiled = torch.compile(f, backend="neuron", dynamic=True)
    x = torch.arange(6.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no graph runs eagerly
        for s in (2.0, 3.5, 4.25):
            torch.testing.assert_close(compiled(x.to(DEV), s).cpu(), f(x, s))
    stats = torchneuron.compile_stats()
    assert stats["eager_fallbacks"] == 0 and stats["xla_compilations"] == 1


def test_host_values_inside_a_graph():
    # A constant made on the host and moved to the device, and a result for the host.
    def f(x):
        window = torch.tensor([2, 3]).to(x.device)
        y = x * window
        return y, y.sum().cpu()

    x = torch.randn(5, 2)
    compiled = torch.compile(f, backend="neuron")
    y, total = compiled(x.to(DEV))
    assert y.device.type == DEV and total.device.type == "cpu"
    torch.testing.assert_close(y.cpu(), f(x)[0])
    torch.testing.assert_close(total, f(x)[1])
    assert torchneuron.compile_stats()["eager_fallbacks"] == 0


def test_allocation_and_slices_inside_a_graph():
    # empty_permuted (a backward's gradient buffer), slice_scatter (the backward of a slice),
    # copy (a slice assignment), select_scatter.
    def f(x):
        buf = torch.empty_permuted((3, 4), (1, 0), device=x.device)
        buf.fill_(1.0)
        y = x.clone()
        y[:, 1:3] = x[:, :2] * 2
        y[0] = y[1]
        return (y[:, 1:] * buf[:, :3]).sum(0)

    _compiled_matches_eager(f, torch.randn(3, 4, generator=torch.Generator().manual_seed(0)),
                            grad=True)


def test_integer_and_mask_indexing_inside_a_graph():
    def f(x, idx, mask):
        picked = x[idx] + x[:, idx[1:2]].sum()
        y = x.clone()
        y[mask] = 0.0
        y[idx] = picked
        return y

    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    idx = torch.tensor([4, 0, -1])
    mask = torch.tensor([True, False, True, False, False])
    _compiled_matches_eager(f, x, idx, mask)


def test_out_of_range_index_raises_in_a_graph():
    def f(x, idx):
        return x[idx] * 2

    compiled = torch.compile(f, backend="neuron")
    x = torch.randn(5, 3, device=DEV)
    compiled(x, torch.tensor([1, 2], device=DEV))
    with pytest.raises(IndexError, match=r"index out of range.*test_graph_coverage\.py:\d+ in f"):
        compiled(x, torch.tensor([1, 7], device=DEV)).cpu()  # raised at the next sync point


def test_rand_inside_a_graph_is_seeded():
    def f(x):
        return x + torch.rand(x.shape, device=x.device)

    compiled = torch.compile(f, backend="neuron")
    x = torch.zeros(64, device=DEV)
    torch.manual_seed(3)
    first = compiled(x).cpu()
    torch.manual_seed(3)
    again = compiled(x).cpu()
    torch.testing.assert_close(again, first)
    assert (first >= 0).all() and (first < 1).all() and first.std() > 0.1


def test_an_unlowerable_graph_says_so_once_with_the_source_line():
    def f(x):
        return torch.ops.tn_test.cpu_only_scale.default(x, 2.0) + 1  # the line named

    x = torch.randn(4, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = torch.compile(f, backend="neuron")(x.to(DEV))
        torch._dynamo.reset()
        torch.compile(f, backend="neuron")(x.to(DEV))  # compiled again: no second warning
    torch.testing.assert_close(out.cpu(), f(x))
    messages = [str(w.message) for w in caught if "eager mode" in str(w.message)]
    assert len(messages) == 1, messages
    assert "tn_test.cpu_only_scale.default" in messages[0]
    assert "test_graph_coverage.py" in messages[0] and "the line named" in messages[0]
    assert "it has no lowering" in messages[0]
    assert torchneuron.compile_stats()["eager_fallbacks"] == 2
