"""Pad-safety rules of matmuls, reductions, softmax and normalization."""

from __future__ import annotations

import jax.numpy as jnp
import torch
import torch.fx

from ...lowerings.dtypes import to_jax_dtype
from ...lowerings.registry import upcast_half
from .core import (
    HIGHEST,
    LOWEST,
    ONE,
    RULES,
    ZERO,
    Analyzer,
    Slots,
    _dims_arg,
    _install,
    _norm_dim,
    aten,
    is_padded,
    padded_dims,
    rule,
)

# -- matmuls ----------------------------------------------------------------------------------


def _contract(an: Analyzer, node, a_name, a_dim, b_name, b_dim) -> list:
    """The masks a contraction over (a_dim of a, b_dim of b) needs: both operands' padding
    zeroed along the contracted dim (0 * NaN would leak otherwise), unless known zero."""
    slots = Slots(node)
    a, b = slots.value(a_name), slots.value(b_name)
    la, lb = an.layout(a), an.layout(b)
    if la[a_dim] != lb[b_dim]:
        an.fail(node, "its operands lay out the contracted dimension differently")
    if not is_padded(la[a_dim]):
        return []
    masks = []
    if a_dim not in an.zero(a):
        masks.append((a_name, la, [a_dim], ZERO))
    if b_dim not in an.zero(b):
        masks.append((b_name, lb, [b_dim], ZERO))
    return masks


@rule(aten.mm.default)
def mm(an: Analyzer, node) -> None:
    la, lb = an.layout(node.args[0]), an.layout(node.args[1])
    masks = _contract(an, node, "self", 1, "mat2", 0)
    an.set(node, an.check(node, (la[0], lb[1])))
    _install(an, node, masks=masks)


@rule(aten.addmm.default, aten._addmm_activation.default)
def addmm(an: Analyzer, node) -> None:
    la, lb = an.layout(node.args[1]), an.layout(node.args[2])
    masks = _contract(an, node, "mat1", 1, "mat2", 0)
    layout = (la[0], lb[1])
    _check_bias(an, node, layout)
    an.set(node, an.check(node, layout))
    _install(an, node, masks=masks)


def _check_bias(an: Analyzer, node, layout) -> None:
    """The bias (argument 0, broadcast to the product) must lay out padded dims as it does."""
    bias = an.layout(node.args[0])
    for i, d in enumerate(bias):
        if d != () and d != layout[len(layout) - len(bias) + i]:
            an.fail(node, "its bias lays out a padded dimension differently")


@rule(aten.bmm.default, aten.baddbmm.default)
def bmm(an: Analyzer, node) -> None:
    # baddbmm: a bias (argument 0) plus the bmm of arguments 1 and 2
    with_bias = node.target is aten.baddbmm.default
    first = 1 if with_bias else 0
    la, lb = an.layout(node.args[first]), an.layout(node.args[first + 1])
    if la[0] != lb[0]:
        an.fail(node, "its operands lay out the batch dimension differently")
    a_name, b_name = ("batch1", "batch2") if with_bias else ("self", "mat2")
    masks = _contract(an, node, a_name, 2, b_name, 1)
    layout = (la[0], la[1], lb[2])
    if with_bias:
        _check_bias(an, node, layout)
    an.set(node, an.check(node, layout))
    _install(an, node, masks=masks)


@rule(aten.dot.default, aten.vdot.default)
def dot(an: Analyzer, node) -> None:
    masks = _contract(an, node, "self", 0, "other" if node.target is aten.vdot.default else "tensor", 0)
    an.set(node, an.check(node, ()))
    _install(an, node, masks=masks)


@rule(aten.mv.default)
def mv(an: Analyzer, node) -> None:
    la = an.layout(node.args[0])
    masks = _contract(an, node, "self", 1, "vec", 0)
    an.set(node, an.check(node, (la[0],)))
    _install(an, node, masks=masks)


# -- reductions -------------------------------------------------------------------------------

# op -> (neutral fill, name of the dims argument or None for all dims, returns indices)
_REDUCTIONS = {
    aten.sum.dim_IntList: (ZERO, "dim", False),
    aten.sum.default: (ZERO, None, False),
    aten.nansum.default: (ZERO, "dim", False),
    aten.count_nonzero.dim_IntList: (ZERO, "dim", False),
    aten.count_nonzero.default: (ZERO, "dim", False),
    aten.prod.dim_int: (ONE, "dim", False),
    aten.prod.default: (ONE, None, False),
    aten.amax.default: (LOWEST, "dim", False),
    aten.amin.default: (HIGHEST, "dim", False),
    aten.any.dim: (ZERO, "dim", False),
    aten.any.dims: (ZERO, "dim", False),
    aten.any.default: (ZERO, None, False),
    aten.all.dim: (ONE, "dim", False),
    aten.all.dims: (ONE, "dim", False),
    aten.all.default: (ONE, None, False),
    aten.logsumexp.default: (LOWEST, "dim", False),
    aten.max.dim: (LOWEST, "dim", True),
    aten.min.dim: (HIGHEST, "dim", True),
    aten.max.default: (LOWEST, None, False),
    aten.min.default: (HIGHEST, None, False),
    aten.argmax.default: (LOWEST, "dim", True),
    aten.argmin.default: (HIGHEST, "dim", True),
}


