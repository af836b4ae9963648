"""The runtime's own kernels: allocation, copies across devices, resize_, set_, item and a few
no-ops. Every other op reaches a lowering, a decomposition or CPU's kernel (runtime/dispatch.py)."""

from __future__ import annotations

import warnings

import torch
from torch._prims_common import suggest_memory_format

from ..lowerings import LOWERINGS
from . import eager, storage, strided, transfer
from .plan import NEURON, handles, plan_for
from .signature import device_mismatch
from .storage import CPU_KEYS

aten = torch.ops.aten


def _device_index(device) -> int:
    if device is None:
        return 0
    device = torch.device(device)
    return device.index or 0


@handles(aten.empty.memory_format)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    dtype = dtype or torch.get_default_dtype()
    _check_sizes(size)
    shape = tuple(size)
    stride = _strides_for(shape, memory_format)
    return storage.new_tensor(shape, dtype, stride, device_index=_device_index(device))


@handles(aten.empty_strided.default)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or torch.get_default_dtype()
    _check_sizes(size)
    if len(size) != len(stride):  # CPU's check, before set_'s own
        raise RuntimeError(f"dimensionality of sizes ({len(size)}) must match dimensionality of "
                           f"strides ({len(stride)})")
    return storage.new_tensor(tuple(size), dtype, tuple(stride), device_index=_device_index(device))


def _check_sizes(size) -> None:
    for s in size:
        if s < 0:
            raise RuntimeError(
                f"Trying to create tensor with negative dimension {s}: {list(size)}"
            )


def _strides_for(shape, memory_format) -> tuple[int, ...]:
    if memory_format == torch.channels_last:
        if len(shape) != 4:
            raise RuntimeError("required rank 4 tensor to use channels_last format")
        n, c, h, w = shape
        return (h * w * c, 1, w * c, c) if c else storage.contiguous_strides(shape)
    if memory_format == torch.channels_last_3d:
        if len(shape) != 5:
            raise RuntimeError("required rank 5 tensor to use channels_last_3d format")
        n, c, d, h, w = shape
        return (d * h * w * c, 1, h * w * c, w * c, c)
    if memory_format == torch.preserve_format:
        raise RuntimeError("unsupported memory format Preserve")
    return storage.contiguous_strides(shape)


@handles(aten._copy_from.default)
def _copy_from(src, dst, non_blocking=False):
    return transfer.copy_into(dst, src)


@handles(aten._copy_from_and_resize.default)
def _copy_from_and_resize(src, dst):
    if dst.shape != src.shape:
        dst.resize_(src.shape)
    return transfer.copy_into(dst, src)


@handles(aten.copy_.default)
def copy_(dst, src, non_blocking=False):
    return transfer.copy_into(dst, src)


@handles(aten._local_scalar_dense.default)
def local_scalar_dense(t):
    if t.numel() != 1:
        raise RuntimeError(
            f"a Tensor with {t.numel()} elements cannot be converted to Scalar"
        )
    return transfer.neuron_to_cpu(t).item()


def _to_copy_strides(t: torch.Tensor, dtype: torch.dtype, memory_format) -> tuple[int, ...]:
    """The strides PyTorch gives `t.to(dtype, memory_format=...)`: its meta kernel applies the
    rules (preserve_format keeps a dense input's strides, as empty_like does; channels_last
    asks for rank 4) and raises PyTorch's own errors."""
    meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    stride = tuple(aten._to_copy.default(meta, dtype=dtype, memory_format=memory_format).stride())
    # (an empty tensor keeps its strides, as on CPU: it holds no elements to lay out)
    if t.numel() and strided.dense_permutation(tuple(t.shape), stride) is None:
        return storage.contiguous_strides(t.shape)
    return stride


def _host_to_new_neuron(t: torch.Tensor, dtype: torch.dtype, stride: tuple[int, ...]):
    """A CPU tensor as a new neuron tensor of `dtype` and (dense) `stride`: laid out in memory
    order on the host, so that the device compiles nothing for a new shape."""
    src = t if t.dtype == dtype else t.to(dtype)
    if src.is_complex() and not dtype.is_complex:
        src = src.real
    if stride != storage.contiguous_strides(t.shape) and src.numel() > 1:
        laid = torch.empty_strided(src.shape, stride, dtype=dtype)
        src = laid.copy_(src).as_strided((src.numel(),), (1,))  # dense: its memory order
    return storage.new_tensor(tuple(t.shape), dtype, stride,
                              storage.host_to_buffer(transfer.cpu_to_numpy(src)))


