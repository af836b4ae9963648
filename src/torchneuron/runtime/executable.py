"""Eager executables: one op call for one argument signature, as one `jax.jit` program.

The program reads its tensor arguments from their storages' flat buffers (view gathers
included), calls the lowering through the op-call core, casts and lays out the results as
PyTorch's meta kernel reports them, and writes the new values of in-place and `out=`
arguments back into their storages' buffers (through views). What depends only on the
signature (output metadata, write targets, layout flags) is worked out once, here.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import torch

from ..lowerings import Lowering
from ..lowerings.dtypes import to_torch_dtype
from . import disk_cache, opcall, rng, signature, storage, strided
from .meta import flatten_results, meta_outputs, promotion_dtype, promotion_operands, to_meta
from .plan import STATIC, OpPlan, size_arguments

# A written argument: (index in the schema, position in a list argument or None).
WriteSlot = tuple[int, int | None]


class Executable:
    """One compiled call of an op for one argument signature.

    `fn(*inputs, *write_inputs, *draw)` takes the signature's inputs (signature.arguments_key),
    then (buffer, offset) of each written argument that it does not replace whole, then the
    four words of the random draw for random ops; it returns one flat tuple: the fresh outputs,
    the new buffers of the written arguments (None: left alone), and the index check's flag
    when the lowering has one."""

    __slots__ = ("fn", "fresh_meta", "writes", "index_error", "num_inputs", "none_results",
                 "warnings")

    def __init__(self, fn: Callable, fresh_meta: list | None, writes: list, index_error,
                 num_inputs: int) -> None:
        self.fn = fn
        # [(dtype, shape, stride) or None for a non-tensor result] per fresh output; None when
        # the layout is learnt from each call's results (no meta kernel, or jit=False).
        self.fresh_meta = fresh_meta
        # [(WriteSlot, (dtype, ViewSpec))] for the arguments whose storages the call rewrites
        self.writes = writes
        self.index_error = index_error
        self.num_inputs = num_inputs
        # Per result of `fn`: whether it is always None (an output the op's mask leaves out, a
        # written argument left alone); None when unknown (then calls cannot be recorded).
        self.none_results: tuple[bool, ...] | None = None
        # The warnings its lowering gave while traced, given again at every call that reuses
        # it (CPU warns at every call: random_ past a float's exact integers, ...).
        self.warnings: tuple[warnings.WarningMessage, ...] = ()


class ResizeOutputs(Exception):
    """An `out=` tensor has the wrong shape: resize it as PyTorch's meta kernel did, retry."""

    def __init__(self, layouts: list) -> None:
        self.layouts = layouts


def write_slots(plan: OpPlan, values: list, order: list[int]) -> list[WriteSlot | None]:
    """Written arguments in the order the lowering returns their new values (None for an
    absent optional argument, which the lowering returns None for)."""
    slots: list[WriteSlot | None] = []
    for i in order:
        v = values[i]
        if isinstance(v, list | tuple):
            slots.extend((i, j) for j in range(len(v)))
        else:
            slots.append(None if v is None else (i, None))
    return slots


def written_tensor(values: list, slot: WriteSlot) -> torch.Tensor:
    i, j = slot
    return values[i] if j is None else values[i][j]


def _check_out_layouts(plan: OpPlan, values: list, meta) -> None:
    metas = flatten_results(meta)
    layouts = []
    mismatch = False
    for n, i in enumerate(plan.out_args):
        t = values[i]
        m = metas[n] if n < len(metas) else None
        if t is None or m is None:
            layouts.append(None)
            continue
        if tuple(t.shape) != tuple(m.shape):
            mismatch = True
            layouts.append((tuple(m.shape), tuple(m.stride())))
        else:
            layouts.append(None)
    if mismatch:
        raise ResizeOutputs(layouts)


def functional_meta(plan: OpPlan, args: tuple, kwargs: dict) -> list | None:
    """The functional twin's results (meta tensors) for an in-place or out= call of `plan`,
    None without a meta kernel."""
    n = plan.num_positional
    meta = meta_outputs(plan.functional, args[:n], {k: v for k, v in kwargs.items()
                                                     if k not in plan.out_names})
    return None if meta is None else flatten_results(meta)


