"""torchneuron: the `neuron` device for PyTorch, lowered through JAX to XLA via PJRT.

`import torchneuron` (or plain `import torch`, through the `torch.backends` entry point)
registers the device; then `tensor.to("neuron")` and `device="neuron"` work as for any
PyTorch device.
"""

from __future__ import annotations

# When `import torchneuron` comes before `import torch`, importing torch runs its backend
# autoload, which calls `_autoload` on this half-initialised package: it must exist already
# and leave the registration to the code below.
_initialised = False


def _autoload() -> None:
    """Entry point for `torch.backends`: importing the package is the registration."""
    if _initialised:
        _device.register()


from .runtime import device as _device  # noqa: E402

__version__ = "0.1.0"

_device.register()

from . import distributed as _distributed  # noqa: E402,F401  (registers the `neuron` c10d backend)
from .runtime import fusion as _fusion  # noqa: E402
from .runtime.api import fallback_ops, op_counts, reset_op_counts  # noqa: E402
from .runtime.fusion import reset_stats as reset_fusion_stats  # noqa: E402
from .runtime.fusion import stats as fusion_stats  # noqa: E402
from .runtime.platform import platform_name  # noqa: E402


def _bucket_trace(nodes, externals, live):
    # Eager traces over a dynamic size are bucketed by the compiler's analysis, which imports
    # Dynamo: loaded at the first trace that needs it.
    from .compiler import eager_traces

    _fusion.set_trace_bucketer(eager_traces.run_trace)
    return eager_traces.run_trace(nodes, externals, live)


_fusion.set_trace_bucketer(_bucket_trace)


def __getattr__(name: str):
    # The compiler imports Dynamo, which is slow to import: load it only when asked for.
    if name in ("compile_stats", "reset_compile_stats"):
        from . import compiler

        return getattr(compiler, name)
    if name == "library":  # custom ops from JAX/Pallas functions (imports on first use)
        import importlib

        return importlib.import_module(f"{__name__}.library")
    raise AttributeError(f"module 'torchneuron' has no attribute {name!r}")


_initialised = True

__all__ = [
    "compile_stats",
    "fallback_ops",
    "fusion_stats",
    "library",
    "op_counts",
    "platform_name",
    "reset_compile_stats",
    "reset_fusion_stats",
    "reset_op_counts",
    "__version__",
]
