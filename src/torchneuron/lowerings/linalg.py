"""Matrix products and linear algebra."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from .registry import lowers

aten = torch.ops.aten
DEFAULT = "DEFAULT"

# float32 matmuls in full precision: XLA on some platforms would otherwise pick a faster,
# less exact algorithm, and results must match CPU PyTorch.
_PRECISION = lax.Precision.HIGHEST


def _matmul(a, b):
    return jnp.matmul(a, b, precision=_PRECISION)


@lowers(aten.mm.default, promote=DEFAULT)
def mm(x, y):
    return _matmul(x, y)


@lowers(aten.bmm.default, promote=DEFAULT)
def bmm(x, y):
    return _matmul(x, y)


@lowers(aten.matmul.default, promote=DEFAULT)
def matmul(x, y):
    return _matmul(x, y)


@lowers(aten.dot.default, aten.vdot.default, promote=DEFAULT)
def dot(x, y):
    return jnp.dot(x, y, precision=_PRECISION)


@lowers(aten.mv.default, promote=DEFAULT)
def mv(x, v):
    return _matmul(x, v)


def _scaled_sum(bias, product, beta, alpha):
    scaled = product if _is_number(alpha, 1) else product * alpha
    if _is_number(beta, 0):
        # PyTorch ignores `input` entirely when beta == 0 (NaN in it must not propagate).
        return jnp.broadcast_to(scaled, product.shape)
    if _is_number(beta, 1):
        return bias + scaled
    if isinstance(beta, int | float):
        return bias * beta + scaled
    # beta is traced (it may change between calls): the same rule, decided at run time
    scaled_bias = jnp.where(beta == 0, jnp.zeros((), product.dtype), bias * beta)
    return scaled_bias + scaled


def _is_number(value, number) -> bool:
    return isinstance(value, int | float) and value == number


@lowers(aten.addmm.default, promote=DEFAULT)
def addmm(bias, x, y, *, beta=1, alpha=1):
    return _scaled_sum(bias, _matmul(x, y), beta, alpha)


@lowers(aten.baddbmm.default, promote=DEFAULT)
def baddbmm(bias, x, y, *, beta=1, alpha=1):
    return _scaled_sum(bias, _matmul(x, y), beta, alpha)


@lowers(aten.addbmm.default, promote=DEFAULT)
def addbmm(bias, x, y, *, beta=1, alpha=1):
    return _scaled_sum(bias, jnp.sum(_matmul(x, y), axis=0), beta, alpha)


@lowers(aten.addmv.default, promote=DEFAULT)
def addmv(bias, x, v, *, beta=1, alpha=1):
    return _scaled_sum(bias, _matmul(x, v), beta, alpha)


@lowers(aten.addr.default, promote=DEFAULT)
def addr(bias, u, v, *, beta=1, alpha=1):
    return _scaled_sum(bias, jnp.outer(u, v), beta, alpha)


@lowers(aten.outer.default, promote=DEFAULT)
def outer(u, v):
    return jnp.outer(u, v)


@lowers(aten._addmm_activation.default, promote=DEFAULT, static=("use_gelu",))
def addmm_activation(bias, x, y, *, beta=1, alpha=1, use_gelu=False):
    import jax

    out = _scaled_sum(bias, _matmul(x, y), beta, alpha)
    return jax.nn.gelu(out, approximate=True) if use_gelu else jnp.maximum(out, 0)


@lowers(aten.linalg_cross.default, promote=DEFAULT)
def linalg_cross(x, y, *, dim=-1):
    x, y = jnp.broadcast_arrays(x, y)
    return jnp.cross(x, y, axis=dim)


@lowers(aten.tril.default)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowers(aten.triu.default)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


@lowers(aten.trace.default)
def trace(x):
    dtype = jnp.int64 if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_ else x.dtype
    return jnp.trace(x).astype(dtype)
