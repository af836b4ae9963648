"""Counters of which route each ATen op took on the neuron device."""

from __future__ import annotations

import collections

from . import _native
from .plan import COUNTS, Route


def fallback_ops() -> dict[str, int]:
    """Ops that ran on CPU because they have no lowering, with their call counts."""
    return dict(COUNTS[Route.FALLBACK])


def op_counts() -> dict[str, dict[str, int]]:
    """Per route ('native', 'decomposed', 'fallback'): op name -> number of calls (native
    calls served by the C++ fast path included)."""
    counts = {route.label: dict(COUNTS[route])
              for route in (Route.NATIVE, Route.DECOMPOSED, Route.FALLBACK)}
    native = _native.fastpath()
    if native is not None:
        counts["native"] = dict(collections.Counter(counts["native"]) + collections.Counter(native.fast_counts()))
    return counts


def reset_op_counts() -> None:
    for counter in COUNTS.values():
        counter.clear()
    native = _native.fastpath()
    if native is not None:
        native.reset_fast_counts()
