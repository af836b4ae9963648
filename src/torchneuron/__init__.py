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


def _autoload() -> None:
    """Entry point for `torch.backends`: importing the package is the registration."""
    _device.register()


__all__ = ["fallback_ops", "op_counts", "platform_name", "reset_op_counts", "__version__"]
