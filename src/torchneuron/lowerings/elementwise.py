"""Pointwise math, comparisons, logic and activations.

Inputs arrive already promoted to PyTorch's computation dtype (`promote=`); the runtime casts
results to the dtype PyTorch's meta kernel reports, so these functions only say what is computed.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .dtypes import not_implemented_for
from .registry import Promotion, decomposes
from .registry import lowers as _register

aten = torch.ops.aten

_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))

# Pointwise ops compute half and bfloat16 in float32 and round once, as CPU's kernels do
# (`opmath`), unless registered with opmath=False: ops whose result depends on the format
# itself (nextafter's neighbour, frexp's bits, nan_to_num's largest finite value), ops that
# only move values (nothing to round; a float32 detour would round a fill value twice), and
# ops that reproduce CPU's per-step half rounding themselves.
lowers = functools.partial(_register, opmath=True)


def _erfinv(x):
    # JAX's float32 erfinv is a single-precision polynomial, off by up to ~100 ulp near +-1
    # (amplified by erfinv's backward, exp(erfinv(x)**2)); CPU refines its approximation with
    # Newton steps. Computing in float64 and rounding matches CPU to within an ulp.
    if x.dtype in (jnp.float32, jnp.float16, jnp.bfloat16):
        return jax.scipy.special.erfinv(x.astype(jnp.float64)).astype(x.dtype)
    return jax.scipy.special.erfinv(x)


def _exp2(x):
    """2**x exact at whole x, as CPU's exp2: XLA computes exp(x * ln 2), which gives
    15.999999999999998 for 2**4 (and logspace's integer results truncate it to 15)."""
    if not jnp.issubdtype(x.dtype, jnp.floating) or x.dtype in (jnp.float16, jnp.bfloat16):
        return jnp.exp2(x)  # complex; half types (computed in float32 and rounded)
    whole = jnp.round(x)
    finite = jnp.isfinite(x)
    # |x| beyond the exponent range saturates to inf or 0 all the same
    limit = 2 * jnp.finfo(x.dtype).maxexp
    n = jnp.clip(jnp.where(finite, whole, 0), -limit, limit).astype(jnp.int32)
    exact = jnp.ldexp(jnp.exp2(x - whole), n)
    return jnp.where(finite, exact, jnp.exp2(x))


def _unary(op_packet, fn, promote=Promotion.INT_TO_FLOAT, overloads=("default",)):
    ops = [getattr(op_packet, o) for o in overloads]
    lowers(*ops, promote=promote)(lambda x: fn(x))


# ---- unary float math ------------------------------------------------------------------
for _name, _fn in {
    "exp": jnp.exp, "exp2": _exp2, "expm1": jnp.expm1, "log": jnp.log, "log2": jnp.log2,
    "log10": jnp.log10, "log1p": jnp.log1p, "sqrt": jnp.sqrt, "rsqrt": lax.rsqrt,
    "sin": jnp.sin, "cos": jnp.cos, "tan": jnp.tan, "asin": jnp.arcsin, "acos": jnp.arccos,
    "atan": jnp.arctan, "sinh": jnp.sinh, "cosh": jnp.cosh, "tanh": jnp.tanh,
    "asinh": jnp.arcsinh, "acosh": jnp.arccosh, "atanh": jnp.arctanh,
    "sigmoid": jax.nn.sigmoid, "erf": jax.scipy.special.erf, "erfc": jax.scipy.special.erfc,
    "erfinv": lambda x: _erfinv(x), "lgamma": jax.scipy.special.gammaln,
    "reciprocal": lambda x: 1 / x,
    "i0": jax.scipy.special.i0, "sinc": jnp.sinc,
}.items():
    _unary(getattr(aten, _name), _fn)

for _name, _fn in {
    "neg": jnp.negative, "abs": jnp.abs, "sign": lambda x: x if x.dtype == jnp.bool_ else jnp.sign(x), "square": jnp.square,
    "bitwise_not": lambda x: jnp.logical_not(x) if x.dtype == jnp.bool_ else jnp.invert(x),
}.items():
    _unary(getattr(aten, _name), _fn, promote=Promotion.DEFAULT)


def _rounder(fn):
    # Integers are already whole: PyTorch returns them unchanged.
    return lambda x: x if not jnp.issubdtype(x.dtype, jnp.inexact) else fn(x)


for _op, _fn in {
    aten.ceil.default: jnp.ceil, aten.floor.default: jnp.floor, aten.trunc.default: jnp.trunc,
    aten.round.default: jnp.round, aten.frac.default: lambda x: x - jnp.trunc(x),
}.items():
    lowers(_op, promote=Promotion.DEFAULT)(_rounder(_fn))


@lowers(aten.round.decimals, promote=Promotion.DEFAULT, static=("decimals",))
def round_decimals(x, *, decimals=0):
    scale = 10.0 ** decimals
    return jnp.round(x * scale) / scale


@lowers(aten.signbit.default, promote=Promotion.DEFAULT)
def signbit(x):
    return jnp.signbit(x)


@lowers(aten.sgn.default, promote=Promotion.DEFAULT)
def sgn(x):
    if x.dtype == jnp.bool_:
        return x
    if jnp.iscomplexobj(x):
        mag = jnp.abs(x)
        return jnp.where(mag == 0, 0, x / jnp.where(mag == 0, 1, mag))
    return jnp.sign(x)


@lowers(aten.isnan.default)
def isnan(x):
    return jnp.isnan(x)


@lowers(aten.isinf.default)
def isinf(x):
    return jnp.isinf(x)


@lowers(aten.isfinite.default)
def isfinite(x):
    return jnp.isfinite(x) if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.ones(x.shape, bool)


@lowers(aten.logical_not.default)
def logical_not(x):
    return jnp.logical_not(x)


@lowers(aten.logit.default, static=("eps",), opmath=False)
def logit(self, eps=None):
    # CPU's logit kernel computes in the tensor's own type: for half/bfloat16 every step
    # (1 - x, the division, the log) rounds to that type, eps is rounded to it and the upper
    # clamp bound is 1 - eps in that type. Each step below is computed in float32 (exact for
    # the subtraction, correctly rounded for the division) and rounded, which reproduces it.
    # (No promote=: it would hand half tensors over already in float32.)
    if not jnp.issubdtype(self.dtype, jnp.floating):
        self = self.astype(jnp.float32)  # integers and bool: the default float type
    dtype = self.dtype
    wide = jnp.float32 if dtype in _HALF else dtype

    def step(v):
        return v.astype(dtype)

    x = self
    if eps is not None and eps >= 0:  # None, a negative or a NaN eps: no clamp
        lo = jnp.asarray(eps, dtype)
        hi = step(1 - lo.astype(wide))
        x = jnp.where(x < lo, lo, jnp.where(x > hi, hi, x))
    denominator = step(1 - x.astype(wide))
    ratio = step(x.astype(wide) / denominator.astype(wide))
    return step(jnp.log(ratio.astype(wide)))


# ---- binary arithmetic -----------------------------------------------------------------


def _addition_meta(x, y, alpha=1):
    # PyTorch's meta kernel checks alpha's type for integer results only; CPU's alpha_check
    # rejects a float alpha for a bool result too, and a bool alpha for other results. (The runtime counts alpha among the
    # promotion operands, so the lowering sees float tensors and cannot tell.)
    result = torch.result_type(x, y)
    if isinstance(alpha, bool) and result != torch.bool:
        raise RuntimeError("Boolean alpha only supported for Boolean results.")
    if isinstance(alpha, float) and result == torch.bool:
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating "
                           "point number.")
    op = aten.add.Tensor if isinstance(y, torch.Tensor) else aten.add.Scalar
    return op(x, y, alpha=alpha)


