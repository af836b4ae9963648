"""The `torch.compile` backend: FX graphs -> JAX functions from the lowering table -> XLA.

The backend imports Dynamo and AOTAutograd, which take a while to import: this package loads
it at the first use of one of the names below, so that eager mode can use the package's light
modules (compiler/eager_traces.py) without it.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {"neuron_backend": ".backend", "compile_stats": ".stats",
          "reset_compile_stats": ".stats"}

__all__ = ["compile_stats", "neuron_backend", "reset_compile_stats"]


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
