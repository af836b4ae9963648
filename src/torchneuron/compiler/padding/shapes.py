"""Pad-safety rules of views and shape ops."""

from __future__ import annotations

import jax.numpy as jnp
import sympy
import torch
import torch.fx
from jax import lax

from .core import (
    Analyzer,
    Slots,
    _dims_arg,
    _install,
    _norm_dim,
    _only_sizes,
    _same,
    aten,
    dim_size,
    is_padded,
    rule,
)

# -- views and shape ops ----------------------------------------------------------------------


def _ratio(a, b):
    """a / b in lowest terms: `cancel` where it is a ratio of polynomials (exact, and some
    100x faster than `simplify`, which also imports sympy.physics on first use)."""
    rest = sympy.cancel(a / b)
    if rest.is_Integer or rest.is_rational_function(*rest.free_symbols):
        return rest
    return sympy.simplify(rest)


def _regroup(factors: list, targets: list) -> list | None:
    """Group row-major `factors` into dims of sizes `targets`, splitting integer factors
    where needed; None if a dim would cut a symbolic factor."""
    fs = [f for f in factors if f != 1]
    out = []
    i = 0
    for target in targets:
        group: list = []
        product = sympy.Integer(1)
        while not _same(product, target):
            if i >= len(fs):
                return None
            f = fs[i]
            rest = _ratio(target, product)
            if f.is_Integer and rest.is_Integer:
                r, fv = int(rest), int(f)
                if r < fv and r > 0 and fv % r == 0:  # split the integer factor
                    group.append(sympy.Integer(r))
                    product = product * r
                    fs[i] = sympy.Integer(fv // r)
                    continue
                if r <= 0 or r % fv != 0:
                    return None
            elif sympy.fraction(sympy.factor(rest / f))[1] != 1:
                return None  # f does not divide what is left of this dim
            group.append(f)
            product = product * f
            i += 1
        out.append(tuple(group))
    if any(f != 1 for f in fs[i:]):
        return None
    return out


@rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default,
      aten._reshape_alias.default)
def view(an: Analyzer, node) -> None:
    source = an.layout(node.args[0])
    meta = node.meta["val"]
    factors = []
    flags = []
    zero = an.zero(node.args[0])
    for i, d in enumerate(source):
        for f in d:
            factors.append(f)
            flags.append(i in zero)
    targets = [an.expr(s) for s in meta.shape]
    groups = _regroup(factors, targets)
    if groups is None:
        an.fail(node, "the new shape splits a padded dimension")
    layout = tuple(() if _same(t, 1) else tuple(g) for g, t in zip(groups, targets))
    an.check(node, layout)
    # A dim keeps zero padding when every padded factor in it comes from a zero-padded dim.
    flag_of: dict = {}
    for f, flag in zip(factors, flags):
        if f.free_symbols:
            flag_of[f] = flag_of.get(f, True) and flag
    new_zero = {j for j, d in enumerate(layout)
                if is_padded(d) and all(flag_of.get(f, False) for f in d if f.free_symbols)}
    an.set(node, layout, new_zero)
    _only_sizes(an, node, ("size", "shape"))


@rule(aten.expand.default, aten.expand_copy.default)
def expand(an: Analyzer, node) -> None:
    source = an.layout(node.args[0])
    meta = node.meta["val"]
    rank = meta.dim()
    offset = rank - len(source)
    dims = []
    zero = set()
    src_zero = an.zero(node.args[0])
    for j in range(rank):
        i = j - offset
        if i >= 0 and source[i] != ():
            dims.append(source[i])
            if i in src_zero:
                zero.add(j)
        else:
            dims.append(an.canonical_dim(meta.shape[j], node))
    an.set(node, an.check(node, tuple(dims)), zero)
    _only_sizes(an, node, ("size",))


@rule(aten.permute.default, aten.permute_copy.default)
def permute(an: Analyzer, node) -> None:
    source = an.layout(node.args[0])
    order = [_norm_dim(d, len(source)) for d in node.args[1]]
    zero = an.zero(node.args[0])
    an.set(node, an.check(node, tuple(source[d] for d in order)),
           {j for j, d in enumerate(order) if d in zero})


@rule(aten.transpose.int, aten.transpose_copy.int, aten.t.default)
def transpose(an: Analyzer, node) -> None:
    source = list(an.layout(node.args[0]))
    rank = len(source)
    if node.target is aten.t.default:
        a, b = (0, 1) if rank == 2 else (0, 0)
    else:
        a, b = _norm_dim(node.args[1], rank), _norm_dim(node.args[2], rank)
    zero = set(an.zero(node.args[0]))
    source[a], source[b] = source[b], source[a]
    swapped = {b if d == a else a if d == b else d for d in zero}
    an.set(node, an.check(node, tuple(source)), swapped)


