"""The boxed fallback: every ATen op on a neuron tensor arrives here.

For each overload a small `OpPlan` is derived once from its schema (which arguments are
tensors, which are written, whether it is a view, where its lowering comes from). A call then
follows the plan:

- view ops run the CPU kernel, which only touches metadata, so views share the StorageImpl;
- ops with a lowering run as one cached `jax.jit` executable per argument signature; view
  reads, type promotion, the op and in-place writes back into storages are all inside it;
- composite ops without a lowering run their `torch._decomp` decomposition;
- anything else runs on CPU, visibly: warned once per op, counted, or refused in strict mode.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import torch
import torch._decomp
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from .. import config
from ..lowerings import LOWERINGS, Lowering
from ..lowerings.dtypes import to_jax_dtype, to_torch_dtype
from ..lowerings.registry import LIMITS, index_exception, lowering_applies
from . import rng, storage, views
from .storage import CPU_KEYS

aten = torch.ops.aten
OpOverload = torch._ops.OpOverload

# Argument kinds, read from the schema once per overload.
STATIC, SCALAR, TENSOR, TENSOR_LIST, OPT_TENSOR_LIST, GENERATOR = range(6)

NEURON = "neuron"

# op name -> how many calls took each path; read by torchneuron.op_counts()/fallback_ops().
NATIVE_COUNTS: collections.Counter[str] = collections.Counter()
DECOMP_COUNTS: collections.Counter[str] = collections.Counter()
FALLBACK_COUNTS: collections.Counter[str] = collections.Counter()
_warned: set[str] = set()


def strict_mode() -> bool:
    return config.strict()


def _device_mismatch(other: torch.device) -> RuntimeError:
    return RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"neuron:0 and {other}!"
    )


_KINDS = {
    "Tensor": TENSOR,
    "Optional[Tensor]": TENSOR,
    "List[Tensor]": TENSOR_LIST,
    "List[Optional[Tensor]]": OPT_TENSOR_LIST,
    "number": SCALAR,
    "Optional[number]": SCALAR,
    "float": SCALAR,
    "Optional[float]": SCALAR,
    "complex": SCALAR,
    "Generator": GENERATOR,
    "Optional[Generator]": GENERATOR,
}


def _kind_of(arg_type: torch._C.JitType) -> int:
    return _KINDS.get(str(arg_type), STATIC)


# Ops whose kernels return a tensor sharing the input's storage although their schema does not
# say so; composite kernels rely on it (`kron.out` writes its result through `_unsafe_view`).
_ALIASING_WITHOUT_ANNOTATION = {aten._unsafe_view.default}


def _functional_overload(op: OpOverload) -> OpOverload | None:
    """`add_.Tensor` -> `add.Tensor`; `add.out` -> `add.Tensor` (matched by argument names)."""
    schema = op._schema
    name = schema.name.split("::")[-1]
    packet_name = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    packet = getattr(aten, packet_name, None)
    if packet is None:
        return None
    if packet_name != name:  # in-place: same overload name
        return getattr(packet, op._overloadname, None)
    wanted = [a.name for a in schema.arguments if not (a.kwarg_only and a.alias_info and a.alias_info.is_write)]
    for overload_name in packet.overloads():
        candidate = getattr(packet, overload_name)
        if candidate is op:
            continue
        cand_schema = candidate._schema
        if any(a.alias_info and a.alias_info.is_write for a in cand_schema.arguments):
            continue
        if [a.name for a in cand_schema.arguments] == wanted:
            return candidate
    return None


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        raise TypeError("torchneuron: symbolic values reach the eager runtime only as concrete ints")
    return value


class OpPlan:
    """What is known about one overload before any call: derived from its schema, cached."""

    def __init__(self, op: OpOverload) -> None:
        self.op = op
        self.name = str(op)
        schema = op._schema
        self.arguments = schema.arguments
        self.arg_names = [a.name for a in self.arguments]
        self.kinds = [_kind_of(a.type) for a in self.arguments]
        self.defaults = [a.default_value if a.has_default_value() else None for a in self.arguments]
        self.num_positional = sum(1 for a in self.arguments if not a.kwarg_only)
        self.num_arguments = len(self.arguments)
        self.mutated = [i for i, a in enumerate(self.arguments) if a.alias_info and a.alias_info.is_write]
        self.out_args = [i for i in self.mutated if self.arguments[i].kwarg_only]
        returns = schema.returns
        # Views and in-place metadata changes (`transpose_`, `as_strided_`) only touch
        # sizes/strides/offset: both run through the CPU kernel on the shared storage.
        self.is_view = op in _ALIASING_WITHOUT_ANNOTATION or torch.Tag.inplace_view in op.tags or (
            bool(returns)
            and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
        )
        # returns that are fresh (not an alias of a written argument)
        self.fresh_returns = [i for i, r in enumerate(returns) if r.alias_info is None]
        self.return_types = [str(r.type) for r in returns]
        self.returns_scalar = len(returns) == 1 and self.return_types[0] in (
            "int", "float", "bool", "number", "complex",
        )
        self.single_tensor_return = self.return_types == ["Tensor"] and self.fresh_returns == [0]
        self.lowering: Lowering | None = LOWERINGS.get(op)
        self.functional: OpOverload | None = None
        if self.lowering is None and self.mutated:
            functional = _functional_overload(op)
            if functional is not None and functional in LOWERINGS:
                self.functional = functional
        self.decomposition: Callable | None = torch._decomp.decomposition_table.get(op)
        if self.out_args and self.decomposition is not None and (
            self.decomposition is torch._decomp.decomposition_table.get(_functional_overload(op))
        ):
            # Registered for the out overload too, but without taking `out` (e.g.
            # reflection_pad1d_backward.grad_input): run it as the functional op's out variant.
            self.decomposition = None
        # The lowering (own or functional twin's) is used only for some calls (registry.LIMITS).
        # A limit on an in-place/out= overload itself applies to it alone (e.g. an in-place
        # variant whose result dtype cannot be written back, where PyTorch's meta misses it).
        self.limited = op in LIMITS or (self.functional is not None and self.functional in LIMITS)
        self.cache: dict[tuple, Callable] = {}
        # In-place/out= variants run the functional lowering: its static arguments (e.g.
        # vector_norm's `ord`) must reach it as Python values here too.
        runs = self.lowering if self.lowering is not None else LOWERINGS.get(self.functional)
        self.static_names = runs.static if runs is not None else frozenset()
        if runs is not None:
            self.kinds = [
                STATIC if (k == SCALAR and n in self.static_names) else k
                for k, n in zip(self.kinds, self.arg_names)
            ]

    def bind(self, args: tuple, kwargs: dict) -> list:
        values = list(args)
        if len(values) < self.num_arguments:
            for i in range(len(values), self.num_arguments):
                name = self.arg_names[i]
                values.append(kwargs[name] if name in kwargs else self.defaults[i])
        return values

    def split(self, values: list) -> tuple[list, dict]:
        n = self.num_positional
        return values[:n], dict(zip(self.arg_names[n:], values[n:]))


_PLANS: dict[OpOverload, OpPlan] = {}


def plan_for(op: OpOverload) -> OpPlan:
    plan = _PLANS.get(op)
    if plan is None:
        plan = _PLANS[op] = OpPlan(op)
    return plan


# ----------------------------------------------------------------------------------------
# Tensor arguments as executable inputs


def _tensor_key_and_inputs(t: torch.Tensor, inputs: list) -> tuple:
    try:
        payload = getattr(t.untyped_storage(), storage.PAYLOAD_ATTR, None)
    except AttributeError:  # not a tensor: a Python number in a Tensor slot (wrapped scalar)
        inputs.append(t)
        return ("number", type(t))
    if t.is_conj() or t.is_neg():
        # A lazy conjugate/negative view (x.conj(), conj().imag, ...): the storage holds the
        # unconjugated/unnegated values; the op must see the logical ones.
        return ("bits", t.is_conj(), t.is_neg(), _plain_key_and_inputs(t, payload, inputs))
    return _plain_key_and_inputs(t, payload, inputs)


def _plain_key_and_inputs(t: torch.Tensor, payload, inputs: list) -> tuple:
    dtype = t.dtype
    if payload is not None and payload.dtype is dtype and payload.buf is not None:
        buf = payload.buf  # the common case: one lookup, no device check needed
    elif t.device.type != NEURON:
        if t.dim() == 0 and t.device.type == "cpu":
            inputs.append(t.item())
            return ("host", dtype)
        raise _device_mismatch(t.device)
    else:
        buf = storage.storage_buffer(t.untyped_storage(), dtype)
    inputs.append(buf)
    if t.is_contiguous():
        offset = t.storage_offset()
        if offset == 0 and t.numel() == buf.shape[0]:
            return (dtype, views.ViewSpec(tuple(t.shape), t.stride(), views.FULL))
        inputs.append(offset)
        return (dtype, views.ViewSpec(tuple(t.shape), t.stride(), views.SLICE))
    inputs.append(t.storage_offset())
    return (dtype, views.ViewSpec(tuple(t.shape), t.stride(), views.STRIDED))


def _collect(plan: OpPlan, values: list) -> tuple[tuple, list]:
    key = []
    inputs: list = []
    for kind, value in zip(plan.kinds, values):
        if kind == STATIC:
            key.append(_hashable(value))
        elif kind == GENERATOR:
            key.append(None)  # the draw is an executable input, see run_lowered
        elif kind == SCALAR:
            if value is None:
                key.append(None)
            else:
                if isinstance(value, torch.Tensor):
                    value = value.item()
                key.append(type(value))
                inputs.append(value)
        elif kind == TENSOR:
            key.append(None if value is None else _tensor_key_and_inputs(value, inputs))
        else:
            key.append(
                tuple(None if v is None else _tensor_key_and_inputs(v, inputs) for v in value)
            )
    return tuple(key), inputs


def _rebuild(plan: OpPlan, key: tuple, inputs, static_values: list) -> list:
    """Inside the trace: the argument list with each tensor replaced by its jax array."""
    it = iter(inputs)

    def tensor(k):
        if k is None:
            return None
        if k[0] == "host":
            return jnp.asarray(next(it), to_jax_dtype(k[1]))
        if k[0] == "number":
            return next(it)
        if k[0] == "bits":
            return views.apply_bits(tensor(k[3]), k[1], k[2])
        buf = next(it)
        spec = k[1]
        offset = 0 if spec.mode == views.FULL else next(it)
        return views.gather(buf, offset, spec)

    values = []
    for kind, k, static in zip(plan.kinds, key, static_values):
        if kind == STATIC:
            values.append(static)
        elif kind == GENERATOR:
            values.append(None)
        elif kind == SCALAR:
            values.append(None if k is None else next(it))
        elif kind == TENSOR:
            values.append(tensor(k))
        else:
            values.append([tensor(x) for x in k])
    return values


# ----------------------------------------------------------------------------------------
# Meta execution: output dtypes/shapes/strides and PyTorch's own input checks


def _to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.device.type == NEURON:
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        return value.to("meta") if value.dim() == 0 else value
    if isinstance(value, list | tuple):
        return type(value)(_to_meta(v) for v in value)
    if isinstance(value, torch.device) and value.type == NEURON:
        return torch.device("meta")
    return value


def meta_outputs(op: OpOverload, args: tuple, kwargs: dict, kernel: Callable | None = None) -> Any:
    """Run `op` (or `kernel`, a lowering's own meta kernel) on meta tensors: PyTorch's checks
    and output metadata, or None if no meta kernel."""
    meta_args = _to_meta(args)
    meta_kwargs = {k: _to_meta(v) for k, v in kwargs.items()}
    try:
        return (kernel or op)(*meta_args, **meta_kwargs)
    except NotImplementedError:
        return None
    except RuntimeError as err:
        text = str(err)
        if "meta" in text.lower() and ("not implemented" in text.lower() or "no kernel" in text.lower() or "could not run" in text.lower()):
            return None
        if "data-dependent" in text or "Cannot" in text and "data" in text:
            return None
        raise


def _promotion_dtype(kind: str, plan: OpPlan, values: list) -> torch.dtype | None:
    promotion_kind = ELEMENTWISE_TYPE_PROMOTION_KIND[kind]
    operands = []
    for k, v in zip(plan.kinds, values):
        if k == TENSOR and v is not None:
            operands.append(_to_meta(v) if isinstance(v, torch.Tensor) else v)
        elif k == SCALAR and v is not None and not isinstance(v, torch.Tensor):
            operands.append(v)
        elif k == TENSOR_LIST:
            operands.extend(_to_meta(x) for x in v)
    if not operands:
        return None
    compute, _ = elementwise_dtypes(*operands, type_promotion_kind=promotion_kind)
    return compute


def _cast_tensors(plan: OpPlan, values: list, dtype) -> list:
    out = []
    for kind, v in zip(plan.kinds, values):
        if kind == TENSOR and v is not None and hasattr(v, "dtype") and v.dtype != dtype:
            v = v.astype(dtype)
        elif kind == TENSOR_LIST:
            v = [x if x is None or x.dtype == dtype else x.astype(dtype) for x in v]
        out.append(v)
    return out


def _flatten_results(result) -> list:
    if isinstance(result, tuple | list):
        flat = []
        for r in result:
            if isinstance(r, list | tuple):
                flat.extend(r)
            else:
                flat.append(r)
        return flat
    return [result]


def _meta_tensors(meta) -> list[torch.Tensor | None]:
    if meta is None:
        return []
    return [m for m in _flatten_results(meta)]


class _Executable:
    """One compiled call of an op for one argument signature."""

    __slots__ = ("fn", "fresh_meta", "writes", "has_check", "index_error", "num_fresh")

    def __init__(self, fn, fresh_meta, writes, has_check, index_error):
        self.fn = fn
        self.fresh_meta = fresh_meta  # [(dtype, shape, stride)] for fresh outputs
        self.writes = writes  # [arg index (or (arg index, list position))] for written args
        self.has_check = has_check
        self.index_error = index_error
        self.num_fresh = 0 if fresh_meta is None else len(fresh_meta)


def _write_targets(plan: OpPlan, values: list) -> list[tuple[int, int | None]]:
    targets = []
    for i in plan.mutated:
        v = values[i]
        if v is None:
            continue
        if isinstance(v, list | tuple):
            targets.extend((i, j) for j in range(len(v)))
        else:
            targets.append((i, None))
    return targets


def _build_executable(plan: OpPlan, lowering: Lowering, key: tuple, values: list, args, kwargs) -> _Executable:
    op = plan.op
    direct = plan.lowering is not None  # lowering registered on this very overload
    meta = meta_outputs(op, args, kwargs, lowering.meta if direct else None)
    if plan.out_args and meta is not None:
        _check_out_layouts(plan, values, meta)
    static_values = [v if k == STATIC else None for k, v in zip(plan.kinds, values)]
    compute_dtype = None
    if lowering.promote is not None:
        compute_dtype = _promotion_dtype(lowering.promote, plan, values)
    targets = _write_targets(plan, values)
    inplace_via_functional = not direct

    # Which results are fresh outputs, with their PyTorch metadata.
    fresh_meta: list = []
    if meta is not None:
        metas = _meta_tensors(meta)
        if inplace_via_functional:
            metas = []
        else:
            returns_flat_fresh = []
            if plan.fresh_returns and len(plan.fresh_returns) == len(plan.return_types):
                returns_flat_fresh = metas
            else:
                returns_flat_fresh = [metas[i] for i in plan.fresh_returns]
            metas = returns_flat_fresh
        for m in metas:
            if isinstance(m, torch.Tensor):
                stride = m.stride()
                if views.dense_permutation(tuple(m.shape), stride) is None:
                    stride = storage.contiguous_strides(m.shape)
                fresh_meta.append((m.dtype, tuple(m.shape), tuple(stride)))
            else:
                fresh_meta.append(None)  # non-tensor return (int/float/bool)
    write_meta = []
    for i, j in targets:
        t = values[i] if j is None else values[i][j]
        write_meta.append((t.dtype, views.spec_of(t, storage.storage_buffer(t.untyped_storage(), t.dtype).shape[0])))
    kwargs_names = plan.arg_names[plan.num_positional :]
    out_names = {plan.arg_names[i] for i in plan.out_args}
    fn = lowering.fn
    has_check = lowering.index_error is not None
    # Contiguity the lowering asks for: fixed per executable (strides are in the cache key).
    layout_kwargs = {f"{n}_contiguous": values[plan.arg_names.index(n)].is_contiguous()
                     for n in lowering.contiguity}
    rng_needed = lowering.rng

    def run(inputs, write_inputs, draw):
        vals = _rebuild(plan, key, inputs, static_values)
        if compute_dtype is not None:
            vals = _cast_tensors(plan, vals, to_jax_dtype(compute_dtype))
        pos = vals[: plan.num_positional]
        kw = {n: v for n, v in zip(kwargs_names, vals[plan.num_positional :]) if n not in out_names}
        if rng_needed:
            kw["key"] = rng.fold_key(draw)
        kw.update(layout_kwargs)
        result = fn(*pos, **kw)
        check = None
        if has_check:
            result, check = result
        flat = _flatten_results(result)
        outputs = []
        if inplace_via_functional:
            fresh_vals, write_vals = [], flat[: len(targets)]
        else:
            nfresh = len(flat) - len(targets) if meta is None else len(fresh_meta)
            fresh_vals, write_vals = flat[:nfresh], flat[nfresh:]
        for n, value in enumerate(fresh_vals):
            m = fresh_meta[n] if n < len(fresh_meta) and lowering.jit else None
            if value is None:  # an output the op does not produce (output_mask)
                outputs.append(None)
                continue
            if m is None:
                outputs.append(jnp.asarray(value))
                continue
            dtype, shape, stride = m
            value = jnp.asarray(value)
            jdtype = to_jax_dtype(dtype)
            if value.dtype != jdtype:
                value = value.astype(jdtype)
            if tuple(value.shape) != shape:
                value = _conform(value, shape, plan.name)
            outputs.append(views.to_memory_order(value, stride))
        new_buffers = []
        for (dtype, spec), value, (buf, offset) in zip(write_meta, write_vals, write_inputs):
            if value is None:  # an optional mutated argument the op left alone
                new_buffers.append(None)
                continue
            value = jnp.asarray(value)
            jdtype = to_jax_dtype(dtype)
            if value.dtype != jdtype:
                value = value.astype(jdtype)
            if tuple(value.shape) != spec.shape:
                value = _broadcast_into(value, spec.shape)
            new_buffers.append(views.scatter(buf, offset, value, spec))
        return outputs, new_buffers, check

    compiled = jax.jit(run) if lowering.jit else run
    # Without a meta kernel the outputs' layout is learnt from each call's results.
    dynamic = (meta is None or not lowering.jit) and not inplace_via_functional
    ex = _Executable(compiled, None if dynamic else fresh_meta, targets, has_check, lowering.index_error)
    ex.writes = list(zip(targets, write_meta))
    return ex


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


def _outputs_meta(outputs: list) -> tuple[list, list]:
    """Layout and flat buffers of outputs computed without PyTorch metadata."""
    metas, flat = [], []
    for value in outputs:
        if value is None:
            metas.append(None)
            flat.append(None)
            continue
        dtype = to_torch_dtype(value.dtype)
        metas.append((dtype, tuple(value.shape), storage.contiguous_strides(value.shape)))
        flat.append(value.reshape(-1))
    return metas, flat


class _ResizeOutputs(Exception):
    """An `out=` tensor has the wrong shape: resize it as PyTorch's meta kernel did, retry."""

    def __init__(self, layouts):
        self.layouts = layouts


def _check_out_layouts(plan: OpPlan, values: list, meta) -> None:
    metas = _meta_tensors(meta)
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
        raise _ResizeOutputs(layouts)


def run_lowered(plan: OpPlan, lowering: Lowering, args: tuple, kwargs: dict) -> Any:
    values = plan.bind(args, kwargs)
    key, inputs = _collect(plan, values)
    ex = plan.cache.get(key)
    if ex is None:
        try:
            ex = _build_executable(plan, lowering, key, values, args, kwargs)
        except _ResizeOutputs as resize:
            for i, layout in zip(plan.out_args, resize.layouts):
                if layout is not None:
                    shape, stride = layout
                    values[i].resize_(shape)
                    if values[i].stride() != stride and views.dense_permutation(shape, stride):
                        values[i].as_strided_(shape, stride)
            return run_lowered(plan, lowering, args, kwargs)
        except Exception as err:
            _raise_as_on_cpu(plan.op, args, kwargs, err)
        plan.cache[key] = ex
    write_inputs = []
    for (i, j), (dtype, spec) in ex.writes:
        t = values[i] if j is None else values[i][j]
        buf = None if spec.mode == views.FULL else storage.storage_buffer(t.untyped_storage(), dtype)
        write_inputs.append((buf, 0 if spec.mode == views.FULL else t.storage_offset()))
    draw = rng.split_draw(rng.next_draw(_generator_arg(plan, values))) if lowering.rng else None
    try:
        outputs, new_buffers, check = ex.fn(inputs, write_inputs, draw)
    except Exception as err:  # raised while tracing the lowering (or by a jit=False one)
        plan.cache.pop(key, None)
        _raise_as_on_cpu(plan.op, args, kwargs, err)
    if check is not None and bool(check):
        raise index_exception(ex.index_error)
    for ((i, j), (dtype, _spec)), buf in zip(ex.writes, new_buffers):
        if buf is not None:
            t = values[i] if j is None else values[i][j]
            storage.set_storage_buffer(t.untyped_storage(), buf, dtype)
    NATIVE_COUNTS[plan.name] += 1
    fresh_meta = ex.fresh_meta
    if fresh_meta is None:
        fresh_meta, outputs = _outputs_meta(outputs)
    return _assemble_returns(plan, fresh_meta, values, outputs)


# Inputs up to this size are copied to CPU to learn which exception CPU raises for a call.
_ERROR_PROBE_BYTES = 1 << 26


def _raise_as_on_cpu(op: OpOverload, args: tuple, kwargs: dict, err: Exception):
    """Raise the exception CPU raises for this call, `err` itself if CPU agrees on its type or
    does not raise. PyTorch's meta kernels and JAX's shape checks raise other types than CPU's
    kernels for the same bad call (AssertionError, IndexError, TypeError for CPU's
    RuntimeError, ...); on this error path the call is re-run on CPU copies of its inputs."""
    try:
        replica = _cpu_replica(args, kwargs)
    except Exception:  # noqa: BLE001  (inputs CPU cannot hold)
        replica = None
    if replica is None:
        raise err
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            op(*replica[0], **replica[1])
    except Exception as cpu_err:
        if type(cpu_err) is not type(err):
            raise cpu_err from err
    raise err


def _generator_arg(plan: OpPlan, values: list):
    for kind, value in zip(plan.kinds, values):
        if kind == GENERATOR:
            return value
    return None


def _assemble_returns(plan: OpPlan, fresh_meta: list, values: list, outputs: list) -> Any:
    if plan.single_tensor_return:
        dtype, shape, stride = fresh_meta[0]
        return storage.new_tensor(shape, dtype, stride, outputs[0])
    if plan.returns_scalar:
        return outputs[0].item() if outputs else None
    fresh = []
    for (m, buf) in zip(fresh_meta, outputs):
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


# ----------------------------------------------------------------------------------------
# Decompositions and the CPU fallback


def to_cpu(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of a neuron tensor's logical value (contiguous)."""
    from .copy import neuron_to_cpu

    return neuron_to_cpu(t)


def _dense_stride(t: torch.Tensor) -> tuple[int, ...]:
    """`t`'s strides when they describe a dense layout (e.g. column-major), else contiguous."""
    stride = tuple(t.stride())
    if views.dense_permutation(tuple(t.shape), stride) is None:
        return storage.contiguous_strides(t.shape)
    return stride


def _cpu_to_new_neuron_strided(t: torch.Tensor) -> torch.Tensor:
    """A new neuron tensor with the value and the (dense) layout of CPU tensor `t`: a CPU
    kernel's column-major result (linalg) stays column-major."""
    from .copy import cpu_to_new_neuron

    if (t.numel() > 1 and not (t.is_conj() or t.is_neg())
            and views.dense_permutation(tuple(t.shape), tuple(t.stride())) is None):
        # Not dense (e.g. lstsq's solution, a narrowed column-major buffer): copy the whole
        # storage and take the same view of it, so sizes, strides and offset are CPU's.
        n = t.untyped_storage().nbytes() // t.element_size()
        flat = cpu_to_new_neuron(torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,)))
        return torch.empty(0, dtype=t.dtype, device=NEURON).set_(
            flat.untyped_storage(), t.storage_offset(), t.shape, t.stride())
    stride = _dense_stride(t)
    if t.dim() <= 1 or stride == storage.contiguous_strides(t.shape):
        return cpu_to_new_neuron(t)
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=NEURON)
    return out.copy_(t)


