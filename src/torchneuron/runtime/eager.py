"""One op call run eagerly on the device: its lowering as a cached executable, or an `out=`
overload computed by its functional op and copied into `out`."""

from __future__ import annotations

from typing import Any

import torch
import torch._decomp

from .. import config
from ..lowerings import LOWERINGS, Lowering
from ..lowerings.registry import index_exception
from . import _native, executable, fusion, rng, signature, storage, strided, value_checks
from .cpu_fallback import (
    cpu_error,
    raise_as_on_cpu,
    raise_if_cpu_refuses,
    raise_if_cpu_refuses_signature,
    run_on_cpu,
)
from .meta import flatten_results, meta_outputs
from .plan import COUNTS, GENERATOR, NEURON, SCALAR, STATIC, OpPlan, Route, plan_for

OpOverload = torch._ops.OpOverload

# Decompositions running now: one that comes back to the op it decomposes (through prims)
# finishes on CPU instead of recursing.
decomposing: set[OpOverload] = set()

def run_lowered(plan: OpPlan, lowering: Lowering, args: tuple, kwargs: dict,
                resized: bool = False) -> Any:
    """Run `lowering` for this call: one cached executable per argument signature, recorded
    into the fusion trace (runtime/fusion.py) when it can be, else run now."""
    recording = fusion.recording() and lowering.jit
    if recording:
        fusion.make_room()
    elif not lowering.jit:
        value_checks.raise_failed()  # it reads values on the host: a sync point
    values = plan.bind(args, kwargs)
    key, inputs = signature.arguments_key(plan, values)
    # The default dtype is part of what an executable computes (int / int, factories without
    # dtype=, int-to-float promotion): executables are kept per default dtype.
    cache_key = (key, torch.get_default_dtype())
    ex = plan.cache.get(cache_key)
    if ex is None:
        if not lowering.rng:
            _raise_if_cpu_lacks_kernel(plan, values, args, kwargs)
        try:
            out_dtypes = (_out_dtypes(plan, values, args, kwargs)
                          if plan.out_args and plan.lowering is None else None)
            ex = executable.build(plan, lowering, key, values, args, kwargs, len(inputs),
                                  out_dtypes, name=_stable_name(plan, lowering, cache_key))
        except executable.ResizeOutputs as resize:
            if resized:  # resizing `out` changed the expected shape: it is one of the inputs
                raise RuntimeError(f"torchneuron: {plan.name}: an out= tensor is also an input "
                                   "and must be resized; pass a separate out= tensor") from None
            for i, layout in zip(plan.out_args, resize.layouts):
                if layout is not None:
                    shape, stride = layout
                    values[i].resize_(shape)
                    if values[i].stride() != stride and strided.dense_permutation(shape, stride):
                        values[i].as_strided_(shape, stride)
            return run_lowered(plan, lowering, args, kwargs, resized=True)
        except Exception as err:
            raise_as_on_cpu(plan.op, args, kwargs, err)
        _remember(plan, cache_key, ex, values, lowering)
        if fusion.any_pending(inputs):
            # Building may have run the recorded trace (CPU's check of an out= dtype reads the
            # arguments): read the inputs again, from the values that trace stored.
            key, inputs = signature.arguments_key(plan, values)
    elif ex.warnings:
        executable.repeat_warnings(ex)
    if ex.writes:
        inputs += executable.write_inputs(ex, values)
    if lowering.rng:
        inputs += rng.split_draw(rng.next_draw(_generator_arg(plan, values)))
    if recording and ex.none_results is not None:
        site = None
        if ex.index_error is not None:
            site = (ex.index_error, plan.op, fusion.user_site())
        results = fusion.record(ex.fn, tuple(inputs), len(ex.none_results), site)
        results = [None if none else r for r, none in zip(results, ex.none_results)]
        if ex.index_error is not None:
            results.pop()  # checked when the trace runs
    else:
        if fusion.any_pending(inputs):
            fusion.flush()  # this call cannot be recorded: its inputs must exist now
            return run_lowered(plan, lowering, args, kwargs, resized)
        try:
            results = ex.fn(*inputs)
        except Exception as err:  # raised while tracing the lowering (or by a jit=False one)
            plan.cache.pop(cache_key, None)
            raise_as_on_cpu(plan.op, args, kwargs, err)
        if ex.index_error is not None:
            *results, bad = results
            if bool(bad):
                error = index_exception(ex.index_error)
                site = f" (in {plan.op}, called at {fusion.user_site()})"  # as a trace says
                _raise_check_failed(plan, args, kwargs, type(error)(f"{error}{site}"), site)
    # The C++ fast path would call it without its warnings.
    executable._LAST[0] = (plan, ex) if plan.reusable(values) and not ex.warnings else None
    num_fresh = len(results) - len(ex.writes)
    outputs, new_buffers = results[:num_fresh], results[num_fresh:]
    for (slot, (dtype, _spec)), buf in zip(ex.writes, new_buffers):
        if buf is not None:
            storage.set_storage_buffer(executable.written_tensor(values, slot).untyped_storage(),
                                       buf, dtype)
    fresh_meta = ex.fresh_meta
    if fresh_meta is None:
        fresh_meta, outputs = executable.dynamic_layout(list(outputs), lowering)
    returned = executable.assemble_returns(plan, fresh_meta, values, outputs)
    if recording and ex.index_error is not None:
        try:
            fusion.flush()  # an op that checks values ends the trace (its check: value_checks.py)
        except type(index_exception(ex.index_error)) as err:
            # The trace's message ends naming the op and the user's line: kept.
            plain = str(index_exception(ex.index_error))
            _raise_check_failed(plan, args, kwargs, err, str(err).removeprefix(plain))
    return returned


