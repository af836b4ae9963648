"""The argument signature codec: a call's arguments as (cache key, executable inputs), and the
values back inside the traced executable.

Eager executables and compiled graphs both take their inputs this way. A neuron tensor
becomes its storage's flat buffer (plus its storage offset when the view does not start at
0) and a key that fixes everything the executable's code depends on: dtype, view layout and
lazy conjugate/negative bits. A 0-dim CPU tensor and a Python number in a Tensor slot become
traced values; Scalar arguments are traced (their type is in the key), static ones are keys.

Tensor keys (tuples, cheap to hash):
    (dtype, ViewSpec)                  a neuron tensor; inputs: buffer [, offset]
    ("host", dtype)                    a 0-dim CPU tensor; input: its Python value
    ("number", type)                   a Python number passed where a Tensor is expected
    ("bits", conj, neg, inner key)     a lazy conj()/neg view of a neuron tensor
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import torch

from ..lowerings.dtypes import UnsupportedDtypeError, is_bit_container, to_jax_dtype
from . import _native, fusion, storage, strided
from .plan import GENERATOR, NEURON, OPT_TENSOR_LIST, SCALAR, STATIC, TENSOR, OpPlan, is_default

HOST = "host"
NUMBER = "number"
BITS = "bits"


def device_mismatch(other: torch.device) -> RuntimeError:
    """PyTorch's error for a tensor of another device among a neuron op's arguments."""
    return RuntimeError(
        "Expected all tensors to be on the same device, but found at least two devices, "
        f"neuron:0 and {other}!"
    )


def tensor_key(t: torch.Tensor, inputs: list) -> tuple:
    """The key of a tensor argument; appends its executable inputs to `inputs`."""
    if not isinstance(t, torch.Tensor):  # a Python number in a Tensor slot (wrapped scalar)
        inputs.append(t)
        return (NUMBER, type(t))
    if t.is_conj() or t.is_neg():
        # A lazy conjugate/negative view (x.conj(), conj().imag, ...): the storage holds the
        # unconjugated/unnegated values; the op must see the logical ones.
        return (BITS, t.is_conj(), t.is_neg(), _plain_key(t, inputs))
    return _plain_key(t, inputs)


def _python_plain_tensor_key(t, inputs: list) -> None:
    return None  # without the C++ library every tensor takes `tensor_key`


_NATIVE = _native.fastpath()

# `tensor_key` of a neuron tensor whose storage holds a buffer in its dtype (no conj/neg
# bits) and of a 0-dim CPU tensor, in C++: about 4x cheaper per argument, which counts for a
# compiled optimizer step's dozens of tensors; None for every other argument.
plain_tensor_key = getattr(_NATIVE, "tensor_key", _python_plain_tensor_key)


def _python_set_buffers(_tensors: list, _buffers: list) -> bool:
    return False  # the caller writes them through storage.set_storage_buffer


# A compiled graph's new storage buffers for its plain mutated inputs, swapped in by C++ (as
# storage.set_storage_buffer does, for arrays); False where the caller must write them.
set_buffers = getattr(_NATIVE, "set_buffers", _python_set_buffers)


def _plain_key(t: torch.Tensor, inputs: list) -> tuple:
    payload = storage.ready_payload(t)  # the common case: one lookup, no device check needed
    if payload is None:
        if t.device.type != NEURON:
            if t.dim() == 0 and t.device.type == "cpu":
                inputs.append(t.item())
                return (HOST, t.dtype)
            raise device_mismatch(t.device)
        storage.storage_buffer(t.untyped_storage(), t.dtype, reader=t)
        payload = storage.ready_payload(t)
    inputs.append(payload.buf)  # an array, or a pending value of the recorded trace
    shape = tuple(t.shape)
    stride = t.stride()
    if t.is_contiguous():
        offset = t.storage_offset()
        if offset == 0 and t.numel() * t.dtype.itemsize == payload.nbytes:
            return (t.dtype, strided.ViewSpec(shape, stride, strided.FULL))
        inputs.append(offset)
        return (t.dtype, strided.ViewSpec(shape, stride, strided.SLICE))
    inputs.append(t.storage_offset())
    return (t.dtype, strided.ViewSpec(shape, stride, strided.STRIDED))


def _scalar_aval(kind: type) -> jax.ShapeDtypeStruct:
    """The abstract value a Python number becomes as an executable input."""
    if kind is bool:
        return jax.ShapeDtypeStruct((), jnp.bool_)
    dtype = {int: jnp.int64, float: jnp.float64, complex: jnp.complex128}[kind]
    return jax.ShapeDtypeStruct((), dtype, weak_type=True)


def _tensor_avals(key: tuple | None, t, avals: list) -> None:
    if key is None:
        return
    tag = key[0]
    if tag == HOST:
        avals.append(_scalar_aval(type(t.item())))
    elif tag == NUMBER:
        avals.append(_scalar_aval(key[1]))
    elif tag == BITS:
        _tensor_avals(key[3], t, avals)
    else:
        avals.append(buffer_aval(t))
        if key[1].mode != strided.FULL:
            avals.append(_scalar_aval(int))


def buffer_aval(t: torch.Tensor) -> jax.ShapeDtypeStruct:
    """The abstract value of a neuron tensor's storage buffer (flat, in the tensor's dtype)."""
    return jax.ShapeDtypeStruct((t.untyped_storage().nbytes() // t.dtype.itemsize,),
                                to_jax_dtype(t.dtype))


def abstract_inputs(plan: OpPlan, key: tuple, values: list) -> list:
    """The abstract values of `arguments_key`'s inputs for these values (no buffer is read)."""
    avals: list = []
    for kind, k, value in zip(plan.kinds, key, values):
        if kind == SCALAR:
            if k is not None:
                avals.append(_scalar_aval(k))
        elif kind == TENSOR:
            _tensor_avals(k, value, avals)
        elif kind not in (STATIC, GENERATOR):
            for kk, v in zip(k, value):
                _tensor_avals(kk, v, avals)
    return avals