@rule(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def unsqueeze(an: Analyzer, node) -> None:
    source = list(an.layout(node.args[0]))
    d = _norm_dim(node.args[1], len(source) + 1)
    zero = {z if z < d else z + 1 for z in an.zero(node.args[0])}
    an.set(node, an.check(node, tuple(source[:d] + [()] + source[d:])), zero)


@rule(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_copy.dims)
def squeeze(an: Analyzer, node) -> None:
    source = an.layout(node.args[0])
    rank = len(source)
    if node.target is aten.squeeze.default:
        dims = set(range(rank))
    else:
        dims = set(_dims_arg(node.args[1], rank)) if rank else set()
    keep = [i for i in range(rank) if not (i in dims and source[i] == ())]
    zero = an.zero(node.args[0])
    an.set(node, an.check(node, tuple(source[i] for i in keep)),
           {j for j, i in enumerate(keep) if i in zero})


@rule(aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int, aten.split_copy.Tensor,
      aten.split_with_sizes_copy.default, aten.unbind_copy.int)
def split(an: Analyzer, node) -> None:
    source = an.layout(node.args[0])
    rank = len(source)
    dim = _norm_dim(Slots(node).value("dim") or 0, rank)
    if is_padded(source[dim]):
        an.fail(node, "splits a padded dimension")
    zero = an.zero(node.args[0])
    layouts = []
    zeros = []
    for meta in node.meta["val"]:
        if node.target in (aten.unbind.int, aten.unbind_copy.int):
            layout = source[:dim] + source[dim + 1:]
            z = frozenset(d if d < dim else d - 1 for d in zero if d != dim)
        else:
            layout = source[:dim] + (an.canonical_dim(meta.shape[dim], node),) + source[dim + 1:]
            z = zero
        layouts.append(an.check(node, layout, meta))
        zeros.append(z)
    an.set_parts(node, layouts, zeros)
    _only_sizes(an, node)


def _max_end(value) -> bool:
    return isinstance(value, int) and value >= 2 ** 62


@rule(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(an: Analyzer, node) -> None:
    slots = Slots(node)
    source = an.layout(node.args[0])
    rank = len(source)
    dim = _norm_dim(slots.value("dim") or 0, rank)
    start, end, step = slots.value("start"), slots.value("end"), slots.value("step")
    start = 0 if start is None else start
    step = 1 if step is None else step
    meta = node.meta["val"]
    zero = an.zero(node.args[0])
    if not is_padded(source[dim]):
        layout = source[:dim] + (an.canonical_dim(meta.shape[dim], node),) + source[dim + 1:]
        an.set(node, an.check(node, layout), zero)
        _only_sizes(an, node, ("start", "end"))
        return
    if len(source[dim]) != 1:
        full = start == 0 and step == 1 and (end is None or _max_end(end) or
                                             _same(an.expr(end), dim_size(source[dim])))
        if not full:
            an.fail(node, "slices a dimension flattened from a padded one")
        an.set(node, an.check(node, source), zero)
        _only_sizes(an, node, ("end",))
        return
    if step != 1:
        an.fail(node, "a step other than 1 along a padded dimension")
    size = source[dim][0]
    start_e = an.expr(start)
    if start_e.is_Integer and int(start_e) < 0:
        start_e = size + start_e
    out_size = an.expr(meta.shape[dim])
    out_dim = an.canonical_dim(meta.shape[dim], node)
    if start_e.is_Integer:
        # A static start keeps the true region a prefix; a static end is inside it, and a
        # symbolic end (or none) is the bucket end: the lowering slices as it is.
        if is_padded(out_dim) and out_dim[0].free_symbols != size.free_symbols:
            an.fail(node, "internal: slice of a padded dimension")
        layout = source[:dim] + (out_dim,) + source[dim + 1:]
        an.set(node, an.check(node, layout), zero if is_padded(out_dim) else zero - {dim})
        _only_sizes(an, node, ("end",))
        return
    # A start counted from the true end (x[:, -k:]): a slice at a traced offset, of a
    # static length.
    if is_padded(out_dim) or not out_size.is_Integer:
        an.fail(node, "a slice from the end of a padded dimension keeps a padded length")
    layout = source[:dim] + (out_dim,) + source[dim + 1:]
    an.set(node, an.check(node, layout), zero - {dim})
    length = int(out_size)

    def dynamic(slots, args, kwargs, trace, dim=dim, start_e=start_e, length=length):
        x = slots.get(args, kwargs, "self")
        return lax.dynamic_slice_in_dim(x, trace.true(start_e), length, axis=dim)
    _only_sizes(an, node, ("start", "end"))
    _install(an, node, replace=dynamic)


@rule(aten.slice_scatter.default)
def slice_scatter(an: Analyzer, node) -> None:
    # The backward of a slice: `src` written into `self[start:end]` along `dim`. Along a
    # padded dim only the true part of `src` is written (its padding would land on true
    # positions of `self` when `end` stops short of the true end).
    slots = Slots(node)
    base, src = an.layout(node.args[0]), an.layout(node.args[1])
    rank = len(base)
    dim = _norm_dim(slots.value("dim") or 0, rank)
    start, step = slots.value("start"), slots.value("step")
    start = 0 if start is None else start
    for k in range(rank):
        if k != dim and base[k] != src[k]:
            an.fail(node, "its source lays out a padded dimension differently")
    an.set(node, an.check(node, base))
    if not is_padded(base[dim]):
        _only_sizes(an, node)
        return
    if len(base[dim]) != 1 or (step is not None and step != 1):
        an.fail(node, "a step other than 1, or a dimension flattened from a padded one")
    start_e = an.expr(start)
    if start_e.is_Integer and int(start_e) < 0:
        start_e = base[dim][0] + start_e
    _only_sizes(an, node, ("start", "end"))
    if start_e.is_Integer:
        offset, length_e = int(start_e), dim_size(src[dim])

        def write_true_part(slots, args, kwargs, trace):
            x, y = slots.get(args, kwargs, "self"), slots.get(args, kwargs, "src")
            y = lax.slice_in_dim(y, 0, min(y.shape[dim], x.shape[dim] - offset), axis=dim)
            placed = lax.dynamic_update_slice_in_dim(x, y, offset, axis=dim)
            shape = [1] * x.ndim
            shape[dim] = x.shape[dim]
            pos = lax.broadcasted_iota(jnp.int64, tuple(shape), dim)
            inside = (pos >= offset) & (pos < offset + trace.true(length_e))
            return jnp.where(inside, placed, x)

        _install(an, node, replace=write_true_part)
        return
    if is_padded(src[dim]):
        an.fail(node, "a padded source written at an offset counted from the true end")

    def write_at_true_offset(slots, args, kwargs, trace):  # x[:, -k:] backward
        x, y = slots.get(args, kwargs, "self"), slots.get(args, kwargs, "src")
        return lax.dynamic_update_slice_in_dim(x, y, trace.true(start_e), axis=dim)

    _install(an, node, replace=write_at_true_offset)


@rule(aten.select.int, aten.select_copy.int)
def select(an: Analyzer, node) -> None:
    source = an.layout(node.args[0])
    rank = len(source)
    dim = _norm_dim(node.args[1], rank)
    index = node.args[2]
    zero = {d if d < dim else d - 1 for d in an.zero(node.args[0]) if d != dim}
    layout = source[:dim] + source[dim + 1:]
    an.set(node, an.check(node, layout), zero)
    if not is_padded(source[dim]):
        _only_sizes(an, node, ("index",))
        return
    if len(source[dim]) != 1:
        an.fail(node, "selects along a dimension flattened from a padded one")
    index_e = an.expr(index)
    if index_e.is_Integer and int(index_e) >= 0:
        return
    if index_e.is_Integer:
        index_e = source[dim][0] + index_e

    def dynamic(slots, args, kwargs, trace, dim=dim, index_e=index_e):
        x = slots.get(args, kwargs, "self")
        return lax.dynamic_index_in_dim(x, trace.true(index_e), axis=dim, keepdims=False)
    _only_sizes(an, node, ("index",))
    _install(an, node, replace=dynamic)


@rule(aten.cat.default)
def cat(an: Analyzer, node) -> None:
    parts = [p for p in node.args[0]]
    meta = node.meta["val"]
    rank = meta.dim()
    dim = _norm_dim(Slots(node).value("dim") or 0, rank)
    layouts = []
    for p in parts:
        layout = an.layout(p)
        pm = p.meta["val"]
        if pm.dim() == 1 and not isinstance(pm.shape[0], torch.SymInt) and int(pm.shape[0]) == 0 \
                and rank != 1:
            continue  # legacy: 1-D empty tensors are skipped
        layouts.append((p, layout))
    padded_parts = [i for i, (_, layout) in enumerate(layouts) if is_padded(layout[dim])]
    other = []
    for j in range(rank):
        if j == dim:
            other.append(None)
            continue
        found = None
        for _, layout in layouts:
            if layout[j] != ():
                if found is None:
                    found = layout[j]
                elif found != layout[j]:
                    an.fail(node, "its inputs lay out a padded dimension differently")
        other.append(found if found is not None else ())
    if not padded_parts:
        cat_dim = an.canonical_dim(meta.shape[dim], node)
    else:
        if len(padded_parts) != 1 or len(layouts[padded_parts[0]][1][dim]) != 1:
            an.fail(node, "concatenates along a padded dimension (only one padded part, "
                          "between static ones, keeps the true region a prefix)")
        at = padded_parts[0]
        factor = layouts[at][1][dim][0]
        sizes = [int(an.expr(p.meta["val"].shape[dim])) for i, (p, _) in enumerate(layouts)
                 if i != at]
        before, after = sum(sizes[:at]), sum(sizes[at:])
        cat_dim = (factor + before + after,)
        if after:
            # The parts after the padded one follow its padding: move them to its true end
            # (a KV cache's new entries after the cached ones).
            def close_the_gap(value, trace, dim=dim, before=before, after=after, factor=factor):
                start = before + trace.padded(factor)
                tail = lax.slice_in_dim(value, start, start + after, axis=dim)
                return lax.dynamic_update_slice_in_dim(value, tail, before + trace.true(factor),
                                                       axis=dim)

            _install(an, node, post=close_the_gap)
    layout = tuple(cat_dim if j == dim else other[j] for j in range(rank))
    zero = frozenset.intersection(*[an.zero(p) for p, _ in layouts]) if layouts else frozenset()
    an.set(node, an.check(node, layout), zero if not padded_parts else zero - {dim})
    _only_sizes(an, node)


@rule(aten.stack.default)
def stack(an: Analyzer, node) -> None:
    parts = node.args[0]
    meta = node.meta["val"]
    dim = _norm_dim(Slots(node).value("dim") or 0, meta.dim())
    first = an.layout(parts[0])
    for p in parts[1:]:
        if an.layout(p) != first:
            an.fail(node, "its inputs lay out a padded dimension differently")
    layout = first[:dim] + (an.canonical_dim(meta.shape[dim], node),) + first[dim:]
    zero = frozenset.intersection(*[an.zero(p) for p in parts])
    an.set(node, an.check(node, layout), {d if d < dim else d + 1 for d in zero})


@rule(aten.constant_pad_nd.default)
def constant_pad_nd(an: Analyzer, node) -> None:
    source = an.layout(node.args[0])
    pad = list(node.args[1])
    value = Slots(node).value("value")
    rank = len(source)
    meta = node.meta["val"]
    highs = []
    dims = list(source)
    for i in range(len(pad) // 2):
        d = rank - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if isinstance(lo, torch.fx.Node) or isinstance(hi, torch.fx.Node):
            an.fail(node, "symbolic padding widths")
        if not is_padded(source[d]):
            dims[d] = an.canonical_dim(meta.shape[d], node)
            continue
        if len(source[d]) != 1 or lo < 0 or hi < 0:
            an.fail(node, "pads or crops a padded dimension in a way that moves its true region")
        dims[d] = (source[d][0] + lo + hi,)
        if hi:
            highs.append((d, source[d][0] + lo))
    layout = an.check(node, tuple(dims))
    an.set(node, layout)
    if not highs:
        return
    # The pad written after the true end must be the pad value, not the input's padding.
    fill = 0 if value is None else value

    def post(out, trace):
        for d, end in highs:
            shape = [1] * out.ndim
            shape[d] = -1
            inside = lax.broadcasted_iota(jnp.int64, (out.shape[d],), 0) < trace.true(end)
            out = jnp.where(inside.reshape(shape), out, jnp.asarray(fill, out.dtype))
        return out
    _install(an, node, post=post)


@rule(aten.tril.default, aten.triu.default)
def tril(an: Analyzer, node) -> None:
    source = an.layout(node.args[0])
    if any(len(d) > 1 for d in source[-2:]):
        an.fail(node, "the diagonal of a dimension flattened from a padded one")
    an.set(node, an.check(node, source))


@rule(aten.flip.default, aten.roll.default)
def flip(an: Analyzer, node) -> None:
    source = an.layout(node.args[0])
    dims = _dims_arg(node.args[1] if node.target is aten.flip.default else Slots(node).value("dims"),
                     len(source))
    if any(is_padded(source[d]) for d in dims):
        an.fail(node, "reverses or rotates a padded dimension")
    an.set(node, an.check(node, source))


@rule(aten.repeat.default)
def repeat(an: Analyzer, node) -> None:
    source = an.layout(node.args[0])
    repeats = list(node.args[1])
    meta = node.meta["val"]
    extra = len(repeats) - len(source)
    dims = [an.canonical_dim(meta.shape[j], node) for j in range(extra)]
    for i, d in enumerate(source):
        r = repeats[extra + i]
        if isinstance(r, torch.fx.Node):
            an.fail(node, "symbolic repeats")
        if r != 1 and is_padded(d):
            an.fail(node, "repeats a padded dimension")
        dims.append(d if r == 1 else an.canonical_dim(meta.shape[extra + i], node))
    an.set(node, an.check(node, tuple(dims)))
