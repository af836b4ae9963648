"""What an eager fused trace looks like up to its sizes (compiler/eager_traces.py, steps 1-2).

*Describe* a trace: each node's op, static arguments, argument views and results, with every
integer that could be a size pulled out into a list (`describe`). Two traces with the same
description but different integers are the same program up to sizes.

*Fit* the sizes: the second shape of a description names the size symbol `s` (the smallest
change, at a position that changes by exactly it) and fits every integer as `a * s + b`
(`Fit`); a trace is bucketed only where the fit reproduces all of its integers.

This module imports nothing of Dynamo, so that a process whose traces never change size does
not pay for importing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..runtime import fusion, storage, strided
from ..runtime.plan import GENERATOR, NEURON, SCALAR, STATIC, TENSOR, size_arguments

aten = torch.ops.aten


class NotBucketable(Exception):
    """This trace is not rebuilt as a graph (the reason says why)."""


# ---------------------------------------------------------------------------------------
# 1. Descriptions


@dataclass(frozen=True)
class Size:
    """An integer of a description that may be a size: its position in the integer list."""

    index: int


class _Describer:
    """Walks a trace's nodes into a hashable description, sizes replaced by `Size`s."""

    def __init__(self, externals: tuple) -> None:
        self.externals = externals
        self.ints: list[int] = []
        self.full_read: set[int] = set()  # external buffers read whole and contiguous

    def size(self, value: int) -> Size:
        self.ints.append(int(value))
        return Size(len(self.ints) - 1)

    def sizes(self, values) -> tuple:
        return tuple(self.size(v) for v in values)

    def static(self, value: Any) -> Any:
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, int):
            return self.size(value)
        if isinstance(value, list | tuple):
            return (type(value).__name__, tuple(self.static(v) for v in value))
        if isinstance(value, float | str | complex | torch.dtype | torch.device | torch.layout
                      | torch.memory_format):
            return value
        raise NotBucketable(f"a static argument of type {type(value).__name__}")

    def external_scalar(self, ref: int) -> Any:
        if ref < 0:
            raise NotBucketable("a scalar argument computed by the trace")
        value = self.externals[ref]
        if isinstance(value, bool):
            return ("scalar", value)
        if isinstance(value, int):
            return ("scalar", self.size(value))
        if isinstance(value, float | complex):
            return ("scalar", value)
        raise NotBucketable(f"a scalar argument of type {type(value).__name__}")

    def tensor(self, key, refs) -> Any:
        if key is None:
            return None
        tag = key[0]
        if tag == "number":  # a Python number in a Tensor slot: part of the program
            return ("number", self.external_scalar(next(refs)))
        if not isinstance(tag, torch.dtype):
            raise NotBucketable(f"an argument of kind {tag!r}")
        ref = next(refs)
        spec = key[1]
        if spec.mode == strided.FULL:
            if ref >= 0:
                self.full_read.add(ref)
            return ("tensor", tag, ref, strided.FULL, self.sizes(spec.shape), None, None)
        offset_ref = next(refs)
        return ("tensor", tag, ref, spec.mode, self.sizes(spec.shape), self.sizes(spec.stride),
                self.external_scalar(offset_ref)[1])

    def node(self, fn, refs: tuple, n: int, site) -> tuple:
        call = fusion.call_of(fn)
        if isinstance(fn, storage.ZeroFill):  # the zeros of a storage never written
            args = (("static", self.static(list(fn.shape)), True), ("static", 0, False),
                    ("static", fn.dtype, False), None, ("static", torch.device(NEURON), False),
                    None)
            fresh = ((fn.dtype, self.sizes(fn.shape), tuple(range(len(fn.shape)))),)
            return (aten.full.default, args, fresh, (), 1, False)
        if call is None:
            raise NotBucketable("an executable that is not an eager op's")
        plan, key, statics, ex, random = call
        if random:
            raise NotBucketable(f"{plan.name} draws random numbers")
        if ex.fresh_meta is None or ex.none_results is None:
            raise NotBucketable(f"{plan.name} learns its output layout per call")
        if ex.writes and plan.lowering is not None:
            raise NotBucketable(f"{plan.name} writes arguments of its own lowering")
        it = iter(refs)
        args = []
        symbolic = size_arguments(plan.op)
        for name, kind, k, static in zip(plan.arg_names, plan.kinds, key, statics):
            if kind == STATIC:
                args.append(("static", self.static(static), name in symbolic))
            elif kind == GENERATOR:
                args.append(None)
            elif kind == SCALAR:
                # Recorded calls keep numbers at their defaults as inputs (signature._gather):
                # a None key is an argument left out.
                args.append(None if k is None else self.external_scalar(next(it)))
            elif kind == TENSOR:
                args.append(self.tensor(k, it))
            else:
                args.append(("list", tuple(self.tensor(kk, it) for kk in k)))
        if next(it, None) is not None:
            raise NotBucketable(f"{plan.name} writes through a partial view")
        fresh = []
        for meta in ex.fresh_meta:
            if meta is None:
                fresh.append(None)
                continue
            dtype, shape, stride = meta
            order = strided.dense_permutation(shape, stride)
            if order is None:
                raise NotBucketable(f"{plan.name} returns a tensor with gaps")
            fresh.append((dtype, self.sizes(shape), order))
        writes = []
        for _slot, (dtype, spec) in ex.writes:
            if spec.mode != strided.FULL:
                raise NotBucketable(f"{plan.name} writes through a partial view")
            writes.append((dtype, self.sizes(spec.shape)))
        checks = ex.index_error is not None  # its last result is the check's flag
        return (plan.op, tuple(args), tuple(fresh), tuple(writes), n, checks)