def _check_inplace_cast(plan: OpPlan, values: list, args: tuple, kwargs: dict) -> None:
    """An in-place op derived from its functional twin stores the functional result in
    `self`: CPU refuses a result dtype that cannot be cast to self's (`int_tensor.logit_()`),
    which PyTorch's meta kernels of unstructured ops do not check."""
    self_index = plan.mutated[0]
    target = values[self_index]
    if not isinstance(target, torch.Tensor):
        return
    results = functional_meta(plan, args, kwargs)
    result = results[0] if results else None
    if isinstance(result, torch.Tensor) and not torch.can_cast(result.dtype, target.dtype):
        raise RuntimeError(
            f"result type {_type_name(result.dtype)} can't be cast to the desired output type "
            f"{_type_name(target.dtype)}"
        )


def _type_name(dtype: torch.dtype) -> str:
    return {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
            torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int",
            torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte", torch.bool: "Bool",
            torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble"}.get(dtype, str(dtype))


def _fresh_layout(m) -> tuple | None:
    if not isinstance(m, torch.Tensor):
        return None  # a non-tensor return (int/float/bool)
    stride = m.stride()
    if strided.dense_permutation(tuple(m.shape), stride) is None:
        stride = storage.contiguous_strides(m.shape)
    return (m.dtype, tuple(m.shape), tuple(stride))


class OutDtypes(NamedTuple):
    """How an out= call whose `out` has another dtype than the functional op's result
    computes (once CPU has accepted that dtype): `round_to` {schema index of an out=
    argument: the functional result's dtype} rounds the result to it before the cast to
    out's dtype (`add(half, half, out=float)` adds in half on CPU); `dtype` is passed as the
    functional op's `dtype=` instead (`sum(half, out=float)` sums in float on CPU)."""

    round_to: dict[int, torch.dtype]
    dtype: torch.dtype | None = None


def build(plan: OpPlan, lowering: Lowering, key: tuple, values: list, args: tuple,
          kwargs: dict, num_inputs: int, out_dtypes: OutDtypes | None = None,
          name: str | None = None) -> Executable:
    """The executable of `lowering` for this call's signature `key` (raises PyTorch's error
    for bad input, or ResizeOutputs when an out= tensor must be resized first). `name`: what
    it computes, the same in every process (eager.py), for the on-disk caches."""
    direct = plan.lowering is not None  # registered on this very overload
    meta = meta_outputs(plan.op, args, kwargs, lowering.meta if direct else None)
    if plan.out_args and meta is not None:
        _check_out_layouts(plan, values, meta)
    if not direct and not plan.out_args:
        _check_inplace_cast(plan, values, args, kwargs)
    static_values = [v if k == STATIC else None for k, v in zip(plan.kinds, values)]
    via = {}
    if out_dtypes is not None:
        via = {(i, None): dtype for i, dtype in out_dtypes.round_to.items()}
        if out_dtypes.dtype is not None:
            static_values[plan.arg_names.index("dtype")] = out_dtypes.dtype
    compute_dtype = None
    if lowering.promote is not None:
        metas = to_meta(values)
        # Integer arithmetic runs in the operands' type whatever out= holds (CPU's uint8 sub
        # wraps around before the cast to a float out=); a floating result may be computed in
        # out's wider type and rounded to its own (OutDtypes), as CPU's result is.
        compute_dtype = promotion_dtype(lowering.promote,
                                        promotion_operands(plan, metas, include_out=False))
        if compute_dtype is not None and (compute_dtype.is_floating_point
                                          or compute_dtype.is_complex):
            wider = promotion_dtype(lowering.promote, promotion_operands(plan, metas))
            # Not complex for real operands: a complex out= holds the real result (floor
            # division of floats into complex64), which complex arithmetic cannot compute.
            if wider is not None and (compute_dtype.is_complex or not wider.is_complex):
                compute_dtype = wider
    # In-place and out= variants run the functional lowering, which returns the new values
    # outputs first; a lowering of this very overload returns them in schema order.
    slots = write_slots(plan, values, plan.mutated if direct else plan.write_order)

    fresh_meta: list = []
    if meta is not None and direct:
        metas = flatten_results(meta)
        if not (plan.fresh_returns and len(plan.fresh_returns) == len(plan.return_types)):
            metas = [metas[i] for i in plan.fresh_returns]
        fresh_meta = [_fresh_layout(m) for m in metas]
    write_meta = []
    write_via = []
    for slot in slots:
        write_via.append(via.get(slot))
        if slot is None:
            write_meta.append(None)
            continue
        t = written_tensor(values, slot)
        numel = t.untyped_storage().nbytes() // t.dtype.itemsize
        write_meta.append((t.dtype, strided.spec_of(t, numel)))
    contiguous = opcall.contiguity_flags(plan, lowering, values)
    jit = lowering.jit
    num_writes = len(slots)
    partial_writes = [wm[1].mode != strided.FULL for wm in write_meta if wm is not None]
    has_check = lowering.index_error is not None

    def run(*flat_inputs):
        inputs = flat_inputs[:num_inputs]
        rest = iter(flat_inputs[num_inputs:])
        write_inputs = [(next(rest), next(rest)) if partial else (None, 0) for partial in partial_writes]
        draw = tuple(rest) if lowering.rng else None
        vals = signature.read_arguments(plan, key, inputs, static_values)
        result, check = opcall.call_lowering(plan, lowering, vals, compute_dtype=compute_dtype,
                                             draw=draw, contiguous=contiguous)
        flat = flatten_results(result)
        if not direct:
            fresh_vals, write_vals = [], flat[:num_writes]
        else:
            nfresh = len(flat) - num_writes if meta is None else len(fresh_meta)
            fresh_vals, write_vals = flat[:nfresh], flat[nfresh:]
        outputs = []
        for n, value in enumerate(fresh_vals):
            m = fresh_meta[n] if n < len(fresh_meta) and jit else None
            if value is None:  # an output the op does not produce (output_mask)
                outputs.append(None)
            elif m is None:
                outputs.append(jnp.asarray(value))
            else:
                dtype, shape, stride = m
                value = opcall.cast_to(value, dtype)
                if tuple(value.shape) != shape:
                    value = _conform(value, shape, plan.name)
                outputs.append(strided.to_memory_order(value, stride))
        new_buffers = []
        targets = iter(write_inputs)
        for wmeta, value, rounding in zip(write_meta, write_vals, write_via):
            if wmeta is None:  # an absent optional argument
                continue
            buf, offset = next(targets)
            if value is None:  # a mutated argument the op left alone
                new_buffers.append(None)
                continue
            dtype, spec = wmeta
            if rounding is not None:
                value = opcall.cast_to(value, rounding)
            value = opcall.cast_to(value, dtype)
            if tuple(value.shape) != spec.shape:
                value = _broadcast_into(value, spec.shape)
            new_buffers.append(strided.scatter(buf, offset, value, spec))
        return (*outputs, *new_buffers, check) if has_check else (*outputs, *new_buffers)

    compiled = run
    code = None
    if jit:
        code = (plan.op, lowering, signature.canonical_key(key), torch.get_default_dtype(),
                compute_dtype, meta is None, tuple(write_via), tuple(sorted(contiguous.items())),
                None if out_dtypes is None else (tuple(sorted(out_dtypes.round_to.items())),
                                                 out_dtypes.dtype),
                tuple(None if m is None else (m[0], m[1], strided.canonical_layout(m[1], m[2]))
                      for m in fresh_meta),
                tuple(None if w is None else (w[0], strided.canonical(w[1])) for w in write_meta))
        compiled = _shared_jit(run, code)
    # Without a meta kernel the outputs' layout is learnt from each call's results.
    dynamic = (meta is None or not jit) and direct
    writes = [(slot, wm) for slot, wm in zip(slots, write_meta) if slot is not None]
    ex = Executable(compiled, None if dynamic else fresh_meta, writes, lowering.index_error,
                    num_inputs)
    if jit and name is not None:
        compiled.stable_name = name  # runtime/fusion.py keys programs on disk by it
    if jit and not dynamic:
        known = None if name is None else disk_cache.known_results(name)
        if known is not None:  # an earlier trace of this very executable found them
            ex.none_results = known
            return ex
        family = _family(plan, key, code)
        known = None if family is None else _FAMILY_RESULTS.get(family)
        if known is not None:  # the trace of another size of it found them
            ex.none_results = known
            if name is not None:
                disk_cache.learn_results(name, known)
            return ex
        # Trace abstractly once (jax.jit keeps the trace for the first real call): which
        # results are None, so that a call can be recorded before it runs (runtime/fusion.py).
        avals = signature.abstract_inputs(plan, key, values)
        for slot, (_dtype, spec) in writes:
            if spec.mode != strided.FULL:
                avals += [signature.buffer_aval(written_tensor(values, slot)),
                          jax.ShapeDtypeStruct((), jnp.int64, weak_type=True)]
        if lowering.rng:
            avals += [jax.ShapeDtypeStruct((), jnp.uint32)] * rng.DRAW_WORDS
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results = jax.eval_shape(compiled, *avals)
        # A shared program (_shared_jit) is not traced again for abstract inputs it was
        # traced for: its warnings for them are the ones it gave then.
        given = compiled.__dict__.setdefault("trace_warnings", {})
        shapes = tuple((a.shape, a.dtype, a.weak_type) for a in avals)
        if caught:
            given[shapes] = tuple(caught)
        ex.warnings = given.get(shapes, ())
        repeat_warnings(ex)  # a lowering's own warning comes while it is traced: pass it on
        ex.none_results = tuple(r is None for r in results)
        if not ex.warnings:  # one that warns is traced in every process, at every size
            if name is not None:
                disk_cache.learn_results(name, ex.none_results)
            if family is not None:
                if len(_FAMILY_RESULTS) >= _FAMILIES_KEPT:
                    _FAMILY_RESULTS.clear()
                _FAMILY_RESULTS[family] = ex.none_results
    return ex


# Which results of an executable are always None (masked outputs, written arguments left
# alone) follows from its op, lowering and arguments' kinds, not from their sizes: executables
# that differ only in sizes (a sequence one longer at every token) share what the first one's
# abstract trace found, instead of tracing again (~1.3 ms each; 0.3 s of a cold generate()).
# Sizes 0 and 1 are told apart from larger ones, as PyTorch's symbolic shapes tell them.
_FAMILY_RESULTS: dict[tuple, tuple[bool, ...]] = {}
_FAMILIES_KEPT = 4096


def _family(plan: OpPlan, key: tuple, code: tuple) -> tuple | None:
    """What `code` (a jitted program) computes, less its sizes (of views, of results, of the
    op's size arguments), each reduced to 0, 1 or more; None where it cannot be hashed."""
    sizes = size_arguments(plan.op)
    arguments = tuple(_without_sizes(k, name in sizes) for k, name in zip(key, plan.arg_names))
    *rest, fresh, writes = code[3:]
    family = (code[0], code[1], arguments, *rest,
              tuple(None if m is None else (m[0], _size_classes(m[1]),
                                            strided.dense_permutation(m[1], m[2]))
                    for m in fresh),
              _without_sizes(writes, False))
    try:
        hash(family)
    except TypeError:
        return None
    return family


def _size_classes(shape: tuple) -> tuple:
    return tuple(min(d, 2) for d in shape)


def _without_sizes(value: Any, ints_are_sizes: bool) -> Any:
    if isinstance(value, strided.ViewSpec):
        return ("view", value.mode, _size_classes(value.shape))
    if ints_are_sizes and type(value) is int:
        return min(value, 2) if value >= 0 else value
    if type(value) in (tuple, list):
        return tuple(_without_sizes(v, ints_are_sizes) for v in value)
    return value


# Jitted programs by what they compute. Signatures that differ only in the strides of size-1
# dimensions (which step over no element) share one, so that a view like `ids[:, -1:]` of a
# growing buffer, whose stride changes at every length, is not a new program each time.
_SHARED: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _shared_jit(run: Callable, code: tuple):
    """The jitted program of `code`, made from `run` unless one is alive already."""
    try:
        jitted = _SHARED.get(code)
    except TypeError:  # a static argument that cannot be hashed: a program of its own
        return jax.jit(run)
    if jitted is None:
        jitted = _SHARED[code] = jax.jit(run)
    return jitted


def repeat_warnings(ex: Executable) -> None:
    for w in ex.warnings:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)


