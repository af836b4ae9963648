"""Pad-safety analysis: may an FX graph with symbolic sizes run on inputs padded to a bucket?

A graph traced with symbolic sizes (Dynamo's `dynamic=True`, `mark_dynamic`, automatic dynamic)
is run on inputs whose dynamic dimensions are padded up to a bucket size (compiler/buckets.py).
This module proves, node by node, that the *true region* of every value (the indices below
the true sizes) is computed exactly as in the unpadded graph, and says what each node must do
to the padding to keep it so. Nothing is assumed about what the padding holds: it may be any
value, NaN and inf included, except where the analysis knows it is exactly zero.

Terms:

- A *layout* describes a value's dimensions: one *dim* per tensor dimension, each a tuple of
  *factors* in row-major order (a dimension flattened from `(batch, seq)` has two). A factor is
  an integer or `s + c` for a bucketed size symbol `s`; a size-1 dimension has no factors.
  The padded value has each factor at its bucket size; its true region is the set of indices
  whose every factor coordinate is below the factor's true size.
- Ops that compute each element from elements at the same position (pointwise ops, views,
  layer norm over static dims, matmuls that do not contract over a padded dim) need nothing.
- Ops that combine elements along a padded dim (reductions, contractions, softmax, scatter-adds,
  the parameter gradients of layer norm) first replace that dim's padding by the neutral
  element (`where(mask, x, neutral)`), and means and variances divide by the true count.
- Index arguments have their padding replaced by a valid index (0), or by `ignore_index` for
  losses, so that neither the gathers nor the bounds checks see the padding.
- Symbolic sizes used as sizes (view shapes, `arange` bounds, `full`) take the bucket value;
  used as numbers (a division by a count, a fill value) they take the true value.

Any op without a rule here, or whose rule cannot prove its case safe, raises `NotPadSafe`
naming the op and the reason; the graph then keeps one executable per shape.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
import sympy
import torch
import torch.fx
from jax import lax
from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod

from ..lowerings import LOWERINGS
from ..lowerings.dtypes import to_jax_dtype
from ..lowerings.registry import upcast_half
from ..runtime import opcall

aten = torch.ops.aten
prims = torch.ops.prims

Factor = sympy.Expr
Dim = tuple[sympy.Expr, ...]
Layout = tuple[Dim, ...]

# The neutral elements a mask writes into the padding, by kind (resolved per dtype).
ZERO, ONE, LOWEST, HIGHEST = "zero", "one", "lowest", "highest"


class NotPadSafe(Exception):
    """The graph cannot be proven exact on padded inputs: `op` and `reason` say why."""

    def __init__(self, op: str, reason: str) -> None:
        super().__init__(f"{op}: {reason}")
        self.op = op
        self.reason = reason


# ---------------------------------------------------------------------------------------
# Sizes


def expr_of(value: Any) -> sympy.Expr:
    """A size (int or SymInt) as a sympy expression."""
    if isinstance(value, bool):
        raise TypeError("a bool is not a size")
    if isinstance(value, int):
        return sympy.Integer(value)
    if isinstance(value, torch.SymInt):
        return sympy.sympify(value.node.expr)
    raise TypeError(f"not a size: {value!r}")


def evaluate(expr: sympy.Expr, env: dict) -> Any:
    """`expr` with its symbols taken from `env` (ints, or traced JAX integers)."""
    if expr.is_Integer:
        return int(expr)
    if expr.is_Symbol:
        return env[expr]
    if expr.is_Add:
        total = 0
        for term in expr.args:
            total = total + evaluate(term, env)
        return total
    if expr.is_Mul:
        product = 1
        for term in expr.args:
            product = product * evaluate(term, env)
        return product
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) >= 0:
        return evaluate(expr.base, env) ** int(expr.exp)
    if isinstance(expr, FloorDiv):
        return evaluate(expr.args[0], env) // evaluate(expr.args[1], env)
    if isinstance(expr, Mod | PythonMod):
        return evaluate(expr.args[0], env) % evaluate(expr.args[1], env)
    raise NotImplementedError(f"size expression {expr} ({type(expr).__name__})")


def dim_size(dim: Dim) -> sympy.Expr:
    return sympy.Mul(*dim) if dim else sympy.Integer(1)


def is_padded(dim: Dim) -> bool:
    return any(f.free_symbols for f in dim)


def padded_dims(layout: Layout) -> list[int]:
    return [i for i, d in enumerate(layout) if is_padded(d)]


def normalize(layout: Layout) -> Layout:
    """One spelling per layout: adjacent integer factors merged, 1s dropped (a view that
    splits 32 into (4, 8) and merges it back lays that dim out as (32,) again)."""
    out = []
    for dim in layout:
        factors: list = []
        for f in dim:
            if f.is_Integer and factors and factors[-1].is_Integer:
                factors[-1] = factors[-1] * f
            else:
                factors.append(f)
        out.append(tuple(f for f in factors if f != 1))
    return tuple(out)


def _same(a: sympy.Expr, b: sympy.Expr) -> bool:
    return a == b or sympy.expand(a - b) == 0


# ---------------------------------------------------------------------------------------
# Analysis results


@dataclass
class Info:
    """What the analysis knows about one node's value: a tensor's layout and the dims whose
    padding is exactly zero, or (for a tuple of values) one Info per element."""

    layout: Layout | None = None
    zero: frozenset = frozenset()
    parts: tuple | None = None


Action = Callable[..., Any]  # (args, kwargs, call, trace) -> value


@dataclass
class Analysis:
    """The proof for one graph: each node's layout, and the rewrites its trace needs."""

    symbols: tuple[sympy.Symbol, ...]
    info: dict[torch.fx.Node, Info]
    actions: dict[torch.fx.Node, Action]


