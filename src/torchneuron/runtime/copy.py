"""Ops the runtime handles itself: allocation, copies across devices, resize, set_, item."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..lowerings.dtypes import to_jax_dtype
from . import storage, views
from .dispatch import (
    NEURON,
    _cpu_fallback,
    _device_mismatch,
    _raise_as_on_cpu,
    logical_array,
    plan_for,
    run_lowered,
    special,
)
from .storage import CPU_KEYS

aten = torch.ops.aten


def _device_index(device) -> int:
    if device is None:
        return 0
    device = torch.device(device)
    return device.index or 0


@special(aten.empty.memory_format)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    dtype = dtype or torch.get_default_dtype()
    _check_sizes(size)
    shape = tuple(size)
    stride = _strides_for(shape, memory_format)
    return storage.new_tensor(shape, dtype, stride, device_index=_device_index(device))


@special(aten.empty_strided.default)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = dtype or torch.get_default_dtype()
    _check_sizes(size)
    return storage.new_tensor(tuple(size), dtype, tuple(stride), device_index=_device_index(device))


def _check_sizes(size) -> None:
    for s in size:
        if s < 0:
            raise RuntimeError(
                f"Trying to create tensor with negative dimension {s}: {list(size)}"
            )


def _strides_for(shape, memory_format) -> tuple[int, ...]:
    if memory_format == torch.channels_last and len(shape) == 4:
        n, c, h, w = shape
        return (h * w * c, 1, w * c, c) if c else storage.contiguous_strides(shape)
    if memory_format == torch.channels_last_3d and len(shape) == 5:
        n, c, d, h, w = shape
        return (d * h * w * c, 1, h * w * c, w * c, c)
    return storage.contiguous_strides(shape)


# ---------------------------------------------------------------------------------------
# Host <-> device


def _cpu_to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().resolve_conj().resolve_neg()
    if t._is_zerotensor():
        # An efficient zero tensor (autograd's zero gradients, e.g. sgn's) has no storage to
        # read: its value is zeros of its shape.
        t = torch.zeros(t.shape, dtype=t.dtype)
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(to_jax_dtype(torch.bfloat16))
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8).numpy().view(to_jax_dtype(t.dtype))
    return t.numpy()


def _numpy_to_cpu(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    a = np.ascontiguousarray(a)
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return torch.from_numpy(a.view(np.uint8)).view(dtype)
    return torch.from_numpy(a)


def neuron_to_cpu(t: torch.Tensor) -> torch.Tensor:
    """The logical value of a neuron tensor as a new contiguous CPU tensor."""
    array = np.asarray(jax.device_get(logical_array(t)))
    if not array.flags.writeable:
        array = array.copy()
    return _numpy_to_cpu(array, t.dtype).reshape(t.shape)


def cpu_to_new_neuron(t: torch.Tensor) -> torch.Tensor:
    array = _cpu_to_numpy(t)
    buf = storage.host_to_buffer(array)
    return storage.new_tensor(tuple(t.shape), t.dtype, None, buf)


_write_jit = jax.jit(views.scatter, static_argnums=(3,))


def write_array(dst: torch.Tensor, value: jax.Array) -> None:
    """Store `value` (dst's shape and dtype) into dst's view of its storage."""
    st = dst.untyped_storage()
    if dst.is_conj() or dst.is_neg():  # a lazy conj/neg view stores conj/neg of its values
        value = views.apply_bits(value, dst.is_conj(), dst.is_neg())
    nelem = st.nbytes() // dst.dtype.itemsize if dst.dtype.itemsize else 0
    spec = views.spec_of(dst, nelem)
    if spec.mode == views.FULL:
        storage.set_storage_buffer(st, value.reshape(-1), dst.dtype)
        return
    buf = storage.storage_buffer(st, dst.dtype)
    storage.set_storage_buffer(st, _write_jit(buf, dst.storage_offset(), value, spec), dst.dtype)


def _cast_broadcast(value: jax.Array, dtype, shape) -> jax.Array:
    jdtype = to_jax_dtype(dtype)
    return _cast_broadcast_jit(value, jdtype, tuple(shape))


def _cast_broadcast_impl(value, jdtype, shape):
    if jnp.issubdtype(value.dtype, jnp.complexfloating) and not jnp.issubdtype(jdtype, jnp.complexfloating):
        value = jnp.real(value)
    if value.dtype != jdtype:
        value = value.astype(jdtype)
    if value.shape != shape:
        value = jnp.broadcast_to(value, shape)
    return value


_cast_broadcast_jit = jax.jit(_cast_broadcast_impl, static_argnums=(1, 2))


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    if dst.device.type == NEURON:
        if src.device.type == NEURON:
            value = logical_array(src)
        else:
            src_cpu = src
            if src_cpu.is_complex() and not dst.is_complex():
                src_cpu = src_cpu.real
            value = storage.host_to_buffer(_cpu_to_numpy(src_cpu)).reshape(src_cpu.shape)
        value = _cast_broadcast(value, dst.dtype, dst.shape)
        write_array(dst, value)
        return dst
    # neuron -> host
    dst.copy_(neuron_to_cpu(src))
    return dst


@special(aten._copy_from.default)
def _copy_from(src, dst, non_blocking=False):
    return copy_into(dst, src)


@special(aten._copy_from_and_resize.default)
def _copy_from_and_resize(src, dst):
    if dst.shape != src.shape:
        dst.resize_(src.shape)
    return copy_into(dst, src)


@special(aten.copy_.default)
def copy_(dst, src, non_blocking=False):
    return copy_into(dst, src)


@special(aten._local_scalar_dense.default)
def local_scalar_dense(t):
    if t.numel() != 1:
        raise RuntimeError(
            f"a Tensor with {t.numel()} elements cannot be converted to Scalar"
        )
    return neuron_to_cpu(t).item()


def _to_copy_strides(t: torch.Tensor, dtype: torch.dtype, memory_format) -> tuple[int, ...]:
    """The strides PyTorch gives `t.to(dtype, memory_format=...)`: its meta kernel applies the
    rules (preserve_format keeps a dense input's strides, as empty_like does; channels_last
    asks for rank 4) and raises PyTorch's own errors."""
    meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    stride = tuple(aten._to_copy.default(meta, dtype=dtype, memory_format=memory_format).stride())
    if views.dense_permutation(tuple(t.shape), stride) is None:
        return storage.contiguous_strides(t.shape)
    return stride


_memory_order_jit = jax.jit(views.to_memory_order, static_argnums=(1,))


@special(aten._to_copy.default)
def to_copy(t, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    dtype = dtype or t.dtype
    target = torch.device(device) if device is not None else t.device
    stride = _to_copy_strides(t, dtype, memory_format)
    if target.type == NEURON:
        if t.device.type == NEURON:
            value = _cast_broadcast(logical_array(t), dtype, t.shape)
        else:
            src = t if t.dtype == dtype else t.to(dtype)
            if src.is_complex() and not dtype.is_complex:
                src = src.real
            value = storage.host_to_buffer(_cpu_to_numpy(src)).reshape(src.shape)
        return storage.new_tensor(tuple(t.shape), dtype, stride, _memory_order_jit(value, stride))
    if t.device.type == NEURON:
        out = torch.empty_strided(t.shape, stride, dtype=dtype, device=target)
        return out.copy_(neuron_to_cpu(t))
    raise _device_mismatch(t.device)


# ---------------------------------------------------------------------------------------
# Metadata ops that need a storage of ours


@special(aten.resize_.default)
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
        old = storage.storage_buffer(st, t.dtype) if st.nbytes() else None
        new_st = storage.new_storage(needed, t.dtype)
        if old is not None and old.shape[0]:
            count = needed // t.dtype.itemsize
            grown = jnp.zeros((count,), old.dtype).at[: old.shape[0]].set(old)
            storage.set_storage_buffer(new_st, grown, t.dtype)
        storage.attach(t, new_st, t.storage_offset(), shape, stride)
    else:
        storage.attach(t, st, t.storage_offset(), shape, stride)
    return t


@special(aten.resize_as_.default)
def resize_as_(t, other, *, memory_format=None):
    return resize_(t, other.shape, memory_format=memory_format)


@special(
    aten.set_.source_Storage_storage_offset,
    aten.set_.source_Storage,
    aten.set_.source_Tensor,
    aten.set_.source_Tensor_storage_offset,
)
def set_(t, source, *args, **kwargs):
    src_device = source.device
    if src_device.type != NEURON:
        raise _device_mismatch(src_device)
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


@special(aten.set_.default)
def set_empty(t):
    return storage.attach(t, storage.new_storage(0, t.dtype), 0, (0,), (1,))


@special(aten.is_pinned.default)
def is_pinned(t, device=None):
    return False


@special(aten.record_stream.default)
def record_stream(t, stream):
    return None


@special(aten._pin_memory.default)
def pin_memory(t, device=None):
    warnings.warn("torchneuron: pin_memory has no effect for neuron tensors", stacklevel=2)
    return t


@special(aten.native_batch_norm.default)
def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    # `native_batch_norm` updates the running statistics without declaring them mutated in its
    # schema, so it cannot run as one lowering; its `_native_batch_norm_legit` twins declare
    # them and run fused (instead of the ~20 ops of its decomposition).
    if training:
        if running_mean is None or running_var is None:
            return aten._native_batch_norm_legit.no_stats(input, weight, bias, True, momentum, eps)
        return aten._native_batch_norm_legit.default(
            input, weight, bias, running_mean, running_var, True, momentum, eps
        )
    out, _, _ = aten._native_batch_norm_legit_no_training.default(
        input, weight, bias, running_mean, running_var, momentum, eps
    )
    empty = input.new_empty((0,), dtype=out.dtype if input.dtype.is_floating_point else input.dtype)
    return out, empty, empty.clone()


@special(aten._native_batch_norm_legit.default)
def native_batch_norm_legit(input, weight, bias, running_mean, running_var, training, momentum, eps):
    if not training:
        # CPU's kernel returns empty save_mean/save_invstd in evaluation mode, while PyTorch's
        # meta kernel (which the lowering's output layout follows) says (C,): CPU is the reference.
        out, _, _ = aten._native_batch_norm_legit_no_training.default(
            input, weight, bias, running_mean, running_var, momentum, eps
        )
        empty = input.new_empty((0,))
        return out, empty, empty.clone()
    plan = plan_for(aten._native_batch_norm_legit.default)
    args = (input, weight, bias, running_mean, running_var, training, momentum, eps)
    if plan.lowering is None:
        return _cpu_fallback(plan, args, {})
    return run_lowered(plan, plan.lowering, args, {})


@special(aten._native_batch_norm_legit.out)
def native_batch_norm_legit_out(input, weight, bias, running_mean, running_var, training, momentum,
                                eps, *, out, save_mean, save_invstd):
    # No functional twin the runtime can derive this from (`.default` mutates the running
    # statistics too): run it, then resize and fill the outputs as the CPU kernel does.
    results = native_batch_norm_legit(input, weight, bias, running_mean, running_var, training,
                                      momentum, eps)
    for dst, value in zip((out, save_mean, save_invstd), results):
        if dst.device.type != NEURON:
            raise _device_mismatch(dst.device)
        if dst.shape != value.shape:
            dst.resize_(value.shape)
        dst.copy_(value)
    return out, save_mean, save_invstd


@special(aten.nonzero.default)
def nonzero(t):
    # CPU's kernel fills a (ndim, n) buffer and returns its transpose: (n, ndim) with strides
    # (1, n). Composites (argwhere) hand that layout on, so match it.
    plan = plan_for(aten.nonzero.default)
    if plan.lowering is None:
        return _cpu_fallback(plan, (t,), {})
    result = run_lowered(plan, plan.lowering, (t,), {})
    n, ndim = result.shape
    value = logical_array(result)
    return storage.new_tensor((n, ndim), result.dtype, (1, n), _column_major_jit(value))


_column_major_jit = jax.jit(lambda value: value.T.reshape(-1))


@special(aten.narrow_copy.default)
def narrow_copy(t, dim, start, length):
    # Without a kernel of ours the composite one runs, whose `narrow` raises IndexError for a
    # bad dim where CPU's own kernel raises RuntimeError.
    try:
        return t.narrow(dim, start, length).clone()
    except Exception as err:
        _raise_as_on_cpu(aten.narrow_copy.default, (t, dim, start, length), {}, err)