def write_inputs(ex: Executable, values: list) -> list:
    """The flat (buffer, offset) inputs of the written arguments that the executable does not
    replace whole."""
    inputs = []
    for slot, (dtype, spec) in ex.writes:
        if spec.mode != strided.FULL:
            t = written_tensor(values, slot)
            buf = storage.ready_buffer(t)  # a pending value of the trace is an input as it is
            if buf is None:
                buf = storage.storage_buffer(t.untyped_storage(), dtype, reader=t)
            inputs.append(buf)
            inputs.append(t.storage_offset())
    return inputs


# The last executable an eager call ran, with its plan: the C++ fast path (runtime/fastpath.py)
# takes it after a call it sent to Python, to run later calls of the same signature itself.
_LAST: list = [None]


def take_last():
    """(plan, executable) of the last eager call, once; None if taken or there is none."""
    last, _LAST[0] = _LAST[0], None
    return last


def _broadcast_into(value, shape: tuple):
    """An in-place result written into its (smaller) target: PyTorch's error when it does not
    fit (`x.add_(y)` with y of a larger shape), not JAX's ValueError."""
    try:
        return jnp.broadcast_to(value, shape)
    except ValueError:
        raise RuntimeError(
            f"output with shape {list(shape)} doesn't match the broadcast shape {list(value.shape)}"
        ) from None