class Trace:
    """Sizes while one bucketed executable is traced: bucket sizes (static ints) and true sizes
    (traced integers, inputs of the executable), and the masks built from them."""

    def __init__(self, padded: dict, true: dict) -> None:
        self.padded_env = padded
        self.true_env = true
        self._masks: dict = {}

    def padded(self, expr: sympy.Expr) -> int:
        return int(evaluate(expr, self.padded_env))

    def true(self, expr: sympy.Expr) -> Any:
        return evaluate(expr, self.true_env)

    def dim_mask(self, dim: Dim):
        """A bool vector over the dim's padded length: True inside the true region."""
        mask = self._masks.get(dim)
        if mask is None:
            sizes = [self.padded(f) for f in dim]
            for i, f in enumerate(dim):
                if f.free_symbols:
                    inside = lax.broadcasted_iota(jnp.int64, tuple(sizes), i) < self.true(f)
                    mask = inside if mask is None else mask & inside
            mask = mask.reshape(-1)
            self._masks[dim] = mask
        return mask

    def region(self, layout: Layout, dims) -> Any:
        """The true region over `dims` of a value with `layout`, broadcastable to its shape."""
        rank = len(layout)
        mask = None
        for d in dims:
            if not is_padded(layout[d]):
                continue
            shape = [1] * rank
            shape[d] = -1
            m = self.dim_mask(layout[d]).reshape(shape)
            mask = m if mask is None else mask & m
        return mask

    def mask(self, x, layout: Layout, dims, fill) -> Any:
        """`x` with its padding along `dims` replaced by `fill` (a kind or a number)."""
        region = self.region(layout, dims)
        if region is None:
            return x
        return jnp.where(region, x, _fill_value(fill, x.dtype))

    def count(self, layout: Layout, dims) -> Any:
        """The number of true elements over `dims` (an int or a traced integer)."""
        total = 1
        for d in dims:
            for f in layout[d]:
                total = total * self.true(f)
        return total


