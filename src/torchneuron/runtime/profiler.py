"""torch.profiler support: each op on the neuron device becomes a record named after its route.

While a `torch.profiler.profile()` (or `torch.autograd.profiler.profile()`) is running, the
router (runtime/dispatch.py) runs every neuron op inside `record(route, op)`, a
`torch.autograd.profiler.record_function("neuron::<route>::<op>")`, for example

    neuron::native::aten.mm.default        a lowering, run as an XLA executable
    neuron::decomposed::aten.var.correction a decomposition into other neuron ops
    neuron::fallback::aten.foo.default     no lowering: ran on the CPU and was copied back
    neuron::view::aten.view.default        a view (metadata only, CPU kernel on shared storage)
    neuron::handler::aten.copy_.default    copies, factories, resize (the runtime's own kernels)

The route is the one the call took (the same value the op counters record). The records sit
inside PyTorch's own `aten::<op>` records, so `prof.key_averages()` shows both the op and the
route it took, with CPU times (the neuron CPU client runs synchronously, so CPU time is the
op's time). Outside a profiler, the router pays one attribute check per op.
"""

from __future__ import annotations

from typing import Any

from torch.autograd.profiler import record_function

from .plan import Route, plan_for

PREFIX = "neuron::"


def path_of(op) -> str:
    """The route calls of `op` take when no `only_when` turns them away."""
    return plan_for(op).route.label


def record_name(route: Route, op) -> str:
    return f"{PREFIX}{route.label}::{op}"


def record(route: Route, op) -> record_function:
    """The profiler record of one call of `op` that took `route`."""
    return record_function(record_name(route, op))


def neuron_records(prof) -> dict[str, dict[str, Any]]:
    """From a finished profiler: 'neuron::<route>::<op>' -> {path, op, count, cpu_time_total_us}."""
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