@handles(aten._to_copy.default)
def to_copy(t, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    dtype = dtype or t.dtype
    target = torch.device(device) if device is not None else t.device
    if target.type == NEURON and t.device.type == NEURON and layout in (None, torch.strided) \
            and target.index in (None, t.device.index):
        # A cast or copy on the same device runs the op's lowering: recorded and fused like
        # any other op, where a gather and a cast compiled per view shape ran at once.
        kwargs = dict(dtype=dtype, layout=layout, device=device, pin_memory=pin_memory,
                      non_blocking=non_blocking, memory_format=memory_format)
        return eager.run_lowered(plan_for(aten._to_copy.default),
                                 LOWERINGS[aten._to_copy.default], (t,), kwargs)
    stride = _to_copy_strides(t, dtype, memory_format)
    if target.type == NEURON:
        if t.device.type != NEURON:
            return _host_to_new_neuron(t, dtype, stride)
        # another neuron device, or another layout
        value = transfer.cast_broadcast(transfer.logical_array(t), dtype, t.shape)
        return storage.new_tensor(tuple(t.shape), dtype, stride, transfer.memory_order_jit(value, stride))
    if t.device.type == NEURON:
        out = torch.empty_strided(t.shape, stride, dtype=dtype, device=target)
        return out.copy_(transfer.neuron_to_cpu(t))
    raise device_mismatch(t.device)


# ---------------------------------------------------------------------------------------
# Metadata ops that need a storage of ours


@handles(aten.resize_.default)
def resize_(t, size, *, memory_format=None):
    _check_sizes(size)
    shape = tuple(size)
    if shape == tuple(t.shape) and memory_format is None:
        # As CPU: the same sizes keep the tensor's strides (a column-major out= stays so).
        return t
    stride = _strides_for(shape, memory_format)
    needed = storage.storage_size_for(shape, stride, t.storage_offset()) * t.dtype.itemsize
    st = t.untyped_storage()
    if needed > st.nbytes():
        st = _grow(st, needed, t.dtype)
    storage.attach(t, st, t.storage_offset(), shape, stride)
    return t


def _grow(st, nbytes: int, dtype: torch.dtype):
    """`st` grown to `nbytes`, in place as CPU grows a storage, so that every view of it
    sees the new size (`arange(4., out=x[:, 1:])` writes past the view's end into x's
    storage). Without the C++ hooks a storage cannot be resized: a new, larger one."""
    try:
        st.resize_(nbytes)
    except RuntimeError:
        return storage.grown_storage(st, nbytes, dtype)
    return st


@handles(aten.resize_as_.default)
def resize_as_(t, other, *, memory_format=None):
    resize_(t, other.shape)
    if memory_format is None:
        return t
    if memory_format == torch.preserve_format:  # as CPU: the layout `other` suggests
        memory_format = suggest_memory_format(other)
    stride = _strides_for(tuple(t.shape), memory_format)
    return storage.attach(t, t.untyped_storage(), t.storage_offset(), tuple(t.shape), stride)


@handles(
    aten.set_.source_Storage_storage_offset,
    aten.set_.source_Storage,
    aten.set_.source_Tensor,
    aten.set_.source_Tensor_storage_offset,
)
def set_(t, source, *args, **kwargs):
    src_device = source.device
    if src_device.type != NEURON:
        raise device_mismatch(src_device)
    if isinstance(source, torch.Tensor):
        if not args and not kwargs:
            return storage.attach(
                t, source.untyped_storage(), source.storage_offset(), source.shape, source.stride()
            )
        return aten.set_.source_Storage_storage_offset.redispatch(
            CPU_KEYS, t, source.untyped_storage(), *args, **kwargs
        )
    if not args and not kwargs:
        n = source.nbytes() // t.dtype.itemsize
        return storage.attach(t, source, 0, (n,), (1,))
    return aten.set_.source_Storage_storage_offset.redispatch(CPU_KEYS, t, source, *args, **kwargs)


@handles(aten.set_.default)
def set_empty(t):
    return storage.attach(t, storage.new_storage(0, t.dtype), 0, (0,), (1,))


@handles(aten.is_pinned.default)
def is_pinned(t, device=None):
    return False


@handles(aten.record_stream.default)
def record_stream(t, stream):
    return None


@handles(aten._pin_memory.default)
def pin_memory(t, device=None):
    warnings.warn("torchneuron: pin_memory has no effect for neuron tensors", stacklevel=2)
    return t