# Arguments CPU kernels write although the schema does not mark them mutable: the CPU path
# copies them back too (native_batch_norm updates its running statistics in place).
_UNANNOTATED_WRITES = {
    aten.native_batch_norm.default: ("running_mean", "running_var"),
    aten.native_batch_norm.out: ("running_mean", "running_var"),
}


def _cpu_fallback(plan: OpPlan, args: tuple, kwargs: dict) -> Any:
    name = plan.name
    if strict_mode():
        raise NotImplementedError(
            f"torchneuron: {name} has no lowering on the neuron device and TORCHNEURON_STRICT=1 "
            "forbids falling back to CPU"
        )
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"torchneuron: {name} has no lowering on the neuron device; it runs on CPU "
            "(see torchneuron.fallback_ops())",
            stacklevel=3,
        )
    FALLBACK_COUNTS[name] += 1
    originals: dict[int, torch.Tensor] = {}
    bound = plan.bind(args, kwargs)
    mutated = plan.mutated + [plan.arg_names.index(n) for n in _UNANNOTATED_WRITES.get(plan.op, ())]
    written = {id(t) for i in mutated
               for t in (bound[i] if isinstance(bound[i], list | tuple) else [bound[i]])}

    def convert(value):
        if isinstance(value, torch.Tensor) and value.device.type == NEURON:
            cpu = to_cpu(value)
            if id(value) in written:
                # A tensor the kernel writes: give it a storage of its own (resizable, unlike
                # one borrowed from numpy) and the neuron tensor's layout, which out= kernels
                # keep or restride (linalg kernels want column-major outputs).
                cpu = torch.empty_strided(value.shape, _dense_stride(value), dtype=value.dtype).copy_(cpu)
            elif value.dim() > 1 and _dense_stride(value) != storage.contiguous_strides(value.shape):
                # An input in another dense layout (channels_last, column-major): CPU kernels
                # choose their result's layout from their inputs' (upsampling keeps
                # channels_last), so the CPU copy keeps it too.
                cpu = torch.empty_strided(value.shape, _dense_stride(value), dtype=value.dtype).copy_(cpu)
            originals[id(cpu)] = value
            return cpu
        if isinstance(value, list | tuple):
            return type(value)(convert(v) for v in value)
        if isinstance(value, torch.device) and value.type == NEURON:
            return torch.device("cpu")
        return value

    cpu_args = convert(args)
    cpu_kwargs = {k: convert(v) for k, v in kwargs.items()}
    result = plan.op(*cpu_args, **cpu_kwargs)
    # Write back what the op mutated.
    values_cpu = plan.bind(cpu_args, cpu_kwargs)
    for i in mutated:
        items = values_cpu[i] if isinstance(values_cpu[i], list | tuple) else [values_cpu[i]]
        for cpu_t in items:
            if cpu_t is None or id(cpu_t) not in originals:
                continue
            target = originals[id(cpu_t)]
            if target.shape != cpu_t.shape:
                target.resize_(cpu_t.shape)
                stride = _dense_stride(cpu_t)
                if target.stride() != stride:
                    target.as_strided_(cpu_t.shape, stride)
            target.copy_(cpu_t)

    def back(value):
        if isinstance(value, torch.Tensor):
            if id(value) in originals:
                return originals[id(value)]
            if value.layout != torch.strided:
                # No sparse (or other layout) kernels exist for PrivateUse1 tensors here.
                raise NotImplementedError(
                    f"torchneuron: {name} returns a {value.layout} tensor; the neuron device "
                    "supports only strided tensors"
                )
            return _cpu_to_new_neuron_strided(value)
        if isinstance(value, list | tuple):
            return type(value)(back(v) for v in value)
        return value

    return back(result)