def _fill_value(fill, dtype):
    dtype = jnp.dtype(dtype)
    if not isinstance(fill, str):
        return jnp.asarray(fill, dtype)
    if dtype == jnp.bool_:
        return jnp.asarray(fill in (ONE, HIGHEST), dtype)
    if fill == ZERO:
        return jnp.zeros((), dtype)
    if fill == ONE:
        return jnp.ones((), dtype)
    if jnp.issubdtype(dtype, jnp.inexact):
        return jnp.asarray(-np.inf if fill == LOWEST else np.inf, dtype)
    info = jnp.iinfo(dtype)
    return jnp.asarray(info.min if fill == LOWEST else info.max, dtype)


# ---------------------------------------------------------------------------------------
# The analyzer


_SYM_FUNCTIONS = {
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
    operator.mod, operator.neg, operator.pow, operator.eq, operator.ne, operator.lt,
    operator.le, operator.gt, operator.ge, operator.and_, operator.or_,
}


class Analyzer:
    """Walks a graph once, giving each node a layout and, where needed, a rewrite."""

    def __init__(self, gm: torch.fx.GraphModule, symbols, static: dict, inputs: dict) -> None:
        """`symbols`: the bucketed size symbols; `static`: other symbols -> their value in this
        call; `inputs`: placeholder -> (layout or None for canonical, zero dims)."""
        self.gm = gm
        self.symbols = tuple(symbols)
        self.symbol_set = frozenset(symbols)
        self.static = {s: sympy.Integer(v) for s, v in static.items()}
        self.inputs = inputs
        self.info: dict[torch.fx.Node, Info] = {}
        self.actions: dict[torch.fx.Node, Action] = {}

    # -- helpers used by the rules ------------------------------------------------------
    def fail(self, node: torch.fx.Node, reason: str):
        raise NotPadSafe(str(node.target), reason)

    def expr(self, value: Any) -> sympy.Expr:
        if isinstance(value, torch.fx.Node):
            value = value.meta.get("val")
        e = expr_of(value)
        return e.xreplace(self.static) if self.static else e

    def bucketed(self, value: Any) -> bool:
        """Whether a size (int, SymInt or node) depends on a bucketed symbol."""
        try:
            return bool(self.expr(value).free_symbols & self.symbol_set)
        except TypeError:
            return False

    def canonical_dim(self, size: Any, node: torch.fx.Node) -> Dim:
        e = self.expr(size)
        if e.is_Integer:
            return () if int(e) == 1 else (e,)
        free = e.free_symbols
        if len(free) == 1 and next(iter(free)) in self.symbol_set:
            s = next(iter(free))
            if (e - s).is_Integer:
                return (e,)
        if free - self.symbol_set:
            self.fail(node, f"size {e} depends on a symbol that is not a bucketed size")
        self.fail(node, f"cannot tell how the padding is laid out in a dimension of size {e}")

    def canonical(self, meta: torch.Tensor, node: torch.fx.Node) -> Layout:
        return tuple(self.canonical_dim(s, node) for s in meta.shape)

    def layout(self, value: Any) -> Layout | None:
        """The layout of a tensor argument (None for anything else)."""
        if isinstance(value, torch.fx.Node):
            info = self.info.get(value)
            return None if info is None else info.layout
        return None

    def zero(self, value: Any) -> frozenset:
        if isinstance(value, torch.fx.Node) and value in self.info:
            return self.info[value].zero
        return frozenset()

    def check(self, node: torch.fx.Node, layout: Layout, meta: Any = None) -> Layout:
        """`layout` must describe `meta`'s shape (the node's fake value by default)."""
        meta = node.meta.get("val") if meta is None else meta
        if len(layout) != meta.dim():
            self.fail(node, "internal: layout rank differs from the value's")
        for dim, size in zip(layout, meta.shape):
            if not _same(dim_size(dim), self.expr(size)):
                self.fail(node, f"internal: layout {dim} does not match size {self.expr(size)}")
        return layout

    def set(self, node, layout, zero=frozenset()) -> None:
        self.info[node] = Info(normalize(layout), frozenset(zero))

    def set_parts(self, node, layouts, zeros=None) -> None:
        zeros = zeros or [frozenset()] * len(layouts)
        self.info[node] = Info(parts=tuple(
            None if layout is None else Info(normalize(layout), frozenset(z))
            for layout, z in zip(layouts, zeros)))

    # -- the walk -------------------------------------------------------------------------
    def run(self) -> Analysis:
        for node in self.gm.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node)
            elif node.op == "get_attr":
                value = getattr(self.gm, node.target)
                if isinstance(value, torch.Tensor):
                    self.set(node, tuple(() if s == 1 else (sympy.Integer(s),) for s in value.shape))
            elif node.op == "call_function":
                self._call(node)
            elif node.op == "output":
                pass
        return Analysis(self.symbols, self.info, self.actions)

    def _placeholder(self, node) -> None:
        meta = node.meta.get("val")
        if not isinstance(meta, torch.Tensor):
            return
        layout, zero = self.inputs.get(node, (None, None))
        if layout is None:
            layout = self.canonical(meta, node)
        self.check(node, layout, meta)
        if zero is None:
            zero = padded_dims(layout)
        self.set(node, layout, zero)

    def _call(self, node) -> None:
        target = node.target
        if target in _SYM_FUNCTIONS or target in (aten.sym_size.int, aten.sym_numel.default,
                                                  aten.sym_stride.int):
            if target is aten.sym_stride.int and self.layout(node.args[0]) and \
                    padded_dims(self.layout(node.args[0])):
                self.fail(node, "the strides of a padded value differ from the unpadded ones")
            return
        if target is operator.getitem:
            source = self.info.get(node.args[0])
            if source is not None and source.parts is not None:
                part = source.parts[node.args[1]]
                if part is not None:
                    self.info[node] = part
            return
        rule = RULES.get(target)
        if rule is None:
            if _touches_padding(self, node):
                packet = getattr(target, "_overloadpacket", None)
                name = getattr(packet, "__name__", "")
                if name.startswith("_foreach_"):
                    self.fail(node, "foreach ops over padded values are not analyzed")
                self.fail(node, "no padding rule for this op")
            _static(self, node)
            return
        try:
            rule(self, node)
        except NotPadSafe:
            raise
        except (TypeError, AttributeError, IndexError, KeyError, ValueError) as err:
            # An argument the rule did not expect (a None, a non-tensor): not proven safe.
            self.fail(node, f"its arguments are not analyzed ({type(err).__name__}: {err})")


