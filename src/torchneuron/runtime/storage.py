"""Device storages and the payloads behind them.

Every neuron tensor has a real `StorageImpl` of the right byte size with a unique synthetic
address, so views, `data_ptr()` and `untyped_storage()` behave as on any PyTorch device. The
data lives on the storage as a `Payload`: a flat 1-D `jax.Array` in one element dtype. This is
the only module that touches payloads, so a deferred value can later stand in for the array.
"""

from __future__ import annotations

import functools
import gc
import threading
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..lowerings.dtypes import buffer_dtype
from . import _native, fusion, platform

aten = torch.ops.aten
CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_set_storage = aten.set_.source_Storage_storage_offset._handle
_ADDRESS_ALIGN = 1 << 12
PAYLOAD_ATTR = _PAYLOAD_ATTR = "_neuron_payload"


class _PythonPayload:
    """The device data of one storage: `buf` is flat, `dtype` is its torch element dtype.

    `buf is None` means the storage has never been written (`torch.empty`): it reads as zeros
    and is materialized on first use, so allocation never pays for a fill. (The C library's
    `Payload` type is the same record, created and freed without running Python code; this
    class serves when the library is not built.)
    """

    __slots__ = ("buf", "dtype", "nbytes", "__weakref__")

    def __init__(self, nbytes: int, dtype: torch.dtype, buf: jax.Array | None = None) -> None:
        self.nbytes = nbytes
        self.dtype = dtype
        self.buf = buf
        with _STATS_LOCK:
            _STATS[2] += 1
            _account(nbytes)

    def set_nbytes(self, nbytes: int) -> None:
        with _STATS_LOCK:
            _account(nbytes - self.nbytes)
        self.nbytes = nbytes

    def __del__(self) -> None:
        with _STATS_LOCK:
            _STATS[3] += 1
            _account(-self.nbytes)


# allocated, peak, number of allocations, number of frees (without the C library)
_STATS = [0, 0, 0, 0]
_STATS_LOCK = threading.Lock()


def _account(delta: int) -> None:
    _STATS[0] += delta
    if _STATS[0] > _STATS[1]:
        _STATS[1] = _STATS[0]


_NATIVE = _native.fastpath()
Payload = _NATIVE.Payload if _NATIVE is not None else _PythonPayload


def memory_stats() -> tuple[int, int, int, int]:
    """(bytes allocated, peak bytes, allocations, frees) of neuron storages."""
    if _NATIVE is not None:
        return _NATIVE.memory_stats()
    with _STATS_LOCK:
        return tuple(_STATS)


def reset_peak_memory() -> None:
    if _NATIVE is not None:
        _NATIVE.reset_peak()
        return
    with _STATS_LOCK:
        _STATS[1] = _STATS[0]


_DEVICES: dict[int, torch.device] = {}


def _device(index: int) -> torch.device:
    device = _DEVICES.get(index)
    if device is None:  # built lazily: "neuron" exists only once the backend is registered
        device = _DEVICES[index] = torch.device("neuron", index)
    return device


_next_address = [1 << 44]
_address_lock = threading.Lock()


def _reserve_address(nbytes: int) -> int:
    """A fresh synthetic device address; address ranges of storages never overlap."""
    if not nbytes:
        return 0
    span = (nbytes + _ADDRESS_ALIGN - 1) // _ADDRESS_ALIGN * _ADDRESS_ALIGN
    with _address_lock:
        address = _next_address[0]
        _next_address[0] = address + span
    return address


def new_storage(nbytes: int, dtype: torch.dtype, buf=None, device_index: int = 0):
    """A fresh neuron `UntypedStorage` of `nbytes` bytes carrying a payload."""
    storage = torch._C._construct_storage_from_data_pointer(
        _reserve_address(nbytes), _device(device_index), nbytes
    )
    if fusion.is_pending(buf):
        payload = Payload(nbytes, dtype)
        fusion.track(payload, buf)
    else:
        payload = Payload(nbytes, dtype, buf)
        if buf is not None:
            _LATEST[0] = buf
    setattr(storage, _PAYLOAD_ATTR, payload)
    return storage


def payload_of(storage) -> Payload:
    payload = getattr(storage, _PAYLOAD_ATTR, None)
    if payload is None:
        if not storage.resizable() and storage.nbytes():
            payload = _aliased_payload(storage)
        else:
            # Made by PyTorch's allocator (e.g. `torch.UntypedStorage(n, device="neuron")`).
            payload = Payload(storage.nbytes(), torch.uint8)
        setattr(storage, _PAYLOAD_ATTR, payload)
    return payload


