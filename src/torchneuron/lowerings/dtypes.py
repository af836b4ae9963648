"""torch dtype <-> JAX dtype, and the PyTorch type-promotion helpers lowerings share."""

from __future__ import annotations

import platform

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import torch
from jax import lax

TORCH_TO_JAX: dict[torch.dtype, np.dtype] = {
    torch.bool: np.dtype(np.bool_),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.uint16: np.dtype(np.uint16),
    torch.uint32: np.dtype(np.uint32),
    torch.uint64: np.dtype(np.uint64),
    torch.float16: np.dtype(np.float16),
    torch.bfloat16: np.dtype(ml_dtypes.bfloat16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
    torch.complex64: np.dtype(np.complex64),
    torch.complex128: np.dtype(np.complex128),
    torch.float8_e4m3fn: np.dtype(ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: np.dtype(ml_dtypes.float8_e5m2),
}
JAX_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in TORCH_TO_JAX.items()}


class UnsupportedDtypeError(TypeError):
    """A dtype the device cannot compute in. For one it stores (complex32) the runtime runs
    the call on CPU instead."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__(f"torchneuron: dtype {dtype} is not supported on the neuron device")
        self.dtype = dtype


def to_jax_dtype(dtype: torch.dtype) -> np.dtype:
    try:
        return TORCH_TO_JAX[dtype]
    except KeyError:
        raise UnsupportedDtypeError(dtype) from None


# complex32 (chalf) has no JAX type: the device stores its values as their bits, one 32-bit
# word per element, which copies, views and layout changes move unchanged; ops that compute
# on complex32 run on CPU.
_BIT_CONTAINERS = {torch.complex32: np.dtype(np.uint32)}


def buffer_dtype(dtype: torch.dtype) -> np.dtype:
    """The element type of a storage buffer holding `dtype` values."""
    container = _BIT_CONTAINERS.get(dtype)
    return container if container is not None else to_jax_dtype(dtype)


def is_bit_container(dtype: torch.dtype) -> bool:
    """Whether the device holds `dtype` as bits only (no arithmetic: ops run on CPU)."""
    return dtype in _BIT_CONTAINERS


def to_torch_dtype(dtype) -> torch.dtype:
    return JAX_TO_TORCH[np.dtype(dtype)]


_SCALAR_TYPE_NAMES = {
    torch.bool: "Bool", torch.uint8: "Byte", torch.int8: "Char", torch.int16: "Short",
    torch.int32: "Int", torch.int64: "Long", torch.float16: "Half", torch.bfloat16: "BFloat16",
    torch.float32: "Float", torch.float64: "Double", torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble", torch.uint16: "UInt16", torch.uint32: "UInt32",
    torch.uint64: "UInt64",
}


def scalar_type_name(dtype) -> str:
    """PyTorch's C++ name of a dtype (torch or JAX), as its error messages write it ("Float")."""
    if not isinstance(dtype, torch.dtype):
        dtype = to_torch_dtype(dtype)
    return _SCALAR_TYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def not_implemented_for(kernel: str, dtype) -> NotImplementedError:
    """CPU's error for a kernel that is not dispatched over `dtype`."""
    return NotImplementedError(f'"{kernel}" not implemented for \'{scalar_type_name(dtype)}\'')


def default_float() -> np.dtype:
    return TORCH_TO_JAX[torch.get_default_dtype()]


def float_or_default(x):
    """Cast integral/bool arrays to PyTorch's default float dtype (int-to-float promotion)."""
    return x if jnp.issubdtype(x.dtype, jnp.inexact) else x.astype(default_float())


def lowest_value(dtype) -> jnp.ndarray:
    """The smallest value of `dtype` (-inf for floats): the neutral element of a max."""
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(-jnp.inf, dtype)
    if dtype == jnp.bool_:
        return jnp.array(False)
    return jnp.array(jnp.iinfo(dtype).min, dtype)


# Out-of-range float-to-integer conversion is undefined in C++; PyTorch's CPU kernels give
# what the host's instruction gives, and casts to the narrower types go through int32 and keep
# its low bits. x86's truncating conversions return the "integer indefinite" value (the type's
# minimum) for NaN and out-of-range inputs; Arm's saturate and give 0 for NaN, as XLA's
# conversions do. uint32/uint64 are left to XLA: CPU's vectorized and scalar paths disagree.
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")
_THROUGH_INT32 = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32))


def cast(x: jnp.ndarray, target) -> jnp.ndarray:
    """`x.astype(target)` with the values PyTorch's CPU kernels give: a complex value to a real
    type keeps its real part; a float to an integer type converts as the host CPU does."""
    target = np.dtype(target)
    if jnp.iscomplexobj(x) and not jnp.issubdtype(target, jnp.complexfloating):
        x = jnp.real(x)  # PyTorch drops the imaginary part (with a warning, at trace time)
    if x.dtype == np.bool_ and jnp.issubdtype(target, jnp.inexact):
        return _bool_to_float(x, target)
    if jnp.issubdtype(x.dtype, jnp.floating) and (target in _THROUGH_INT32 or target == np.int64):
        wide = np.dtype(np.int64) if target == np.int64 else np.dtype(np.int32)
        converted = x.astype(wide)
        if _X86:
            if x.dtype.itemsize < 4:
                x = x.astype(np.float32)  # exactly; the bounds overflow half and bfloat16
            # [-2^31, 2^31) (or 2^63): both bounds are exact in float32/64; NaN fails both
            lowest = np.iinfo(wide).min
            in_range = (x >= float(lowest)) & (x < -float(lowest))
            converted = jnp.where(in_range, converted, jnp.asarray(lowest, wide))
        x = converted
    return x.astype(target)


def _bool_to_float(x: jnp.ndarray, target: np.dtype) -> jnp.ndarray:
    """A bool array as 0.0/1.0 of a floating (or complex) type, built from the bits of 1.0:
    XLA rewrites `convert(bool) * y` into `select(bool, y, 0)`, which makes `False * nan` 0
    where PyTorch gives nan (`float_tensor * bool_mask`, xlogy of a bool tensor)."""
    real = np.dtype(target.type(0).real.dtype) if jnp.issubdtype(target, jnp.complexfloating) \
        else target
    bits = np.dtype(f"uint{real.itemsize * 8}")
    one = np.array(1, real).view(bits)
    value = lax.bitcast_convert_type(x.astype(bits) * one, real)
    return value.astype(target) if real != target else value

