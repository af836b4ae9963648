"""The C++ fast path (runtime/_native/fastpath.cpp): what Python tells it about ops.

With the native library loaded, the PrivateUse1 kernel of every op is C++. It runs view ops
itself and calls known executables of lowered ops directly; everything else, and the first
call of every signature, comes to `dispatch.dispatch_op` as before. This module answers the
kernel's two questions:

- `describe(name, overload)`: may calls of this op take the fast path, and how are its
  arguments and returns laid out? (asked once per op);
- `take_last(op)`: the executable the Python path just ran for this op, if the kernel may
  reuse it for every call with the same signature (asked after a Python call).

Nothing here changes what an op computes: the kernel reuses only executables whose every
input is described by its signature, with the layouts PyTorch's meta kernel reported.
"""

from __future__ import annotations

import jax
import torch

from . import executable, platform
from .plan import SCALAR, STATIC, TENSOR, OpPlan, Route, plan_for

# The kernel's routes (fastpath.cpp `Route`).
SLOW, VIEW, NATIVE = 1, 2, 3
# The kernel's argument kinds (fastpath.cpp `ArgKind`).
_KIND = {STATIC: 0, SCALAR: 1, TENSOR: 2}
OTHER = 3


def _resolve(name: str, overload: str):
    namespace, _, op_name = name.partition("::")
    packet = getattr(getattr(torch.ops, namespace), op_name)
    return getattr(packet, overload or "default")


def _fast_route(plan: OpPlan) -> int:
    if not plan.route_is_fixed and (plan.route is not Route.NATIVE
                                    or plan.signature_decides is None):
        return SLOW  # a per-call route (dispatch.route_of), unless the signature decides it
    if plan.route is Route.VIEW:
        return VIEW
    if plan.route is not Route.NATIVE:
        return SLOW
    lowering = plan.runs
    if (not lowering.jit or lowering.rng or plan.out_args or lowering.result_strides is not None
            or any(kind not in _KIND for kind in plan.kinds)):
        return SLOW
    # Fresh returns must be single tensors; aliased returns are the written arguments.
    if any(t not in ("Tensor", "Tensor?") for t in plan.return_types):
        return SLOW
    return NATIVE


def describe(name: str, overload: str) -> tuple:
    """(route, op, argument kinds, returns, defaults) for the kernel; returns: ((fresh, arg),
    ...); defaults: per argument, the traced number's schema default or None
    (plan.scalar_defaults: a call passing it has no input for it)."""
    op = _resolve(name, overload)
    plan = plan_for(op)
    route = _fast_route(plan)
    kinds = tuple(_KIND.get(kind, OTHER) for kind in plan.kinds)
    returns = ()
    if route == NATIVE:
        # As executable.assemble_returns: fresh outputs in order, then the written arguments.
        aliases = iter(plan.mutated)
        returns = tuple((True, -1) if i in plan.fresh_returns else (False, next(aliases))
                        for i in range(len(plan.return_types)))
    return route, op, kinds, returns, tuple(plan.scalar_defaults)


def take_last(op) -> tuple | None:
    """The executable the Python path ran last, as the kernel keeps it, if it ran for `op`:
    (fn, ((dtype, sizes, strides, nbytes), ...), ((written arg, whole buffer), ...),
    index_error or None, (result is always None, ...))."""
    last = executable.take_last()
    if last is None:
        return None
    plan, ex = last
    if (plan.op is not op or ex.fresh_meta is None or ex.none_results is None
            or any(m is None for m in ex.fresh_meta)):
        return None
    outputs = tuple(
        (dtype, shape, stride, _nbytes(shape, stride, dtype)) for dtype, shape, stride in ex.fresh_meta
    )
    writes = tuple((slot[0], spec.mode == 0) for slot, (_dtype, spec) in ex.writes)
    if any(slot[1] is not None for slot, _ in ex.writes):
        return None  # a list argument is written
    return ex.fn, outputs, writes, ex.index_error, ex.none_results


def _nbytes(shape, stride, dtype: torch.dtype) -> int:
    if any(s == 0 for s in shape):
        return 0
    return (1 + sum((s - 1) * st for s, st in zip(shape, stride))) * dtype.itemsize


def scalar_array(value: bool | int | float | complex) -> jax.Array:
    """`value` as the kernel passes a repeated scalar argument: an uncommitted device array,
    weakly typed as the number is, so the executable sees the same abstract value."""
    return jax.device_put(value)


def scalar_arrays_apply() -> bool:
    """Whether cached scalar arrays cost no transfer: an uncommitted array lives on JAX's
    default device, so it must be the only device behind `neuron`."""
    try:
        devices = platform.jax_devices()
    except RuntimeError:
        return False
    return len(devices) == 1 and devices[0] == jax.devices()[0]