def _conform(value, shape: tuple, op_name: str):
    """A lowering result in the shape PyTorch's meta kernel reports; a real disagreement is an
    error (never reinterpreted silently)."""
    if value.size == 1 and all(s == 1 for s in shape) or value.ndim == 0:
        return jnp.broadcast_to(value, shape)
    if [s for s in value.shape if s != 1] == [s for s in shape if s != 1]:
        return value.reshape(shape)
    raise RuntimeError(
        f"torchneuron: the lowering of {op_name} produced shape {tuple(value.shape)} where "
        f"PyTorch expects {shape} (please report this bug)"
    )


def dynamic_layout(outputs: list, lowering: Lowering) -> tuple[list, list]:
    """Layouts and flat buffers of outputs computed without PyTorch metadata (contiguous,
    or the lowering's `result_strides`)."""
    metas, flat = [], []
    for value in outputs:
        if value is None:
            metas.append(None)
            flat.append(None)
            continue
        shape = tuple(value.shape)
        if lowering.result_strides is not None:
            stride = tuple(lowering.result_strides(shape))
            flat.append(_memory_order_jit(value, stride))
        else:
            stride = storage.contiguous_strides(shape)
            flat.append(value.reshape(-1))
        metas.append((to_torch_dtype(value.dtype), shape, stride))
    return metas, flat