def _tensor_nodes(node) -> list:
    out = []
    for a in list(node.args) + list(node.kwargs.values()):
        if isinstance(a, torch.fx.Node):
            out.append(a)
        elif isinstance(a, list | tuple):
            out.extend(x for x in a if isinstance(x, torch.fx.Node))
    return out


def _touches_padding(an: Analyzer, node) -> bool:
    """Whether a node reads a padded value, uses a bucketed size, or makes a padded value."""
    for a in _tensor_nodes(node):
        layout = an.layout(a)
        if layout is not None and padded_dims(layout):
            return True
        val = a.meta.get("val")
        if isinstance(val, torch.SymInt) and an.bucketed(val):
            return True
    for value in _flat_metas(node.meta.get("val")):
        if any(an.bucketed(s) for s in value.shape):
            return True
    return False


def _flat_metas(meta) -> list:
    if isinstance(meta, torch.Tensor):
        return [meta]
    if isinstance(meta, list | tuple):
        return [m for sub in meta for m in _flat_metas(sub)]
    return []


def _static(an: Analyzer, node) -> None:
    """An op that never sees padding: its outputs have static layouts."""
    meta = node.meta.get("val")
    if isinstance(meta, torch.Tensor):
        an.set(node, an.canonical(meta, node))
    elif isinstance(meta, list | tuple):
        an.set_parts(node, [an.canonical(m, node) if isinstance(m, torch.Tensor) else None
                            for m in meta])