def describe(nodes, externals: tuple) -> tuple[tuple, list[int]]:
    """(description, integers) of a trace; raises NotBucketable."""
    d = _Describer(externals)
    described = tuple(d.node(fn, refs, n, site) for fn, refs, n, site in nodes)
    # External buffers: their dtype, and their length where no whole read gives their shape.
    buffers = []
    for ref, value in enumerate(externals):
        if isinstance(value, int | float | complex | bool):
            buffers.append(None)
        elif ref in d.full_read:
            buffers.append(("read whole", str(value.dtype)))
        else:
            buffers.append(("flat", str(value.dtype), d.size(value.shape[0])))
    return (described, tuple(buffers)), d.ints


# ---------------------------------------------------------------------------------------
# 2. The size fit


@dataclass(frozen=True)
class Fit:
    """Every integer of a description as `a * s + b`, with `s` the integer at `base`."""

    base: int
    coefficients: tuple[int, ...]
    offsets: tuple[int, ...]

    def size_of(self, ints: list[int]) -> int:
        return ints[self.base]

    def matches(self, ints: list[int]) -> bool:
        s = ints[self.base]
        return all(v == a * s + b for v, a, b in zip(ints, self.coefficients, self.offsets))


def fit(first: list[int], second: list[int], shape_positions: set[int]) -> Fit | None:
    """The fit through two samples, or None when they do not differ by one size."""
    changes = [(abs(b - a), i) for i, (a, b) in enumerate(zip(first, second)) if a != b]
    if not changes:
        return None
    step = min(c for c, _ in changes)
    # The base: a tensor dimension that changes by exactly the step (the size itself), of at
    # least 2 (symbolic sizes are; 0 and 1 are kept apart).
    candidates = [i for c, i in changes if c == step and i in shape_positions
                  and min(first[i], second[i]) >= 2]
    if not candidates:
        return None
    base = candidates[0]
    delta = second[base] - first[base]
    coefficients, offsets = [], []
    for a, b in zip(first, second):
        if (b - a) % delta:
            return None
        k = (b - a) // delta
        coefficients.append(k)
        offsets.append(a - k * first[base])
    return Fit(base, tuple(coefficients), tuple(offsets))


def shape_positions(description: tuple) -> set[int]:
    """Integer positions that are tensor dimensions (of arguments and results)."""
    positions: set[int] = set()
    for _op, args, fresh, writes, *_rest in description[0]:
        for arg in args:
            for t in (arg[1] if arg and arg[0] == "list" else (arg,)):
                if t and t[0] == "tensor":
                    positions.update(v.index for v in t[4])
        for result in (*fresh, *writes):
            if result is not None:
                positions.update(v.index for v in result[1])
    return positions