def _reduced(an: Analyzer, node, dims_name):
    slots = Slots(node)
    source = an.layout(node.args[0])
    rank = len(source)
    dims = _dims_arg(slots.value(dims_name) if dims_name else None, rank)
    keepdim = bool(slots.value("keepdim")) if "keepdim" in [a.name for a in slots.schema.arguments] \
        else False
    if node.target in (aten.argmax.default, aten.argmin.default) and slots.value("dim") is None:
        keepdim = False
    layout = tuple(() if i in dims else d for i, d in enumerate(source) if keepdim or i not in dims)
    zero = an.zero(node.args[0])
    kept = [i for i in range(rank) if keepdim or i not in dims]
    new_zero = {j for j, i in enumerate(kept) if i in zero and i not in dims}
    return source, dims, layout, new_zero


def reduction(an: Analyzer, node) -> None:
    fill, dims_name, indices = _REDUCTIONS[node.target]
    source, dims, layout, zero = _reduced(an, node, dims_name)
    meta = node.meta["val"]
    if isinstance(meta, list | tuple):
        an.set_parts(node, [an.check(node, layout, m) for m in meta], [zero, frozenset()])
    else:
        an.set(node, an.check(node, layout), zero)
    padded = [d for d in dims if is_padded(source[d])]
    if not padded:
        return
    if indices and any(len(source[d]) > 1 for d in padded):
        an.fail(node, "indices over a dimension flattened from a padded one count the padding")
    if indices and len(dims) > 1:
        an.fail(node, "indices over several padded dimensions count the padding")
    if fill != ZERO or not set(padded) <= an.zero(node.args[0]):
        _install(an, node, masks=[("self", source, padded, fill)])


for _op in _REDUCTIONS:
    RULES[_op] = reduction


@rule(aten.linalg_vector_norm.default)
def vector_norm(an: Analyzer, node) -> None:
    source, dims, layout, zero = _reduced(an, node, "dim")
    an.set(node, an.check(node, layout))
    ord_ = Slots(node).value("ord")
    ord_ = 2 if ord_ is None else ord_
    padded = [d for d in dims if is_padded(source[d])]
    if not padded:
        return
    if isinstance(ord_, torch.fx.Node):
        an.fail(node, "a symbolic order")
    fill = HIGHEST if ord_ < 0 else ZERO  # |inf|^p = 0 for p < 0; min |x| ignores +inf
    _install(an, node, masks=[("self", source, padded, fill)])


def _mean_of(x, region, axes, keepdim, count):
    x = x if region is None else jnp.where(region, x, jnp.zeros((), x.dtype))
    return jnp.sum(x, axis=tuple(axes), keepdims=keepdim) / count


@rule(aten.mean.dim, aten.mean.default)
def mean(an: Analyzer, node) -> None:
    dims_name = "dim" if node.target is aten.mean.dim else None
    source, dims, layout, zero = _reduced(an, node, dims_name)
    an.set(node, an.check(node, layout))
    if not any(is_padded(source[d]) for d in dims):
        return
    keepdim = bool(Slots(node).value("keepdim")) if dims_name else False

    def replace(slots, args, kwargs, trace):
        x = slots.get(args, kwargs, "self")
        dtype = slots.get(args, kwargs, "dtype")
        if dtype is not None:
            x = x.astype(to_jax_dtype(dtype))
        x = upcast_half(x)
        return _mean_of(x, trace.region(source, dims), dims, keepdim, trace.count(source, dims))
    _install(an, node, replace=replace)


@rule(aten.var.correction, aten.std.correction, aten.var_mean.correction,
      aten.std_mean.correction)
def variance(an: Analyzer, node) -> None:
    source, dims, layout, zero = _reduced(an, node, "dim")
    meta = node.meta["val"]
    if isinstance(meta, list | tuple):
        an.set_parts(node, [an.check(node, layout, m) for m in meta])
    else:
        an.set(node, an.check(node, layout))
    if not any(is_padded(source[d]) for d in dims):
        return
    slots0 = Slots(node)
    keepdim = bool(slots0.value("keepdim"))
    correction = slots0.value("correction")
    if isinstance(correction, torch.fx.Node):
        an.fail(node, "a symbolic correction")
    correction = 1 if correction is None else correction
    target = node.target

    def replace(slots, args, kwargs, trace):
        x = upcast_half(slots.get(args, kwargs, "self"))
        region = trace.region(source, dims)
        n = trace.count(source, dims)
        mean = _mean_of(x, region, dims, True, n)
        diff = jnp.where(region, x - mean, jnp.zeros((), x.dtype))
        sq = jnp.real(diff * jnp.conj(diff)) if jnp.iscomplexobj(diff) else diff * diff
        var = jnp.sum(sq, axis=tuple(dims), keepdims=keepdim) / jnp.maximum(n - correction, 0)
        if not keepdim:
            mean = jnp.squeeze(mean, tuple(dims))
        if target in (aten.std.correction, aten.std_mean.correction):
            var = jnp.sqrt(var)
        if target in (aten.var.correction, aten.std.correction):
            return var
        return var, mean
    _install(an, node, replace=replace)


