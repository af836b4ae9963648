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
- `buckets` (str, default `TORCHNEURON_BUCKETS`, itself `pow2` by default): how graphs with
  dynamic sizes round them up to buckets (compiler/buckets.py); `"off"` compiles per shape.
"""

from __future__ import annotations

from typing import Any

import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from . import advisories, buckets
from .graph import CompiledGraph, LoweringError, eager_graph
from .support import graph_decompositions

KNOWN_OPTIONS = {"buckets", "donate", "max_shapes", "strict"}

advisories.install()


def _graph_compiler(options: dict[str, Any], kind: str, link: buckets.BucketLink):
    """The compiler of one kind of graph ("forward", "backward", "inference"); the forward and
    backward of one Dynamo graph share `link`, so that they are bucketed together."""

    def compile_graph(gm: torch.fx.GraphModule, example_inputs):
        bucketing = buckets.for_graph(gm, kind, options, link, _user_outputs(kind))
        try:
            compiled = CompiledGraph(gm, options)
        except LoweringError as err:
            run = eager_graph(gm, err, options)
            return make_boxed_func(buckets.unpadded(run, bucketing))
        compiled.bucketing = bucketing
        return make_boxed_func(compiled)

    return compile_graph


def _user_outputs(kind: str) -> int | None:
    """How many of a training forward's outputs the caller sees; the rest are saved for the
    backward (None: all of them)."""
    if kind != "forward":
        return None
    context = torch._guards.TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is None or getattr(meta, "num_symints_saved_for_bw", None) is None:
        return None
    return int(meta.num_forward)


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
    buckets.rule_for(options)  # a bad rule is an error now, not at the first dynamic graph
    link = buckets.BucketLink()
    return aot_autograd(
        fw_compiler=_graph_compiler(options, "forward", link),
        bw_compiler=_graph_compiler(options, "backward", link),
        inference_compiler=_graph_compiler(options, "inference", link),
        decompositions=graph_decompositions(),
        # Input mutations (optimizer state, BatchNorm running statistics) stay in the graph
        # as copy_ nodes: the executable writes them, instead of one eager copy_ per input.
        keep_inference_input_mutations=True,
    )(gm, example_inputs)
