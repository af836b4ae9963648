"""Values in and out of the device: a neuron tensor's logical value as a JAX array or a CPU
tensor, CPU tensors as new neuron tensors, and writes of a value into a (view of a) tensor."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from .. import config
from ..lowerings.dtypes import (
    UnsupportedDtypeError,
    buffer_dtype,
    cast,
    is_bit_container,
    to_jax_dtype,
)
from . import storage, strided, value_checks
from .plan import NEURON

aten = torch.ops.aten

_gather_jit = jax.jit(strided.gather, static_argnums=(2,))
_apply_bits_jit = jax.jit(strided.apply_bits, static_argnums=(1, 2))
_write_jit = jax.jit(strided.scatter, static_argnums=(3,))
memory_order_jit = jax.jit(strided.to_memory_order, static_argnums=(1,))


def logical_array(t: torch.Tensor) -> jax.Array:
    """The logical value of a neuron tensor as a jax.Array of its shape."""
    buf = storage.storage_buffer(t.untyped_storage(), t.dtype)
    spec = strided.spec_of(t, buf.shape[0])
    if spec.mode == strided.FULL:
        value = buf.reshape(spec.shape)
    else:
        value = _gather_jit(buf, t.storage_offset(), spec)
    if t.is_conj() or t.is_neg():
        bits = _complex32_bits_jit if is_bit_container(t.dtype) else _apply_bits_jit
        value = bits(value, t.is_conj(), t.is_neg())
    return value


def _complex32_bits(bits: jax.Array, conj: bool, neg: bool) -> jax.Array:
    """Lazy conj/neg bits applied to complex32 values held as uint32 words (the real half in
    the low 16 bits, as in memory): sign flips of the float16 halves, which is what CPU's
    conj and neg compute (no arithmetic, NaNs kept)."""
    halves = lax.bitcast_convert_type(bits, jnp.uint16)  # (..., 2): real, imaginary
    flips = jnp.array([0x8000 if neg else 0, 0x8000 if conj != neg else 0], jnp.uint16)
    return lax.bitcast_convert_type(halves ^ flips, jnp.uint32)


_complex32_bits_jit = jax.jit(_complex32_bits, static_argnums=(1, 2))


def logical_host_array(t: torch.Tensor) -> np.ndarray:
    """The logical value of a neuron tensor as a (read-only) numpy array; on the CPU platform
    it is a view of the tensor's buffer, with nothing compiled or copied. (The runtime's own
    reads, not a sync point: they raise no deferred check.)"""
    view = _host_view(t)
    return np.asarray(jax.device_get(logical_array(t))) if view is None else view


def _host_view(t: torch.Tensor) -> np.ndarray | None:
    """On the CPU platform, `t`'s value as a read-only numpy view of its storage buffer, which
    is host memory already: reading a view through numpy's strides compiles nothing, where a
    gather on the device compiles one program per view shape. None where the device must
    compute the value (lazy conj/neg bits, more dimensions than numpy holds)."""
    if config.platform() != "cpu" or t.is_conj() or t.is_neg() or t.dim() > _NUMPY_MAX_DIMS:
        return None
    host = np.asarray(jax.device_get(storage.storage_buffer(t.untyped_storage(), t.dtype)))
    shape = tuple(t.shape)
    if t.numel() == 0:
        return np.empty(shape, host.dtype)
    strides = tuple(s * host.itemsize for s in t.stride())
    # ml_dtypes types (bfloat16, float8) go through unsigned integers of the same size: numpy
    # cannot rebuild some of them from the array interface that as_strided goes through
    # (float8_e5m2's '<f1'). numpy's own types do not need the two extra views.
    raw = host if host.dtype.isbuiltin == 1 else host.view(f"u{host.itemsize}")
    return np.lib.stride_tricks.as_strided(raw[t.storage_offset():], shape, strides,
                                           writeable=False).view(host.dtype)


# numpy holds at most 32 dimensions (64 since numpy 2); PyTorch and XLA have no such limit, so
# values of more dimensions cross the host boundary flattened.
_NUMPY_MAX_DIMS = 32


def cpu_to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's logical value as a contiguous numpy array (bfloat16/float8 as ml_dtypes),
    flattened when it has more dimensions than numpy holds."""
    t = t.detach().resolve_conj().resolve_neg()
    if t._is_zerotensor():
        # An efficient zero tensor (autograd's zero gradients, e.g. sgn's) has no storage to
        # read: its value is zeros of its shape.
        t = torch.zeros(t.shape, dtype=t.dtype)
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dim() > _NUMPY_MAX_DIMS:
        t = t.reshape(-1)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(to_jax_dtype(torch.bfloat16))
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return t.view(torch.uint8).numpy().view(to_jax_dtype(t.dtype))
    if is_bit_container(t.dtype):
        return t.view(torch.int32).numpy().view(buffer_dtype(t.dtype))
    return t.numpy()


