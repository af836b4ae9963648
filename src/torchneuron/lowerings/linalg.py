"""Matrix products and linear algebra."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import torch
from jax import lax

from .registry import Promotion, at_call, lowers

aten = torch.ops.aten

# float32 matmuls in full precision: XLA on some platforms would otherwise pick a faster,
# less exact algorithm, and results must match CPU PyTorch.
_PRECISION = lax.Precision.HIGHEST


def _matmul(a, b):
    return jnp.matmul(a, b, precision=_PRECISION)


@lowers(aten.mm.default, promote=Promotion.DEFAULT)
def mm(x, y):
    return _matmul(x, y)


@lowers(aten.bmm.default, promote=Promotion.DEFAULT)
def bmm(x, y):
    return _matmul(x, y)


@lowers(aten.matmul.default, promote=Promotion.DEFAULT)
def matmul(x, y):
    return _matmul(x, y)


@lowers(aten.dot.default, promote=Promotion.DEFAULT)
def dot(x, y):
    return jnp.dot(x, y, precision=_PRECISION)


@lowers(aten.vdot.default, promote=Promotion.DEFAULT)
def vdot(x, y):
    # vdot conjugates its first argument (sum(conj(x) * y)); dot does not.
    return jnp.dot(jnp.conj(x), y, precision=_PRECISION)


@lowers(aten.mv.default, promote=Promotion.DEFAULT)
def mv(x, v):
    return _matmul(x, v)


def _integral_scalar(value, dtype):
    """`value` as CPU's integer/bool kernels use it: converted to the tensor type (truncated)."""
    if isinstance(value, bool | int | float):
        return bool(value) if dtype == jnp.bool_ else int(value)
    return jnp.asarray(value).astype(dtype)


def _tensor_math(*arrays):
    """The arrays in their common type, half/bfloat16 widened to float32 (CPU's kernels
    accumulate these in float32 and round once). Used instead of `promote=` by the ops with
    alpha/beta: promotion would count those scalars (a float beta would turn integer
    matrices into float32 ones, whereas CPU truncates beta to the integer type)."""
    dtype = jnp.result_type(*arrays)
    if dtype in (jnp.float16, jnp.bfloat16):
        dtype = jnp.dtype(jnp.float32)
    return [a.astype(dtype) for a in arrays]


def _scaled_sum(bias, product, beta, alpha):
    if not jnp.issubdtype(product.dtype, jnp.inexact):
        # CPU converts alpha and beta to the integer type first: beta=0.2 becomes 0 (input
        # ignored), alpha=0.6 becomes 0.
        beta, alpha = _integral_scalar(beta, product.dtype), _integral_scalar(alpha, product.dtype)
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


def _not_integer(arguments: dict) -> bool:
    # Where _scalars_fit accepts whatever the scalars are (its signature_decides).
    dtype = arguments["self"].dtype
    return dtype.is_floating_point or dtype.is_complex or dtype == torch.bool


def _scalars_fit(arguments: dict) -> bool:
    # For integer tensors CPU converts alpha/beta with an overflow check ("value cannot be
    # converted to type uint8_t without overflow"): calls whose scalars fall outside the type's
    # range go to CPU's kernel, which raises or wraps as it does.
    if _not_integer(arguments):
        return True
    info = torch.iinfo(arguments["self"].dtype)
    return all(
        not isinstance(v, int | float) or info.min <= v <= info.max
        for v in (arguments.get("beta", 1), arguments.get("alpha", 1))
    )


@lowers(aten.addmm.default, only_when=_scalars_fit, signature_decides=_not_integer)
def addmm(bias, x, y, *, beta=1, alpha=1):
    bias, x, y = _tensor_math(bias, x, y)
    return _scaled_sum(bias, _matmul(x, y), beta, alpha)


@lowers(aten.baddbmm.default, only_when=_scalars_fit, signature_decides=_not_integer)
def baddbmm(bias, x, y, *, beta=1, alpha=1):
    bias, x, y = _tensor_math(bias, x, y)
    return _scaled_sum(bias, _matmul(x, y), beta, alpha)


@lowers(aten.addbmm.default, only_when=_scalars_fit, signature_decides=_not_integer)
def addbmm(bias, x, y, *, beta=1, alpha=1):
    dtype = jnp.result_type(bias, x, y)
    if dtype in (jnp.float16, jnp.bfloat16) and x.shape[0] > 0:
        # CPU adds the batches one addmm at a time, so the running sum is rounded to the half
        # type after each batch (each addmm itself accumulates in float32).
        products = _matmul(x.astype(jnp.float32), y.astype(jnp.float32))
        total = jnp.broadcast_to(bias, products.shape[1:]).astype(jnp.float32)
        for i in range(x.shape[0]):
            total = _scaled_sum(total, products[i], beta if i == 0 else 1, alpha)
            total = total.astype(dtype).astype(jnp.float32)
        return total.astype(dtype)
    bias, x, y = _tensor_math(bias, x, y)
    return _scaled_sum(bias, jnp.sum(_matmul(x, y), axis=0), beta, alpha)


