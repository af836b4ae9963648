"""Which PJRT platform backs the `neuron` device, and the JAX settings it needs.

`TORCHNEURON_PLATFORM` picks the JAX platform (`cpu` by default; `cuda`, `tpu` or the name of
any installed PJRT plugin). float64/int64 must stay exact, so `jax_enable_x64` is always on,
and float16 results must not depend on the host's instruction set (see HOST_INDEPENDENT_ISA_FLAG).
"""

from __future__ import annotations

import functools
import os
import platform
import warnings

# XLA's CPU code generator always lets LLVM fuse a multiply and an add into one FMA (one
# rounding instead of two). On processors with AVX512-FP16 that happens in float16 too, while
# elsewhere every float16 operation rounds: the same program gives different float16 results on
# different x86-64 hosts. Capping the instruction set below AVX512-FP16 makes float16 arithmetic
# round each operation everywhere (float32 and bfloat16 are unaffected: XLA computes bfloat16 in
# float32). XLA reads XLA_FLAGS when its CPU client starts, which is after this import; a
# `--xla_cpu_max_isa` the user set is kept.
HOST_INDEPENDENT_ISA_FLAG = "--xla_cpu_max_isa=AVX512_BF16"


def with_host_independent_isa(xla_flags: str, machine: str) -> str:
    """`xla_flags` plus the instruction-set cap on x86-64, unless it already sets one."""
    if machine.lower() not in ("x86_64", "amd64") or "xla_cpu_max_isa" in xla_flags:
        return xla_flags
    return f"{xla_flags} {HOST_INDEPENDENT_ISA_FLAG}".strip()


_user_xla_flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = with_host_independent_isa(_user_xla_flags, platform.machine())

import jax  # noqa: E402
from jax._src import xla_bridge as _xla_bridge  # noqa: E402
from jax._src.lib import _jax as _jax_lib  # noqa: E402

if os.environ["XLA_FLAGS"] != _user_xla_flags and _xla_bridge.backends_are_initialized():
    warnings.warn(
        "torchneuron: JAX started its backends before torchneuron was imported, so XLA runs "
        f"without {HOST_INDEPENDENT_ISA_FLAG} and float16 results may depend on this host's "
        "instruction set; import torch before using JAX, or set that flag in XLA_FLAGS",
        RuntimeWarning, stacklevel=2,
    )

from .. import config  # noqa: E402
from . import disk_budget  # noqa: E402

jax.config.update("jax_enable_x64", True)
# Asynchronous dispatch on the CPU client, as a GPU runs its queue: a fused program (a training
# step) runs on XLA's threads while Python records the next one (eager MLP step 1.30 -> 1.06 ms).
# Programs still run in the order they were launched, so waiting for the latest result waits
# for all (torch.neuron.synchronize). The CPU client runs cheap single ops inline either way
# (64x64 add: 10.9 us per call with it, 10.7 without). TORCHNEURON_LAUNCH_BLOCKING=1 makes every
# launch synchronous, so that errors surface at their call.
jax.config.update("jax_cpu_enable_async_dispatch", config.flag("TORCHNEURON_ASYNC_DISPATCH")
                  and not config.flag("TORCHNEURON_LAUNCH_BLOCKING"))
# JAX records the Python stack at the creation of every array, for its device memory profiles
# (jax.profiler.device_memory_profile); every op's result is such an array, and the stack is
# the user's: 0.3-0.5 us of an 8 us op run by itself. Nothing in torchneuron reads it.
if not config.flag("TORCHNEURON_JAX_TRACEBACKS") and hasattr(_jax_lib, "set_tracebacks_enabled"):
    _jax_lib.set_tracebacks_enabled(False)
# With TORCHNEURON_EAGER_DISK_CACHE=1, single eager executables (ops run one by one) are kept on
# disk by JAX's own cache (keyed by the program), so a second process loads them instead of
# compiling; fused programs have their own cache (runtime/fusion.py, on by default). Off by
# default: that cache also serves compiled graphs whose program equals an eager one, which the
# compiled path's counters do not expect. Its size is kept to TORCHNEURON_DISK_CACHE_BYTES
# here, once per process: JAX's own limit scans the whole directory at every write (measured:
# 16 of 49 s of a generate() call with 1,200 entries).
if config.flag("TORCHNEURON_COMPILE_CACHE") and config.flag("TORCHNEURON_EAGER_DISK_CACHE"):
    _jax_cache = config.cache_root() / "jax"
    disk_budget.prune(_jax_cache, int(config.raw("TORCHNEURON_DISK_CACHE_BYTES")),
                      disk_budget.jax_entry)
    jax.config.update("jax_compilation_cache_dir", str(_jax_cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def platform_name() -> str:
    """The JAX platform requested through `TORCHNEURON_PLATFORM` (default `cpu`)."""
    return config.platform()


@functools.cache
def jax_devices() -> tuple[jax.Device, ...]:
    """The PJRT devices behind `neuron:0 .. neuron:N-1`."""
    name = platform_name()
    try:
        devices = jax.devices(name)
    except RuntimeError as err:
        raise RuntimeError(
            f"torchneuron: PJRT platform '{name}' (TORCHNEURON_PLATFORM) is not available: {err}"
        ) from err
    return tuple(devices)


def jax_device(index: int = 0) -> jax.Device:
    devices = jax_devices()
    if not 0 <= index < len(devices):
        raise RuntimeError(
            f"Invalid device ordinal neuron:{index}: {len(devices)} device(s) are available"
        )
    return devices[index]


def device_count() -> int:
    """How many neuron devices there are (0 when the platform is unavailable)."""
    try:
        return len(jax_devices())
    except RuntimeError:
        return 0