def _run_out_variant(plan: OpPlan, functional: OpOverload, args: tuple, kwargs: dict) -> Any:
    """`op.out`: PyTorch's checks on meta, the functional op, then resize and copy into out."""
    values = plan.bind(args, kwargs)
    meta = meta_outputs(plan.op, args, kwargs)
    outs = [values[i] for i in plan.out_args]
    func_values = [v for i, v in enumerate(values) if i not in plan.out_args]
    func_plan = plan_for(functional)
    pos, kw = func_plan.split(func_values)
    # Call the functional op's decomposition, not the op: for structured ops the functional
    # kernel of a PrivateUse1 device is a composite that calls this very `out` overload.
    decomposition = torch._decomp.decomposition_table.get(functional)
    if functional in _decomposing or plan.op in _decomposing:
        # The decomposition came back to this op (through prims): finish it on CPU.
        return _cpu_fallback(plan, args, kwargs)
    if functional in LOWERINGS or decomposition is None:
        _decomposing.add(plan.op)
        try:
            result = functional(*pos, **kw)
        finally:
            _decomposing.discard(plan.op)
    else:
        DECOMP_COUNTS[str(functional)] += 1
        _decomposing.add(functional)
        try:
            result = decomposition(*pos, **kw)
        finally:
            _decomposing.discard(functional)
    results = _flatten_results(result)
    metas = _meta_tensors(meta) if meta is not None else results
    for out, res, m in zip(outs, results, metas):
        if out.device.type != NEURON:
            raise _device_mismatch(out.device)
        if tuple(out.shape) != tuple(m.shape):
            out.resize_(m.shape)
            if m.stride() != out.stride() and m.is_contiguous() is False:
                out.as_strided_(m.shape, m.stride())
        out.copy_(res)
    if len(outs) == 1:
        return outs[0]
    return tuple(outs)


