"""Random number ops. Each takes `key=`, a JAX PRNG key drawn from the device generator."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch

from .dtypes import not_implemented_for, scalar_type_name, to_jax_dtype
from .registry import at_call, decomposes, lowers

aten = torch.ops.aten


def _float_dtype(x):
    return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32


def _real_draws(x, what: str):
    """(dtype of the draws, their shape): a complex tensor draws its real and imaginary parts
    (CPU fills view_as_real(x)); CPU's kernels refuse integer and bool tensors."""
    if jnp.iscomplexobj(x):
        return jnp.finfo(x.dtype).dtype, x.shape + (2,)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise not_implemented_for(what, x.dtype)
    return x.dtype, x.shape


def _from_parts(values, dtype):
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return jax.lax.complex(values[..., 0], values[..., 1]).astype(dtype)
    return values.astype(dtype)


def _sampling(dtype):
    return jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype


# The bounds are static: CPU's two range checks raise with the values in the message.
@lowers(aten.uniform.default, rng=True, static=("from", "to"))
def uniform(x, from_=0.0, to=1.0, *, generator=None, key):
    part, shape = _real_draws(x, "check_uniform_bounds")
    low, high = _dtype_bounds(part)
    name = _CPP_NAMES.get(jnp.dtype(part).name, str(part))
    for value, what in ((from_, "from"), (to, "to")):
        if not low <= value <= high:
            raise RuntimeError(f"{what} is out of bounds for {name}")
    if from_ > to:
        raise RuntimeError(
            f"uniform_ expects to return a [from, to) range, but found from={from_:g} > to={to:g}")
    if to - from_ > float(jnp.finfo(part).max):
        name = scalar_type_name(part)
        raise RuntimeError(
            f"uniform_ expects to-from <= std::numeric_limits<{name}>::max(), but found "
            f"to={to:g} and from={from_:g} which result in to-from to exceed the limit")
    u = jax.random.uniform(key, shape, _sampling(part))
    return _from_parts((from_ + u * (to - from_)).astype(part), x.dtype)


def _std_allowed(a: dict) -> bool:
    # std is traced (a new value compiles nothing), so CPU's check runs per call; NaN fails
    return a["std"] >= 0


def _refuse_std(std: float):
    raise RuntimeError(f"normal expects std >= 0.0, but found std {std:g}")


@decomposes(aten.normal_.default, aten.normal_functional.default)
def normal_refused(self, mean=0.0, std=1.0, *, generator=None):
    """The calls `_std_allowed` turns away."""
    _refuse_std(std)


@decomposes(aten.normal.float_float, aten.normal.Tensor_float)
def normal_from_mean_refused(mean, std=1.0, *args, **kwargs):
    """The calls `_std_allowed` turns away."""
    _refuse_std(std)


@lowers(aten.normal.float_float, rng=True, static=("size",), only_when=_std_allowed)
def normal_float_float(mean, std, size, *, generator=None, dtype=None, layout=None,
                       device=None, pin_memory=None, key):
    jdtype = to_jax_dtype(dtype or torch.get_default_dtype())
    return mean + std * jax.random.normal(key, tuple(size), jdtype)


def _normal_meta(op):
    """PyTorch's meta kernel of `op`, except for an empty integer or bool tensor: CPU checks
    std, then returns before its dtype check (`torch.randn(0, dtype=torch.int16)`)."""

    def meta(x, mean=0.0, std=1.0, *, generator=None):
        if x.numel() == 0 and not (x.is_floating_point() or x.is_complex()):
            if std < 0:
                _refuse_std(std)
            return x if op is aten.normal_.default else torch.empty_like(x)
        return op(x, mean, std, generator=generator)

    return meta


@lowers(aten.normal_.default, rng=True, meta=_normal_meta(aten.normal_.default),
        only_when=_std_allowed)
@lowers(aten.normal_functional.default, rng=True,
        meta=_normal_meta(aten.normal_functional.default), only_when=_std_allowed)
def normal_functional(x, mean=0.0, std=1.0, *, generator=None, key):
    if x.size == 0:
        return x  # nothing to draw (an empty integer tensor is not refused: see _normal_meta)
    part, shape = _real_draws(x, "normal_")
    if jnp.iscomplexobj(x):
        std = std / np.sqrt(2.0)  # CPU: each part has half the variance; mean added to both
    draws = mean + std * jax.random.normal(key, shape, _sampling(part))
    return _from_parts(draws.astype(part), x.dtype)


@lowers(aten.normal.Tensor_float, rng=True, only_when=_std_allowed)
def normal_tensor_float(mean, std=1.0, *, generator=None, key):
    return mean + std * jax.random.normal(key, mean.shape, _float_dtype(mean))


