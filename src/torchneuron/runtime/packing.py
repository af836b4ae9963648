"""Scalar inputs of a fused program, passed as one array per type.

A trace's program takes, besides buffers, every scalar its ops were called with: storage
offsets, `alpha`, learning rates, a random draw's key words. JAX turns each Python or numpy
scalar into a device array at every call (about 2 us apiece on the CPU client); an MLP
training step's program had 71 of its 93 inputs such scalars. Packed, a step pays one
conversion per type instead. Inside the program each element is given back the exact type
the scalar itself would have had (weakly typed for Python numbers, as `jax.jit` types them),
so the ops' executables trace to the same computation.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np
from jax._src.lax.lax import _convert_element_type

# Scalar type -> (the dtype of its packed array, whether jax.jit types it weakly).
_PACKED: dict[type, tuple[np.dtype, bool]] = {
    int: (np.dtype(np.int64), True),
    float: (np.dtype(np.float64), True),
    complex: (np.dtype(np.complex128), True),
    bool: (np.dtype(np.bool_), False),
    np.uint32: (np.dtype(np.uint32), False),  # a random draw's key words (runtime/rng.py)
}


def _getter(positions: tuple[int, ...]) -> Callable[[tuple], tuple]:
    if len(positions) == 1:
        only = positions[0]
        return lambda values: (values[only],)
    return operator.itemgetter(*positions)


class ScalarPacking:
    """How one program's inputs are packed, from the types of a trace's external inputs.

    `pack(externals)` gives the program's arguments: the inputs that are not scalars, in
    order, then one array per scalar type; `unpack(arguments)` (inside the traced program)
    gives back the externals, each scalar as a 0-dim value of its own type."""

    __slots__ = ("count", "kept", "groups", "saved", "_kept", "_groups")

    def __init__(self, types: tuple[type, ...]) -> None:
        self.count = len(types)
        by_type: dict[type, list[int]] = {}
        kept: list[int] = []
        for position, kind in enumerate(types):
            if kind in _PACKED:
                by_type.setdefault(kind, []).append(position)
            else:
                kept.append(position)
        self.kept = tuple(kept)
        self.groups = tuple((kind, tuple(positions)) for kind, positions in by_type.items())
        # conversions a call saves packed: one array per type instead of one per scalar
        self.saved = sum(len(positions) - 1 for positions in by_type.values())
        self._kept = _getter(self.kept) if kept else (lambda values: ())
        self._groups = tuple((_PACKED[kind][0], _getter(positions))
                             for kind, positions in self.groups)

    def pack(self, externals: tuple) -> tuple:
        packed = [np.array(get(externals), dtype) for dtype, get in self._groups]
        return (*self._kept(externals), *packed)

    def unpack(self, arguments: tuple) -> list:
        externals: list = [None] * self.count
        for position, value in zip(self.kept, arguments):
            externals[position] = value
        for (kind, positions), array in zip(self.groups, arguments[len(self.kept):]):
            dtype, weak = _PACKED[kind]
            for i, position in enumerate(positions):
                externals[position] = _convert_element_type(array[i], dtype, weak_type=weak)
        return externals

    def __repr__(self) -> str:  # part of a program's on-disk key (runtime/fusion.py)
        groups = ", ".join(f"{kind.__name__}: {positions}" for kind, positions in self.groups)
        return f"ScalarPacking(kept={self.kept}, {groups})"