def numpy_to_cpu(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    a = np.ascontiguousarray(a)
    if dtype == torch.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return torch.from_numpy(a.view(np.uint8)).view(dtype)
    if is_bit_container(dtype):
        return torch.from_numpy(a.view(np.int32)).view(dtype)
    return torch.from_numpy(a)


def neuron_to_cpu(t: torch.Tensor) -> torch.Tensor:
    """The logical value of a neuron tensor as a new contiguous CPU tensor: a read on the host,
    a sync point (it raises a failed deferred check)."""
    value_checks.raise_failed()
    view = _host_view(t)
    if view is not None:
        return numpy_to_cpu(np.array(view, order="C", copy=True), t.dtype).reshape(t.shape)
    value = logical_array(t)
    if value.ndim > _NUMPY_MAX_DIMS:
        value = value.reshape(-1)
    array = np.asarray(jax.device_get(value))
    if not array.flags.writeable:
        array = array.copy()
    return numpy_to_cpu(array, t.dtype).reshape(t.shape)


def cpu_to_new_neuron(t: torch.Tensor) -> torch.Tensor:
    """A new contiguous neuron tensor with the value of CPU tensor `t`."""
    buf = storage.host_to_buffer(cpu_to_numpy(t))
    return storage.new_tensor(tuple(t.shape), t.dtype, None, buf)


def dense_stride(t: torch.Tensor) -> tuple[int, ...]:
    """`t`'s strides when they describe a dense layout (e.g. column-major), else contiguous."""
    stride = tuple(t.stride())
    if strided.dense_permutation(tuple(t.shape), stride) is None:
        return storage.contiguous_strides(t.shape)
    return stride


def preserved_stride(t: torch.Tensor) -> tuple[int, ...]:
    """`t`'s strides when they describe a dense layout, else dense strides in the order of
    `t`'s (a sliced channels_last image stays channels_last), as `empty_like` chooses them."""
    stride = tuple(t.stride())
    if strided.dense_permutation(tuple(t.shape), stride) is not None:
        return stride
    meta = torch.empty_strided(t.shape, stride, dtype=t.dtype, device="meta")
    return tuple(torch.empty_like(meta, memory_format=torch.preserve_format).stride())


def cpu_to_new_neuron_like(t: torch.Tensor) -> torch.Tensor:
    """A new neuron tensor with the value and the layout of CPU tensor `t`: a CPU kernel's
    column-major result (linalg) stays column-major, a non-dense one keeps its view."""
    if (t.numel() > 1 and not (t.is_conj() or t.is_neg())
            and strided.dense_permutation(tuple(t.shape), tuple(t.stride())) is None):
        # Not dense (e.g. lstsq's solution, a narrowed column-major buffer): copy the whole
        # storage and take the same view of it, so sizes, strides and offset are CPU's.
        n = t.untyped_storage().nbytes() // t.element_size()
        flat = cpu_to_new_neuron(torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,)))
        return torch.empty(0, dtype=t.dtype, device=NEURON).set_(
            flat.untyped_storage(), t.storage_offset(), t.shape, t.stride())
    stride = dense_stride(t)
    if t.dim() <= 1 or stride == storage.contiguous_strides(t.shape):
        return cpu_to_new_neuron(t)
    out = torch.empty_strided(t.shape, stride, dtype=t.dtype, device=NEURON)
    return out.copy_(t)