# ---------------------------------------------------------------------------------------
# Arguments by schema name


class Slots:
    """Where each schema argument of a call sits in (args, kwargs), and its default."""

    def __init__(self, node: torch.fx.Node) -> None:
        self.node = node
        self.schema = node.target._schema
        self.where: dict[str, tuple[str, Any]] = {}
        for i, arg in enumerate(self.schema.arguments):
            if not arg.kwarg_only and i < len(node.args):
                self.where[arg.name] = ("a", i)
            elif arg.name in node.kwargs:
                self.where[arg.name] = ("k", arg.name)
        self.defaults = {a.name: a.default_value for a in self.schema.arguments
                         if a.has_default_value()}

    def value(self, name: str) -> Any:
        """The argument as the node holds it (a node, a list, a constant) or its default."""
        where = self.where.get(name)
        if where is None:
            return self.defaults.get(name)
        kind, key = where
        return self.node.args[key] if kind == "a" else self.node.kwargs[key]

    def get(self, args, kwargs, name: str) -> Any:
        where = self.where.get(name)
        if where is None:
            return self.defaults.get(name)
        kind, key = where
        return args[key] if kind == "a" else kwargs[key]

    def put(self, args: list, kwargs: dict, name: str, value: Any) -> None:
        where = self.where.get(name)
        if where is None:
            # a defaulted argument: pass it by name
            kwargs[name] = value
            return
        kind, key = where
        if kind == "a":
            args[key] = value
        else:
            kwargs[key] = value


def _sym_uses(an: Analyzer, node) -> list[tuple[str, torch.fx.Node]]:
    """(argument name, node) for each argument that is a symbolic size depending on a bucketed
    symbol (inside lists too)."""
    out = []
    slots = Slots(node)
    for arg in slots.schema.arguments:
        value = slots.value(arg.name)
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            if isinstance(item, torch.fx.Node) and isinstance(item.meta.get("val"), torch.SymInt | torch.SymFloat) \
                    and an.bucketed(item):
                out.append((arg.name, item))
    return out


def _true_numbers(an: Analyzer, node, names) -> list[tuple[str, sympy.Expr]]:
    """The symbolic-size arguments `names` (Scalar positions) that take the true value."""
    out = []
    slots = Slots(node)
    for name, item in _sym_uses(an, node):
        if name not in names:
            continue
        if not isinstance(slots.value(name), torch.fx.Node):
            an.fail(node, f"a symbolic size inside the list argument '{name}'")
        out.append((name, an.expr(item)))
    return out


def _only_sizes(an: Analyzer, node, size_args=()) -> None:
    """Every bucketed symbolic argument of `node` must be one of `size_args` (used as a size)."""
    for name, item in _sym_uses(an, node):
        if name not in size_args:
            an.fail(node, f"uses the symbolic size {an.expr(item)} as its argument '{name}'")


def _install(an: Analyzer, node, masks=(), numbers=(), replace=None, post=None) -> None:
    """Record the node's rewrite: `masks` = (argument, layout, dims, fill) applied to its
    arguments, `numbers` = (argument, expr) set to true sizes; then either `replace`
    (slots, args, kwargs, trace) -> value runs instead of the lowering, or the lowering runs
    and `post` (value, trace) -> value adjusts its result."""
    masks = [m for m in masks if m[2] and any(is_padded(m[1][d]) for d in m[2])]
    if not masks and not numbers and replace is None and post is None:
        return
    slots = Slots(node)
    meta = node.meta.get("val")

    def action(args, kwargs, call, trace):
        args, kwargs = list(args), dict(kwargs)
        for name, layout, dims, fill in masks:
            value = slots.get(args, kwargs, name)
            slots.put(args, kwargs, name, trace.mask(value, layout, dims, fill))
        for name, expr in numbers:
            slots.put(args, kwargs, name, trace.true(expr))
        if replace is not None:
            return opcall.cast_results(replace(slots, args, kwargs, trace), meta)
        result = call(args, kwargs)
        return result if post is None else opcall.cast_results(post(result, trace), meta)

    an.actions[node] = action


