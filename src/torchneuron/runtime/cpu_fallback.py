"""CPU's kernel on copies of a call's arguments: the visible fallback for ops without a
lowering, and the replay that learns which exception CPU raises for a bad call.

The fallback warns once per op and is refused under `TORCHNEURON_STRICT=1` (the router counts
it). Tensors it writes are copied back into the neuron tensors, through their views; its
results come back in CPU's layout.
"""

from __future__ import annotations

import concurrent.futures
import warnings
from typing import Any

import torch

from .. import config
from . import storage, transfer
from .meta import callable_for
from .plan import NEURON, OPT_TENSOR_LIST, TENSOR, TENSOR_LIST, OpPlan
from .signature import device_mismatch

OpOverload = torch._ops.OpOverload

_warned: set[tuple[str, str | None]] = set()

SPARSE_ON_CPU = "sparse tensors are stored on the neuron device but computed on CPU"

# Inputs up to this size are copied to CPU to learn which exception CPU raises for a call.
_ERROR_PROBE_BYTES = 1 << 26


def run_on_cpu(plan: OpPlan, args: tuple, kwargs: dict, reason: str | None = None) -> Any:
    """Run `plan.op` with CPU's kernel on copies of the arguments; write back what it wrote.
    `reason`: why this call cannot run on the device (default: the op has no lowering)."""
    name = plan.name
    bound = plan.bind(args, kwargs)
    check_devices(plan, bound)
    if reason is None:
        refused = f"{name} has no lowering on the neuron device and"
        warned = f"{name} has no lowering on the neuron device; it runs on CPU"
    else:
        refused, warned = f"{name}: {reason}, and", f"{name} runs on CPU: {reason}"
    if config.strict():
        raise NotImplementedError(
            f"torchneuron: {refused} TORCHNEURON_STRICT=1 forbids falling back to CPU")
    if (name, reason) not in _warned:
        _warned.add((name, reason))
        warnings.warn(f"torchneuron: {warned} (see torchneuron.fallback_ops())", stacklevel=4)
    originals: dict[int, torch.Tensor] = {}
    written = {id(t) for i in plan.mutated
               for t in (bound[i] if isinstance(bound[i], list | tuple) else [bound[i]])}

    def convert(value):
        if isinstance(value, torch.Tensor) and value.device.type == NEURON and (
                value.layout == torch.sparse_coo):
            cpu = transfer.sparse_to_device(value, "cpu")
            originals[id(cpu)] = value
            return cpu
        if isinstance(value, torch.Tensor) and value.device.type == NEURON:
            cpu = transfer.neuron_to_cpu(value)
            stride = transfer.preserved_stride(value)
            if id(value) in written:
                # A tensor the kernel writes: give it a storage of its own (resizable, unlike
                # one borrowed from numpy) and the neuron tensor's layout, which out= kernels
                # keep or restride (linalg kernels want column-major outputs).
                cpu = torch.empty_strided(value.shape, stride, dtype=value.dtype).copy_(cpu)
            elif value.dim() > 1 and stride != storage.contiguous_strides(value.shape):
                # An input in another layout (channels_last, column-major, a slice of either):
                # CPU kernels choose their result's layout from their inputs' (upsampling
                # keeps channels_last, and its uint8 kernel wants input and out= alike), so
                # the CPU copy keeps the order of the strides.
                cpu = torch.empty_strided(value.shape, stride, dtype=value.dtype).copy_(cpu)
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
    values_cpu = plan.bind(cpu_args, cpu_kwargs)
    for i in plan.mutated:
        items = values_cpu[i] if isinstance(values_cpu[i], list | tuple) else [values_cpu[i]]
        for cpu_t in items:
            if cpu_t is None or id(cpu_t) not in originals:
                continue
            target = originals[id(cpu_t)]
            if target.layout == torch.sparse_coo:
                transfer.copy_sparse_into(target, cpu_t)
                continue
            if target.shape != cpu_t.shape:
                target.resize_(cpu_t.shape)
                stride = transfer.dense_stride(cpu_t)
                if target.stride() != stride:
                    target.as_strided_(cpu_t.shape, stride)
            target.copy_(cpu_t)

    def back(value):
        if isinstance(value, torch.Tensor):
            if id(value) in originals:
                return originals[id(value)]
            if value.layout == torch.sparse_coo:
                return transfer.sparse_to_device(value, NEURON)
            if value.layout != torch.strided:
                # No CSR/CSC/BSR (or other layout) tensors exist for PrivateUse1 here.
                raise NotImplementedError(
                    f"torchneuron: {name} returns a {value.layout} tensor; the neuron device "
                    "supports only strided tensors"
                )
            return transfer.cpu_to_new_neuron_like(value)
        if isinstance(value, list | tuple):
            return type(value)(back(v) for v in value)
        return value

    return back(result)


