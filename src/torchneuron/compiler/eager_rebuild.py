"""A described eager trace rebuilt as a graph over its size, bucketed and compiled
(compiler/eager_traces.py, steps 3-4).

*Rebuild* the trace as a graph: the ops replayed on fake tensors whose sizes are the fitted
expressions (`make_fx`), reading each argument as its executable did (a view of its storage's
flat buffer) and returning each kept value as a flat buffer.

*Prove and run*: the padding analysis must accept the graph (else `NotBucketable`); the graph
is compiled by `CompiledGraph`, which pads the inputs to the bucket, runs the bucket's
executable and cuts the outputs.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from typing import Any

import sympy
import torch
from torch._dynamo.source import ConstantSource
from torch._guards import SLoc
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

from ..lowerings.dtypes import to_torch_dtype
from ..runtime import storage, strided
from ..runtime.meta import flatten_results
from ..runtime.plan import NEURON, plan_for
from . import buckets, padding
from .graph import CompiledGraph, LoweringError
from .trace_shapes import Fit, NotBucketable, Size


class _TraceShapeEnv(ShapeEnv):
    """A ShapeEnv that records no source line for its symbols and guards: they come from a
    replayed eager trace, not from user code, and ShapeEnv's first stack walk imports parts
    of Inductor and torch.export (0.16 s of the first bucketed trace of a process)."""

    def _get_sloc(self, framework_loc: str | None = None) -> SLoc:
        return SLoc(framework_loc or "a bucketed eager trace (torchneuron)", None)

    def _get_stack_summary(self, is_debug: bool = False,
                           framework_loc: str | None = None) -> tuple[SLoc, str]:
        return self._get_sloc(framework_loc), ""  # (creating a symbol walks the stack too)


class _Rebuild:
    """Replays a described trace on fake tensors of symbolic sizes, under make_fx."""

    def __init__(self, description: tuple, fit: Fit, ints: list[int], externals: tuple,
                 live: tuple) -> None:
        self.nodes, self.buffers = description
        self.fit = fit
        self.ints = ints
        self.externals = externals
        self.live = live
        self.env = _TraceShapeEnv()
        self.mode = FakeTensorMode(shape_env=self.env)
        hint = fit.size_of(ints)
        symbol = self.env.create_symbol(hint, source=ConstantSource("eager_size"),
                                        dynamic_dim=DimDynamic.DYNAMIC)
        self.sympy_symbol = symbol
        self.symbol = self.env.create_symintnode(symbol, hint=hint)
        self.s = self.symbol
        self.blocks_of: dict[int, list] = {}  # id(flat buffer) -> the shape it flattens
        # external index -> how the graph takes it: ("tensor", shape sizes, dtype) or None
        self.inputs = self._inputs()

    def value(self, item: Any) -> Any:
        """A description item with its sizes as expressions of the size symbol."""
        if isinstance(item, Size):
            a = self.fit.coefficients[item.index]
            b = self.fit.offsets[item.index]
            return b if a == 0 else a * self.s + b
        if isinstance(item, tuple) and len(item) == 2 and item[0] in ("list", "tuple") and \
                isinstance(item[1], tuple):
            values = [self.value(v) for v in item[1]]
            return values if item[0] == "list" else tuple(values)
        return item

    def constant(self, item: Any) -> Any:
        """A description item that the op takes as plain ints: the same for every size."""
        if isinstance(item, Size):
            if self.fit.coefficients[item.index]:
                raise NotBucketable("an integer argument that is not a size changes with it")
            return self.fit.offsets[item.index]
        if isinstance(item, tuple) and len(item) == 2 and item[0] in ("list", "tuple") and \
                isinstance(item[1], tuple):
            values = [self.constant(v) for v in item[1]]
            return values if item[0] == "list" else tuple(values)
        return item

    def _inputs(self) -> dict:
        inputs = {}
        first_read: dict[int, tuple] = {}
        for _op, args, *_rest in self.nodes:
            for arg in args:
                for t in (arg[1] if arg and arg[0] == "list" else (arg,)):
                    if t and t[0] == "tensor" and t[3] == strided.FULL and t[2] >= 0:
                        first_read.setdefault(t[2], t)
        for ref, buffer in enumerate(self.buffers):
            if buffer is None:
                continue
            if buffer[0] == "read whole":
                t = first_read[ref]
                inputs[ref] = (t[4], t[1])
            else:
                inputs[ref] = ((buffer[2],), to_torch_dtype(self.externals[ref].dtype))
        return inputs

    def placeholders(self) -> list:
        with self.mode:
            return [torch.empty([self.value(v) for v in shape], dtype=dtype,
                                device=NEURON)
                    for shape, dtype in self.inputs.values()]

    def graph(self) -> torch.fx.GraphModule:
        fakes = self.placeholders()
        with self.mode, _quiet_fake_kernels():
            return make_fx(self._replay, tracing_mode="real")(self.s, *fakes)

    def assumptions(self) -> tuple:
        """What the replay assumed about the size (its value range, the guards the fake
        kernels recorded): a size that breaks one of them gets another graph."""
        expr = padding.expr_of(self.symbol)
        if expr != self.sympy_symbol or expr in self.env.replacements:
            raise NotBucketable("the rebuilt trace fixes its size")
        bounds = self.env.var_to_range[expr]
        return expr, bounds.lower, bounds.upper, tuple(g.expr for g in self.env.guards)

    # -- the replay -----------------------------------------------------------------------
    def _replay(self, s, *tensors):
        self.s = s
        flat: dict[int, Any] = {}  # value reference -> flat buffer (the trace's own view)
        logical: dict[int, Any] = {}
        for ref, t in zip(self.inputs, tensors):
            logical[ref] = t
        results: list = []
        for op, args, fresh, writes, n, checks in self.nodes:
            values = [self._argument(a, flat, logical, results) for a in args]
            outputs = self._call(op, values, fresh, writes)
            if checks:  # the graph's lowering checks the indices itself
                outputs.append(None)
            if len(outputs) != n:
                raise NotBucketable(f"{op}: {len(outputs)} results for {n}")
            results.extend(outputs)
        return [results[v] for v in self.live]

    def _buffer(self, ref: int, flat: dict, logical: dict, results: list):
        if ref < 0:
            value = results[-ref - 1]
            if value is None:
                raise NotBucketable("an argument the trace left out")
            return value
        if ref not in flat:
            flat[ref] = logical[ref].reshape(-1)
            self.blocks_of[id(flat[ref])] = list(logical[ref].shape)
        return flat[ref]

    def _argument(self, arg, flat, logical, results):
        if arg is None:
            return None
        kind = arg[0]
        if kind == "static":
            return self.value(arg[1]) if arg[2] else self.constant(arg[1])
        if kind in ("scalar", "number"):
            return self.value(arg[1]) if kind == "scalar" else self.value(arg[1][1])
        if kind == "list":
            return [self._argument(t, flat, logical, results) for t in arg[1]]
        _, _dtype, ref, mode, shape, stride, offset = arg
        sizes = [self.value(v) for v in shape]
        if mode == strided.FULL:
            if ref >= 0 and self.inputs.get(ref, (None,))[0] == shape:
                return logical[ref]
            return self._buffer(ref, flat, logical, results).view(sizes)
        buffer = self._buffer(ref, flat, logical, results)
        concrete = ([self.ints[v.index] for v in shape], [self.ints[v.index] for v in stride],
                    self.ints[offset.index])
        expected = ([self.value(v) for v in stride], self.value(offset))
        for from_end in (False, True):
            view = self._strided_view(buffer, sizes, *concrete, self._length(ref, results),
                                      from_end, expected[0])
            if view is None:
                view = self._element_view(buffer, sizes, concrete[2], from_end)
            if view is not None and _same_layout(view, *expected):
                return view
        return torch.as_strided(buffer, sizes, *expected)

    def _start(self, start: int, size: int, symbolic_size, from_end: bool):
        """A start coordinate along a block: as it is, or counted from the block's end (a
        read of the last position, whose offset moves with the size)."""
        if from_end and isinstance(symbolic_size, torch.SymInt) and start > 0:
            return symbolic_size - (size - start)
        return start

    def _element_view(self, buffer, sizes: list, offset: int, from_end: bool):
        """A read of one element (every read dim of size 1 or broadcast), as selects along
        the blocks of the flattened value."""
        blocks = self.blocks_of.get(id(buffer))
        if blocks is None or any(size != 1 for size in sizes if not isinstance(size, int)):
            return None
        concrete = [int(b.node.hint) if isinstance(b, torch.SymInt) else int(b) for b in blocks]
        coordinates, remaining = _unravel(offset, concrete)
        if remaining or any(c >= b for c, b in zip(coordinates, concrete)):
            return None
        view = buffer.view(blocks)
        for c, b, symbolic in zip(coordinates, concrete, blocks):
            view = view.select(0, self._start(c, b, symbolic, from_end))
        view = view.reshape([1] * len(sizes))
        if any(size != 1 for size in sizes):
            view = view.expand(sizes)
        return view

    def _quotient(self, a, b):
        """a / b for sizes (ints or SymInts of the size symbol) when it is a polynomial in
        the symbol with integer coefficients, as an int or SymInt; else None."""
        q = sympy.cancel(padding.expr_of(a) / padding.expr_of(b))
        if q.is_Integer:
            return int(q)
        symbol = padding.expr_of(self.symbol)
        if not q.is_polynomial(symbol) or q.free_symbols - {symbol}:
            return None
        coefficients = sympy.Poly(q, symbol).all_coeffs()[::-1]
        if not all(c.is_Integer for c in coefficients):
            return None
        value = 0
        for k, c in enumerate(coefficients):
            if c:
                value = value + int(c) * self.s ** k if k else value + int(c)
        return value

    def _strided_view(self, buffer, sizes: list, shape: list, stride: list, offset: int,
                      length: int, from_end: bool, symbolic_stride: list):
        """A strided read of a flat buffer as ops the padding analysis knows: a view of the
        buffer as its row-major blocks, slices, a permute and an expand; None when the
        layout has no such form."""
        dims = [d for d in range(len(shape)) if shape[d] != 1 and stride[d] != 0]
        order = sorted(dims, key=lambda d: -stride[d])
        if not order:
            return None
        blocks, block_sizes = [], []
        outer = length
        for d in order:
            if stride[d] == 0 or outer % stride[d]:
                return None
            blocks.append(outer // stride[d])
            outer = stride[d]
        if outer != 1:  # the innermost read dim skips elements: one more block, at offset
            blocks.append(outer)
        starts, _ = _unravel(offset, blocks)
        for i, d in enumerate(order):
            if starts[i] + shape[d] > blocks[i]:
                return None
        if len(blocks) > len(order) and starts[-1] >= blocks[-1]:
            return None
        # The blocks' sizes for every size: the ratios of the (symbolic) strides.
        outer = buffer.shape[0]
        for d in order:
            block = self._quotient(outer, symbolic_stride[d])
            if block is None:
                return None
            block_sizes.append(block)
            outer = symbolic_stride[d]
        if len(blocks) > len(order):
            block_sizes.append(outer)
        view = buffer.view(block_sizes)
        for i, d in enumerate(order):
            if not (starts[i] == 0 and shape[d] == blocks[i]):
                start = self._start(starts[i], blocks[i], block_sizes[i], from_end)
                view = view.narrow(i, start, sizes[d])
        if len(blocks) > len(order):
            view = view.select(len(order), self._start(starts[-1], blocks[-1], block_sizes[-1],
                                                       from_end))
        # Now the read dims in stride order; the size-1 and broadcast dims go back in.
        inverse = sorted(range(len(order)), key=lambda i: order[i])
        view = view.permute(inverse)
        placed = sorted(order)
        for d in range(len(shape)):
            if d not in placed:
                view = view.unsqueeze(d)
        if any(stride[d] == 0 and shape[d] != 1 for d in range(len(shape))):
            view = view.expand(sizes)
        return view

    def _length(self, ref: int, results: list) -> int:
        """The concrete length of a buffer in this sample."""
        if ref >= 0:
            return int(self.externals[ref].shape[0])
        value = results[-ref - 1]
        return int(value.shape[0].node.hint) if isinstance(value.shape[0], torch.SymInt) \
            else int(value.shape[0])

    def _call(self, op, values: list, fresh: tuple, writes: tuple) -> list:
        plan = plan_for(op)
        direct = plan.lowering is not None
        if direct:
            pos, kw = plan.split(values)
            result = _fake_call(op, pos, kw)
            metas = flatten_results(result)
            if not (plan.fresh_returns and len(plan.fresh_returns) == len(plan.return_types)):
                metas = [metas[i] for i in plan.fresh_returns]
            outputs = []
            for value, layout in zip(metas, fresh):
                outputs.append(None if value is None or layout is None
                               else self._flat(value.permute(layout[2])))
            return outputs
        functional = plan.functional
        if functional is None:
            raise NotBucketable(f"{op} has no functional twin")
        func_values = [v for i, v in enumerate(values) if i not in plan.out_args]
        pos, kw = plan_for(functional).split(func_values)
        written = flatten_results(_fake_call(functional, pos, kw))
        outputs = []
        for value, (dtype, shape) in zip(written, writes):
            if value is None:
                outputs.append(None)
                continue
            if value.dtype != dtype:
                value = value.to(dtype)
            sizes = [self.value(v) for v in shape]
            if list(value.shape) != sizes:
                value = value.expand(sizes)
            outputs.append(self._flat(value))
        return outputs

    def _flat(self, value):
        """`value`'s elements in row-major order as a flat buffer, remembering its shape."""
        flat = value.contiguous().reshape(-1)
        self.blocks_of[id(flat)] = list(value.shape)
        return flat