def read_tensor(key: tuple | None, inputs: Iterator) -> Any:
    """Inside the trace: the logical value of a tensor argument from its key and inputs."""
    if key is None:
        return None
    tag = key[0]
    if tag == HOST:
        return jnp.asarray(next(inputs), to_jax_dtype(key[1]))
    if tag == NUMBER:
        return next(inputs)
    if tag == BITS:
        return strided.apply_bits(read_tensor(key[3], inputs), key[1], key[2])
    if is_bit_container(tag):  # its buffer holds bits (complex32): nothing computes on them
        raise UnsupportedDtypeError(tag)
    buf = next(inputs)
    spec = key[1]
    offset = 0 if spec.mode == strided.FULL else next(inputs)
    return strided.gather(buf, offset, spec)


def hashable(value: Any) -> Any:
    """A static argument as part of a cache key."""
    if isinstance(value, list):
        return tuple(hashable(v) for v in value)
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        raise TypeError("torchneuron: symbolic values reach the eager runtime only as concrete ints")
    return value


def canonical_key(key: Any) -> Any:
    """`key` with the size-1 dimensions' strides of its views made contiguous
    (strided.canonical): one key for calls that read and write the same elements."""
    if isinstance(key, strided.ViewSpec):
        return strided.canonical(key)
    if type(key) is tuple:
        return tuple(canonical_key(k) for k in key)
    return key


def arguments_key(plan: OpPlan, values: list) -> tuple[tuple, list]:
    """(key, inputs) of a call's bound values (schema order)."""
    for _ in range(3):
        flushes = fusion.STATS.flushes
        key, inputs = _gather(plan, values)
        if fusion.STATS.flushes == flushes or not fusion.any_pending(inputs):
            return key, inputs
        # Reading an argument ran the recorded trace (a storage read in another dtype than
        # it holds): the pending values gathered before it are stale; read them again.
    raise RuntimeError(f"torchneuron: {plan.name}: reading the arguments kept running the "
                       "recorded trace")


def _gather(plan: OpPlan, values: list) -> tuple[tuple, list]:
    key = []
    inputs: list = []
    host = False  # a 0-dim CPU tensor among the tensors (then no written argument may be one)
    # A call run by itself takes a number passed at its schema default as a constant, one
    # input less (plan.scalar_defaults); a recorded call keeps it an input (fused programs
    # pass their scalars packed, and compute as they did).
    defaults = plan.scalar_defaults if not fusion.recording() else itertools.repeat(None)
    for kind, value, default in zip(plan.kinds, values, defaults):
        if kind == STATIC:
            key.append(hashable(value))
        elif kind == GENERATOR:
            key.append(None)  # the draw is an executable input of its own
        elif kind == SCALAR:
            if value is None or is_default(value, default):
                key.append(None)  # read_arguments gives the lowering the default
            else:
                if isinstance(value, torch.Tensor):
                    value = value.item()
                key.append(type(value))
                inputs.append(value)
        elif kind == TENSOR:
            tkey = None if value is None else tensor_key(value, inputs)
            host = host or (tkey is not None and tkey[0] is HOST)
            key.append(tkey)
        elif kind == OPT_TENSOR_LIST:  # the indices of index/index_put
            key.append(tuple(None if v is None else tensor_key(_index_on_device(v), inputs)
                             for v in value))
        else:
            key.append(tuple(None if v is None else tensor_key(v, inputs) for v in value))
    if host:
        for i in plan.mutated:  # a 0-dim CPU tensor is no place to write (out=, self)
            if isinstance(values[i], torch.Tensor) and values[i].device.type != NEURON:
                raise device_mismatch(values[i].device)
    return tuple(key), inputs


def _index_on_device(index: torch.Tensor) -> torch.Tensor:
    """As CUDA does, advanced indexing takes CPU index tensors (and masks) and moves them to
    the device (0-dim ones are host scalars already)."""
    if isinstance(index, torch.Tensor) and index.device.type == "cpu" and index.dim():
        return index.to(NEURON)
    return index


def read_arguments(plan: OpPlan, key: tuple, inputs, static_values: list) -> list:
    """Inside the trace: the argument list with every tensor replaced by its jax value."""
    it = iter(inputs)
    values = []
    for kind, k, static, default in zip(plan.kinds, key, static_values, plan.scalar_defaults):
        if kind == STATIC:
            values.append(static)
        elif kind == GENERATOR:
            values.append(None)
        elif kind == SCALAR:
            values.append(default if k is None else next(it))
        elif kind == TENSOR:
            values.append(read_tensor(k, it))
        else:
            values.append([read_tensor(x, it) for x in k])
    return values
