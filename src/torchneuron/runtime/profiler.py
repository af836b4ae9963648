"""torch.profiler support: each op on the neuron device becomes a record named after its path.

While a `torch.profiler.profile()` (or `torch.autograd.profiler.profile()`) is running, the
dispatcher (runtime/dispatch.py) sends every neuron op through `profiled`, which wraps it in
`torch.autograd.profiler.record_function("neuron::<path>::<op>")`, for example

    neuron::native::aten.mm.default        a lowering, run as an XLA executable
    neuron::decomposed::aten.var.correction a PyTorch decomposition into other neuron ops
    neuron::fallback::aten.foo.default     no lowering: ran on the CPU and was copied back
    neuron::view::aten.view.default        a view (metadata only, CPU kernel on shared storage)
    neuron::special::aten.copy_.default    copies, factories, resize (runtime handlers)

The records sit inside PyTorch's own `aten::<op>` records, so `prof.key_averages()` shows
both the op and the path it took, with CPU times (the neuron CPU client runs synchronously, so
CPU time is the op's time). Outside a profiler, dispatch pays one attribute check per op.
"""

from __future__ import annotations

from typing import Any

from torch.autograd.profiler import record_function

from . import dispatch

PREFIX = "neuron::"


def path_of(op) -> str:
    """Which path `dispatch.neuron_fallback` takes for `op` now."""
    if op in dispatch.SPECIAL:
        return "special"
    plan = dispatch.plan_for(op)
    if plan.is_view:
        return "view"
    if plan.lowering is not None or plan.functional is not None:
        return "native"
    if plan.decomposition is not None and op not in dispatch._decomposing:
        return "decomposed"
    if plan.out_args:
        functional = dispatch._functional_overload(op)
        if functional is not None and (
            functional in dispatch.LOWERINGS or functional in dispatch.torch._decomp.decomposition_table
        ):
            return "decomposed"
    return "fallback"


def record_name(op) -> str:
    return f"{PREFIX}{path_of(op)}::{op}"


def profiled(run, op, args: tuple, kwargs: dict) -> Any:
    """Run `run(op, *args, **kwargs)` inside a profiler record named after the op's path."""
    with record_function(record_name(op)):
        return run(op, *args, **kwargs)


def neuron_records(prof) -> dict[str, dict[str, Any]]:
    """From a finished profiler: 'neuron::<path>::<op>' -> {path, op, count, cpu_time_total_us}."""
    out: dict[str, dict[str, Any]] = {}
    for event in prof.key_averages():
        if not event.key.startswith(PREFIX):
            continue
        _, path, op = event.key.split("::", 2)
        out[event.key] = {
            "path": path,
            "op": op,
            "count": event.count,
            "cpu_time_total_us": event.cpu_time_total,
        }
    return out
