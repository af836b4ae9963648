"""Errors that depend on values, reported at the next sync point, as CUDA reports them.

An op that checks its indices (embedding, gather, index_select, nll_loss's targets...) computes
its check on the device, as one more result of its program. Reading that result at once would
make the host wait for everything queued before the op: in a training step, for the previous
optimizer step before the embedding, for the whole forward before the loss, so that the host
records nothing while the device runs. So the check's flag is kept (`defer`) and read at the
next sync point (`raise_failed`): a read of a value on the host (`.item()`, `.cpu()`, printing, `bool()`,
saving, a CPU fallback, a collective, a data-dependent op) or `torch.neuron.synchronize()`. A
failed check raises there, naming the op and the user's source line of its call, as a CUDA
device-side assert surfaces at the next synchronizing call.

Checks stay at the call where CUDA's own kernels read their result back at once
(`lowerings.registry.at_call`: a singular matrix, a bad distribution, which code catches to
retry), and all of them with `TORCHNEURON_LAUNCH_BLOCKING=1`. With fusion off, eager ops run
one by one and raise at the call in CPU's own wording; compiled graphs still defer.
"""

from __future__ import annotations

import threading

import numpy as np

from .. import config
from ..lowerings.registry import CheckedAtCall, index_exception

# (check flag, (index_error, op, user's source line)), in the order the ops were called.
_PENDING: list[tuple] = []
# The first check found failed while pruning (raised at the next sync point all the same).
_FAILED: list[tuple] = []
_AT_CALL = [False]
_PRUNE_AT = 32
_lock = threading.Lock()


def configure() -> None:
    """Apply TORCHNEURON_LAUNCH_BLOCKING: every check is read at its call."""
    _AT_CALL[0] = config.flag("TORCHNEURON_LAUNCH_BLOCKING")


def raises_at_call(index_error) -> bool:
    """Whether a failed check of this kind raises at the call instead of the next sync point."""
    return _AT_CALL[0] or isinstance(index_error, CheckedAtCall)


def error_of(site: tuple) -> Exception:
    """The exception of a failed check: its kind's message, the op and the user's line."""
    index_error, op, where = site
    error = index_exception(index_error)
    return type(error)(f"{error} (in {op}, called at {where})")


def _failed(flag) -> bool:
    # Through NumPy: a jax.Array's own `bool()` costs ~5 us (its checks and profiler
    # annotation) against ~0.6 us, and a pruning pass reads up to `_PRUNE_AT` flags.
    return bool(np.asarray(flag))


def check(flag, site: tuple) -> None:
    """A check's flag (a device array, true when the check failed) just computed: kept for the
    next sync point, or read now where its kind raises at the call."""
    if not raises_at_call(site[0]):
        defer(flag, site)
    elif _failed(flag):
        raise error_of(site)


def defer(flag, site: tuple) -> None:
    """Keep a check's flag (a device array, true when the check failed) for the next sync
    point; `site` is (index_error, op, user's source line)."""
    with _lock:
        _PENDING.append((flag, site))
        if len(_PENDING) >= _PRUNE_AT:
            _prune()


def _prune() -> None:
    # A loop that never syncs would keep its flags forever: drop the ones already computed
    # and fine, keeping the first failed one (raised at the next sync point).
    keep = []
    for flag, site in _PENDING:
        if not flag.is_ready():
            keep.append((flag, site))
        elif not _FAILED and _failed(flag):
            _FAILED.append((flag, site))
    _PENDING[:] = keep


def pending() -> int:
    """How many checks wait for the next sync point."""
    return len(_PENDING) + len(_FAILED)


def raise_failed() -> None:
    """At a sync point: wait for the deferred checks and raise the first that failed (all of
    them are then forgotten: one failure is reported once)."""
    if not _PENDING and not _FAILED:
        return
    with _lock:
        checks = _FAILED + _PENDING
        _FAILED.clear()
        _PENDING.clear()
    for flag, site in checks:
        if _failed(flag):
            raise error_of(site)