@lowers(aten.add.Tensor, aten.add.Scalar, promote=Promotion.DEFAULT, meta=_addition_meta)
def add(x, y, alpha=1):
    if x.dtype == jnp.bool_ and jnp.asarray(y).dtype == jnp.bool_:
        # CPU computes x + bool(alpha) * y in bool: x or (y and alpha).
        if _is_one(alpha):
            return jnp.logical_or(x, y)
        return jnp.logical_or(x, jnp.logical_and(y, jnp.asarray(alpha) != 0))
    return x + y * alpha if not _is_one(alpha) else x + y


def _is_bool(v) -> bool:
    return v.dtype == torch.bool if isinstance(v, torch.Tensor) else isinstance(v, bool)


_BOOL_SUBTRACTION = ("Subtraction, the `-` operator, with two bool tensors is not supported. "
                     "Use the `^` or `logical_xor()` operator instead.")


def _subtraction_meta(tensor_op, scalar_op):
    """PyTorch's meta kernels reject bool - bool only; CPU rejects any bool operand."""

    def meta(x, y, alpha=1):
        if _is_bool(x) and _is_bool(y):
            raise RuntimeError(_BOOL_SUBTRACTION)
        if _is_bool(x) or _is_bool(y):
            raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not "
                               "supported. If you are trying to invert a mask, use the `~` or "
                               "`logical_not()` operator instead.")
        op = tensor_op if isinstance(y, torch.Tensor) else scalar_op
        return op(x, y, alpha=alpha)

    return meta


