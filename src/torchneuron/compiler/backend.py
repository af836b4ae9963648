"""`torch.compile(model, backend="neuron")`.

Dynamo captures the graph, AOTAutograd splits it into forward and backward graphs of core ATen
ops (with PyTorch's own decompositions), and each graph becomes one XLA executable built from
the same lowerings eager mode uses.

Options (`torch.compile(..., options={...})`):
- `max_shapes` (int, default 16): executables kept in memory per graph; with dynamic shapes
  XLA compiles once per distinct concrete input shape, and at most this many stay loaded.
- `strict` (bool, default False): raise instead of running a graph that cannot be lowered in
  eager mode on the device.
- `donate` (bool, default True): the executable overwrites the storage buffers of the inputs
  a graph mutates (parameters and optimizer state in a compiled step), in place, instead of
  writing new ones; `False` keeps every input buffer intact (for debugging).
"""

from __future__ import annotations

from typing import Any

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from . import advisories
from .graph import CompiledGraph, LoweringError, eager_graph
from .support import graph_decompositions

KNOWN_OPTIONS = {"donate", "max_shapes", "strict"}

advisories.install()


def _graph_compiler(options: dict[str, Any]):
    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        try:
            return make_boxed_func(CompiledGraph(gm, options))
        except LoweringError as err:
            return make_boxed_func(eager_graph(gm, err, options))

    return compile_graph


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs: Any):
    """The Dynamo backend registered as "neuron"."""
    advisories.install()  # again: torch._dynamo.reset() drops the callback
    options = dict(kwargs.pop("options", None) or {})
    options.update(kwargs)
    unknown = set(options) - KNOWN_OPTIONS
    if unknown:
        raise ValueError(
            f"torch.compile(backend='neuron'): unknown option(s) {sorted(unknown)}; "
            f"known: {sorted(KNOWN_OPTIONS)}"
        )
    compiler = _graph_compiler(options)
    return aot_autograd(
        fw_compiler=compiler,
        bw_compiler=compiler,
        decompositions=graph_decompositions(),
        # Input mutations (optimizer state, BatchNorm running statistics) stay in the graph
        # as copy_ nodes: the executable writes them, instead of one eager copy_ per input.
        keep_inference_input_mutations=True,
    )(gm, example_inputs)
