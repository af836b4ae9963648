"""Every `TORCHNEURON_*` setting, parsed in one place with one convention.

Settings are environment variables, so that user code needs no change. Each is read when the
runtime needs it (most at import or first use; `TORCHNEURON_STRICT` at each fallback), always
through this module. Booleans accept `1/true/yes/on` and `0/false/no/off` (any case; empty means
the default); any other value raises `ValueError` naming the variable, never a silent guess.

docs/CONFIGURATION.md documents exactly the variables listed in `SETTINGS` (a test checks it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
# The values that turn bucketing off (TORCHNEURON_BUCKETS, torch.compile's "buckets").
BUCKETS_OFF = ("none", *_FALSE)


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    kind: str  # "bool", "int", "str" or "path"
    summary: str


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("TORCHNEURON_PLATFORM", "cpu", "str",
                "JAX/PJRT platform behind the neuron devices (cpu, cuda, tpu, or a plugin)"),
        Setting("TORCHNEURON_STRICT", "0", "bool",
                "raise instead of running an op (or a compiled graph) on CPU / eagerly"),
        Setting("TORCHNEURON_ASYNC_DISPATCH", "1", "bool",
                "JAX's asynchronous dispatch on the CPU client (off under launch blocking)"),
        Setting("TORCHNEURON_JAX_TRACEBACKS", "0", "bool",
                "JAX records the Python stack of every array it creates (memory profiles)"),
        Setting("TORCHNEURON_AUTOGRAD_DEVICE_THREAD", "0", "bool",
                "run backward passes on PyTorch's per-device autograd thread"),
        Setting("TORCHNEURON_NATIVE_LIBRARY", "1", "bool",
                "build and load the small C++ library (fast path, generators, allocator)"),
        Setting("TORCHNEURON_HOST_KERNELS", "1", "bool",
                "on the CPU platform, programs call PyTorch's CPU convolution kernels (needs the C++ library)"),
        Setting("TORCHNEURON_REBUILD_EXTENSION", "0", "bool",
                "rebuild the C++ library even if cached or an earlier build failed"),
        Setting("TORCHNEURON_CACHE_DIR", "", "path",
                "root of the on-disk caches (default $XDG_CACHE_HOME/torchneuron or ~/.cache/torchneuron)"),
        Setting("TORCHNEURON_EAGER_DISK_CACHE", "0", "bool",
                "keep single eager executables in JAX's on-disk cache (fused programs are on disk anyway)"),
        Setting("TORCHNEURON_COMPILE_CACHE", "1", "bool",
                "keep compiled executables on disk across processes"),
        Setting("TORCHNEURON_FUSION", "1", "bool",
                "record eager ops and run each run of them as one XLA program"),
        Setting("TORCHNEURON_FUSION_CAP", "512", "int",
                "recorded ops after which the trace runs even if nothing reads it"),
        Setting("TORCHNEURON_FUSION_PROGRAMS", "128", "int",
                "fused programs kept in memory (least recently used dropped first)"),
        Setting("TORCHNEURON_EAGER_SIGNATURES", "64", "int",
                "eager executables kept per op (one per argument signature; oldest dropped first)"),
        Setting("TORCHNEURON_DISK_CACHE_BYTES", "2000000000", "int",
                "size of each on-disk executable cache (least recently used entries removed)"),
        Setting("TORCHNEURON_LAUNCH_BLOCKING", "0", "bool",
                "run every eager op at the call, raising its errors there (debugging)"),
        Setting("TORCHNEURON_DIST_CHECK", "1", "bool",
                "check that collectives agree on shapes and dtypes across ranks"),
        Setting("TORCHNEURON_BUCKETS", "pow2", "str",
                "how torch.compile rounds dynamic sizes up to buckets (pow2, pow2:MIN, "
                "multiple:N, sizes:A,B,..., off)"),
    )
}


def raw(name: str) -> str:
    """The variable's value as set (stripped), or its default when unset or empty."""
    setting = SETTINGS[name]
    value = os.environ.get(name, "").strip()
    return value if value else setting.default


def flag(name: str) -> bool:
    """A boolean setting."""
    if SETTINGS[name].kind != "bool":
        raise TypeError(f"{name} is not a boolean setting")
    value = raw(name).lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{name}={os.environ.get(name)!r}: expected one of {', '.join(_TRUE + _FALSE)}"
    )


def strict() -> bool:
    """`TORCHNEURON_STRICT`: CPU fallbacks and eagerly run graphs raise instead."""
    return flag("TORCHNEURON_STRICT")


def platform() -> str:
    """`TORCHNEURON_PLATFORM`, lower case (default `cpu`)."""
    return raw("TORCHNEURON_PLATFORM").lower()


def cache_root() -> Path:
    """Root of every on-disk cache: `$TORCHNEURON_CACHE_DIR`, else
    `$XDG_CACHE_HOME/torchneuron`, else `~/.cache/torchneuron`."""
    root = raw("TORCHNEURON_CACHE_DIR")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "torchneuron"