def _norm_dim(d: int, rank: int) -> int:
    return d % rank if rank else 0


def _dims_arg(value, rank: int) -> list[int]:
    if value is None or (isinstance(value, list | tuple) and len(value) == 0):
        return list(range(rank))
    if isinstance(value, int):
        value = [value]
    return sorted({_norm_dim(int(d), rank) for d in value})


# ---------------------------------------------------------------------------------------
# Rules

RULES: dict[Any, Callable[[Analyzer, torch.fx.Node], None]] = {}


def rule(*ops):
    def register(fn):
        for op in ops:
            if op in RULES:
                raise RuntimeError(f"two padding rules for {op}")
            RULES[op] = fn
        return fn

    return register


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
      aten.eye.default, aten.eye.m)
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


# -- views and shape ops ----------------------------------------------------------------------


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
            rest = sympy.simplify(target / product)
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
        if padded_parts != [len(layouts) - 1] or len(layouts[-1][1][dim]) != 1:
            an.fail(node, "concatenates along a padded dimension (only a last padded part "
                          "after static ones keeps the true region a prefix)")
        static = sum(int(an.expr(p.meta["val"].shape[dim])) for p, _ in layouts[:-1])
        cat_dim = (layouts[-1][1][dim][0] + static,)
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
    bias = an.layout(node.args[0])
    for i, d in enumerate(bias):
        j = 2 - len(bias) + i
        if d != () and d != layout[j]:
            an.fail(node, "its bias lays out a padded dimension differently")
    an.set(node, an.check(node, layout))
    _install(an, node, masks=masks)


@rule(aten.bmm.default)
def bmm(an: Analyzer, node) -> None:
    la, lb = an.layout(node.args[0]), an.layout(node.args[1])
    if la[0] != lb[0]:
        an.fail(node, "its operands lay out the batch dimension differently")
    masks = _contract(an, node, "self", 2, "mat2", 1)
    an.set(node, an.check(node, (la[0], la[1], lb[2])))
    _install(an, node, masks=masks)


@rule(aten.baddbmm.default)
def baddbmm(an: Analyzer, node) -> None:
    la, lb = an.layout(node.args[1]), an.layout(node.args[2])
    if la[0] != lb[0]:
        an.fail(node, "its operands lay out the batch dimension differently")
    masks = _contract(an, node, "batch1", 2, "batch2", 1)
    layout = (la[0], la[1], lb[2])
    bias = an.layout(node.args[0])
    for i, d in enumerate(bias):
        j = 3 - len(bias) + i
        if d != () and d != layout[j]:
            an.fail(node, "its bias lays out a padded dimension differently")
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


@rule(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss(an: Analyzer, node) -> None:
    # Padded targets become ignore_index: they add nothing to the sum nor to the count of a
    # mean; padded log-probabilities become 0 (the lowering multiplies them by a 0 weight).
    slots = Slots(node)
    source, target = an.layout(node.args[0]), an.layout(node.args[1])
    class_dim = 0 if len(source) == 1 else 1
    if is_padded(source[class_dim]):
        an.fail(node, "the class dimension is padded")
    ignore = slots.value("ignore_index")
    if isinstance(ignore, torch.fx.Node):
        an.fail(node, "a symbolic ignore_index")
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
    slots = Slots(node)
    source, target = an.layout(node.args[1]), an.layout(node.args[2])
    class_dim = 0 if len(source) == 1 else 1
    if is_padded(source[class_dim]):
        an.fail(node, "the class dimension is padded")
    ignore = slots.value("ignore_index")
    if isinstance(ignore, torch.fx.Node):
        an.fail(node, "a symbolic ignore_index")
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