def _unravel(offset: int, blocks: list[int]) -> tuple[list[int], int]:
    """The row-major coordinates of `offset` over `blocks` (the first one unbounded), and
    what is left past the last block (0 unless the offset is past the end)."""
    coordinates = []
    for i in range(len(blocks)):
        step = math.prod(blocks[i + 1:])
        start, offset = divmod(offset, step)
        coordinates.append(start)
    return coordinates, offset


@contextlib.contextmanager
def _quiet_fake_kernels() -> Iterator[None]:
    """FakeTensorMode logs a traceback at ERROR level for a fake kernel that raises; the
    rebuild handles that failure (`_fake_call`: the trace runs as before, the reason kept
    for `why_not_bucketed()`), so the user's stderr gets no traceback for it."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    disabled = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = disabled


def _fake_call(op, args: list, kwargs: dict):
    """`op` on fake tensors of symbolic sizes; an op whose fake kernel does not take them
    (some FFT and upsampling backward kernels) leaves the trace as it was."""
    try:
        return op(*args, **kwargs)
    except NotBucketable:
        raise
    except Exception as err:
        raise NotBucketable(f"{op} does not run on symbolic sizes "
                            f"({type(err).__name__}: {str(err)[:200]})") from None


def _same_layout(view, stride: list, offset) -> bool:
    """Whether a rebuilt view has the trace's (symbolic) strides and offset for every size."""
    got = [padding.expr_of(x) for x in view.stride()] + [padding.expr_of(view.storage_offset())]
    want = [padding.expr_of(x) if isinstance(x, torch.SymInt) else sympy.Integer(x)
            for x in [*stride, offset]]
    return len(got) == len(want) and all(
        padding._same(g, w) for g, w, size in zip(got, want, [*view.shape, 2]) if size != 1)