@lowers(aten.sub.Tensor, aten.sub.Scalar, promote=Promotion.DEFAULT,
        meta=_subtraction_meta(aten.sub.Tensor, aten.sub.Scalar))
# In place too, for CPU's bool checks (a bool scalar operand: x.sub_(True) is refused); the
# in-place meta kernel does the rest (the result must cast to self's dtype).
@lowers(aten.sub_.Tensor, aten.sub_.Scalar, promote=Promotion.DEFAULT,
        meta=_subtraction_meta(aten.sub_.Tensor, aten.sub_.Scalar))
def sub(x, y, alpha=1):
    _refuse_bool_subtraction(x)
    return x - y * alpha if not _is_one(alpha) else x - y


@lowers(aten.rsub.Tensor, aten.rsub.Scalar, promote=Promotion.DEFAULT,
        meta=_subtraction_meta(aten.rsub.Tensor, aten.rsub.Scalar))
def rsub(x, y, alpha=1):
    _refuse_bool_subtraction(x)
    return y - x * alpha if not _is_one(alpha) else y - x


def _refuse_bool_subtraction(x) -> None:
    # Promoted operands: bool only when both were. In-place overloads (x.sub_(True),
    # _foreach_sub_) run PyTorch's meta kernel of their own, which lets a bool scalar pass.
    if jnp.asarray(x).dtype == jnp.bool_:
        raise RuntimeError(_BOOL_SUBTRACTION)


def _is_one(value) -> bool:
    return isinstance(value, int | float) and value == 1


@lowers(aten.mul.Tensor, aten.mul.Scalar, promote=Promotion.DEFAULT)
def mul(x, y):
    if x.dtype == jnp.bool_:
        return jnp.logical_and(x, y)
    return x * y


@lowers(aten.div.Tensor, aten.div.Scalar, promote=Promotion.INT_TO_FLOAT)
# true_divide: as for bitwise_and.Scalar_Tensor below, only Dynamo's symbolic-scalar pass
# leaves it in a graph.
@lowers(aten.true_divide.Tensor, promote=Promotion.INT_TO_FLOAT, graph_only=True)
def div(x, y):
    return x / y


@lowers(aten.div.Tensor_mode, aten.div.Scalar_mode, promote=Promotion.DEFAULT, static=("rounding_mode",))
def div_mode(x, y, *, rounding_mode=None):
    if rounding_mode is None:
        return x / y
    if jnp.issubdtype(x.dtype, jnp.integer):
        if rounding_mode == "floor":
            return jnp.floor_divide(x, y)
        q = lax.div(x, jnp.asarray(y, x.dtype))  # C-style: truncates toward zero
        return q
    q = x / y
    return jnp.floor(q) if rounding_mode == "floor" else jnp.trunc(q)


@lowers(aten.floor_divide.default, aten.floor_divide.Scalar, promote=Promotion.DEFAULT)
def floor_divide(x, y):
    if jnp.issubdtype(x.dtype, jnp.integer):
        return jnp.floor_divide(x, y)
    return jnp.floor(x / y)


@lowers(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor, promote=Promotion.DEFAULT)
def remainder(x, y):
    return jnp.remainder(x, y)


@lowers(aten.fmod.Tensor, aten.fmod.Scalar, promote=Promotion.DEFAULT)
def fmod(x, y):
    return jnp.fmod(x, y)


def _integer_pow(x, y):
    """PyTorch's integer pow: square-and-multiply wrapping in the integer type; a negative
    exponent gives 0, except for bases 1 and -1 (1 and +-1 by the exponent's parity)."""
    dtype = jnp.result_type(x, y)
    x, y = jnp.broadcast_arrays(jnp.asarray(x, dtype), jnp.asarray(y, dtype))
    bits = jnp.iinfo(dtype).bits

    def step(_, carry):
        result, base, e = carry
        result = jnp.where((e & 1) == 1, result * base, result)
        return result, base * base, e >> 1

    e = jnp.where(y < 0, jnp.zeros_like(y), y)
    result, _, _ = lax.fori_loop(0, bits, step, (jnp.ones_like(x), x, e))
    if jnp.issubdtype(dtype, jnp.signedinteger):
        odd = (y & 1) == 1
        negative = jnp.where(x == 1, 1, jnp.where(x == -1, jnp.where(odd, -1, 1), 0))
        result = jnp.where(y < 0, negative.astype(dtype), result)
    return result


def _not_integer_base(a: dict) -> bool:
    return a["self"].dtype.is_floating_point or a["self"].dtype.is_complex