def _aliased_payload(storage) -> Payload:
    """The payload behind a storage that wraps a neuron address it did not allocate.

    `torch.from_dlpack`/`torch.asarray` of a neuron tensor's DLPack capsule make a new storage
    around the tensor's synthetic address; the capsule keeps the original storage alive, so
    the new storage shares its payload (writes through either are seen by both, as on CUDA).
    Found by a scan of live storages: this runs once per such storage, never on the hot path.
    """
    start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    inside = None
    for obj in gc.get_objects():
        if type(obj) is not torch.UntypedStorage or obj is storage or obj.device.type != "neuron":
            continue
        payload = getattr(obj, _PAYLOAD_ATTR, None)
        if payload is None:
            continue
        base = obj.data_ptr()
        if base == start and end <= base + obj.nbytes():
            return payload
        if base < start < base + obj.nbytes():
            inside = obj
    if inside is not None:
        # A payload is one flat array from its storage's first byte; a second storage that
        # starts inside it cannot share it, and a copy would silently stop aliasing.
        raise RuntimeError(
            "torchneuron: this neuron tensor wraps memory inside another neuron storage "
            f"(a DLPack capsule of a view starting {start - inside.data_ptr()} bytes into its "
            "storage); only tensors that start at their storage's first element can be "
            "shared through DLPack on the neuron device: call .clone() before to_dlpack")
    raise RuntimeError(
        "torchneuron: this neuron tensor wraps memory the neuron device did not allocate "
        "(e.g. a DLPack capsule of another device's memory); copy the data through the CPU "
        "(tensor.cpu()) instead")


def resize_payload(storage, nbytes: int) -> None:
    """Called by the C++ hooks after `UntypedStorage.resize_`: keep the payload's prefix."""
    payload = payload_of(storage)
    old = storage_buffer(storage, payload.dtype) if payload.buf is not None else None
    payload.set_nbytes(nbytes)
    if old is None or nbytes == 0:
        payload.buf = None
        return
    count = nbytes // payload.dtype.itemsize
    keep = min(count, old.shape[0])
    grown = jnp.zeros((count,), old.dtype)
    payload.buf = grown.at[:keep].set(old[:keep]) if keep else grown


def grown_storage(old, nbytes: int, dtype: torch.dtype):
    """A new, larger storage that starts with `old`'s contents (`resize_` past its end)."""
    new = new_storage(nbytes, dtype)
    if old.nbytes():
        buf = storage_buffer(old, dtype)
        if buf.shape[0]:
            count = nbytes // dtype.itemsize
            set_storage_buffer(new, jnp.zeros((count,), buf.dtype).at[: buf.shape[0]].set(buf), dtype)
    return new


def storage_size_for(shape, stride, offset: int = 0) -> int:
    """Number of elements a storage needs for the given view (0 for an empty tensor)."""
    if any(s == 0 for s in shape):
        return 0
    return offset + 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def contiguous_strides(shape) -> tuple[int, ...]:
    strides = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def attach(tensor: torch.Tensor, storage, offset: int, shape, stride) -> torch.Tensor:
    """Point `tensor` at `storage` (metadata only, through the CPU kernel of `set_`)."""
    _set_storage.redispatch_boxed(CPU_KEYS, tensor, storage, offset, shape, stride)
    return tensor


def new_tensor(shape, dtype: torch.dtype, stride=None, buf=None, device_index: int = 0):
    """A neuron tensor with its own storage; `buf` (flat, memory order) or uninitialized."""
    shape = tuple(shape)
    stride = contiguous_strides(shape) if stride is None else tuple(stride)
    nbytes = storage_size_for(shape, stride) * dtype.itemsize
    return output_tensor(shape, stride, nbytes, dtype, buf, device_index)


def output_tensor(shape: tuple, stride: tuple, nbytes: int, dtype: torch.dtype, buf,
                  device_index: int = 0) -> torch.Tensor:
    """A neuron tensor over a new storage of `nbytes` holding `buf` (an executable's output, a
    pending value, or None: never written). The C++ library makes it as the fast path makes
    an op's output; without it, a Python storage and a `set_` redispatch (a compiled 64x64 add
    took 55-80 us per call that way, 37-52 us with the library)."""
    if _NATIVE is not None and device_index == 0:
        return _NATIVE.new_tensor(dtype, shape, stride, nbytes, buf)
    storage = new_storage(nbytes, dtype, buf, device_index)
    tensor = torch._C._acc.create_empty_tensor(shape, dtype)
    return attach(tensor, storage, 0, shape, stride)


def ready_payload(tensor: torch.Tensor):
    """The hot path's read: the payload of a neuron tensor's storage when it holds a buffer in
    the tensor's dtype (an array, or a pending value of the recorded trace), else None (then
    `storage_buffer` materializes or reinterprets). None also for tensors of other devices,
    which carry no payload."""
    payload = getattr(tensor.untyped_storage(), _PAYLOAD_ATTR, None)
    if payload is not None and payload.dtype is tensor.dtype and payload.buf is not None:
        return payload
    return None


def ready_buffer(tensor: torch.Tensor):
    """`ready_payload(tensor).buf`, or None."""
    payload = ready_payload(tensor)
    return None if payload is None else payload.buf