@lowers(aten.addmv.default, only_when=_scalars_fit, signature_decides=_not_integer)
def addmv(bias, x, v, *, beta=1, alpha=1):
    bias, x, v = _tensor_math(bias, x, v)
    return _scaled_sum(bias, _matmul(x, v), beta, alpha)


@lowers(aten.addr.default, only_when=_scalars_fit, signature_decides=_not_integer)
def addr(bias, u, v, *, beta=1, alpha=1):
    dtype = jnp.result_type(bias, u, v)
    if dtype in (jnp.float16, jnp.bfloat16):
        return _half_addr(bias, u, v, beta, alpha, dtype)
    bias, u, v = _tensor_math(bias, u, v)
    return _scaled_sum(bias, jnp.outer(u, v), beta, alpha)


def _half_addr(bias, u, v, beta, alpha, dtype):
    # CPU's addr kernel runs half/bfloat16 in the type itself: alpha and beta are rounded to
    # it, and so is every step of beta*self + (alpha*u_i)*v_j. Each step is computed in
    # float32 (exact or correctly rounded for one product or sum) and rounded.
    def rounded(x):
        return x.astype(dtype).astype(jnp.float32)

    a, b = rounded(jnp.asarray(alpha)), rounded(jnp.asarray(beta))
    u, v, bias = u.astype(jnp.float32), v.astype(jnp.float32), bias.astype(jnp.float32)
    product = rounded(rounded(a * u)[:, None] * v[None, :])
    if _is_number(beta, 0):
        return jnp.broadcast_to(product, product.shape).astype(dtype)
    total = rounded(rounded(b * bias) + product)
    if not isinstance(beta, int | float):
        total = jnp.where(beta == 0, product, total)  # input ignored when beta == 0
    return total.astype(dtype)


@lowers(aten.outer.default, promote=Promotion.DEFAULT)
def outer(u, v):
    return jnp.outer(u, v)


@lowers(aten._addmm_activation.default, promote=Promotion.DEFAULT, static=("use_gelu",))
def addmm_activation(bias, x, y, *, beta=1, alpha=1, use_gelu=False):
    import jax

    out = _scaled_sum(bias, _matmul(x, y), beta, alpha)
    # CPU's kernel applies the exact (erf) GELU; the tanh approximation is cuBLASLt's.
    return jax.nn.gelu(out, approximate=False) if use_gelu else jnp.maximum(out, 0)


@lowers(aten.linalg_cross.default)
def linalg_cross(x, y, *, dim=-1):
    dtype = jnp.result_type(x, y)
    x, y = jnp.broadcast_arrays(x.astype(dtype), y.astype(dtype))
    if dtype not in (jnp.float16, jnp.bfloat16):
        return jnp.cross(x, y, axis=dim)
    # CPU's cross kernel computes half/bfloat16 in the type itself: both products and their
    # difference are rounded to it (XLA would keep the products in float32).
    def rounded(v):
        return v.astype(dtype).astype(jnp.float32)

    x, y = jnp.moveaxis(x, dim, -1).astype(jnp.float32), jnp.moveaxis(y, dim, -1).astype(jnp.float32)
    first, second = [1, 2, 0], [2, 0, 1]
    result = rounded(rounded(x[..., first] * y[..., second]) - rounded(x[..., second] * y[..., first]))
    return jnp.moveaxis(result, -1, dim).astype(dtype)


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


# ----------------------------------------------------------------------------------------
# Decompositions (LAPACK through JAX's CPU kernels)
#
# Only results that are unique are lowered. Singular and eigen vectors are unique only up
# to sign (phase), and JAX's LAPACK picks other signs than the one PyTorch links (MKL), so
# `_linalg_svd` / `_linalg_eigh` are lowered only when no vectors are asked for (svdvals,
# eigvalsh, matrix_rank, matrix norms, cond); calls that want vectors run on CPU.
# Cholesky and Householder QR are unique (LAPACK's reflector sign convention is part of the
# algorithm) and are lowered fully.


def _empty(dtype):
    # PyTorch returns a (0,)-shaped tensor for an output it was told not to compute.
    return jnp.zeros((0,), dtype)


def _mH(x):
    return jnp.conj(jnp.swapaxes(x, -1, -2))


