"""Pad-safety rules of pointwise and creation ops."""

from __future__ import annotations

import math

import torch
import torch.fx

from ...lowerings import LOWERINGS
from .core import (
    RULES,
    Analyzer,
    Layout,
    Slots,
    _install,
    _only_sizes,
    _sym_uses,
    _tensor_nodes,
    _true_numbers,
    aten,
    padded_dims,
    prims,
    rule,
)

# -- pointwise ------------------------------------------------------------------------------

# Ops that map a zero to a zero whatever else they are given: they keep known-zero padding.
_ZERO_KEEPING = {
    aten.clone.default, aten._to_copy.default, prims.convert_element_type.default,
    aten.lift_fresh_copy.default, aten.alias.default, aten.detach.default, aten.neg.default,
    aten.relu.default, aten.abs.default, aten.lift_fresh.default,
}

_POINTWISE_EXTRA = (
    aten._to_copy.default, prims.convert_element_type.default, aten.lift_fresh_copy.default,
    aten.lift_fresh.default, aten.alias.default, aten.detach.default, aten.fill.Scalar,
    aten.fill.Tensor, aten.zero.default, aten.copy.default, aten.masked_fill.Tensor,
    aten.where.Scalar, aten.where.ScalarOther, aten.where.ScalarSelf,
    aten.leaky_relu_backward.default, aten.hardtanh_backward.default,
    aten.hardshrink_backward.default, aten.softshrink_backward.default, aten.clamp.Tensor,
    aten.clamp_min.Tensor, aten.clamp_max.Tensor,
)


def _broadcast_layout(an: Analyzer, node, tensors) -> Layout:
    meta = node.meta.get("val")
    rank = meta.dim()
    dims: list = [None] * rank
    for a in tensors:
        layout = an.layout(a)
        if layout is None:
            continue
        offset = rank - len(layout)
        for i, d in enumerate(layout):
            if d == ():
                continue
            j = offset + i
            if dims[j] is None:
                dims[j] = d
            elif dims[j] != d:
                an.fail(node, "its inputs lay out a padded dimension differently")
    for j in range(rank):
        if dims[j] is None:
            dims[j] = an.canonical_dim(meta.shape[j], node)
    return an.check(node, tuple(dims))


def pointwise(an: Analyzer, node) -> None:
    meta = node.meta.get("val")
    tensors = [a for a in _tensor_nodes(node) if an.layout(a) is not None]
    scalars = [name for name, _ in _sym_uses(an, node)]
    if isinstance(meta, list | tuple):  # frexp: two outputs of the same shape
        an.set_parts(node, [_layout_like(an, node, tensors, m) for m in meta])
    else:
        layout = _broadcast_layout(an, node, tensors)
        zero = frozenset()
        if node.target in _ZERO_KEEPING and tensors:
            zero = an.zero(tensors[0])
        elif node.target is aten.where.self and len(tensors) == 3:
            zero = an.zero(node.args[1]) & an.zero(node.args[2])
        elif node.target in (aten.mul.Scalar, aten.div.Scalar) and \
                isinstance(node.args[1], int | float) and math.isfinite(node.args[1]) and \
                (node.target is aten.mul.Scalar or node.args[1] != 0):
            zero = an.zero(node.args[0])
        an.set(node, layout, zero)
    _install(an, node, numbers=_true_numbers(an, node, scalars))


def _layout_like(an, node, tensors, meta) -> Layout:
    for a in tensors:
        layout = an.layout(a)
        if layout is not None and len(layout) == meta.dim():
            return an.check(node, layout, meta)
    return an.canonical(meta, node)


for _op in list(LOWERINGS):
    if torch.Tag.pointwise in _op.tags and _op is not aten.equal.default:
        RULES[_op] = pointwise
for _op in _POINTWISE_EXTRA:
    RULES.setdefault(_op, pointwise)


# -- creation -------------------------------------------------------------------------------


@rule(aten.full.default, aten.zeros.default, aten.ones.default, aten.empty.memory_format,
      aten.new_full.default, aten.new_zeros.default, aten.new_ones.default,
      aten.new_empty.default, aten.scalar_tensor.default, aten.full_like.default,
      aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default,
      aten.eye.default, aten.eye.m, aten.empty_permuted.default)
def creation(an: Analyzer, node) -> None:
    # Sizes take the bucket value (the value is the same at every index, so the true
    # region holds what the unpadded graph holds); a symbolic fill value takes the true one.
    meta = node.meta.get("val")
    like = node.args[0] if node.target in (aten.full_like.default, aten.zeros_like.default,
                                           aten.ones_like.default, aten.empty_like.default) \
        else None
    layout = an.layout(like) if like is not None else None
    if layout is None or len(layout) != meta.dim():
        layout = an.canonical(meta, node)
    an.check(node, layout)
    fill = Slots(node).value("fill_value")
    zero = frozenset()
    if node.target in (aten.zeros.default, aten.new_zeros.default, aten.zeros_like.default) or \
            (isinstance(fill, int | float) and not isinstance(fill, bool) and fill == 0):
        zero = frozenset(padded_dims(layout))
    an.set(node, layout, zero)
    _only_sizes(an, node, ("size", "n", "m", "fill_value", "s"))
    _install(an, node, numbers=_true_numbers(an, node, ("fill_value", "s")))


@rule(aten.arange.start_step, aten.arange.default, aten.arange.start)
def arange(an: Analyzer, node) -> None:
    # arange(start, end) over the bucket: the true region [0, end - start) holds the same
    # values; the padding holds the values past the end (replaced wherever they are read as
    # indices).
    slots = Slots(node)
    start = slots.value("start")
    step = slots.value("step")
    if isinstance(start, torch.fx.Node) and an.bucketed(start):
        an.fail(node, "a symbolic start moves the true region")
    if step is not None and step != 1:
        an.fail(node, "a step other than 1 with a symbolic end")
    an.set(node, an.canonical(node.meta["val"], node))
    _only_sizes(an, node, ("end",))