# ---------------------------------------------------------------------------------------
# 4. Bucketed programs


# The smallest bucket of a trace whose size grows by one per call (generate()'s KV cache):
# it will pass through every bucket, and each costs a compilation (0.4 s for a 2-layer GPT-2's
# step) while padding a short sequence to 64 costs little (in a decoding step only attention
# reads the padded length). Applies under the default rule (`pow2`); a rule set in
# TORCHNEURON_BUCKETS with a minimum (`pow2:16`) or another kind is used as it is.
GROWING_MINIMUM = 64


class Program:
    """One description made into a bucketed graph."""

    def __init__(self, description: tuple, fit: Fit, ints: list[int], externals: tuple,
                 live: tuple, growing: bool = False) -> None:
        rebuild = _Rebuild(description, fit, ints, externals, live)
        self.fit = fit
        self.inputs = rebuild.inputs
        gm = rebuild.graph()
        self.symbol, self.lower, self.upper, self.guards = rebuild.assumptions()
        rule = buckets.rule_for({})
        if growing and rule == buckets.BucketRule("pow2"):
            rule = buckets.BucketRule("pow2", minimum=GROWING_MINIMUM)
        bucketing = buckets.GraphBucketing(gm, "inference", rule, None, None)
        if not bucketing.active:
            raise NotBucketable("no input has the size as a dimension")
        analysis = bucketing.analysis(bucketing.static_hints())
        if isinstance(analysis, padding.NotPadSafe):
            raise NotBucketable(f"{analysis.op}: {analysis.reason}")
        try:
            compiled = CompiledGraph(gm, {"donate": False})
        except LoweringError as err:
            raise NotBucketable(str(err)) from None
        compiled.bucketing = bucketing
        self.compiled = compiled

    def admits(self, ints: list[int]) -> bool:
        """Whether this trace's integers are the fitted ones, at a size (true and bucketed)
        for which the graph's assumptions hold."""
        if not self.fit.matches(ints):
            return False
        true = self.fit.size_of(ints)
        for value in (true, self.compiled.bucketing.rule.bucket(true)):
            if not self.lower <= value <= self.upper:
                return False
            at = {self.symbol: sympy.Integer(value)}
            if not all(bool(g.xreplace(at)) for g in self.guards):
                return False
        return True

    def run(self, ints: list[int], externals: tuple, sites: list) -> list:
        s = self.fit.size_of(ints)
        args: list = [s]
        for ref, (shape, dtype) in self.inputs.items():
            sizes = [self.fit.coefficients[v.index] * s + self.fit.offsets[v.index]
                     for v in shape]
            args.append(storage.new_tensor(sizes, dtype, None, externals[ref]))
        # A failed index check names the eager op and the user's line, not the graph's.
        outputs = self.compiled(*args, check_sites=sites or None)
        values = []
        for t in outputs:
            payload = storage.ready_payload(t)
            if payload is None or t.storage_offset() != 0 or \
                    t.numel() * t.dtype.itemsize != payload.nbytes:
                raise RuntimeError("torchneuron: a bucketed trace returned a view (a bug)")
            values.append(payload.buf)
        return values