class _VectorsHidden(threading.local):
    """How many composites that never show singular/eigen vectors to their caller (svdvals,
    eigvalsh, pinv, eigvals) are running on this thread. Inside them the vectors' signs do not
    matter (their results and gradients are invariant), so the vector modes are lowered."""

    depth = 0


_HIDDEN = _VectorsHidden()


def _vectors_ok(arguments: dict) -> bool:
    return _HIDDEN.depth > 0


@lowers(aten._linalg_svd.default, static=("full_matrices", "compute_uv"),
        only_when=lambda a: not a["compute_uv"] or _vectors_ok(a))
def linalg_svd(A, full_matrices=False, compute_uv=True, *, driver=None):
    # CPU ignores `driver` (a cuSOLVER choice).
    if not compute_uv:
        s = lax.linalg.svd(A, full_matrices=False, compute_uv=False)
        return _empty(A.dtype), s, _empty(A.dtype)
    return lax.linalg.svd(A, full_matrices=full_matrices, compute_uv=True)


@lowers(aten._linalg_eigh.default, static=("UPLO", "compute_v"),
        only_when=lambda a: not a["compute_v"] or _vectors_ok(a))
def linalg_eigh(A, UPLO="L", compute_v=True):
    # LAPACK reads only the UPLO triangle: JAX reads the lower one.
    v, w = lax.linalg.eigh(A, lower=UPLO == "L", symmetrize_input=False)
    return w, (v if compute_v else _empty(A.dtype))


def _cholesky_unblocked(a):
    """LAPACK's unblocked lower Cholesky (potf2) of one matrix, stopping at the first pivot
    that is not positive: (the factor as potf2 leaves it, info). Used only when the fast
    factorization failed, so that `info` and the partial factor are PyTorch's."""
    n = a.shape[-1]
    idx = jnp.arange(n)

    def step(j, carry):
        a, info = carry
        row = jnp.where(idx < j, a[j, :], 0)
        ajj = jnp.real(a[j, j]) - jnp.sum(jnp.abs(row) ** 2)
        running = info == 0
        ok = ajj > 0  # False for NaN too, as LAPACK's disnan check
        d = jnp.sqrt(jnp.where(ok, ajj, 1)).astype(a.dtype)
        col = (a[:, j] - a @ jnp.conj(row)) / d
        col = jnp.where((idx > j) & ok, col, a[:, j]).at[j].set(jnp.where(ok, d, ajj.astype(a.dtype)))
        a = jnp.where(running, a.at[:, j].set(col), a)
        info = jnp.where(running & ~ok, j + 1, info)
        return a, info

    return lax.fori_loop(0, n, step, (a, jnp.zeros((), jnp.int32)))


def _cholesky_with_info(A, upper: bool):
    """(factor, info) as PyTorch's linalg_cholesky_ex returns them."""
    # LAPACK reads only the triangle it factors; JAX's cholesky reads the lower one.
    M = _mH(A) if upper else A
    batch = M.shape[:-2]
    n = M.shape[-1]
    if n == 0:
        L, info = M, jnp.zeros(batch, jnp.int32)
    else:
        L = lax.linalg.cholesky(M, symmetrize_input=False)
        flat = M.reshape((-1, n, n))

        def slow(_):
            partial, info = jax.vmap(_cholesky_unblocked)(flat)
            return jnp.tril(partial).reshape(M.shape), info.reshape(batch)

        def fast(_):
            return L, jnp.zeros(batch, jnp.int32)

        L, info = lax.cond(jnp.all(jnp.isfinite(L)), fast, slow, None)
    return (_mH(L) if upper else L), info


_NOT_PD = "linalg.cholesky: The factorization could not be completed because the input is not positive-definite."


@lowers(aten.linalg_cholesky_ex.default, index_error=at_call(torch.linalg.LinAlgError, _NOT_PD))
def linalg_cholesky_ex(A, *, upper=False, check_errors=False):
    L, info = _cholesky_with_info(A, upper)
    return (L, info), (jnp.any(info != 0) if check_errors else jnp.zeros((), bool))


@lowers(aten.cholesky.default,
        index_error=at_call(torch.linalg.LinAlgError,
                            _NOT_PD.replace("linalg.cholesky", "cholesky")))
def cholesky(A, upper=False):
    L, info = _cholesky_with_info(A, upper)
    return L, jnp.any(info != 0)


@lowers(aten.linalg_qr.default, static=("mode",))
def linalg_qr(A, mode="reduced"):
    q, r = lax.linalg.qr(A, full_matrices=mode == "complete")
    if mode == "r":
        return _empty(A.dtype), r
    return q, r


@lowers(aten.linalg_householder_product.default)
def linalg_householder_product(A, tau):
    return lax.linalg.householder_product(A, tau)


