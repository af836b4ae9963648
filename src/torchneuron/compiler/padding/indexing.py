"""Pad-safety rules of indexing, losses, random ops and writes into inputs."""

from __future__ import annotations

import jax.numpy as jnp
import torch
import torch.fx

from .core import (
    RULES,
    ZERO,
    Analyzer,
    Slots,
    _install,
    _norm_dim,
    _static,
    _touches_padding,
    aten,
    is_padded,
    padded_dims,
    rule,
)

# -- indexing ---------------------------------------------------------------------------------


def _index_masks(an: Analyzer, node, name: str, fill=ZERO) -> list:
    value = Slots(node).value(name)
    layout = an.layout(value)
    if layout is None:
        return []
    padded = padded_dims(layout)
    if fill == ZERO and set(padded) <= an.zero(value):
        return []
    return [(name, layout, padded, fill)]


@rule(aten.embedding.default)
def embedding(an: Analyzer, node) -> None:
    weight, indices = an.layout(node.args[0]), an.layout(node.args[1])
    if padded_dims(weight):
        an.fail(node, "the embedding table is padded")
    an.set(node, an.check(node, indices + (weight[1],)))
    _install(an, node, masks=_index_masks(an, node, "indices"))


@rule(aten.embedding_dense_backward.default)
def embedding_backward(an: Analyzer, node) -> None:
    grad, indices = an.layout(node.args[0]), an.layout(node.args[1])
    if Slots(node).value("scale_grad_by_freq"):
        if padded_dims(indices):
            an.fail(node, "scale_grad_by_freq counts the padding's indices")
    an.set(node, an.canonical(node.meta["val"], node))
    masks = _index_masks(an, node, "indices")
    padded = padded_dims(grad)
    if padded and not set(padded) <= an.zero(node.args[0]):
        masks.append(("grad_output", grad, padded, ZERO))
    _install(an, node, masks=masks)


@rule(aten.index_select.default)
def index_select(an: Analyzer, node) -> None:
    source, index = an.layout(node.args[0]), an.layout(node.args[2])
    dim = _norm_dim(node.args[1], len(source))
    if is_padded(source[dim]):
        an.fail(node, "indexes into a padded dimension (its bounds are the true size)")
    layout = source[:dim] + ((index[0] if index else ()),) + source[dim + 1:]
    an.set(node, an.check(node, layout))
    _install(an, node, masks=_index_masks(an, node, "index"))


@rule(aten.gather.default)
def gather(an: Analyzer, node) -> None:
    source, index = an.layout(node.args[0]), an.layout(node.args[2])
    dim = _norm_dim(node.args[1], len(source))
    if is_padded(source[dim]):
        an.fail(node, "gathers along a padded dimension (its bounds are the true size)")
    for k, (s, i) in enumerate(zip(source, index)):
        if k != dim and is_padded(i) and s != i:
            an.fail(node, "its index is padded where the source is not")
    an.set(node, an.check(node, index))
    _install(an, node, masks=_index_masks(an, node, "index"))