def _power_allowed(a: dict) -> bool:
    # CPU refuses an integer (or bool) tensor to a negative Python int power; the exponent is
    # traced, so this is checked per call (integer bases never take the C++ fast path).
    exponent = a["exponent"]
    return _not_integer_base(a) or not (isinstance(exponent, int) and exponent < 0)


@decomposes(aten.pow.Tensor_Scalar)
def pow_refused(self, exponent):
    """The calls `_power_allowed` turns away."""
    raise RuntimeError("Integers to negative integer powers are not allowed.")


# CPU's complex pow to these Python-number exponents runs its own kernels (fill, copy, sqrt,
# products, reciprocal) instead of std::pow; they differ where values overflow.
_COMPLEX_POWERS = (
    (0.0, jnp.ones_like), (1.0, lambda x: x), (0.5, jnp.sqrt), (2.0, lambda x: x * x),
    (3.0, lambda x: x * x * x), (-0.5, lax.rsqrt), (-1.0, lambda x: 1 / x),
    (-2.0, lambda x: 1 / (x * x)),
)


@lowers(aten.pow.Tensor_Scalar, promote=Promotion.DEFAULT, only_when=_power_allowed,
        signature_decides=_not_integer_base)
def pow_tensor_scalar(x, y):
    if not jnp.iscomplexobj(x):
        return pow_(x, y)
    result = _complex_pow(x, y)
    for value, special in reversed(_COMPLEX_POWERS):  # y is traced: choose by value
        result = jnp.where(y == value, special(x), result)
    return result


def _complex_pow(x, y):
    # CPU's std::pow of complex numbers is exp(y * log(x)) (glibc's cpow). XLA's complex
    # power squares |x| first, which overflows for large finite x.
    # At x = 0, C's complex product and exp (Annex G) make log(0) = -inf give 0 for
    # Re(y) > 0 and (inf, nan) for Re(y) < 0, where XLA's give NaN.
    x = jnp.asarray(x)
    dtype = jnp.result_type(x, y)
    general = jnp.exp(y * jnp.log(x)).astype(dtype)
    re_y = jnp.real(y)
    at_zero = jnp.where(re_y > 0, jnp.zeros((), dtype),
                        lax.complex(jnp.inf, jnp.nan).astype(dtype))
    return jnp.where((x == 0) & (re_y != 0), at_zero, general)


@lowers(aten.pow.Tensor_Tensor, aten.pow.Scalar, promote=Promotion.DEFAULT)
def pow_(x, y):
    x = jnp.asarray(x)
    if jnp.iscomplexobj(x) or jnp.iscomplexobj(jnp.asarray(y)):
        return _complex_pow(x, y)
    if jnp.asarray(y).dtype == jnp.bool_:  # a bool exponent is 0 or 1: x or 1, in x's dtype
        return jnp.where(y, x, jnp.ones_like(x))
    y_integer = isinstance(y, int) or (not isinstance(y, float)
                                       and jnp.issubdtype(jnp.asarray(y).dtype, jnp.integer))
    # Integer semantics only when both are integers: pow.Scalar (`10 ** float_tensor`, as
    # logspace computes) passes an integer base with a floating exponent.
    if jnp.issubdtype(x.dtype, jnp.integer) and y_integer:
        if isinstance(y, int) and y >= 0:
            return lax.integer_pow(x, y)
        return _integer_pow(x, y)
    if jnp.issubdtype(x.dtype, jnp.integer):
        x = x.astype(jnp.asarray(y).dtype)
    return jnp.power(x, y)


def _gcd(x, y):
    """CPU's Euclid in the integer type (C remainder; |INT_MIN| stays negative), with a fixed
    number of steps: jnp.gcd loops forever on INT_MIN."""
    dtype = jnp.result_type(x, y)
    a, b = jnp.broadcast_arrays(jnp.abs(jnp.asarray(x, dtype)), jnp.abs(jnp.asarray(y, dtype)))

    def step(_, carry):
        a, b = carry
        nonzero = a != 0
        rem = lax.rem(b, jnp.where(nonzero, a, jnp.ones_like(a)))
        return jnp.where(nonzero, rem, a), jnp.where(nonzero, a, b)

    # Euclid takes at most log_phi(2**bits) + 2 steps.
    steps = jnp.iinfo(dtype).bits * 3 // 2 + 3
    return lax.fori_loop(0, steps, step, (a, b))[1]


@lowers(aten.gcd.default, promote=Promotion.DEFAULT)
def gcd(x, y):
    return _gcd(x, y)


