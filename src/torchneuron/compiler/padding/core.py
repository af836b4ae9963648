"""The pad-safety analysis itself: layouts and sizes, the analyzer that walks a graph, the
trace-time helpers of the rewrites, and the rule table the op families fill (package docstring:
the terms)."""

from __future__ import annotations

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

from ...runtime import opcall

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
        return _exact_divisions(sympy.sympify(value.node.expr))
    raise TypeError(f"not a size: {value!r}")


def _exact_divisions(expr: sympy.Expr) -> sympy.Expr:
    """`expr` with each floor division that divides exactly written as the quotient (a view's
    meta kernel infers a size as `numel // known`, e.g. `(s**2) // s`)."""
    if not expr.has(FloorDiv):
        return expr

    def exact(a, b):
        quotient = sympy.cancel(a / b)
        if sympy.fraction(quotient)[1] == 1:
            return quotient
        return FloorDiv(a, b)

    return expr.replace(lambda e: isinstance(e, FloorDiv), lambda e: exact(*e.args))


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