def check_devices(plan: OpPlan, values: list) -> None:
    """Refuse a CPU tensor among a neuron call's tensor arguments, as CUDA does: CPU's kernel
    would take it without a word. Legal, as on CUDA: 0-dim CPU tensors (scalars) and the CPU
    index tensors of advanced indexing (the optional-tensor lists of index/index_put)."""
    neuron = other = None
    for kind, value in zip(plan.kinds, values):
        if kind == TENSOR:
            items = (value,)
        elif kind == TENSOR_LIST:
            items = value
        else:
            continue
        for t in items:
            if not isinstance(t, torch.Tensor):
                continue
            if t.device.type == NEURON:
                neuron = t
            elif t.dim() and other is None:
                other = t.device
    if neuron is not None and other is not None:
        raise device_mismatch(other)


# ----------------------------------------------------------------------------------------
# Error replay


class _ProbeTooBig(Exception):
    pass


def cpu_replica(args: tuple, kwargs: dict, zeros: bool = False) -> tuple[tuple, dict] | None:
    """CPU copies of a call's arguments that alias each other as the neuron tensors do (one
    copied storage per neuron storage); None when they exceed _ERROR_PROBE_BYTES. Only for
    error paths: learning what CPU's kernel says about a call. `zeros`: storages of zeros
    instead of copies (nothing is read from the device)."""
    mirrors: dict[int, Any] = {}
    replicas: dict[int, torch.Tensor] = {}  # one replica per tensor object, as CPU sees identity
    budget = [_ERROR_PROBE_BYTES]

    def convert(value):
        if isinstance(value, torch.Tensor) and value.device.type == NEURON:
            replica = replicas.get(id(value))
            if replica is not None:
                return replica
            st = value.untyped_storage()
            key = st.data_ptr()
            cpu_st = mirrors.get(key)
            if cpu_st is None:
                budget[0] -= st.nbytes()
                if budget[0] < 0:
                    raise _ProbeTooBig
                flat = torch.empty(0, dtype=value.dtype, device=NEURON).set_(st)
                # A storage of torch's own (numpy's is not resizable, and CPU kernels
                # resize `out` before some of their checks).
                cpu_flat = torch.zeros_like(flat, device="cpu")
                if not zeros:
                    cpu_flat.copy_(transfer.neuron_to_cpu(flat))
                cpu_st = mirrors[key] = cpu_flat.untyped_storage()
            replica = replicas[id(value)] = torch.empty(0, dtype=value.dtype).set_(
                cpu_st, value.storage_offset(), value.shape, value.stride())
            return replica
        if isinstance(value, list | tuple):
            return type(value)(convert(v) for v in value)
        if isinstance(value, torch.device) and value.type == NEURON:
            return torch.device("cpu")
        return value

    try:
        return convert(args), {k: convert(v) for k, v in kwargs.items()}
    except _ProbeTooBig:
        return None


def raise_if_cpu_refuses(op: OpOverload, args: tuple, kwargs: dict) -> bool:
    """Run the call on CPU copies of its arguments (cpu_replica) and let CPU's error, if it
    has one, propagate: for what PyTorch's meta kernels do not check (overlapping writes,
    the out= dtypes a kernel accepts). Calls too large to copy are let through (False)."""
    replica = cpu_replica(args, kwargs)
    if replica is None:
        return False
    _run_replica(op, *replica)
    return True


def raise_if_cpu_refuses_signature(op: OpOverload, args: tuple, kwargs: dict) -> bool:
    """`raise_if_cpu_refuses` for refusals that do not depend on the values (a dtype CPU has
    no kernel for): tried on zeros first, so that nothing is read from the device (no
    sync); only a call CPU refuses on zeros is run again on copies of the real values.
    True when CPU ran the call (it has a kernel for these dtypes)."""
    replica = cpu_replica(args, kwargs, zeros=True)
    if replica is None:
        return False
    try:
        _run_replica(op, *replica)
    except Exception:  # noqa: BLE001  (CPU's verdict on the real values decides)
        return raise_if_cpu_refuses(op, args, kwargs)
    return True


