"""The `torch.compile` backend: FX graphs -> JAX functions from the lowering table -> XLA."""

from .backend import neuron_backend
from .stats import compile_stats, reset_compile_stats

__all__ = ["compile_stats", "neuron_backend", "reset_compile_stats"]
