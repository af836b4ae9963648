"""Ops that create values from sizes and scalars (the allocation itself is the runtime's)."""

from __future__ import annotations

import math
import warnings

import jax.numpy as jnp
import jax.scipy.special as jss
import torch
from jax import lax
from torch._prims_common import corresponding_complex_dtype

from .dtypes import cast, to_jax_dtype
from .registry import decomposes, lowers

aten = torch.ops.aten
prims = torch.ops.prims


def _dtype(dtype):
    return to_jax_dtype(dtype or torch.get_default_dtype())


@lowers(aten.full.default, static=("size",))
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, _dtype(dtype))


def _dense_here(args: dict) -> bool:
    """A `ones_like` call that makes a dense tensor on self's device; one asking for another
    device or layout takes the composite way (empty_like + fill_, below)."""
    device, layout = args.get("device"), args.get("layout")
    if device is not None:
        device, here = torch.device(device), args["self"].device
        if device.type != here.type or device.index not in (None, here.index):
            return False
    return layout in (None, torch.strided)


def _like_dtype(self, dtype):
    return to_jax_dtype(dtype) if dtype is not None else self.dtype


# Autograd's first gradient (`ones_like(loss)`) at every backward(): one recorded op, where the
# composite kernel made an empty tensor in Python and filled it (~25 us per call).
@lowers(aten.ones_like.default, only_when=_dense_here, signature_decides=_dense_here)
def ones_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(self.shape, _like_dtype(self, dtype))


@decomposes(aten.ones_like.default)
def _ones_like_elsewhere(self, *, dtype=None, layout=None, device=None, pin_memory=None,
                         memory_format=torch.preserve_format):
    return torch.empty_like(self, dtype=dtype, layout=layout, device=device,
                            pin_memory=pin_memory, memory_format=memory_format).fill_(1)


@lowers(aten.full_like.default, graph_only=True)
def full_like(self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None,
              memory_format=None):
    # Compiled graphs only: in eager mode full_like's composite kernel runs empty_like + fill_.
    return jnp.full(self.shape, fill_value, _like_dtype(self, dtype))


@lowers(aten._efficientzerotensor.default, static=("size",))
def efficientzerotensor(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    # Autograd's zero gradients (sgn's, ...): on this device an ordinary tensor of zeros.
    return jnp.zeros(tuple(size), _dtype(dtype))


@lowers(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s, _dtype(dtype))


@lowers(aten.arange.start_step, static=("start", "end", "step"))
def arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None:
        is_int = all(isinstance(v, int | bool) for v in (start, end, step))
        dtype = torch.int64 if is_int else torch.get_default_dtype()
    jdtype = to_jax_dtype(dtype)
    count = _arange_length(start, end, step)
    # Computed in float64/int64 then cast, as PyTorch does (start + i * step).
    wide = jnp.int64 if jnp.issubdtype(jdtype, jnp.integer) else jnp.float64
    return (start + jnp.arange(count, dtype=wide) * step).astype(jdtype)


_INT64_MAX = 2**63 - 1


def _arange_length(start, end, step) -> int:
    """The number of elements of arange(start, end, step), refusing what CPU refuses."""
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if not (math.isfinite(start) and math.isfinite(end)):
        raise RuntimeError(f"unsupported range: {start:g} -> {end:g}")
    if (step > 0 and end < start) or (step < 0 and end > start):
        raise RuntimeError("upper bound and lower bound inconsistent with step sign")
    size = math.ceil((end - start) / step)
    if size > _INT64_MAX:
        raise RuntimeError("invalid size, possible overflow?")
    return size


@lowers(aten.linspace.default, static=("start", "end", "steps"))
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    if dtype is None and any(isinstance(v, complex) for v in (start, end)):
        # Complex bounds make the default complex dtype, as on CPU (the imaginary parts were
        # dropped; logspace's decomposition calls linspace so and lost them too).
        dtype = corresponding_complex_dtype(torch.get_default_dtype())
    jdtype = _dtype(dtype)
    if steps == 1:
        return jnp.full((1,), start, jdtype)
    step = (end - start) / (steps - 1)
    idx = jnp.arange(steps, dtype=jnp.float64)
    # PyTorch fills the first half from `start` and the second half from `end` (symmetry).
    halfway = steps // 2
    values = jnp.where(idx < halfway, start + step * idx, end - step * (steps - 1 - idx))
    if jnp.issubdtype(jdtype, jnp.integer):
        values = jnp.trunc(values)
    return values.astype(jdtype)


@lowers(aten.logspace.default, static=("start", "end", "steps", "base"))
def logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None,
             pin_memory=None):
    """base ** linspace(start, end, steps). Real bounds: exponents and powers in float64,
    then cast, as PyTorch's decomposition does; integer dtypes truncate the bounds first.
    Complex bounds: computed in the complex dtype asked for (the decomposition uses the
    default complex dtype whatever is asked: complex128 came out with complex64's precision,
    and linspace dropped the imaginary parts)."""
    if any(isinstance(v, complex) for v in (start, end)):
        target = dtype or corresponding_complex_dtype(torch.get_default_dtype())
        compute = target
    else:
        target = dtype or torch.get_default_dtype()
        if not (target.is_floating_point or target.is_complex):
            start, end = int(start), int(end)
        compute = torch.float64
    exponents = linspace(start, end, steps, dtype=compute)
    powers = jnp.power(jnp.asarray(base, exponents.dtype), exponents)
    return powers.astype(to_jax_dtype(target))