# A std tensor is checked by value, as CPU and CUDA check it (a NaN fails too): through the
# runtime's check flag, raised when the call's result is computed.
_NEGATIVE_STD = at_call(RuntimeError, "normal expects all elements of std >= 0.0")


def _std_is_bad(std):
    return jnp.any(~(std >= 0))


@lowers(aten.normal.float_Tensor, rng=True, index_error=_NEGATIVE_STD)
def normal_float_tensor(mean, std, *, generator=None, key):
    return mean + std * jax.random.normal(key, std.shape, _float_dtype(std)), _std_is_bad(std)


@lowers(aten.normal.Tensor_Tensor, rng=True, index_error=_NEGATIVE_STD)
def normal_tensor_tensor(mean, std, *, generator=None, key):
    shape = jnp.broadcast_shapes(mean.shape, std.shape)
    draws = mean + std * jax.random.normal(key, shape, jnp.result_type(mean, std))
    return draws, _std_is_bad(std)


@lowers(aten.bernoulli.default, rng=True)
def bernoulli(x, *, generator=None, key):
    return jax.random.uniform(key, x.shape, jnp.float32) < x.astype(jnp.float32)


@lowers(aten.bernoulli.p, aten.bernoulli_.float, rng=True)
def bernoulli_p(x, p=0.5, *, generator=None, key):
    return jax.random.uniform(key, x.shape, jnp.float64) < p


@lowers(aten.bernoulli.Tensor, rng=True)
def bernoulli_tensor(x, p, *, generator=None, key):
    return jax.random.uniform(key, x.shape, jnp.float64) < jnp.broadcast_to(p, x.shape)


@lowers(aten.exponential.default, rng=True)
def exponential(x, lambd=1.0, *, generator=None, key):
    return jax.random.exponential(key, x.shape, _float_dtype(x)) / lambd


@lowers(aten.geometric.default, rng=True)
def geometric(x, p, *, generator=None, key):
    u = jax.random.uniform(key, x.shape, jnp.float64, minval=jnp.finfo(jnp.float64).tiny)
    return jnp.ceil(jnp.log(u) / jnp.log1p(-p))


@lowers(aten.log_normal.default, rng=True)
def log_normal(x, mean=1.0, std=2.0, *, generator=None, key):
    return jnp.exp(mean + std * jax.random.normal(key, x.shape, _float_dtype(x)))


@lowers(aten.cauchy.default, rng=True)
def cauchy(x, median=0.0, sigma=1.0, *, generator=None, key):
    return median + sigma * jax.random.cauchy(key, x.shape, _float_dtype(x))


# ---- random_: discrete uniform integers, with CPU's range rules ---------------------------
#
# random_(from, to) draws from [from, to); random_(from) from [from, max]; random_() from
# [0, max]; max is the dtype's largest integer, or 2**digits for a floating dtype (the largest
# range in which every integer is representable). A range outside the dtype raises; for a
# floating dtype a bound beyond +-2**digits warns when the executable is built (CPU warns on
# every call; an unjitted lowering would warn every time but keeps the op out of compiled
# graphs).

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# How CPU's messages print the dtypes (C++ type names).
_CPP_NAMES = {
    "bool": "bool", "uint8": "unsigned char", "int8": "signed char", "int16": "short int",
    "int32": "int", "int64": "long int", "uint16": "short unsigned int",
    "uint32": "unsigned int", "uint64": "long unsigned int", "float16": "c10::Half",
    "bfloat16": "c10::BFloat16", "float32": "float", "float64": "double",
}


def _digits(dtype) -> int:
    """Significand bits, the implicit one included (std::numeric_limits<T>::digits)."""
    return jnp.finfo(dtype).nmant + 1


def _dtype_bounds(dtype) -> tuple[float, float]:
    if dtype == jnp.bool_:
        return 0, 1
    if jnp.issubdtype(dtype, jnp.floating):
        info = jnp.finfo(dtype)
        return float(info.min), float(info.max)
    if dtype == jnp.uint64:
        return 0, _INT64_MAX
    info = jnp.iinfo(dtype)
    return int(info.min), int(info.max)


def _check_in_range(from_: int, to_inc: int, dtype) -> None:
    name = _CPP_NAMES.get(jnp.dtype(dtype).name, str(dtype))
    low, high = _dtype_bounds(dtype)
    if not low <= from_ <= high:
        raise RuntimeError(f"from is out of bounds for {name}")
    if not low <= to_inc <= high:
        raise RuntimeError(f"to - 1 is out of bounds for {name}")
    if jnp.issubdtype(dtype, jnp.floating):
        d = _digits(dtype)
        for value, what in ((from_, "from"), (to_inc, "to - 1")):
            if not -(2**d) <= value <= 2**d:
                warnings.warn(
                    f"{what} is out of bounds [-(2^{d}), 2^{d}]. Due to precision limitations "
                    f"{name} can support discrete uniform distribution only within this range. "
                    "This warning will become an error in version 1.7 release, please fix the "
                    "code in advance", UserWarning, stacklevel=2)


