"""Which ATen ops a compiled graph can hold, and which AOTAutograd decomposes first.

Every op that eager mode runs on the device (through its lowering, a runtime kernel, a view
or a decomposition) must be computable inside a graph too, or the graph runs op by op: a
graph calls an op's lowering (`graph_lowering`, which includes the graph-only records of
`_to_copy`, `empty_*` and the traceable forms of `index`/`index_put`), or AOTAutograd
decomposes the op first, with the decomposition eager mode runs (`graph_decompositions`).
`NOT_IN_GRAPHS` lists the few ops that cannot be inside one executable and why;
tests/compiler/test_graph_coverage.py walks the whole table.
"""

from __future__ import annotations

import functools

import torch
import torch._decomp
from torch._decomp import core_aten_decompositions

from ..lowerings import LOWERINGS, Lowering
from ..lowerings.registry import DECOMPOSITIONS
from ..runtime.plan import Route, plan_for

aten = torch.ops.aten
OpOverload = torch._ops.OpOverload

_DATA_DEPENDENT = (
    "its output shape depends on the values (Dynamo splits the graph before such an op "
    "unless torch._dynamo.config.capture_dynamic_output_shape_ops is set; leave it unset)"
)

# Ops eager mode runs on the device that one executable cannot hold, and why.
NOT_IN_GRAPHS: dict[OpOverload, str] = {
    aten._local_scalar_dense.default: (
        "it reads a value back to the host (`.item()`); Dynamo splits the graph there unless "
        "torch._dynamo.config.capture_scalar_outputs is set"
    ),
    aten.nonzero.default: _DATA_DEPENDENT,
    aten.masked_select.default: _DATA_DEPENDENT,
    aten._unique2.default: _DATA_DEPENDENT,
    aten.unique_consecutive.default: _DATA_DEPENDENT,
    aten.bincount.default: _DATA_DEPENDENT,
    aten.repeat_interleave.Tensor: _DATA_DEPENDENT,
    aten._pin_memory.default: "pinned memory is host memory",
    aten.is_pinned.default: "pinned memory is host memory",
    aten._nested_view_from_buffer.default: "nested tensors are not supported on the device",
    # The runtime's cross-device copies: AOTAutograd's functional graphs hold `_to_copy`.
    aten._copy_from.default: "a copy between storages; graphs hold `_to_copy` instead",
    aten._copy_from_and_resize.default: "a copy between storages; graphs hold `_to_copy` instead",
}


# Assertions AOTAutograd may leave in a graph; its tracing already checked them for the
# shapes an executable serves, so they compute nothing.
CHECKS = frozenset({
    aten._assert_tensor_metadata.default, aten._assert_scalar.default,
    aten.sym_constrain_range.default, aten.sym_constrain_range_for_size.default,
    aten._functional_sym_constrain_range.default,
    aten._functional_sym_constrain_range_for_size.default,
})


def is_foreach(target) -> bool:
    packet = getattr(target, "_overloadpacket", None)
    return packet is not None and packet.__name__.startswith("_foreach_")


# Per-element overloads to try for each `_foreach_*` overload, in order.
_FOREACH_OVERLOADS = {
    "default": ("default",),
    "Scalar": ("Tensor", "Tensor_Scalar", "default"),
    "ScalarList": ("Tensor", "Tensor_Scalar", "default"),
    "List": ("Tensor", "Tensor_Tensor", "default"),
    "Tensor": ("Tensor", "Tensor_Tensor"),
    "ScalarAndTensor": ("Scalar",),
}


def foreach_base(target):
    """The per-tensor op a `_foreach_*` overload applies, when it has a usable lowering."""
    name = target._overloadpacket.__name__[len("_foreach_"):]
    packet = getattr(aten, name, None)
    if packet is None or name in ("copy", "zero", "norm"):
        return None
    if packet in (aten.addcmul, aten.addcdiv) and target._overloadname != "Scalar" and \
            target._overloadname != "ScalarList":
        return None
    for overload in _FOREACH_OVERLOADS.get(target._overloadname, ()):
        op = getattr(packet, overload, None)
        if op is not None and op in LOWERINGS:
            lowering = LOWERINGS[op]
            if lowering.jit and not lowering.rng and lowering.index_error is None:
                return op
    return None


def graph_lowering(op: OpOverload) -> Lowering | None:
    """The record a graph calls for `op`: its lowering, or the traceable form of a lowering
    that runs on concrete arrays in eager mode (`graph_form`)."""
    lowering = LOWERINGS.get(op)
    if lowering is None or lowering.jit:
        return lowering
    return lowering.graph_form


@functools.cache
def graph_decompositions() -> dict:
    """What AOTAutograd decomposes before the backend sees a graph: PyTorch's core-ATen
    decompositions, the project's marked for graphs, and every decomposition eager mode runs
    for an op without a lowering; minus the ops a graph lowers as single nodes (XLA fuses
    them better than their pieces)."""
    table = dict(core_aten_decompositions())
    for op, decomposition in DECOMPOSITIONS.items():
        if decomposition.in_graphs:
            table[op] = decomposition.fn
    for op in set(torch._decomp.decomposition_table) | set(DECOMPOSITIONS):
        if op in table or graph_lowering(op) is not None or not isinstance(op, OpOverload):
            continue
        plan = plan_for(op)
        if plan.route is Route.DECOMPOSED and plan.decomposition is not None:
            table[op] = plan.decomposition
    for op in list(table):
        if graph_lowering(op) is not None:
            del table[op]
    return table


def op_refusal(op: OpOverload) -> str | None:
    """Why no graph can hold `op` (None: graphs lower it, or AOTAutograd decomposes it)."""
    if op in NOT_IN_GRAPHS:
        return NOT_IN_GRAPHS[op]
    if op in CHECKS:
        return None
    if is_foreach(op):
        return None if foreach_base(op) is not None else "it has no per-tensor lowering"
    if op in graph_decompositions():
        return None
    lowering = graph_lowering(op)
    if lowering is None:
        if op in LOWERINGS:
            return _DATA_DEPENDENT
        return "it has no lowering"
    return None