@lowers(aten.eye.default, aten.eye.m, static=("n", "m"))
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, n if m is None else m, dtype=_dtype(dtype))


def _kaiser_window_meta(window_length, periodic=True, beta=12.0, *, dtype=None, layout=None,
                       device=None, pin_memory=None):
    # CPU's own argument checks (floating dtype, strided layout, length >= 0) on an empty
    # window; PyTorch's composite kernel would compute in a DispatchStub that only CPU and
    # CUDA implement ("DispatchStub: missing kernel for neuron").
    aten.kaiser_window.beta(min(window_length, 0), periodic, beta, dtype=dtype, layout=layout)
    return torch.empty(window_length, dtype=dtype or torch.get_default_dtype(), device="meta")


# The overloads without beta (12) or periodic (True) call the composite kernel directly.
@lowers(aten.kaiser_window.default, aten.kaiser_window.periodic, aten.kaiser_window.beta,
        static=("window_length", "periodic"), meta=_kaiser_window_meta)
def kaiser_window(window_length, periodic=True, beta=12.0, *, dtype=None, layout=None,
                  device=None, pin_memory=None):
    out = _dtype(dtype)
    if window_length <= 1:
        return jnp.ones((window_length,), out)
    n = window_length + 1 if periodic else window_length
    # As CPU's kernel: positions in the result dtype, the rest in its opmath type.
    compute = jnp.promote_types(out, jnp.float32)
    alpha = jnp.asarray((n - 1) / 2.0, compute)
    beta = jnp.asarray(beta, compute)
    position = jnp.arange(n, dtype=compute)
    if jnp.finfo(out).nmant < jnp.finfo(compute).nmant:
        # Positions rounded to a half/bfloat16 as CPU's are. A cast there and back would not
        # do it: XLA drops such round trips (excess precision allowed).
        info = jnp.finfo(out)
        position = lax.reduce_precision(position, exponent_bits=info.nexp, mantissa_bits=info.nmant)
    ratio = (position - alpha) / alpha
    window = jss.i0(beta * jnp.sqrt(jnp.abs(1 - ratio * ratio))) / jss.i0(beta)
    return window[:window_length].astype(out)


# ---- allocation and copies inside compiled graphs ------------------------------------------
# Eager mode runs these through the runtime's own kernels (runtime/handlers.py), which own
# storages; inside a graph a value has no storage, so allocation is a fresh array and a copy
# within the device is a dtype cast. Layout is not a value's property here: a graph's outputs
# are laid out in the strides of its fake tensors when the executable returns them.


@lowers(aten.empty.memory_format, static=("size",), graph_only=True)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    # Uninitialized memory in eager mode; zeros here (XLA removes them when overwritten).
    return jnp.zeros(tuple(size), _dtype(dtype))


