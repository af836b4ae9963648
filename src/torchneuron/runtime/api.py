"""Counters of which path each ATen op took on the neuron device."""

from __future__ import annotations

from . import dispatch


def fallback_ops() -> dict[str, int]:
    """Ops that ran on CPU because they have no lowering, with their call counts."""
    return dict(dispatch.FALLBACK_COUNTS)


def op_counts() -> dict[str, dict[str, int]]:
    """Per path ('native', 'decomposed', 'fallback'): op name -> number of calls."""
    return {
        "native": dict(dispatch.NATIVE_COUNTS),
        "decomposed": dict(dispatch.DECOMP_COUNTS),
        "fallback": dict(dispatch.FALLBACK_COUNTS),
    }


def reset_op_counts() -> None:
    dispatch.NATIVE_COUNTS.clear()
    dispatch.DECOMP_COUNTS.clear()
    dispatch.FALLBACK_COUNTS.clear()
