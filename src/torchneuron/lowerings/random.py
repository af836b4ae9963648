"""Random number ops. Each takes `key=`, a JAX PRNG key drawn from the device generator."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from .dtypes import to_jax_dtype, to_torch_dtype
from .registry import lowers

aten = torch.ops.aten


def _float_dtype(x):
    return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32


@lowers(aten.uniform.default, rng=True)
def uniform(x, from_=0.0, to=1.0, *, generator=None, key):
    dtype = _float_dtype(x)
    sample_dtype = jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype
    u = jax.random.uniform(key, x.shape, sample_dtype)
    return (from_ + u * (to - from_)).astype(dtype)


@lowers(aten.normal.float_float, rng=True, static=("size",))
def normal_float_float(mean, std, size, *, generator=None, dtype=None, layout=None,
                       device=None, pin_memory=None, key):
    jdtype = to_jax_dtype(dtype or torch.get_default_dtype())
    return mean + std * jax.random.normal(key, tuple(size), jdtype)


@lowers(aten.normal_functional.default, aten.normal_.default, rng=True)
def normal_functional(x, mean=0.0, std=1.0, *, generator=None, key):
    dtype = _float_dtype(x)
    sample_dtype = jnp.float32 if dtype in (jnp.float16, jnp.bfloat16) else dtype
    return (mean + std * jax.random.normal(key, x.shape, sample_dtype)).astype(dtype)


@lowers(aten.normal.Tensor_float, rng=True)
def normal_tensor_float(mean, std=1.0, *, generator=None, key):
    return mean + std * jax.random.normal(key, mean.shape, _float_dtype(mean))


@lowers(aten.normal.float_Tensor, rng=True)
def normal_float_tensor(mean, std, *, generator=None, key):
    return mean + std * jax.random.normal(key, std.shape, _float_dtype(std))


@lowers(aten.normal.Tensor_Tensor, rng=True)
def normal_tensor_tensor(mean, std, *, generator=None, key):
    shape = jnp.broadcast_shapes(mean.shape, std.shape)
    return mean + std * jax.random.normal(key, shape, jnp.result_type(mean, std))


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


def _random_ints(key, shape, low, high, dtype):
    if jnp.issubdtype(dtype, jnp.floating) or dtype == jnp.bool_:
        draw = jax.random.randint(key, shape, low, high, jnp.int64)
        return draw.astype(dtype)
    return jax.random.randint(key, shape, low, high, jnp.int64).astype(dtype)


@lowers(getattr(aten.random, "from"), rng=True, static=("from", "to"))
def random_from(x, from_, to=None, *, generator=None, key):
    if to is None:
        to = _max_exclusive(x.dtype)
        if from_ >= to:
            raise RuntimeError(
                "random_ expects 'from' casted to dtype to be less than or equal to 'to_inc' "
                f"casted to dtype, but got from={from_} > to_inc={to - 1}")
    _check_bounds(x.dtype, from_, to)
    return _random_ints(key, x.shape, from_, to, x.dtype)


@lowers(aten.random.to, rng=True, static=("to",))
def random_to(x, to, *, generator=None, key):
    _check_bounds(x.dtype, 0, to)
    return _random_ints(key, x.shape, 0, to, x.dtype)


@lowers(aten.random.default, rng=True)
def random_default(x, *, generator=None, key):
    return _random_ints(key, x.shape, 0, _max_exclusive(x.dtype), x.dtype)


def _max_exclusive(dtype) -> int:
    """One past the largest value `random_()` draws: 2**digits for floats (every integer up to
    it is representable; digits counts the implicit bit), the type's maximum for integers."""
    if dtype == jnp.bool_:
        return 2
    if jnp.issubdtype(dtype, jnp.floating):
        return 2 ** (jnp.finfo(dtype).nmant + 1) + 1
    # int64's maximum + 1 does not fit the int64 draw: its top value is left out.
    return min(int(jnp.iinfo(dtype).max) + 1, int(jnp.iinfo(jnp.int64).max))


def _check_bounds(dtype, from_: int, to: int) -> None:
    """CPU's checks of random_(from, to): a non-empty range whose ends the dtype holds."""
    if from_ >= to:
        raise RuntimeError(
            f"random_ expects 'from' to be less than 'to', but got from={from_} >= to={to}")
    if dtype == jnp.bool_:
        low, high = 0, 1
    elif jnp.issubdtype(dtype, jnp.floating):
        low, high = float(jnp.finfo(dtype).min), float(jnp.finfo(dtype).max)
    else:
        low, high = int(jnp.iinfo(dtype).min), int(jnp.iinfo(dtype).max)
    name = to_torch_dtype(dtype)
    if not low <= from_ <= high:
        raise RuntimeError(f"from is out of bounds for {name}")
    if not low <= to - 1 <= high:
        raise RuntimeError(f"to - 1 is out of bounds for {name}")


@lowers(aten.randperm.default, aten.randperm.generator, aten.randperm.out,
        aten.randperm.generator_out, rng=True, static=("n",))
def randperm(n, *, generator=None, dtype=None, layout=None, device=None, pin_memory=None, key):
    return jax.random.permutation(key, n)


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
        index_error=(RuntimeError, "invalid multinomial distribution: the probability tensor "
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
