"""torchneuron: the `neuron` device for PyTorch, lowered through JAX to XLA via PJRT.

`import torchneuron` (or plain `import torch`, through the `torch.backends` entry point)
registers the device; then `tensor.to("neuron")` and `device="neuron"` work as for any
PyTorch device.
"""

from __future__ import annotations

from .runtime import device as _device

__version__ = "0.1.0"

_device.register()

from .runtime.api import fallback_ops, op_counts, reset_op_counts  # noqa: E402
from .runtime.platform import platform_name  # noqa: E402
from . import distributed as _distributed  # noqa: E402,F401  (registers the `neuron` c10d backend)


def __getattr__(name: str):
    # The compiler imports Dynamo, which is slow to import: load it only when asked for.
    if name in ("compile_stats", "reset_compile_stats"):
        from . import compiler

        return getattr(compiler, name)
    raise AttributeError(f"module 'torchneuron' has no attribute {name!r}")


def _autoload() -> None:
    """Entry point for `torch.backends`: importing the package is the registration."""
    _device.register()


__all__ = [
    "compile_stats",
    "fallback_ops",
    "op_counts",
    "platform_name",
    "reset_compile_stats",
    "reset_op_counts",
    "__version__",
]