@lowers(aten.lcm.default, promote=Promotion.DEFAULT)
def lcm(x, y):
    # CPU: |x / gcd * y| (0 when gcd is 0) in C++ arithmetic: 8/16-bit types are promoted
    # to int first, so the product wraps only when cast back.
    dtype = jnp.result_type(x, y)
    g = _gcd(x, y)
    wide = jnp.int32 if jnp.iinfo(dtype).bits < 32 else dtype
    x, y, g = (jnp.asarray(v).astype(wide) for v in (x, y, g))
    return jnp.abs(jnp.where(g == 0, 0, lax.div(x, jnp.where(g == 0, 1, g)) * y)).astype(dtype)


@lowers(aten.float_power.Tensor_Tensor, aten.float_power.Tensor_Scalar,
        aten.float_power.Scalar)
def float_power(x, y):
    dtype = jnp.complex128 if jnp.iscomplexobj(x) or jnp.iscomplexobj(y) else jnp.float64
    return jnp.power(jnp.asarray(x, dtype), jnp.asarray(y, dtype))


@lowers(aten.atan2.default, promote=Promotion.INT_TO_FLOAT)
def atan2(x, y):
    return jnp.arctan2(x, y)


@lowers(aten.hypot.default, promote=Promotion.DEFAULT)
def hypot(x, y):
    return jnp.hypot(x, y)


@lowers(aten.heaviside.default, opmath=False)
def heaviside(x, values):
    # No promotion: CPU requires one dtype (PyTorch's decomposition checked nothing, so
    # heaviside, heaviside_ and out= computed where CPU raises).
    if jnp.iscomplexobj(x) or jnp.iscomplexobj(values):
        raise RuntimeError("heaviside is not yet implemented for complex tensors.")
    if x.dtype != jnp.asarray(values).dtype:
        raise RuntimeError("heaviside is not yet implemented for tensors with different dtypes.")
    return jnp.where(x == 0, values, (x > 0).astype(x.dtype))


@lowers(aten.copysign.Tensor, aten.copysign.Scalar, promote=Promotion.INT_TO_FLOAT)
def copysign(x, y):
    return jnp.copysign(x, y)


@lowers(aten.nextafter.default, promote=Promotion.DEFAULT, opmath=False)
def nextafter(x, y):
    return jnp.nextafter(x, y)


@lowers(aten.logaddexp.default, promote=Promotion.DEFAULT)
def logaddexp(x, y):
    if jnp.iscomplexobj(x) or jnp.iscomplexobj(y):
        return _complex_logaddexp(x, y)
    return jnp.logaddexp(x, y)


def _complex_logaddexp(x, y):
    """CPU's complex formula: max + log1p(exp(min - max)), ordered by real part. Its imaginary
    part is max's plus a principal angle (not wrapped into (-pi, pi] as log(exp + exp) is)."""
    x, y = jnp.broadcast_arrays(jnp.asarray(x), jnp.asarray(y))
    x_first = x.real < y.real
    lo, hi = jnp.where(x_first, x, y), jnp.where(x_first, y, x)
    out = jnp.log1p(jnp.exp(lo - hi)) + hi
    both_inf = ~jnp.isfinite(lo.real) & (lo.real == hi.real)
    out = jnp.where(both_inf, jnp.where(lo.real < 0, lo, jnp.log(jnp.exp(lo) + jnp.exp(hi))), out)
    nan = jnp.isnan(x) | jnp.isnan(y)
    return jnp.where(nan, jnp.asarray(complex(jnp.nan, jnp.nan), out.dtype), out)


@lowers(aten.logaddexp2.default, promote=Promotion.DEFAULT)
def logaddexp2(x, y):
    return jnp.logaddexp2(x, y)


@lowers(aten.xlogy.Tensor, aten.xlogy.Scalar_Self, aten.xlogy.Scalar_Other, promote=Promotion.INT_TO_FLOAT)
def xlogy(x, y):
    return jax.scipy.special.xlogy(x, y)


def _no_complex(name: str, x) -> None:
    # Inputs arrive promoted: a complex operand makes both complex. CPU has no ordering of
    # complex numbers (jnp orders them lexicographically).
    if jnp.iscomplexobj(x):
        raise RuntimeError(f"{name} not implemented for complex tensors.")


@lowers(aten.maximum.default, promote=Promotion.DEFAULT)
def maximum(x, y):
    _no_complex("maximum", x)
    return jnp.maximum(x, y)  # propagates NaN like torch.maximum


@lowers(aten.minimum.default, promote=Promotion.DEFAULT)
def minimum(x, y):
    _no_complex("minimum", x)
    return jnp.minimum(x, y)


@lowers(aten.fmax.default, promote=Promotion.DEFAULT)
def fmax(x, y):
    _no_complex("fmax", x)
    return jnp.fmax(x, y)