def write_array(dst: torch.Tensor, value: jax.Array) -> None:
    """Store `value` (dst's shape and dtype) into dst's view of its storage."""
    st = dst.untyped_storage()
    if dst.is_conj() or dst.is_neg():  # a lazy conj/neg view stores conj/neg of its values
        value = strided.apply_bits(value, dst.is_conj(), dst.is_neg())
    nelem = st.nbytes() // dst.dtype.itemsize if dst.dtype.itemsize else 0
    spec = strided.spec_of(dst, nelem)
    if spec.mode == strided.FULL:
        storage.set_storage_buffer(st, value.reshape(-1), dst.dtype)
        return
    buf = storage.storage_buffer(st, dst.dtype)
    storage.set_storage_buffer(st, _write_jit(buf, dst.storage_offset(), value, spec), dst.dtype)


def _cast_broadcast_impl(value, jdtype, shape):
    if value.dtype != jdtype:
        value = cast(value, jdtype)
    if value.shape != shape:
        value = jnp.broadcast_to(value, shape)
    return value


_cast_broadcast_jit = jax.jit(_cast_broadcast_impl, static_argnums=(1, 2))


def cast_broadcast(value: jax.Array, dtype: torch.dtype, shape) -> jax.Array:
    """`value` as `dtype` (complex to real keeps the real part, as copy_ does), broadcast."""
    return _cast_broadcast_jit(value, buffer_dtype(dtype), tuple(shape))


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """`dst.copy_(src)` where either side (or both) is a neuron tensor."""
    if src.dtype != dst.dtype and (is_bit_container(src.dtype) or is_bit_container(dst.dtype)):
        # complex32 is held as bits: a conversion needs CPU (the router runs copy_ there)
        raise UnsupportedDtypeError(src.dtype if is_bit_container(src.dtype) else dst.dtype)
    if dst.device.type == NEURON:
        if src.device.type == NEURON:
            value = logical_array(src)
        else:
            src_cpu = src
            if src_cpu.is_complex() and not dst.is_complex():
                src_cpu = src_cpu.real
            value = storage.host_to_buffer(cpu_to_numpy(src_cpu)).reshape(src_cpu.shape)
        write_array(dst, cast_broadcast(value, dst.dtype, dst.shape))
        return dst
    dst.copy_(neuron_to_cpu(src))  # neuron -> host
    return dst


# ---- sparse COO tensors (runtime/sparse.py): dense indices and values on either side ------

# SparseCPU's kernels, where they are device-generic (runtime/sparse.py)
SPARSE_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.SparseCPU)


def sparse_to_device(t: torch.Tensor, device) -> torch.Tensor:
    """A sparse COO tensor with its indices and values moved to `device` (same flags; it is
    valid already, so PyTorch's optional invariant checks are not run again)."""
    return torch.sparse_coo_tensor(t._indices().to(device), t._values().to(device), t.shape,
                                   dtype=t.dtype, device=device, is_coalesced=t.is_coalesced(),
                                   requires_grad=False, check_invariants=False)


def copy_sparse_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """`dst.copy_(src)` for a sparse neuron `dst`: PyTorch's device-generic sparse copy (it
    resizes dst and takes copies of src's indices and values, moved to dst's device)."""
    aten.copy_sparse_to_sparse_.default.redispatch(SPARSE_CPU_KEYS, dst,
                                                   sparse_to_device(src, dst.device))