@rule(aten.cumsum.default, aten.cumprod.default, aten.cummax.default, aten.cummin.default,
      aten.logcumsumexp.default, aten._logcumsumexp.default, aten._cummax_helper.default,
      aten._cummin_helper.default)
def cumulative(an: Analyzer, node) -> None:
    # A scan along a padded dim reads only earlier elements: the true prefix stays exact.
    source = an.layout(node.args[0])
    dim = _norm_dim(node.args[1], len(source))
    if len(source[dim]) > 1 and is_padded(source[dim]):
        an.fail(node, "scans a dimension flattened from a padded one")
    meta = node.meta["val"]
    if isinstance(meta, list | tuple):
        an.set_parts(node, [an.check(node, source, m) for m in meta])
    else:
        an.set(node, an.check(node, source))


# -- softmax ----------------------------------------------------------------------------------


@rule(aten._softmax.default, aten._log_softmax.default, aten._safe_softmax.default)
def softmax(an: Analyzer, node) -> None:
    source = an.layout(node.args[0])
    dim = _norm_dim(node.args[1], len(source))
    an.set(node, an.check(node, source))
    _install(an, node, masks=[("self", source, [dim], LOWEST)])


@rule(aten._softmax_backward_data.default)
def softmax_backward(an: Analyzer, node) -> None:
    grad, out = an.layout(node.args[0]), an.layout(node.args[1])
    dim = _norm_dim(node.args[2], len(grad))
    an.set(node, an.check(node, grad))
    masks = []
    if dim not in an.zero(node.args[0]):
        masks.append(("grad_output", grad, [dim], ZERO))
    masks.append(("output", out, [dim], ZERO))
    _install(an, node, masks=masks)


@rule(aten._log_softmax_backward_data.default)
def log_softmax_backward(an: Analyzer, node) -> None:
    grad = an.layout(node.args[0])
    dim = _norm_dim(node.args[2], len(grad))
    an.set(node, an.check(node, grad))
    if dim not in an.zero(node.args[0]):
        _install(an, node, masks=[("grad_output", grad, [dim], ZERO)])


# -- normalization ----------------------------------------------------------------------------


@rule(aten.native_layer_norm.default)
def layer_norm(an: Analyzer, node) -> None:
    source = an.layout(node.args[0])
    k = len(node.args[1])
    if padded_dims(source[len(source) - k:]):
        an.fail(node, "normalizes over a padded dimension")
    stats = source[:len(source) - k] + ((),) * k
    metas = node.meta["val"]
    an.set_parts(node, [an.check(node, source, metas[0]), an.check(node, stats, metas[1]),
                        an.check(node, stats, metas[2])])


@rule(aten.native_layer_norm_backward.default)
def layer_norm_backward(an: Analyzer, node) -> None:
    # The weight and bias gradients sum over the outer dims: zero every input's padding
    # there (the saved mean and rstd too, so that x_hat is 0, not NaN, in the padding).
    grad = an.layout(node.args[0])
    k = len(node.args[2])
    outer = list(range(len(grad) - k))
    if padded_dims(grad[len(grad) - k:]):
        an.fail(node, "normalizes over a padded dimension")
    metas = node.meta["val"]
    layouts = []
    for m in metas:
        if m is None:
            layouts.append(None)
        elif m.dim() == len(grad):
            layouts.append(an.check(node, grad, m))
        else:
            layouts.append(an.canonical(m, node))
    an.set_parts(node, layouts)
    padded = [d for d in outer if is_padded(grad[d])]
    if not padded:
        return
    masks = []
    for name in ("grad_out", "input", "mean", "rstd"):
        value = Slots(node).value(name)
        layout = an.layout(value)
        if name == "grad_out" and set(padded) <= an.zero(value):
            continue
        masks.append((name, layout, padded, ZERO))
    _install(an, node, masks=masks)


@rule(aten._native_batch_norm_legit_no_training.default)
def batch_norm_eval(an: Analyzer, node) -> None:
    source = an.layout(node.args[0])
    if len(source) > 1 and is_padded(source[1]):
        an.fail(node, "the channel dimension is padded")
    metas = node.meta["val"]
    an.set_parts(node, [an.check(node, source, metas[0])] +
                 [an.canonical(m, node) for m in metas[1:]])