@lowers(aten.fmin.default, promote=Promotion.DEFAULT)
def fmin(x, y):
    _no_complex("fmin", x)
    return jnp.fmin(x, y)


# ---- bitwise / logical -----------------------------------------------------------------


def _bitwise(fn_bool, fn_int):
    def lower(x, y):
        x, y = jnp.asarray(x), jnp.asarray(y)
        if x.dtype == jnp.bool_:
            return fn_bool(x, y)
        return fn_int(x, y)

    return lower


for _name, _logical, _bits in (("bitwise_and", jnp.logical_and, jnp.bitwise_and),
                                ("bitwise_or", jnp.logical_or, jnp.bitwise_or),
                                ("bitwise_xor", jnp.logical_xor, jnp.bitwise_xor)):
    _packet, _kernel = getattr(aten, _name), _bitwise(_logical, _bits)
    lowers(_packet.Tensor, _packet.Scalar, promote=Promotion.DEFAULT)(_kernel)
    # (Scalar, Tensor): eager mode reaches it through its composite kernel; compiled graphs
    # get it from Dynamo's pass that turns symbolic Python scalars into 0-d tensors.
    lowers(_packet.Scalar_Tensor, promote=Promotion.DEFAULT, graph_only=True)(_kernel)


@lowers(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
        aten.__lshift__.Tensor, aten.__lshift__.Scalar, promote=Promotion.DEFAULT)
def left_shift(x, y):
    bits = jnp.iinfo(x.dtype).bits
    y = jnp.asarray(y, x.dtype)
    return jnp.where((y >= bits) | (y < 0), jnp.zeros_like(x), jnp.left_shift(x, y))


@lowers(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
        aten.__rshift__.Tensor, aten.__rshift__.Scalar, promote=Promotion.DEFAULT)
def right_shift(x, y):
    # CPU: a shift past the width (or a negative one, for signed types) fills with the sign
    # bit (0 for unsigned types); clipping a negative shift to 0 returned x unchanged.
    bits = jnp.iinfo(x.dtype).bits
    y = jnp.asarray(y, x.dtype)
    shifted = jnp.right_shift(x, jnp.clip(y, 0, bits - 1))
    if jnp.issubdtype(x.dtype, jnp.unsignedinteger):
        return jnp.where(y >= bits, jnp.zeros_like(x), shifted)
    return jnp.where((y < 0) | (y >= bits), jnp.right_shift(x, bits - 1), shifted)


@lowers(aten.logical_and.default, promote=Promotion.DEFAULT)
def logical_and(x, y):
    return jnp.logical_and(x, y)


@lowers(aten.logical_or.default, promote=Promotion.DEFAULT)
def logical_or(x, y):
    return jnp.logical_or(x, y)


@lowers(aten.logical_xor.default, promote=Promotion.DEFAULT)
def logical_xor(x, y):
    return jnp.logical_xor(x, y)


# ---- comparisons -----------------------------------------------------------------------
def _comparison(name: str, fn):
    ordering = name not in ("eq", "ne")

    def compare(x, y):
        if ordering and jnp.iscomplexobj(x):  # complex numbers have no order: CPU refuses
            raise not_implemented_for(f"{name}_cpu", jnp.asarray(x).dtype)
        return fn(x, y)

    return compare


for _name, _fn in {
    "eq": jnp.equal, "ne": jnp.not_equal, "lt": jnp.less, "le": jnp.less_equal,
    "gt": jnp.greater, "ge": jnp.greater_equal,
}.items():
    _packet = getattr(aten, _name)
    lowers(_packet.Tensor, _packet.Scalar, promote=Promotion.DEFAULT)(_comparison(_name, _fn))


# ---- ternary / selection ---------------------------------------------------------------


@lowers(aten.where.self, opmath=False)
def where(condition, x, y):
    dtype = jnp.result_type(x, y)
    return jnp.where(condition, x.astype(dtype), y.astype(dtype))


@lowers(aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar, opmath=False)
def where_scalar(condition, x, y):
    return jnp.where(condition, x, y)


@lowers(aten.clamp.default, aten.clamp.Tensor, promote=Promotion.DEFAULT)
def clamp(x, min=None, max=None):
    if min is not None:
        x = jnp.where(jnp.isnan(x) if jnp.issubdtype(x.dtype, jnp.inexact) else False, x, jnp.maximum(x, min))
        if jnp.issubdtype(jnp.asarray(min).dtype, jnp.inexact):
            x = jnp.where(jnp.isnan(min), min, x)
    if max is not None:
        x = jnp.where(jnp.isnan(x) if jnp.issubdtype(x.dtype, jnp.inexact) else False, x, jnp.minimum(x, max))
        if jnp.issubdtype(jnp.asarray(max).dtype, jnp.inexact):
            x = jnp.where(jnp.isnan(max), max, x)
    return x