@lowers(aten.empty_strided.default, static=("size", "stride"), graph_only=True)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _dtype(dtype))


@lowers(aten.empty_permuted.default, static=("size", "physical_layout"), graph_only=True)
def empty_permuted(size, physical_layout, *, dtype=None, layout=None, device=None,
                   pin_memory=None):
    return jnp.zeros(tuple(size), _dtype(dtype))


@lowers(aten._to_copy.default)
def to_copy(self, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None):
    # A dtype cast (`.float()`, `.to(torch.bfloat16)`). Inside one executable every value is
    # an XLA array, so a copy between the host and the device changes nothing here: the
    # graph's outputs are handed back on the device their fake tensors name.
    x = jnp.asarray(self)
    if dtype is None:
        return x  # values are immutable inside a trace: the copy is the value itself
    return _cast(x, dtype)


# PyTorch's own decompositions (torch._refs) cast with this prim; with dynamic shapes some of
# them reach the backend's graphs.
@lowers(prims.convert_element_type.default, graph_only=True)
def convert_element_type(a, dtype):
    return _cast(jnp.asarray(a), dtype)


def _cast(x, dtype):
    return cast(x, to_jax_dtype(dtype))


# ---- out= variants ---------------------------------------------------------------------
# CPU's kernels keep an out= tensor that already has the right number of elements, whatever
# its shape and strides, and fill it in its logical order (`arange(4., out=x.t())`); only
# one of another size is resized to 1-D. PyTorch's decompositions resize it to the 1-D shape.


def _fill_out(out: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    if out.numel() != values.numel():
        out.resize_(values.shape)
    return out.copy_(values.reshape(out.shape))


def _scalar(value):
    return value.item() if isinstance(value, torch.Tensor) else value


# Each calls the functional overload itself: `torch.arange(...)` would come back here
# through its composite kernel (arange.default -> arange.out).
@decomposes(aten.arange.out)
def arange_end_out(end, *, out):
    return arange_out(0, end, 1, out=out)


@decomposes(aten.arange.start_out)
def arange_out(start, end, step=1, *, out):
    start, end, step = _scalar(start), _scalar(end), _scalar(step)
    count = _arange_length(start, end, step)
    if out.numel() not in (0, count):
        # As CPU warns: a float step often gives one element more or less than expected.
        warnings.warn(f"The number of elements in the out tensor of shape {list(out.shape)} is "
                      f"{out.numel()} which does not match the computed number of elements "
                      f"{count}. Note that this may occur as a result of rounding error. The "
                      f"out tensor will be resized to a tensor of shape ({count},).",
                      UserWarning, stacklevel=2)
    floating = out.dtype.is_floating_point or out.dtype.is_complex
    if floating or all(isinstance(v, int | bool) for v in (start, end, step)):
        # The lowering's own formula, start + i * step in int64/float64 then cast, with only
        # the length static: `torch.arange(n, n + 1)` at every step of a generate() loop is
        # one program (start and step are traced), not one per start.
        wide = torch.float64 if floating else torch.int64
        index = aten.arange.start_step(0, count, 1, dtype=wide, device=out.device)
        values = (index * step + start).to(out.dtype)
    else:  # an integer result of fractional bounds: the lowering itself
        values = aten.arange.start_step(start, end, step, dtype=out.dtype, device=out.device)
    return _fill_out(out, values)


@decomposes(aten.linspace.out, aten.linspace.Tensor_Tensor_out, aten.linspace.Tensor_Scalar_out,
            aten.linspace.Scalar_Tensor_out)
def linspace_out(start, end, steps, *, out):
    return _fill_out(out, aten.linspace.default(_scalar(start), _scalar(end), steps,
                                                dtype=out.dtype, device=out.device))


@decomposes(aten.logspace.out, aten.logspace.Tensor_Tensor_out, aten.logspace.Tensor_Scalar_out,
            aten.logspace.Scalar_Tensor_out)
def logspace_out(start, end, steps, base=10.0, *, out):
    return _fill_out(out, aten.logspace.default(_scalar(start), _scalar(end), steps, base,
                                                dtype=out.dtype, device=out.device))