def _raise_check_failed(plan: OpPlan, args: tuple, kwargs: dict, err: Exception,
                        site: str = ""):
    """A lowering's value check failed: raise CPU's error for the call where CPU refuses
    copies of its arguments, as CPU words it (the index out of range, the singular matrix's
    element), else `err`. `site` is appended to CPU's message."""
    cpu_err = cpu_error(plan.op, args, kwargs)
    if cpu_err is None:
        raise err
    try:
        worded = type(cpu_err)(f"{cpu_err}{site}") if site else cpu_err
    except Exception:  # noqa: BLE001  (an exception type that takes other arguments)
        worded = cpu_err
    raise worded from err


# (op, tensor dtypes, scalar types, dtype/str/bool static arguments, default dtype) that CPU
# has a kernel for.
_CPU_KERNEL_EXISTS: set[tuple] = set()


def _raise_if_cpu_lacks_kernel(plan: OpPlan, values: list, args: tuple, kwargs: dict) -> None:
    """CPU kernels refuse some dtypes ("lerp_kernel_scalar" not implemented for 'Int'; sort,
    max, clamp of complex) where a lowering would compute something, and meta kernels do not
    check this. A new signature with a complex, integer or bool tensor asks CPU (on zeros:
    raise_if_cpu_refuses_signature), once per op and dtypes."""
    dtypes = []
    unusual = False
    for kind, value in zip(plan.kinds, values):
        items = value if isinstance(value, list | tuple) else (value,)
        for item in items:
            if isinstance(item, torch.Tensor):
                dtype = item.dtype
                dtypes.append(dtype)
                unusual = unusual or not dtype.is_floating_point
            elif kind == STATIC and isinstance(item, torch.dtype | str | bool):
                dtypes.append(item)
            elif kind == SCALAR and item is not None:
                dtypes.append(type(item))
    if not unusual:
        return
    probe = (plan.op, tuple(dtypes), torch.get_default_dtype())
    if probe in _CPU_KERNEL_EXISTS:
        return
    if raise_if_cpu_refuses_signature(plan.op, args, kwargs):
        _CPU_KERNEL_EXISTS.add(probe)


def _remember(plan: OpPlan, cache_key: tuple, ex: executable.Executable, values: list,
              lowering: Lowering) -> None:
    """Keep `ex` for its signature; an op keeps at most TORCHNEURON_EAGER_SIGNATURES of them
    (the oldest goes first), so that ever-new shapes do not grow memory without bound."""
    cache = plan.cache
    cache[cache_key] = ex
    # What the executable computes, for traces rebuilt as graphs (compiler/eager_traces.py):
    # the static arguments only, never the call's tensors.
    statics = tuple(v if k == STATIC else None for k, v in zip(plan.kinds, values))
    # The signature with its size-1 strides made contiguous, as the program shared by such
    # signatures reads its views (executable._shared_jit): one description for all of them.
    fusion.name_executable(ex.fn, plan.op, fusion.OpCall(
        plan, signature.canonical_key(cache_key[0]), statics, ex, bool(lowering.rng)))
    budget = _signature_budget()
    native = _native.fastpath()
    while len(cache) > budget:
        evicted = cache.pop(next(iter(cache)))
        if not any(kept.fn is evicted.fn for kept in cache.values()):  # a shared program
            fusion.forget_executable(evicted.fn)
        if native is not None:
            native.forget_executable(evicted.fn)