@lowers(aten.clamp_min.default, aten.clamp_min.Tensor, promote=Promotion.DEFAULT)
def clamp_min(x, min):
    return clamp(x, min, None)


@lowers(aten.clamp_max.default, aten.clamp_max.Tensor, promote=Promotion.DEFAULT)
def clamp_max(x, max):
    return clamp(x, None, max)


@lowers(aten.lerp.Scalar, aten.lerp.Tensor, promote=Promotion.DEFAULT)
def lerp(start, end, weight):
    # PyTorch's formula: exact at weight 0 and 1 and stable on both halves.
    diff = end - start
    return jnp.where(jnp.abs(weight) < 0.5, start + weight * diff, end - diff * (1 - weight))


@lowers(aten.addcmul.default, promote=Promotion.DEFAULT)
def addcmul(x, t1, t2, *, value=1):
    return x + value * t1 * t2


@lowers(aten.addcdiv.default, promote=Promotion.DEFAULT)
def addcdiv(x, t1, t2, *, value=1):
    return x + value * (t1 / t2)


@lowers(aten.nan_to_num.default, static=("nan", "posinf", "neginf"), opmath=False)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x
    return jnp.nan_to_num(x, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


@lowers(aten.fill.Scalar, aten.fill.Tensor, opmath=False)
def fill(x, value):
    return jnp.full(x.shape, value, x.dtype)


@lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor, opmath=False)
def masked_fill(x, mask, value):
    return jnp.where(mask, jnp.asarray(value).astype(x.dtype), x)


@lowers(aten.zero.default, opmath=False)
def zero(x):
    return jnp.zeros(x.shape, x.dtype)


@lowers(aten.clone.default, opmath=False)
def clone(x, *, memory_format=None):
    return x


@lowers(aten.conj_physical.default, opmath=False)
def conj(x):
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


@lowers(aten.real.default, opmath=False)
def real(x):
    return jnp.real(x)


@lowers(aten.imag.default, opmath=False)
def imag(x):
    return jnp.imag(x)


@lowers(aten.angle.default, promote=Promotion.INT_TO_FLOAT)
def angle(x):
    if jnp.iscomplexobj(x):
        return jnp.angle(x)
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0.0).astype(x.dtype))


# ---- activations -----------------------------------------------------------------------


@lowers(aten.relu.default)
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype)) if x.dtype != jnp.bool_ else x


@lowers(aten.threshold.default)
def threshold(x, threshold, value):
    return jnp.where(x <= threshold, jnp.asarray(value, x.dtype), x)


@lowers(aten.threshold_backward.default)
def threshold_backward(grad_output, x, threshold):
    return jnp.where(x <= threshold, jnp.zeros((), grad_output.dtype), grad_output)


_SQRT1_2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


@lowers(aten.gelu.default, static=("approximate",))
def gelu(x, *, approximate="none"):
    if approximate == "tanh":
        return jax.nn.gelu(_gelu_opmath(x), approximate=True)
    # PyTorch's formula, in float32 for half types as PyTorch does. jax.nn.gelu goes through
    # erfc, which XLA expands into several fusions (exp, abs, select); erf is one polynomial,
    # about 3x faster on the CPU.
    x = _gelu_opmath(x)
    return x * 0.5 * (1 + lax.erf(x * _SQRT1_2))


def _gelu_opmath(x):
    return x.astype(jnp.float32) if x.dtype in (jnp.bfloat16, jnp.float16) else x


@lowers(aten.gelu_backward.default, static=("approximate",))
def gelu_backward(grad_output, x, *, approximate="none"):
    if approximate == "tanh":
        x, grad_output = _gelu_opmath(x), _gelu_opmath(grad_output)
        _, vjp = jax.vjp(lambda v: jax.nn.gelu(v, approximate=True), x)
        return vjp(grad_output)[0]
    x, grad_output = _gelu_opmath(x), _gelu_opmath(grad_output)
    cdf = 0.5 * (1 + lax.erf(x * _SQRT1_2))
    pdf = jnp.exp(-0.5 * x * x) * _INV_SQRT_2PI
    return grad_output * (cdf + x * pdf)


@lowers(aten.silu.default)
def silu(x):
    return x / (1 + jnp.exp(-x))  # CPU's formula


@lowers(aten.silu_backward.default)
def silu_backward(grad_output, x):
    s = jax.nn.sigmoid(x)
    return grad_output * s * (1 + x * (1 - s))