def storage_buffer(storage, dtype: torch.dtype, reader: torch.Tensor | None = None) -> jax.Array:
    """The flat payload of `storage` viewed as `dtype` (materialized, reinterpreted if needed;
    a pending value of the recorded trace runs the trace first). `reader`: the caller passes
    the buffer to a recorded op reading it through this tensor, so a storage never written
    may be filled with zeros inside the trace (a pending value), where XLA drops them if the
    op overwrites them."""
    payload = getattr(storage, _PAYLOAD_ATTR, None) or payload_of(storage)
    buf = payload.buf
    if buf is None and reader is not None and fusion.recording():
        count = payload.nbytes // dtype.itemsize
        whole = reader.is_contiguous() and reader.storage_offset() == 0 and \
            reader.numel() == count
        shape = tuple(reader.shape) if whole else (count,)
        (zeros,) = fusion.record(_zero_fill(shape, dtype), (), 1, None)
        payload.dtype = dtype
        fusion.track(payload, zeros)
        return zeros
    if fusion.is_pending(buf):
        if reader is not None and payload.dtype == dtype and fusion.recording():
            return buf  # a value of the trace being recorded, read by an op recorded into it
        fusion.flush()
        buf = payload.buf
        if fusion.is_pending(buf):
            error = fusion.failure(buf)
            if error is not None:
                raise RuntimeError("torchneuron: this tensor's value was never computed: the op "
                                   f"that was to compute it failed ({type(error).__name__}: "
                                   f"{error})") from error
            raise RuntimeError("torchneuron: a recorded value was lost (its trace failed to run)")
    if buf is not None and payload.dtype == dtype:
        return buf
    if buf is None:
        buf = _zeros(payload.nbytes // dtype.itemsize, dtype)
    else:
        source = _BOOL_VIEW_SOURCES.pop(payload, None)
        if source is not None and source[0] is buf and source[2] is dtype:
            new = source[1]  # the bytes a bool view normalized, not written since
        else:
            new = reinterpret(buf, payload.dtype, dtype)
        if dtype is torch.bool and payload.dtype is not torch.bool:
            # XLA's predicates are 0 or 1; CPU reads any nonzero byte of a bool view of other
            # data as True. The bytes themselves stay readable through the other dtype.
            normalized = jax.device_put(np.asarray(jax.device_get(new)).view(np.uint8) != 0,
                                        platform.jax_device(0))
            _BOOL_VIEW_SOURCES[payload] = (normalized, buf, payload.dtype)
            new = normalized
        buf = new
    payload.buf, payload.dtype = buf, dtype
    return buf


# payload -> (the normalized bool buffer, the buffer it was made from, that buffer's dtype),
# for a bool view of other bytes (`x.view(torch.bool)` of uint8 values above 1).
_BOOL_VIEW_SOURCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _zeros(count: int, dtype: torch.dtype) -> jax.Array:
    """The contents of a storage never written (`empty` followed by `fill_`, as `torch.ones`
    runs): on the CPU client a host array handed over, because `jnp.zeros` compiles one
    executable per size (a new shape cost two compilations instead of one)."""
    jax_dtype = buffer_dtype(dtype)
    if platform.platform_name() == "cpu":
        return jax.device_put(np.zeros((count,), jax_dtype), platform.jax_device(0))
    return jnp.zeros((count,), jax_dtype, device=platform.jax_device(0))


class ZeroFill:
    """The recorded op that makes the zeros a storage never written reads as: `shape` (how
    its first reader views it whole, else its length) elements of `dtype`, flat. One object
    per shape, so that traces of the same shapes match."""

    __slots__ = ("shape", "dtype", "stable_name")

    def __init__(self, shape: tuple, dtype: torch.dtype) -> None:
        self.shape, self.dtype = shape, dtype
        self.stable_name = f"zeros|{shape!r}|{dtype}"  # fusion's on-disk program keys

    def __call__(self) -> tuple:
        return (jnp.zeros(self.shape, buffer_dtype(self.dtype)).reshape(-1),)


_zero_fill = functools.lru_cache(maxsize=256)(ZeroFill)


def set_storage_buffer(storage, buf: jax.Array, dtype: torch.dtype) -> None:
    """The storage's new contents: an array, or a pending value of the recorded trace."""
    payload = payload_of(storage)
    payload.dtype = dtype
    if fusion.is_pending(buf):
        fusion.track(payload, buf)
    else:
        payload.buf = buf
        _LATEST[0] = buf


# The most recently produced buffer: PJRT runs a device's work in order, so waiting for it
# waits for everything queued before it (`torch.neuron.synchronize`).
_LATEST = fusion.LATEST


def wait_for_pending() -> None:
    """Run the recorded trace and wait until the device has finished all queued work."""
    fusion.wait()


def reinterpret(buf: jax.Array, src: torch.dtype, dst: torch.dtype) -> jax.Array:
    """Reinterpret the bytes of a flat buffer as another dtype (`Tensor.view(dtype)`)."""
    raw = np.asarray(jax.device_get(buf)).view(np.uint8) if buf.size else np.zeros(0, np.uint8)
    count = raw.size // dst.itemsize
    out = raw[: count * dst.itemsize].view(buffer_dtype(dst))
    return jax.device_put(out, platform.jax_device(0))


def host_to_buffer(array: np.ndarray) -> jax.Array:
    # The CPU client may alias host memory it is given: copy, so that later writes to the
    # source tensor cannot show through on the device.
    return jax.device_put(np.array(array, copy=True, order="C").reshape(-1), platform.jax_device(0))