def _run_replica(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    # On a thread of its own: PyTorch's C++ warnings (TORCH_WARN) are buffered per thread
    # until the outermost op call returns, which would show the replica's warnings to the
    # user after the device's own (a second "An output ... was resized", a second
    # deprecation). On the worker they are shown, and dropped, while the replica runs.
    global _REPLICA_WORKER
    if _REPLICA_WORKER is None:
        _REPLICA_WORKER = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="torchneuron-cpu-replica")
    return _REPLICA_WORKER.submit(_run_quietly, callable_for(op, args, kwargs), args,
                                  kwargs).result()


_REPLICA_WORKER: concurrent.futures.ThreadPoolExecutor | None = None


def _run_quietly(fn, args: tuple, kwargs: dict) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def raise_as_on_cpu(op: OpOverload, args: tuple, kwargs: dict, err: Exception):
    """Raise the exception CPU raises for this call; `err` itself if CPU agrees on its type (and
    `err` is not one of PyTorch's Python-side checks) or does not raise. PyTorch's meta
    kernels and JAX's shape checks raise other types than CPU's kernels for the same bad call
    (AssertionError, IndexError, TypeError for CPU's RuntimeError, ...); on this error path
    the call is re-run on CPU copies of its inputs."""
    cpu_err = cpu_error(op, args, kwargs)
    if cpu_err is not None and (type(cpu_err) is not type(err) or raised_by_torch_python(err)):
        raise cpu_err from err
    raise err


def cpu_error(op: OpOverload, args: tuple, kwargs: dict) -> Exception | None:
    """The exception CPU's kernel raises for this call on copies of its arguments; None when
    it raises none, or when the arguments cannot be copied (too large, values lost with a
    trace that failed, inputs CPU cannot hold)."""
    try:
        replica = cpu_replica(args, kwargs)
    except Exception:  # noqa: BLE001  (see the docstring)
        replica = None
    if replica is None:
        return None
    try:
        _run_replica(op, *replica)
    except Exception as cpu_err:  # noqa: BLE001  (whatever CPU raises is its answer)
        return cpu_err
    return None


def raised_by_torch_python(err: Exception) -> bool:
    """Whether `err` comes from PyTorch's Python-side checks (meta kernels, refs): their
    messages are worded apart from CPU's kernels' (`linspace():` for `torch.linspace():`),
    and CPU's are what users and PyTorch's tests match."""
    tb = err.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    name = tb.tb_frame.f_code.co_filename.replace("\\", "/")
    return "/torch/" in name and "/torchneuron/" not in name


# ----------------------------------------------------------------------------------------
# Writes into overlapping memory

# Ops whose CPU kernel accepts `out=` one of the inputs itself (add, mul, ...; not gather).
_IDENTICAL_OUT_OK: set[OpOverload] = set()


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) byte address a tensor's elements can occupy."""
    numel = t.numel()
    if numel == 0:
        return (0, 0)
    lo = t.data_ptr()
    if t.is_contiguous():  # the common case, without the Python loop
        return lo, lo + numel * t.element_size()
    return lo, lo + (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size()


def _tensor_inputs(plan: OpPlan, values: list, written: int):
    """(schema index, tensor) of a call's tensor arguments other than `written`, the items of
    tensor lists included (`torch.cat([x, y], out=x)`)."""
    for j, (kind, v) in enumerate(zip(plan.kinds, values)):
        if j == written or v is None:
            continue
        if kind == TENSOR:
            if isinstance(v, torch.Tensor):
                yield j, v
        elif kind == TENSOR_LIST or kind == OPT_TENSOR_LIST:
            for item in v:
                if isinstance(item, torch.Tensor):
                    yield j, item


def check_write_overlap(plan: OpPlan, args: tuple, kwargs: dict) -> None:
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
        for j, v in _tensor_inputs(plan, values, i):
            if v is w and j not in plan.out_args and i not in plan.out_args:
                continue  # in-place: self is read and written
            vlo, vhi = _byte_range(v)
            # The same tensor overlaps itself for CPU even when empty (`cat([x, y], out=x)`).
            if v is w or vlo < hi and lo < vhi and v.device.type == NEURON:
                same = (vlo == lo and v.shape == w.shape and v.stride() == w.stride())
                identical_only = same if not suspicious else identical_only and same
                suspicious = True
    if not suspicious or (identical_only and plan.op in _IDENTICAL_OUT_OK):
        return
    raise_if_cpu_refuses(plan.op, args, kwargs)
    if identical_only:  # CPU accepts `out=` an input itself for this op: no need to ask again
        _IDENTICAL_OUT_OK.add(plan.op)