@lowers(aten.sigmoid_backward.default)
def sigmoid_backward(grad_output, output):
    return grad_output * output * (1 - output)


@lowers(aten.tanh_backward.default)
def tanh_backward(grad_output, output):
    return grad_output * (1 - output * output)


@lowers(aten.leaky_relu.default)
def leaky_relu(x, negative_slope=0.01):
    return jnp.where(x > 0, x, x * negative_slope)


@lowers(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad_output, x, negative_slope, self_is_result):
    return jnp.where(x > 0, grad_output, grad_output * negative_slope)


@lowers(aten.elu.default)
def elu(x, alpha=1, scale=1, input_scale=1):
    return jnp.where(x > 0, x * scale, alpha * scale * jnp.expm1(x * input_scale))


@lowers(aten.hardtanh.default)
def hardtanh(x, min_val=-1, max_val=1):
    return jnp.clip(x, min_val, max_val)


@lowers(aten.hardtanh_backward.default)
def hardtanh_backward(grad_output, x, min_val, max_val):
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros((), grad_output.dtype), grad_output)


@lowers(aten.softplus.default)
def softplus(x, beta=1, threshold=20):
    bx = x * beta
    return jnp.where(bx > threshold, x, jnp.log1p(jnp.exp(bx)) / beta)


@lowers(aten.mish.default)
def mish(x):
    return x * jnp.tanh(jax.nn.softplus(x))


@lowers(aten.hardsigmoid.default)
def hardsigmoid(x):
    return jnp.clip(x / 6 + 0.5, 0, 1)


@lowers(aten.hardswish.default)
def hardswish(x):
    return x * jnp.clip(x / 6 + 0.5, 0, 1)


# ---- frexp -----------------------------------------------------------------------------
# (storage width, mantissa bits, exponent bias) of each float format, for frexp's bit work.
_FLOAT_BITS = {
    jnp.dtype(jnp.float64): (jnp.uint64, 52, 1023),
    jnp.dtype(jnp.float32): (jnp.uint32, 23, 127),
    jnp.dtype(jnp.float16): (jnp.uint16, 10, 15),
    jnp.dtype(jnp.bfloat16): (jnp.uint16, 7, 127),
}


@lowers(aten.frexp.Tensor, opmath=False)
def frexp(x):
    """Mantissa in [0.5, 1) and int32 exponent, computed on the bits: jnp.frexp gets
    subnormals wrong (XLA's CPU flushes them to zero), CPU gives their exact decomposition."""
    if x.dtype not in _FLOAT_BITS:
        raise RuntimeError("torch.frexp() only supports floating-point dtypes")
    utype, nmant, bias = _FLOAT_BITS[x.dtype]
    width = jnp.dtype(utype).itemsize * 8
    bits = lax.bitcast_convert_type(x, utype)
    one = utype(1)
    mant_mask = utype((1 << nmant) - 1)
    exp_mask = utype((1 << (width - 1 - nmant)) - 1)
    sign = bits & (one << utype(width - 1))
    field = (bits >> utype(nmant)) & exp_mask
    mant = bits & mant_mask
    # A subnormal's leading one at bit p of its mantissa field: value = 1.f * 2**(p - nmant + 1 - bias).
    top = utype(width - 1) - lax.clz(mant)  # p (garbage when mant == 0, unused then)
    sub_shift = utype(nmant) - top
    sub_mant = (mant << sub_shift) & mant_mask
    sub_exp = top.astype(jnp.int32) - (nmant + bias) + 2
    subnormal = field == 0
    mantissa_bits = jnp.where(subnormal, sub_mant, mant)
    exponent = jnp.where(subnormal, sub_exp, field.astype(jnp.int32) - bias + 1)
    mantissa = lax.bitcast_convert_type(sign | (utype(bias - 1) << utype(nmant)) | mantissa_bits, x.dtype)
    # zeros, infinities and NaN: the value itself and exponent 0 (as std::frexp gives)
    special = (field == exp_mask) | ((field == 0) & (mant == 0))
    return jnp.where(special, x, mantissa), jnp.where(special, 0, exponent).astype(jnp.int32)


# ---- shrink backward ---------------------------------------------------------------------


@lowers(aten.softshrink_backward.default, aten.hardshrink_backward.default)
def shrink_backward(grad_out, self, lambd):
    # CPU: zero gradient inside [-lambd, lambd], the incoming gradient elsewhere (NaN inputs
    # are outside, so their gradient passes through).
    inside = (self >= -lambd) & (self <= lambd)
    return jnp.where(inside, jnp.zeros_like(grad_out), grad_out)