# ----------------------------------------------------------------------------------------
# The fallback itself

SPECIAL: dict[OpOverload, Callable] = {}
_decomposing: set[OpOverload] = set()


def special(*ops: OpOverload) -> Callable[[Callable], Callable]:
    def register(fn):
        for op in ops:
            SPECIAL[op] = fn
        return fn

    return register


_torch_profiler = torch.autograd.profiler


_set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame


def neuron_fallback(op: OpOverload, *args, **kwargs) -> Any:
    # When an op runs eagerly inside a torch.compile'd function (after a graph break), Dynamo's
    # frame hook is active: without turning it off here, Dynamo would try to compile the
    # runtime's own Python (and JAX's) as user code.
    prior = _set_eval_frame(None)
    try:
        # Under torch.profiler, runtime/profiler.py records the op with the path it takes.
        if _torch_profiler._is_profiler_enabled:
            from .profiler import profiled

            return profiled(_neuron_op, op, args, kwargs)
        return _neuron_op(op, *args, **kwargs)
    finally:
        if prior is not None:
            _set_eval_frame(prior)


def _neuron_op(op: OpOverload, *args, **kwargs) -> Any:
    handler = SPECIAL.get(op)
    if handler is not None:
        return handler(*args, **kwargs)
    plan = _PLANS.get(op)
    if plan is None:
        plan = plan_for(op)
    if plan.is_view:
        # Views are metadata over the same storage: the CPU kernel does exactly that. (The
        # table's view lowerings are for compiled graphs, where views are values.)
        _check_devices(args)
        return op.redispatch(CPU_KEYS, *args, **kwargs)
    if plan.mutated:
        _check_write_overlap(plan, args, kwargs)
    if plan.limited and not lowering_applies(
        op if op in LIMITS else plan.functional or op, dict(zip(plan.arg_names, plan.bind(args, kwargs)))
    ):
        # The lowering covers only some modes of this op (registry.LIMITS): not this call's.
        return _cpu_fallback(plan, args, kwargs)
    if plan.lowering is not None:
        return run_lowered(plan, plan.lowering, args, kwargs)
    if plan.functional is not None:
        if plan.out_args and not LOWERINGS[plan.functional].jit:
            # A data-dependent result shape (nonzero, masked_select): no meta kernel sizes
            # `out` beforehand, so compute the result, then resize and fill `out`.
            return _run_out_variant(plan, plan.functional, args, kwargs)
        return run_lowered(plan, LOWERINGS[plan.functional], args, kwargs)
    if plan.decomposition is not None and op not in _decomposing:
        # Some decompositions come back to the op they decompose (through prims); the guard
        # sends such a re-entry to the CPU path instead of recursing.
        DECOMP_COUNTS[plan.name] += 1
        _decomposing.add(op)
        try:
            return plan.decomposition(*args, **kwargs)
        finally:
            _decomposing.discard(op)
    if plan.out_args:
        functional = _functional_overload(op)
        if functional is not None and (
            functional in LOWERINGS or functional in torch._decomp.decomposition_table
        ):
            return _run_out_variant(plan, functional, args, kwargs)
    return _cpu_fallback(plan, args, kwargs)


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte address a tensor's elements can occupy."""
    numel = t.numel()
    if numel == 0:
        return (0, 0)
    lo = t.data_ptr()
    if t.is_contiguous():  # the common case, without the Python loop
        return lo, lo + numel * t.element_size()
    return lo, lo + (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()


def _check_write_overlap(plan: OpPlan, args: tuple, kwargs: dict) -> None:
    """CPU refuses to write a tensor whose elements share memory (`x.expand(3, 3).add_(1)`)
    or that overlaps one of the op's inputs (`torch.gather(x, 0, i, out=x[:3])`): the JAX
    path would compute something instead. When a written tensor (not a list) has such an
    overlap, the call runs on CPU copies with the same aliasing, and CPU's error is raised.
    Whether CPU objects depends on the op (`out=` the input itself is fine for elementwise
    ops, not for gather), which is why CPU decides."""
    values = plan.bind(args, kwargs)
    suspicious = identical_only = False
    for i in plan.mutated:
        w = values[i]
        if not isinstance(w, torch.Tensor):
            continue
        if not w.is_contiguous() and any(s == 0 and n > 1 for n, s in zip(w.shape, w.stride())):
            suspicious, identical_only = True, False
            break
        lo, hi = _byte_range(w)
        if lo == hi:
            continue
        for j, (kind, v) in enumerate(zip(plan.kinds, values)):
            if kind != TENSOR or j == i or not isinstance(v, torch.Tensor):
                continue
            if v is w and j not in plan.out_args and i not in plan.out_args:
                continue  # in-place: self is read and written
            vlo, vhi = _byte_range(v)
            if vlo < hi and lo < vhi and v.device.type == NEURON:
                same = (vlo == lo and v.shape == w.shape and v.stride() == w.stride())
                identical_only = same if not suspicious else identical_only and same
                suspicious = True
    if not suspicious or (identical_only and plan.op in _IDENTICAL_OUT_OK):
        return
    _probe_overlap_on_cpu(plan.op, args, kwargs)
    if identical_only:  # CPU accepts `out=` an input itself for this op: no need to ask again
        _IDENTICAL_OUT_OK.add(plan.op)


# Ops whose CPU kernel accepts `out=` one of the inputs itself (add, mul, ...; not gather).
_IDENTICAL_OUT_OK: set[OpOverload] = set()


def _cpu_replica(args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """CPU copies of a call's arguments that alias each other as the neuron tensors do (one
    copied storage per neuron storage); None when they exceed _ERROR_PROBE_BYTES. Only for
    error paths: learning what CPU's kernel says about a call."""
    from .copy import neuron_to_cpu

    mirrors: dict[int, Any] = {}
    budget = [_ERROR_PROBE_BYTES]

    def convert(value):
        if isinstance(value, torch.Tensor) and value.device.type == NEURON:
            st = value.untyped_storage()
            key = st.data_ptr()
            cpu_st = mirrors.get(key)
            if cpu_st is None:
                budget[0] -= st.nbytes()
                if budget[0] < 0:
                    raise _ProbeTooBig
                flat = torch.empty(0, dtype=value.dtype, device=NEURON).set_(st)
                cpu_st = mirrors[key] = neuron_to_cpu(flat).untyped_storage()
            return torch.empty(0, dtype=value.dtype).set_(
                cpu_st, value.storage_offset(), value.shape, value.stride())
        if isinstance(value, list | tuple):
            return type(value)(convert(v) for v in value)
        if isinstance(value, torch.device) and value.type == NEURON:
            return torch.device("cpu")
        return value

    try:
        return convert(args), {k: convert(v) for k, v in kwargs.items()}
    except _ProbeTooBig:
        return None


class _ProbeTooBig(Exception):
    pass


def _probe_overlap_on_cpu(op: OpOverload, args: tuple, kwargs: dict) -> None:
    """Run `op` on CPU tensors that alias each other as the neuron ones do; raise CPU's error."""
    replica = _cpu_replica(args, kwargs)
    if replica is None:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        op(*replica[0], **replica[1])  # CPU's error, if it has one, propagates


def _check_devices(args) -> None:
    for a in args:
        if isinstance(a, torch.Tensor) and a.device.type != NEURON and a.dim() != 0:
            raise _device_mismatch(a.device)


_library: torch.library.Library | None = None


def install() -> None:
    global _library
    if _library is not None:
        return
    from . import copy as _copy  # noqa: F401  (registers the copy/factory/resize handlers)

    _library = torch.library.Library("_", "IMPL")
    _library.fallback(neuron_fallback, "PrivateUse1")
    # Structured ops have composite functional/in-place kernels that would route every call
    # through `op.out` plus an `empty`; a direct kernel for each lowered op saves that hop.
    global _aten_library
    _aten_library = torch.library.Library("aten", "IMPL")
    direct = {op for op in LOWERINGS if not plan_for(op).is_view} | set(SPECIAL)
    for op in list(LOWERINGS):
        inplace = _inplace_overload(op)
        if inplace is not None and not plan_for(inplace).is_view:
            direct.add(inplace)
    direct |= _DIRECT_OUT
    # A CompositeImplicitAutograd op (matmul, reshape, ...) must stay composite: a backend
    # kernel would make autograd use its derivative formula (e.g. matmul_backward), which has
    # no kernel anywhere.
    direct = {op for op in direct if not _is_composite_implicit(op)}
    for op in direct:
        _aten_library.impl(op._schema.name.split("::")[1] + ("." + op._overloadname if op._overloadname != "default" else ""),
                           _direct_kernel(op), "PrivateUse1")


_aten_library: torch.library.Library | None = None

# `out=` overloads whose CompositeExplicitAutograd kernel refuses devices other than
# CPU/CUDA/XPU ("mode only supports CPU, CUDA and XPU device type"): a direct kernel routes
# them to the runtime, which derives them from the functional lowering.
_DIRECT_OUT = {aten.mode.values}


def _is_composite_implicit(op: OpOverload) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


def _inplace_overload(op: OpOverload) -> OpOverload | None:
    name = op._schema.name.split("::")[1]
    packet = getattr(aten, name + "_", None)
    if packet is None:
        return None
    return getattr(packet, op._overloadname, None)


def _direct_kernel(op: OpOverload) -> Callable:
    def kernel(*args, **kwargs):
        return neuron_fallback(op, *args, **kwargs)

    return kernel


def logical_array(t: torch.Tensor) -> jax.Array:
    """The logical value of a neuron tensor as a jax.Array of its shape."""
    buf = storage.storage_buffer(t.untyped_storage(), t.dtype)
    spec = views.spec_of(t, buf.shape[0])
    if spec.mode == views.FULL:
        value = buf.reshape(spec.shape)
    else:
        value = _gather_jit(buf, t.storage_offset(), spec)
    if t.is_conj() or t.is_neg():
        value = _apply_bits_jit(value, t.is_conj(), t.is_neg())
    return value


_gather_jit = jax.jit(views.gather, static_argnums=(2,))
_apply_bits_jit = jax.jit(views.apply_bits, static_argnums=(1, 2))