def _stable_name(plan: OpPlan, lowering: Lowering, cache_key: tuple) -> str | None:
    """What an executable computes, the same in every process (the on-disk caches' keys):
    its op, which of the op's records runs, and its signature; None when the lowering is not
    the package's own (an override, a custom kernel: code the keys do not cover) or the
    signature holds a value whose text names an object rather than a value."""
    module = getattr(lowering.fn, "__module__", "")
    if not module.startswith("torchneuron.lowerings."):
        return None
    name = f"{plan.op}|{module}.{lowering.fn.__qualname__}|{signature.canonical_key(cache_key)!r}"
    return None if " at 0x" in name else name


def _signature_budget() -> int:
    return int(config.raw("TORCHNEURON_EAGER_SIGNATURES"))


def _out_dtypes(plan: OpPlan, values: list, args: tuple, kwargs: dict) -> executable.OutDtypes | None:
    """For an out= call computed by its functional op: None when every `out` has the dtype of
    the functional result; else CPU's error if CPU refuses those dtypes (PyTorch's meta
    kernels accept any: `neg(float, out=double)`, `aminmax(float, out=double)`), else how the
    call computes in them."""
    results = executable.functional_meta(plan, args, kwargs)
    if results is None:
        return None
    round_to = {}
    for i, natural in zip(plan.out_args, results):
        out = values[i]
        if isinstance(out, torch.Tensor) and isinstance(natural, torch.Tensor) and (
                out.dtype != natural.dtype):
            round_to[i] = natural.dtype
    if not round_to:
        return None
    raise_if_cpu_refuses(plan.op, args, kwargs)
    if len(plan.out_args) == 1 and "dtype" in plan.arg_names and (
            values[plan.arg_names.index("dtype")] is None):
        # Reductions with a `dtype=` argument (sum, mean, cumsum, prod) compute in out's.
        return executable.OutDtypes({}, values[plan.out_args[0]].dtype)
    return executable.OutDtypes(round_to)


def _generator_arg(plan: OpPlan, values: list):
    for kind, value in zip(plan.kinds, values):
        if kind == GENERATOR:
            return value
    return None


def run_decomposition(plan: OpPlan, args: tuple, kwargs: dict) -> Any:
    """The op's decomposition (the project's, else PyTorch's) on the device."""
    values = plan.bind(args, kwargs)
    for i in plan.out_args:
        out = values[i]
        if isinstance(out, torch.Tensor) and out.device.type != NEURON:
            raise signature.device_mismatch(out.device)
    _raise_if_cpu_lacks_kernel(plan, values, args, kwargs)
    decomposing.add(plan.op)
    try:
        return plan.decomposition(*args, **kwargs)
    finally:
        decomposing.discard(plan.op)


def run_out_variant(plan: OpPlan, functional: OpOverload, args: tuple, kwargs: dict) -> Any:
    """`op.out`: PyTorch's checks on meta, the functional op, then resize and copy into out."""
    values = plan.bind(args, kwargs)
    meta = meta_outputs(plan.op, args, kwargs)
    outs = [values[i] for i in plan.out_args]
    func_values = [v for i, v in enumerate(values) if i not in plan.out_args]
    pos, kw = plan_for(functional).split(func_values)
    # Call the functional op's decomposition, not the op: for structured ops the functional
    # kernel of a PrivateUse1 device is a composite that calls this very `out` overload.
    decomposition = torch._decomp.decomposition_table.get(functional)
    if functional in decomposing or plan.op in decomposing:
        # The decomposition came back to this op (through prims): finish it on CPU.
        return run_on_cpu(plan, args, kwargs)
    if functional in LOWERINGS or decomposition is None:
        decomposing.add(plan.op)
        try:
            result = functional(*pos, **kw)
        finally:
            decomposing.discard(plan.op)
    else:
        COUNTS[Route.DECOMPOSED][str(functional)] += 1
        decomposing.add(functional)
        try:
            result = decomposition(*pos, **kw)
        finally:
            decomposing.discard(functional)
    results = flatten_results(result)
    metas = flatten_results(meta) if meta is not None else results
    for out, res in zip(outs, results):
        if out.device.type != NEURON:
            raise signature.device_mismatch(out.device)
        if isinstance(res, torch.Tensor) and out.dtype != res.dtype:
            # PyTorch's meta kernels accept any out= dtype (nonzero has none): ask CPU.
            raise_if_cpu_refuses(plan.op, args, kwargs)
            break
    for out, res, m in zip(outs, results, metas):
        if tuple(out.shape) != tuple(m.shape):
            out.resize_(m.shape)
            if m.stride() != out.stride() and m.is_contiguous() is False:
                out.as_strided_(m.shape, m.stride())
        out.copy_(res)
    if len(outs) == 1:
        return outs[0]
    return tuple(outs)