@rule(aten.index.Tensor, aten._unsafe_index.Tensor)
def index(an: Analyzer, node) -> None:
    # Advanced indexing with one or more index tensors (broadcast together). Padded index
    # entries are set to 0, a valid index, and land in padded positions of the result. An
    # index into a padded source dim keeps the true bounds: a value outside the true size
    # (negative ones wrapped by the true size) is moved outside the bucket, so the graph's
    # bound check raises where the unpadded graph would.
    source = an.layout(node.args[0])
    indices = list(node.args[1])
    present = [i for i, x in enumerate(indices) if x is not None]
    if not present:
        _static_or_same(an, node)
        return
    bounded = []
    for p in present:
        if is_padded(source[p]):
            if len(source[p]) != 1:
                an.fail(node, "indexes into a padded dimension laid out in several factors")
            bounded.append(p)
    layouts = {p: an.layout(indices[p]) for p in present}
    if any(layout is None for layout in layouts.values()):
        an.fail(node, "an index that is not a tensor")
    rank = max(len(layout) for layout in layouts.values())
    dims: list = [()] * rank
    for layout in layouts.values():
        for j, d in enumerate(layout, start=rank - len(layout)):
            if d == ():
                continue
            if dims[j] == ():
                dims[j] = d
            elif dims[j] != d:
                an.fail(node, "its index tensors lay out a padded dimension differently")
    if present == list(range(present[0], present[-1] + 1)):  # adjacent: in place
        layout = source[:present[0]] + tuple(dims) + source[present[-1] + 1:]
    else:  # PyTorch moves the indexed dims to the front
        layout = tuple(dims) + tuple(d for i, d in enumerate(source) if i not in present)
    an.set(node, an.check(node, layout))
    masked = [(p, layouts[p], padded_dims(layouts[p])) for p in present
              if padded_dims(layouts[p]) and not set(padded_dims(layouts[p])) <= an.zero(indices[p])]
    if not bounded and not masked:
        return

    def rewrite(args, kwargs, call, trace):
        args = list(args)
        lst = list(args[1])
        for p in bounded:
            true, bucket = trace.true(source[p][0]), trace.padded(source[p][0])
            i = lst[p]
            i = jnp.where(i < 0, i + true, i)
            lst[p] = jnp.where((i < 0) | (i >= true), bucket, i)
        for p, index_layout, padded in masked:
            lst[p] = trace.mask(lst[p], index_layout, padded, ZERO)
        args[1] = lst
        return call(args, kwargs)

    an.actions[node] = rewrite


def _static_or_same(an: Analyzer, node) -> None:
    meta = node.meta["val"]
    an.set(node, an.canonical(meta, node))


def _nll_arguments(an: Analyzer, node, self_index: int):
    """(slots, input layout, target layout, class dim, ignore_index) of an nll_loss node whose
    input is argument `self_index` (its target the next one)."""
    slots = Slots(node)
    source, target = an.layout(node.args[self_index]), an.layout(node.args[self_index + 1])
    class_dim = 0 if len(source) == 1 else 1
    if is_padded(source[class_dim]):
        an.fail(node, "the class dimension is padded")
    ignore = slots.value("ignore_index")
    if isinstance(ignore, torch.fx.Node):
        an.fail(node, "a symbolic ignore_index")
    return slots, source, target, class_dim, ignore


@rule(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss(an: Analyzer, node) -> None:
    # Padded targets become ignore_index: they add nothing to the sum nor to the count of a
    # mean; padded log-probabilities become 0 (the lowering multiplies them by a 0 weight).
    slots, source, target, class_dim, ignore = _nll_arguments(an, node, 0)
    reduction = slots.value("reduction")
    metas = node.meta["val"]
    out = target if reduction == 0 else ()
    an.set_parts(node, [an.check(node, out, metas[0]), an.check(node, (), metas[1])])
    padded = padded_dims(target)
    if not padded:
        return
    sample_dims = [d for d in range(len(source)) if d != class_dim]
    masks = [("target", target, padded, ignore),
             ("self", source, [d for d in sample_dims if is_padded(source[d])], ZERO)]
    _install(an, node, masks=masks)


@rule(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(an: Analyzer, node) -> None:
    _, source, target, _, ignore = _nll_arguments(an, node, 1)
    an.set(node, an.check(node, source))
    padded = padded_dims(target)
    if padded:
        _install(an, node, masks=[("target", target, padded, ignore)])


# -- ops that draw random numbers --------------------------------------------------------------


def _random(an: Analyzer, node) -> None:
    if _touches_padding(an, node):
        an.fail(node, "random draws at the bucket shape would differ from the unpadded draws")
    _static(an, node)


for _name in ("native_dropout", "bernoulli", "rand_like", "randn_like", "uniform", "normal",
              "exponential", "cauchy", "log_normal", "geometric", "random", "rand", "randn",
              "randint", "randint_like", "multinomial", "randperm", "rrelu_with_noise"):
    _packet = getattr(aten, _name, None)
    if _packet is None:
        continue
    for _overload in _packet.overloads():
        RULES.setdefault(getattr(_packet, _overload), _random)


@rule(aten.copy_.default)
def copy_(an: Analyzer, node) -> None:
    dst = an.layout(node.args[0])
    if dst is not None and padded_dims(dst):
        an.fail(node, "writes a padded value into a graph input")
    src = an.layout(node.args[1])
    if src is not None and padded_dims(src):
        an.fail(node, "writes a padded value into a graph input")
    _static(an, node)
