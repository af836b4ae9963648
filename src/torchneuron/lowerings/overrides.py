"""Scoped replacements of an op's lowering (`torchneuron.library.override`).

While an override is active its `Lowering` is the op's entry in `LOWERINGS`; when the last
override of an op ends, the built-in entry (or its absence) comes back. Overrides of one op
stack, and may end in any order.

`token()` names the overrides in force: compiled graphs key their executables by it, so a
graph traced with an override is never reused without it (and the reverse). The token uses
serial numbers, never `id()`, so a new override cannot collide with an ended one.
"""

from __future__ import annotations

import itertools
import threading

import torch

from .registry import LOWERINGS, Lowering

OpOverload = torch._ops.OpOverload

_serials = itertools.count(1)
_lock = threading.Lock()
# op -> [(serial, lowering)], the last one in force
_ACTIVE: dict[OpOverload, list[tuple[int, Lowering]]] = {}
# op -> its built-in lowering (None: it has none), saved by its first override
_BUILTIN: dict[OpOverload, Lowering | None] = {}
_token: tuple = ()


def builtin(op: OpOverload) -> Lowering | None:
    """The op's own lowering, whatever overrides are in force."""
    with _lock:
        return _BUILTIN[op] if op in _ACTIVE else LOWERINGS.get(op)


def install(op: OpOverload, lowering: Lowering) -> int:
    """Make `lowering` the op's lowering until `remove(op, serial)`; returns that serial."""
    global _token
    with _lock:
        serial = next(_serials)
        if op not in _ACTIVE:
            _BUILTIN[op] = LOWERINGS.get(op)
            _ACTIVE[op] = []
        _ACTIVE[op].append((serial, lowering))
        LOWERINGS[op] = lowering
        _token = _compute_token()
    return serial


def remove(op: OpOverload, serial: int) -> None:
    global _token
    with _lock:
        stack = _ACTIVE.get(op, [])
        stack[:] = [entry for entry in stack if entry[0] != serial]
        if stack:
            LOWERINGS[op] = stack[-1][1]
        else:
            original = _BUILTIN.pop(op)
            del _ACTIVE[op]
            if original is None:
                LOWERINGS.pop(op, None)
            else:
                LOWERINGS[op] = original
        _token = _compute_token()


def _compute_token() -> tuple:
    return tuple(sorted((str(op), stack[-1][0]) for op, stack in _ACTIVE.items() if stack))


def token() -> tuple:
    """The overrides in force, as a hashable value (empty when none)."""
    return _token