def _as_dtype_int(value: int, dtype) -> int:
    """The integer that `value` becomes in a floating dtype (C++'s cast from int64); a value
    past the dtype's range stays as it is (the range check raises for it)."""
    with np.errstate(over="ignore"):
        rounded = np.array(value, np.int64).astype(dtype).astype(np.float64)
    return int(rounded) if np.isfinite(rounded) else value


def _fit_from(from_: int, dtype) -> int:
    # A lower bound that rounds below itself in the dtype is moved up by one ulp, so that no
    # draw falls under it (CPU's update_from).
    if from_ >= _INT64_MAX:
        return from_
    rounded = _as_dtype_int(from_ + 1, dtype)
    if rounded < from_:
        n = abs(from_ + 1).bit_length() - 1
        return rounded + (1 << (n - _digits(dtype) + 1))
    return from_


def _fit_to(to: int, dtype) -> int:
    rounded = _as_dtype_int(to - 1, dtype)
    if rounded >= to:
        n = abs(to - 1).bit_length() - 1
        return rounded - (1 << (n - _digits(dtype) + 1))
    return to


def _draw(key, shape, low: int, count: int, dtype):
    """`count` (up to 2**64) consecutive integers from `low`, uniformly, as `dtype`."""
    bits = jax.random.bits(key, shape, jnp.uint64)
    if count < 2**64:
        bits = bits % jnp.uint64(count)
    # low + offset in 64-bit two's complement, as CPU's uint64 arithmetic
    value = jax.lax.bitcast_convert_type(bits + jnp.uint64(low % 2**64), jnp.int64)
    return value.astype(dtype)


def _random_from_to(x, from_: int, to: int, key):
    if from_ >= to:
        raise RuntimeError(
            f"random_ expects 'from' to be less than 'to', but got from={from_} >= to={to}")
    if jnp.issubdtype(x.dtype, jnp.floating):
        from_, to = _fit_from(from_, x.dtype), _fit_to(to, x.dtype)
        if from_ >= to:
            raise RuntimeError(
                "random_ expects 'from' casted to dtype to be less than 'to' casted to dtype, "
                f"but got from={from_} >= to={to}")
    _check_in_range(from_, to - 1, x.dtype)
    return _draw(key, x.shape, from_, to - from_, x.dtype)


def _max_inclusive(dtype) -> int:
    if dtype == jnp.bool_:
        return 1
    if jnp.issubdtype(dtype, jnp.floating):
        return min(2 ** _digits(dtype), _INT64_MAX)
    return int(jnp.iinfo(dtype).max)


@lowers(getattr(aten.random, "from"), rng=True, static=("from", "to"))
def random_from(x, from_, to=None, *, generator=None, key):
    if to is not None:
        return _random_from_to(x, from_, to, key)
    if from_ == _INT64_MIN:  # every int64
        if x.dtype in (jnp.float16, jnp.bool_):
            raise NotImplementedError(
                f"random_ over the full 64-bit range is not implemented for {x.dtype}")
        if x.dtype not in (jnp.int64, jnp.float64, jnp.float32, jnp.bfloat16):
            raise RuntimeError(
                "random_ over the full 64-bit range handles only int64, double, float and "
                "bfloat16")
        return _draw(key, x.shape, _INT64_MIN, 2**64, x.dtype)
    to_inc = _max_inclusive(x.dtype)
    if jnp.issubdtype(x.dtype, jnp.floating):
        from_ = _fit_from(from_, x.dtype)
        if from_ >= to_inc:
            raise RuntimeError(
                "random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' "
                f"casted to dtype, but got from={from_} > to_inc={to_inc}")
    _check_in_range(from_, to_inc, x.dtype)
    return _draw(key, x.shape, from_, to_inc - from_ + 1, x.dtype)


@lowers(aten.random.to, rng=True, static=("to",))
def random_to(x, to, *, generator=None, key):
    return _random_from_to(x, 0, to, key)


@lowers(aten.random.default, rng=True)
def random_default(x, *, generator=None, key):
    if x.dtype == jnp.uint64:
        return _draw(key, x.shape, 0, 2**64, x.dtype)
    return _draw(key, x.shape, 0, _max_inclusive(x.dtype) + 1, x.dtype)


