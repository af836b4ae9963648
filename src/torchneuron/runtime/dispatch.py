"""The router: every ATen op on a neuron tensor arrives in `dispatch_op`.

Each call takes one route (plan.Route), decided from the op's plan and, for lowerings that
serve only some calls (`only_when`), from the call's arguments:

    HANDLER     the runtime's own kernel (runtime/handlers.py)
    VIEW        the CPU kernel, which only touches metadata, so views share the StorageImpl
    NATIVE      the op's lowering as one cached executable (runtime/eager.py)
    DECOMPOSED  a decomposition (the project's, else PyTorch's) into other neuron ops
    FALLBACK    CPU's kernel on copies, visibly: warned once, counted, refused in strict mode

The route taken is counted (`torchneuron.op_counts()`) and, under a profiler, names the record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..lowerings import LOWERINGS
from ..lowerings.dtypes import UnsupportedDtypeError
from ..lowerings.registry import DECOMPOSITIONS
from . import _native, fastpath, fusion, handlers, profiler, storage  # noqa: F401  (handlers register on import)
from .cpu_fallback import check_write_overlap, raise_as_on_cpu, raised_by_torch_python, run_on_cpu
from .eager import decomposing, run_decomposition, run_lowered, run_out_variant
from .plan import (
    _PLANS,
    COUNTS,
    HANDLERS,
    NEURON,
    OpPlan,
    Route,
    inplace_overload,
    kernel_name,
    plan_for,
)
from .signature import device_mismatch
from .storage import CPU_KEYS

OpOverload = torch._ops.OpOverload

_torch_profiler = torch.autograd.profiler
_set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame


def dispatch_op(op: OpOverload, *args, **kwargs) -> Any:
    """The boxed PrivateUse1 kernel of every ATen op without a kernel of its own."""
    # When an op runs eagerly inside a torch.compile'd function (after a graph break), Dynamo's
    # frame hook is active: without turning it off here, Dynamo would try to compile the
    # runtime's own Python (and JAX's) as user code.
    prior = _set_eval_frame(None)
    try:
        plan = _PLANS.get(op)
        if plan is None:
            plan = plan_for(op)
        route = plan.route if plan.route_is_fixed else route_of(plan, args, kwargs)
        if plan.mutated and route is not Route.HANDLER and route is not Route.VIEW:
            check_write_overlap(plan, args, kwargs)
        try:
            if _torch_profiler._is_profiler_enabled:
                with profiler.record(route, op):
                    result = _RUNNERS[route](plan, args, kwargs)
            else:
                result = _RUNNERS[route](plan, args, kwargs)
        except UnsupportedDtypeError as err:
            # A dtype the device stores but does not compute in (complex32): nothing ran on
            # the device yet (the lowering is traced first), so CPU's kernel runs the call.
            if route is Route.FALLBACK or route is Route.VIEW:
                raise
            route = Route.FALLBACK
            result = run_on_cpu(plan, args, kwargs, reason=_unsupported_dtype_reason(err))
        COUNTS[route][plan.name] += 1
        return result
    finally:
        if prior is not None:
            _set_eval_frame(prior)


def _unsupported_dtype_reason(err: UnsupportedDtypeError) -> str:
    return f"{err.dtype} tensors are stored on the neuron device but computed on CPU"


def route_of(plan: OpPlan, args: tuple, kwargs: dict) -> Route:
    """The route this call takes."""
    route = plan.route
    if route is Route.HANDLER or route is Route.VIEW:
        return route
    if plan.only_when is not None and not plan.accepts(args, kwargs):
        # The lowering covers only some modes of this op: not this call's.
        return Route.DECOMPOSED if plan.project_decomposition is not None else Route.FALLBACK
    if route is Route.DECOMPOSED and (plan.decomposition is None or plan.op in decomposing):
        # An out= overload computed by its functional op; a decomposition that came back to
        # the op it decomposes (through prims) finishes on CPU.
        functional = plan.out_functional
        if functional is None or functional in decomposing or plan.op in decomposing:
            return Route.FALLBACK
    return route


def _run_handler(plan: OpPlan, args: tuple, kwargs: dict) -> Any:
    return HANDLERS[plan.op](*args, **kwargs)


def _run_view(plan: OpPlan, args: tuple, kwargs: dict) -> Any:
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type != NEURON and a.dim() != 0:
            raise device_mismatch(a.device)
    return plan.op.redispatch(CPU_KEYS, *args, **kwargs)


def _run_native(plan: OpPlan, args: tuple, kwargs: dict) -> Any:
    if plan.lowering is None and plan.out_args and not plan.runs.jit:
        # A data-dependent result shape (nonzero, masked_select): no meta kernel sizes `out`
        # beforehand, so compute the result, then resize and fill `out`.
        return run_out_variant(plan, plan.functional, args, kwargs)
    lowering = plan.runs
    form = lowering.eager_form
    if form is not None and form.only_when(dict(zip(plan.arg_names, plan.bind(args, kwargs)))):
        lowering = form  # traced for this signature (registry.eager_form)
    return run_lowered(plan, lowering, args, kwargs)


def _run_decomposed(plan: OpPlan, args: tuple, kwargs: dict) -> Any:
    try:
        if plan.decomposition is not None and plan.op not in decomposing:
            return run_decomposition(plan, args, kwargs)
        return run_out_variant(plan, plan.out_functional, args, kwargs)
    except Exception as err:
        # PyTorch's refs word their checks apart from CPU's kernels (`torch.float32` for
        # `Float`), or check in another order (polar's out= dtype before its inputs'):
        # raise what CPU raises for the call.
        if not raised_by_torch_python(err):
            raise
        raise_as_on_cpu(plan.op, args, kwargs, err)


_RUNNERS: dict[Route, Callable[[OpPlan, tuple, dict], Any]] = {
    Route.HANDLER: _run_handler,
    Route.VIEW: _run_view,
    Route.NATIVE: _run_native,
    Route.DECOMPOSED: _run_decomposed,
    Route.FALLBACK: run_on_cpu,
}


# ----------------------------------------------------------------------------------------
# Installation

def install() -> None:
    """Register `dispatch_op` as the PrivateUse1 fallback, plus direct kernels where PyTorch's
    composite kernels would get in the way. With the C++ library, the registered kernel is
    its fast path (runtime/fastpath.py), which calls `dispatch_op` for what it cannot run."""
    if _installed:
        return
    _installed.append(True)
    direct = sorted(kernel_name(op) for op in _direct_ops())
    native = _native.fastpath()
    if native is not None:
        native.init(dispatch_op, fastpath.describe, fastpath.take_last, storage._LATEST,
                    fusion.flush)
        native.install(direct)
        native.set_scalar_arrays(fastpath.scalar_array if fastpath.scalar_arrays_apply() else None)
        fusion.configure()
        return
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(dispatch_op, "PrivateUse1")
    direct_library = torch.library.Library("aten", "IMPL")
    _installed.extend((fallback, direct_library))
    for name in direct:
        op = _op_of(name)
        direct_library.impl(name, _direct_kernel(op), "PrivateUse1")


_installed: list = []


def _op_of(name: str) -> OpOverload:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _direct_ops() -> set[OpOverload]:
    """Ops that get a PrivateUse1 kernel of their own: structured ops have composite
    functional/in-place kernels that would route every call through `op.out` plus an
    `empty`; a direct kernel for each lowered op saves that hop. Runtime handlers and the
    lowerings' `direct_kernels` get one as well, as do project decompositions (which must
    win over PyTorch's composite kernels)."""
    direct = set(HANDLERS) | set(DECOMPOSITIONS)
    for op, lowering in LOWERINGS.items():
        if lowering.graph_only:
            continue
        direct.update(lowering.direct_kernels)
        if not plan_for(op).is_view:
            direct.add(op)
        inplace = inplace_overload(op)
        if inplace is not None and not plan_for(inplace).is_view:
            direct.add(inplace)
    # A CompositeImplicitAutograd op (matmul, reshape, ...) must stay composite: a backend
    # kernel would make autograd use its derivative formula (e.g. matmul_backward), which has
    # no kernel anywhere.
    return {op for op in direct if not _is_composite_implicit(op)}


def _is_composite_implicit(op: OpOverload) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


def _direct_kernel(op: OpOverload) -> Callable:
    def kernel(*args, **kwargs):
        return dispatch_op(op, *args, **kwargs)

    return kernel