_memory_order_jit = jax.jit(strided.to_memory_order, static_argnums=(1,))


def assemble_returns(plan: OpPlan, fresh_meta: list, values: list, outputs: list) -> Any:
    """The op's return value: new tensors for fresh outputs, the written arguments for
    returns that alias them."""
    if plan.single_tensor_return:
        dtype, shape, stride = fresh_meta[0]
        return storage.new_tensor(shape, dtype, stride, outputs[0])
    if plan.returns_scalar:
        return outputs[0].item() if outputs else None
    fresh = []
    for m, buf in zip(fresh_meta, outputs):
        if buf is None:
            fresh.append(None)
        elif m is None:
            fresh.append(buf.item())
        else:
            dtype, shape, stride = m
            fresh.append(storage.new_tensor(shape, dtype, stride, buf))
    n_returns = len(plan.return_types)
    if n_returns == 0:
        return None
    results = []
    fresh_iter = iter(fresh)
    mutated_iter = iter(plan.mutated)
    for rtype, is_fresh in zip(plan.return_types, (i in plan.fresh_returns for i in range(n_returns))):
        if is_fresh:
            if rtype == "List[Tensor]":
                results.append(list(fresh_iter))
            else:
                results.append(next(fresh_iter))
        else:
            results.append(values[next(mutated_iter)])
    return results[0] if n_returns == 1 else tuple(results)