@lowers(aten.randperm.default, aten.randperm.generator, rng=True, static=("n",))
def randperm(n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    _check_randperm_fits(n, dtype)
    return jax.random.permutation(key, n)


@decomposes(aten.randperm.out, aten.randperm.generator_out)
def randperm_out(n, *, generator=None, out):
    # The permutation in out's dtype, whose range CPU checks first (the lowering sees no out);
    # CPU's kernel makes `out` 1-D whatever its shape.
    _check_randperm_fits(n, out.dtype)
    values = aten.randperm.generator(n, generator=generator, dtype=out.dtype, device=out.device)
    return out.resize_((n,)).copy_(values)


_C_INT_NAMES = {torch.int8: "int8_t", torch.uint8: "uint8_t", torch.int16: "int16_t",
                torch.int32: "int32_t"}


def _check_randperm_fits(n: int, dtype: torch.dtype | None) -> None:
    """CPU's checks that every value 0..n-1 is exact in the result's dtype."""
    if dtype == torch.float16 and n > 2049:
        raise RuntimeError("n cannot be greater than 2049 for Half type.")
    for wide, digits, name in ((torch.float32, 24, "Float"), (torch.float64, 53, "Double")):
        if dtype == wide and n > 2**digits + 1:
            raise RuntimeError(f"n cannot be greater than 2^{digits}+1 for {name} type.")
    if dtype in _C_INT_NAMES and n - 1 > torch.iinfo(dtype).max:
        raise RuntimeError(f"value cannot be converted to type {_C_INT_NAMES[dtype]} without "
                           "overflow")


@lowers(aten.native_dropout.default, rng=True, static=("train",))
def native_dropout(x, p, train, *, key):
    if not train:
        return x, jnp.ones(x.shape, bool)
    keep = jax.random.uniform(key, x.shape, jnp.float32) >= p
    scale = jnp.where(p < 1, 1.0 / (1.0 - p), 0.0).astype(x.dtype)
    return jnp.where(keep, x * scale, jnp.zeros((), x.dtype)), keep


@lowers(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    return grad_output * mask.astype(grad_output.dtype) * scale


@lowers(aten.multinomial.default, rng=True,
        index_error=at_call(RuntimeError, "invalid multinomial distribution: the probability tensor "
                     "contains `inf`, `nan` or an element < 0, or a row sums to <= 0"))
def multinomial(probs, num_samples, replacement=False, *, generator=None, key):
    """Categorical draws per row. Without replacement: the Gumbel top-k trick (the k largest
    log p + Gumbel noise are a draw without replacement). Bad rows (negative, inf, NaN, or
    summing to 0) raise like CPU, through the runtime's check flag."""
    if num_samples <= 0:
        raise RuntimeError("cannot sample n_sample <= 0 samples")
    n = probs.shape[-1]
    if not replacement and num_samples > n:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    rows = probs.reshape(-1, n).astype(jnp.float64)
    bad = jnp.any(~jnp.isfinite(rows) | (rows < 0)) | jnp.any(jnp.sum(rows, axis=-1) <= 0)
    logits = jnp.log(jnp.where(rows > 0, rows, 0.0))
    if replacement:
        draws = jax.random.categorical(key, logits, axis=-1, shape=(num_samples, rows.shape[0]))
        out = draws.T
    else:
        scores = logits + jax.random.gumbel(key, rows.shape, jnp.float64)
        out = jax.lax.top_k(scores, num_samples)[1]
    return out.reshape(probs.shape[:-1] + (num_samples,)).astype(jnp.int64), bad


@lowers(aten.rrelu_with_noise.default, rng=True)
def rrelu_with_noise(x, noise, lower=0.125, upper=1.0 / 3.0, training=False, generator=None, *,
                     key):
    """Randomized leaky ReLU. Training: each negative element gets a slope drawn from
    U(lower, upper), recorded in `noise` (1 for the others); eval: the mean slope. Returns
    (output, new noise)."""
    if not training:
        slope = (lower + upper) / 2
        return jnp.where(x >= 0, x, x * jnp.asarray(slope, x.dtype)), noise
    sample_dtype = jnp.float32 if x.dtype in (jnp.float16, jnp.bfloat16) else x.dtype
    u = jax.random.uniform(key, x.shape, sample_dtype)
    slopes = (lower + u * (upper - lower)).astype(x.dtype)
    negative = x < 0
    new_noise = jnp.where(negative, slopes, jnp.ones((), x.dtype)).astype(noise.dtype)
    return jnp.where(negative, x * slopes, x), new_noise.reshape(noise.shape)


@lowers(aten.rand.default, rng=True, static=("size",), graph_only=True)
def rand(size, *, dtype=None, layout=None, device=None, pin_memory=None, key):
    # Eager mode runs rand's composite kernel (empty + uniform_); a graph draws directly.
    jdtype = to_jax_dtype(dtype or torch.get_default_dtype())
    sample_dtype = jnp.float32 if jdtype in (jnp.float16, jnp.bfloat16) else jdtype
    return jax.random.uniform(key, tuple(size), sample_dtype).astype(jdtype)
