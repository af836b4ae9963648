"""Sparse COO tensors on the device: neuron indices and values, computed on CPU.
Compressed layouts (CSR, CSC, BSR, BSC) are refused.

A sparse neuron tensor is PyTorch's own SparseTensorImpl whose indices and values are dense
neuron tensors. Its constructors and accessors are PyTorch's SparseCPU kernels, which only
touch metadata and the two member tensors (they never read memory), run for the
SparsePrivateUse1 key. Every other op on a sparse neuron tensor runs on CPU through the
visible fallback (warned once per op, counted, refused under TORCHNEURON_STRICT=1):
cpu_fallback converts sparse arguments and results in both directions.

PyTorch's device-generic `.to()` can still build a compressed sparse tensor with neuron members
(no op runs on the new tensor, so there is nothing to hook); every op that CPU implements for
compressed layouts then raises one clear NotImplementedError on it instead of a dispatcher
message about a "SparseCsrneuron" backend.
"""

from __future__ import annotations

import torch

from . import cpu_fallback, transfer
from .plan import COUNTS, Route, kernel_name, plan_for

aten = torch.ops.aten

# SparseCPU kernels that are device-generic: construction, member access, resizing, and
# aliasing/copying of the member tensors (which then dispatch as neuron tensors).
_METADATA_OPS = (
    aten._sparse_coo_tensor_with_dims_and_tensors.default,
    aten._sparse_coo_tensor_with_dims.default,
    aten.empty.memory_format,
    aten._indices.default,
    aten._values.default,
    aten.indices.default,
    aten.values.default,
    aten.sparse_dim.default,
    aten.dense_dim.default,
    aten._dimI.default,
    aten._dimV.default,
    aten._nnz.default,
    aten.is_coalesced.default,
    aten._coalesced_.default,
    aten.sparse_resize_.default,
    aten.sparse_resize_and_clear_.default,
    aten.zero_.default,
)

_installed: list = []


def _redispatch(op):
    def kernel(*args, **kwargs):
        return op.redispatch(transfer.SPARSE_CPU_KEYS, *args, **kwargs)

    return kernel


def _on_cpu(op, *args, **kwargs):
    plan = plan_for(op)
    result = cpu_fallback.run_on_cpu(plan, args, kwargs, reason=cpu_fallback.SPARSE_ON_CPU)
    COUNTS[Route.FALLBACK][plan.name] += 1
    return result


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    # copy_ of a device PyTorch does not know comes here; sparse into sparse is a copy of
    # the member tensors (the composite clone, `.to`, autograd's accumulation go through it)
    if src.layout == torch.sparse_coo and dst.layout == torch.sparse_coo:
        transfer.copy_sparse_into(dst, src)
        return dst
    return _on_cpu(aten._copy_from.default, src, dst, non_blocking)


def _cpu_kernel(op):
    def kernel(*args, **kwargs):
        return _on_cpu(op, *args, **kwargs)

    return kernel


def _validate_coo_args(indices, values, size, is_coalesced=None, check_pinning=None):
    # torch.sparse_coo_tensor's invariant checks (PyTorch's tests turn them on) read the
    # indices in a DispatchStub kernel that only CPU and CUDA have: check CPU copies.
    aten._validate_sparse_coo_tensor_args.default(indices.cpu(), values.cpu(), size,
                                                  is_coalesced, check_pinning)


def _refuse_compressed(op):
    def kernel(*args, **kwargs):
        layouts = {a.layout for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)}
        layout = next((lay for lay in layouts if lay not in (torch.strided, torch.sparse_coo)),
                      "compressed sparse")
        raise NotImplementedError(
            f"torchneuron: {op} got a {layout} tensor; the neuron device supports strided and "
            "sparse COO tensors only (on CPU: .to_sparse() gives COO, .to_dense() strided)")

    return kernel


def _cpu_ops_with_kernels_for(key: str):
    """The aten ops that CPU registers a kernel of its own for under dispatch key `key`."""
    for qualified in torch._C._dispatch_get_registrations_for_dispatch_key(key):
        namespace, _, name = qualified.partition("::")
        packet_name, _, overload = name.partition(".")
        packet = getattr(aten, packet_name, None) if namespace == "aten" else None
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if op is not None:
            yield op


def install() -> None:
    if _installed:
        return
    library = torch.library.Library("aten", "IMPL")
    own = {kernel_name(op) for op in _METADATA_OPS} | {"_copy_from"}
    for op in _METADATA_OPS:
        library.impl(kernel_name(op), _redispatch(op), "SparsePrivateUse1")
    library.impl("_copy_from", _copy_from, "SparsePrivateUse1")
    # a composite op: its autograd slot is where a neuron call arrives
    library.impl("_validate_sparse_coo_tensor_args", _validate_coo_args, "AutogradPrivateUse1")
    # Where CPU has a sparse kernel of its own, the whole call runs there: a composite
    # kernel would otherwise decompose it for this key into ops CPU has no sparse kernel for
    # (mv into addmv_).
    for op in _cpu_ops_with_kernels_for("SparseCPU"):
        if kernel_name(op) not in own:
            library.impl(kernel_name(op), _cpu_kernel(op), "SparsePrivateUse1")
    for op in _cpu_ops_with_kernels_for("SparseCsrCPU"):
        library.impl(kernel_name(op), _refuse_compressed(op), "SparseCsrPrivateUse1")
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_on_cpu, "SparsePrivateUse1")
    _installed.extend((library, fallback))