@lowers(aten.ormqr.default)
def ormqr(A, tau, other, left=True, transpose=False):
    # Q = H_1 ... H_k of order m (other's rows for left, its columns for right): the
    # reflectors padded with identity factors (tau = 0) to a square householder_product.
    m = other.shape[-2] if left else other.shape[-1]
    k = tau.shape[-1]
    pad_cols = [(0, 0)] * (A.ndim - 1) + [(0, m - min(A.shape[-1], m))]
    square = jnp.pad(A[..., :m], pad_cols)
    taus = jnp.pad(tau, [(0, 0)] * (tau.ndim - 1) + [(0, m - k)])
    q = lax.linalg.householder_product(square, taus)
    if transpose:
        q = _mH(q)
    return _matmul(q, other) if left else _matmul(other, q)


@lowers(aten._linalg_eigvals.default)
def linalg_eigvals(A):
    w = lax.linalg.eig(A, compute_left_eigenvectors=False, compute_right_eigenvectors=False)[0]
    return w


@lowers(aten.linalg_eigvals.out)
def linalg_eigvals_out(A, *, out=None):
    # linalg_eigvals itself is a composite over _linalg_eigvals (lowered above); its out=
    # overload has a CPU kernel of its own, so it gets a lowering of its own.
    return linalg_eigvals(A)


@lowers(aten.linalg_eig.default, only_when=_vectors_ok)
def linalg_eig(A):
    # Only inside eigvals (only_when): JAX's eigenvectors are scaled otherwise than
    # PyTorch's (MKL's), which eigvals' gradient does not see.
    w, v = lax.linalg.eig(A, compute_left_eigenvectors=False)
    return w, v


def _hiding_vectors(op, composite_key):
    """A kernel for composite `op` that runs PyTorch's own composite (its `composite_key`
    kernel) with the vector modes of svd/eigh/eig lowered: its result never shows them."""

    def kernel(*args, **kwargs):
        _HIDDEN.depth += 1
        try:
            return op._op_dk(composite_key, *args, **kwargs)
        finally:
            _HIDDEN.depth -= 1

    return kernel


_COMPOSITES = torch.library.Library("aten", "IMPL")
_KEY = torch._C.DispatchKey
for _op, _composite, _slot in (
    (aten.linalg_svdvals.default, _KEY.CompositeImplicitAutograd, "AutogradPrivateUse1"),
    (aten.linalg_eigvalsh.default, _KEY.CompositeImplicitAutograd, "AutogradPrivateUse1"),
    (aten.linalg_eigvals.default, _KEY.CompositeImplicitAutograd, "AutogradPrivateUse1"),
    # pinv has a derivative of its own (autograd records it above the backend kernel)
    (aten.linalg_pinv.atol_rtol_tensor, _KEY.CompositeExplicitAutogradNonFunctional, "PrivateUse1"),
):
    _name = _op._schema.name.split("::")[1]
    if _op._overloadname != "default":
        _name += "." + _op._overloadname
    _COMPOSITES.impl(_name, _hiding_vectors(_op, _composite), _slot)


def _column_major(shape, dtype) -> torch.Tensor:
    """A meta tensor laid out as LAPACK results are: each matrix column-major."""
    shape = tuple(shape)
    stride = list(torch.empty(shape, device="meta").stride())
    if len(shape) >= 2:
        stride[-2], stride[-1] = 1, max(shape[-2], 1)
    return torch.empty_strided(shape, tuple(stride), dtype=dtype, device="meta")


def _geqrf_meta(A):
    # PyTorch has no meta kernel for geqrf: its checks and CPU's output layout here.
    if A.dim() < 2:
        raise RuntimeError(
            f"torch.geqrf: input must have at least 2 dimensions. (Got {A.dim()} dimensions)"
        )
    if not (A.dtype.is_floating_point or A.dtype.is_complex):
        raise RuntimeError(f"geqrf: Expected a floating point or complex tensor as input. Got {A.dtype}")
    m, n = A.shape[-2:]
    tau = torch.empty((*A.shape[:-2], min(m, n)), dtype=A.dtype, device="meta")
    return _column_major(A.shape, A.dtype), tau


@lowers(aten.geqrf.default, meta=_geqrf_meta)
def geqrf(A):
    # LAPACK's geqrf itself (jax.lax.linalg.qr is built on it; it is not re-exported).
    from jax._src.lax.linalg import geqrf as jax_geqrf

    return jax_geqrf(A)


def _geqrf_out_meta(A, *, a=None, tau=None):
    return _geqrf_meta(A)


@lowers(aten.geqrf.a, meta=_geqrf_out_meta)
def geqrf_out(A, *, a=None, tau=None):
    # Registered on the out overload too: PyTorch has no meta kernel to size `out` from.
    return geqrf(A)
