"""External buffers that a fused trace reads only through small views, passed as windows.

A trace's program takes each storage it reads as the storage's whole flat buffer, so its
compiled shape follows the buffer's length. A generation loop reads `ids[:, -1:]` of a token
buffer that grows by one at every step: the same trace, over a new buffer length each time,
would compile a new program per token. On the CPU platform, where a host copy costs
microseconds against tens of milliseconds for a compilation, such a buffer is passed as a
fresh copy of the range its views reach (the window), with the views' offsets moved to match:
the program then sees the same shapes at every step.

A trace structure is considered once its program exists (`decide`): if the buffers it reads
only through views changed length since its first run, it narrows them from then on
(`Windows.narrow`). Buffers read whole, written by the trace, or passed to anything but an
eager op's executable are never narrowed, and neither is a buffer whose computation has not
finished (the copy would wait for it).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
import torch

from . import platform, strided
from .plan import SCALAR, STATIC, TENSOR

# The largest window copied, in bytes: past it a copy costs more than it may save.
_MAX_WINDOW_BYTES = 1 << 20


class Windows:
    """How one trace structure narrows its externals: for each narrowed buffer (by external
    index), the external indices of its views' offsets and each view's reach."""

    __slots__ = ("buffers", "lengths", "steady")

    def __init__(self, buffers: list[tuple[int, list[tuple[int, int]]]]) -> None:
        self.buffers = buffers
        self.lengths: list[int | None] = [None] * len(buffers)  # the last window of each
        # False once a window changed length: narrowing no longer keeps the shapes
        self.steady = True

    def narrow(self, externals: tuple) -> tuple:
        """`externals` with each narrowable buffer replaced by its window and its views'
        offsets moved (the same tuple when none is)."""
        narrowed = None
        for i, (ref, reads) in enumerate(self.buffers):
            buf = externals[ref]
            offsets = [externals[o] for o, _reach in reads]
            is_ready = getattr(buf, "is_ready", None)
            if is_ready is None or not is_ready() or not all(type(o) is int for o in offsets):
                continue
            lo = min(offsets)
            hi = max(offset + reach for offset, (_o, reach) in zip(offsets, reads))
            if hi - lo >= buf.shape[0] or (hi - lo) * buf.dtype.itemsize > _MAX_WINDOW_BYTES:
                continue
            if self.lengths[i] not in (None, hi - lo):
                self.steady = False
            self.lengths[i] = hi - lo
            if narrowed is None:
                narrowed = list(externals)
            # A copy: the device may alias a numpy array it is given.
            window = np.array(np.asarray(buf)[lo:hi])
            narrowed[ref] = jax.device_put(window, platform.jax_device(0))
            for o in {o for o, _reach in reads}:
                narrowed[o] = externals[o] - lo
        return externals if narrowed is None else tuple(narrowed)


def applies() -> bool:
    """Whether windows are copied (the CPU platform: host memory is device memory)."""
    return platform.platform_name() == "cpu"


def buffer_shapes(externals: tuple) -> tuple:
    """The shapes of a trace's external buffers (None for scalars), to compare runs."""
    return tuple(getattr(e, "shape", None) for e in externals)


def decide(nodes, externals: tuple, first_shapes: tuple, call_of: Callable) -> Windows | None:
    """How this trace structure narrows its externals, or None when it should not: no buffer
    read only through views changed length since the structure's first run."""
    reads = _view_reads(nodes, externals, call_of)
    changed = [(ref, views) for ref, views in reads.items()
               if externals[ref].shape != first_shapes[ref]]
    return Windows(changed) if changed else None


def _view_reads(nodes, externals: tuple, call_of: Callable) -> dict:
    """External buffer index -> [(offset's external index, reach)] of the buffers that the
    trace reads only through views, at offsets that nothing else uses."""
    views: dict[int, list[tuple[int, int]]] = {}
    excluded: set[int] = set()  # read whole, written, or used by other than an eager op
    owners: dict[int, set[int]] = {}  # offset's external index -> the buffers it offsets
    for fn, refs, _n, _site in nodes:
        call = call_of(fn)
        if call is None:
            excluded.update(r for r in refs if r >= 0)
            continue
        it = iter(refs)
        for kind, key in zip(call.plan.kinds, call.key):
            if kind == STATIC or key is None:
                continue
            if kind == SCALAR:
                excluded.add(next(it))
            elif kind == TENSOR:
                _tensor(key, it, views, excluded, owners)
            else:  # a list of tensors
                for k in key:
                    _tensor(k, it, views, excluded, owners)
        excluded.update(r for r in it if r >= 0)  # written buffers, random draws
    return {ref: reads for ref, reads in views.items()
            if ref not in excluded and hasattr(externals[ref], "shape")
            and all(o not in excluded and owners[o] == {ref} for o, _ in reads)}


def _tensor(key, it, views: dict, excluded: set, owners: dict) -> None:
    if key is None:
        return
    if not isinstance(key[0], torch.dtype):  # a Python number, a host scalar, conj/neg bits
        excluded.update(next(it) for _ in range(_refs_of(key)))
        return
    ref = next(it)
    spec = key[1]
    if spec.mode == strided.FULL:
        excluded.add(ref)
        return
    offset = next(it)
    if ref < 0 or offset < 0:
        excluded.update(r for r in (ref, offset) if r >= 0)
        return
    views.setdefault(ref, []).append((offset, strided.span(spec)))
    owners.setdefault(offset, set()).add(ref)


def _refs_of(key) -> int:
    """How many inputs a tensor key that is not a plain view takes (signature.tensor_key)."""
    if key[0] == "bits":
        inner = key[3]
        if isinstance(inner[0], torch.dtype):
            return 1 if inner[1].mode == strided.FULL else 2
        return _refs_of(inner)
    return 1  # ("host", dtype) and ("number", type): one value
