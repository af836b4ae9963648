"""PyTorch's own CPU kernels, called from programs on XLA's CPU client.

XLA's CPU convolutions run 2-5x slower than PyTorch's (oneDNN) at the sizes of small CNNs
(docs/BENCHMARKS.md, "XLA's kernels against PyTorch's"). The runtime's C++ library exports
ATen's convolution kernels as XLA FFI handlers (runtime/_native/host_kernels.cpp); when the
device runs on the CPU platform the runtime registers them here, and a lowering whose call
its kernel `runs` emits a custom call to it instead of its lax form. The result is
CPU's own (same kernel), written into XLA's buffer.

Without the library, with TORCHNEURON_HOST_KERNELS=0, or on any other platform nothing is
registered and every lowering keeps its lax form.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

_TARGET_PREFIX = "torchneuron_host_"
_registered: dict[str, str] = {}  # kernel name -> the identity of the code behind it


def register(name: str, handler, identity: str) -> None:
    """Make kernel `name` (an XLA FFI handler capsule) callable from CPU programs; `identity`
    names the code behind it (the native library's build), for the on-disk program caches."""
    jax.ffi.register_ffi_target(_TARGET_PREFIX + name, handler, platform="cpu")
    _registered[name] = identity


def available(name: str) -> bool:
    return name in _registered


# The element types the kernels' C++ side maps to ATen's (host_kernels.cpp `scalar_type`).
_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def runs(name: str, *arrays) -> bool:
    """Whether kernel `name` serves a call on `arrays`: registered, and all of one dtype that
    the kernels take (float32 or float64; others keep the lowering's lax form)."""
    return (name in _registered and arrays[0].dtype in _KERNEL_DTYPES
            and all(a.dtype == arrays[0].dtype for a in arrays))


def identity() -> str:
    """What programs built now may call: part of every on-disk program's key, so a program
    that calls a host kernel is never served to a process without it (or with other code)."""
    return ";".join(f"{name}={ident}" for name, ident in sorted(_registered.items()))


def ints(values: Sequence[int]) -> np.ndarray:
    """An integer-list attribute of a kernel call."""
    return np.asarray(list(values), dtype=np.int64)


def call(name: str, results, *args, **attributes):
    """Call kernel `name` on `args` (jax arrays) with FFI attributes; `results` is one
    `jax.ShapeDtypeStruct` or a list of them, and the result is an array or a list."""
    return jax.ffi.ffi_call(_TARGET_PREFIX + name, results)(*args, **attributes)
