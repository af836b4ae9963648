"""Linear solvers and LU-based ops: triangular solves, LU factor/unpack/solve, inverse,
solve, determinants, Cholesky solves, matrix exponential.

PyTorch's conventions are kept exactly where they are visible: LU pivots are LAPACK's
1-based int32 row swaps, `info` is LAPACK's (`i > 0`: `U[i-1, i-1]` is exactly zero), and
the LU factors returned alongside a result are those PyTorch's backward formulas expect.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import torch
from jax.lax import linalg as lax_linalg

from .registry import lowers

aten = torch.ops.aten


# ----------------------------------------------------------------------------------------
# Helpers


def _mh(x: jax.Array) -> jax.Array:
    """Conjugate transpose of the last two dimensions."""
    return jnp.conj(jnp.swapaxes(x, -1, -2))


def _broadcast_batch(*arrays: jax.Array, cores: tuple[int, ...]) -> list[jax.Array]:
    """Broadcast the batch dimensions (all but the last `core` ones) of each array."""
    batches = [a.shape[: a.ndim - c] for a, c in zip(arrays, cores)]
    batch = jnp.broadcast_shapes(*batches)
    return [jnp.broadcast_to(a, batch + a.shape[a.ndim - c :]) for a, c in zip(arrays, cores)]


def _lu(a: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """LU with partial pivoting as LAPACK's getrf: (LU, 1-based int32 pivots, 0-based row
    permutation with A[perm] = L @ U, info)."""
    m, n = a.shape[-2:]
    k = min(m, n)
    batch = a.shape[:-2]
    if a.size == 0:
        pivots = jnp.broadcast_to(jnp.arange(1, k + 1, dtype=jnp.int32), batch + (k,))
        perm = jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), batch + (m,))
        return a, pivots, perm, jnp.zeros(batch, jnp.int32)
    lu, pivots, perm = lax_linalg.lu(a)
    # LAPACK reports the first exactly-zero pivot (1-based); the factorization still completes.
    zero = jnp.diagonal(lu, axis1=-2, axis2=-1) == 0
    info = jnp.where(jnp.any(zero, axis=-1), jnp.argmax(zero, axis=-1) + 1, 0)
    return lu, (pivots + 1).astype(jnp.int32), perm.astype(jnp.int32), info.astype(jnp.int32)


def _rows(x: jax.Array, index: jax.Array) -> jax.Array:
    """x[..., index, :] with index batched like x."""
    return jnp.take_along_axis(x, index[..., :, None], axis=-2)


def _lu_solve_left(lu: jax.Array, perm: jax.Array, b: jax.Array, adjoint: bool) -> jax.Array:
    """Solve A X = B (or A^H X = B) for A[perm] = L @ U stored in `lu`; batches broadcast."""
    lu, perm, b = _broadcast_batch(lu, perm, b, cores=(2, 1, 2))
    if b.size == 0 or lu.size == 0:
        return jnp.zeros(b.shape, jnp.result_type(lu, b))
    if not adjoint:
        y = lax_linalg.triangular_solve(lu, _rows(b, perm), left_side=True, lower=True,
                                        unit_diagonal=True)
        return lax_linalg.triangular_solve(lu, y, left_side=True, lower=False)
    # A^H = U^H L^H P^T: solve U^H, then L^H, then undo the row permutation.
    y = lax_linalg.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True,
                                    conjugate_a=True)
    z = lax_linalg.triangular_solve(lu, y, left_side=True, lower=True, transpose_a=True,
                                    conjugate_a=True, unit_diagonal=True)
    return _rows(z, jnp.argsort(perm, axis=-1))


def _lu_solve(lu: jax.Array, perm: jax.Array, b: jax.Array, left: bool, adjoint: bool) -> jax.Array:
    if left:
        return _lu_solve_left(lu, perm, b, adjoint)
    # X A = B  <=>  A^H X^H = B^H
    return _mh(_lu_solve_left(lu, perm, _mh(b), not adjoint))


def _perm_from_pivots(pivots: jax.Array, m: int) -> jax.Array:
    """LAPACK's 1-based sequential row swaps -> the 0-based permutation they apply."""
    if pivots.shape[-1] == 0 or m == 0:
        return jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), pivots.shape[:-1] + (m,))
    return lax_linalg.lu_pivots_to_permutation(pivots.astype(jnp.int32) - 1, m)


def _pivots_sign(pivots: jax.Array, dtype) -> jax.Array:
    """det(P) for LAPACK pivots: -1 per actual swap."""
    k = pivots.shape[-1]
    swaps = jnp.sum(pivots != jnp.arange(1, k + 1, dtype=pivots.dtype), axis=-1)
    return jnp.where(swaps % 2 == 1, -1, 1).astype(dtype)


def _eye_like(a: jax.Array) -> jax.Array:
    n = a.shape[-1]
    return jnp.broadcast_to(jnp.eye(n, dtype=a.dtype), a.shape)


# ----------------------------------------------------------------------------------------
# Triangular solves


def _triangular(a: jax.Array, b: jax.Array, *, upper: bool, left: bool, unitriangular: bool,
                transpose: bool = False) -> jax.Array:
    a, b = _broadcast_batch(a, b, cores=(2, 2))
    if a.size == 0 or b.size == 0:
        return jnp.zeros(b.shape, jnp.result_type(a, b))
    return lax_linalg.triangular_solve(a, b, left_side=left, lower=not upper,
                                       transpose_a=transpose, unit_diagonal=unitriangular)


@lowers(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    return _triangular(a, b, upper=upper, left=left, unitriangular=unitriangular)


@lowers(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    # torch.triangular_solve transposes without conjugating; the coefficient comes back
    # broadcast to the batch shape.
    a, b = _broadcast_batch(a, b, cores=(2, 2))
    x = _triangular(a, b, upper=upper, left=True, unitriangular=unitriangular, transpose=transpose)
    return x, a


# ----------------------------------------------------------------------------------------
# LU


_ERRORS = {
    "inv": "linalg.inv: The diagonal element is zero, the inversion could not be completed "
    "because the input matrix is singular.",
    "solve": "torch.linalg.solve_ex: The solver failed because the input matrix is singular.",
    "unpack": "pivots passed to lu_unpack must be between 1 and LU.size(-2) inclusive."
    "Did you properly pass the result of lu_factor?",
}


def _no_pivot_error(name: str) -> RuntimeError:
    return RuntimeError(f"{name}: LU without pivoting is not implemented on the neuron device")


@lowers(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    if not pivot:
        raise _no_pivot_error("linalg.lu_factor")
    # check_errors only raises for info < 0 (an invalid argument), which cannot happen here.
    lu, pivots, _perm, info = _lu(a)
    return lu, pivots, info


@lowers(aten.linalg_lu.default)
def linalg_lu(a, *, pivot=True):
    if not pivot:
        raise _no_pivot_error("linalg.lu")
    lu, _pivots, perm, _info = _lu(a)
    return (_permutation_matrix(perm, a.dtype), *_unpack_lu(lu))


def _permutation_matrix(perm: jax.Array, dtype) -> jax.Array:
    """P with A = P @ L @ U for A[perm] = L @ U: P[perm[i], i] = 1."""
    m = perm.shape[-1]
    return jnp.swapaxes(jax.nn.one_hot(perm, m, dtype=dtype), -1, -2)


def _unpack_lu(lu: jax.Array) -> tuple[jax.Array, jax.Array]:
    m, n = lu.shape[-2:]
    k = min(m, n)
    lower = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    upper = jnp.triu(lu[..., :k, :])
    return lower, upper


@lowers(aten.lu_unpack.default, index_error=(RuntimeError, _ERRORS["unpack"]))
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    m = lu.shape[-2]
    empty = jnp.zeros((0,), lu.dtype)
    lower, upper = _unpack_lu(lu) if unpack_data else (empty, empty)
    bad = jnp.zeros((), jnp.bool_)
    if unpack_pivots:
        bad = jnp.any((pivots < 1) | (pivots > m))
        perm = _perm_from_pivots(jnp.clip(pivots, 1, max(m, 1)), m)
        p = _permutation_matrix(perm, lu.dtype)
    else:
        p = empty
    return (p, lower, upper), bad


@lowers(aten.linalg_lu_solve.default)
def linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    perm = _perm_from_pivots(pivots, lu.shape[-1])
    return _lu_solve(lu, perm, b, left, adjoint)


@lowers(aten.linalg_inv_ex.default, index_error=(RuntimeError, _ERRORS["inv"]))
def linalg_inv_ex(a, *, check_errors=False):
    lu, _pivots, perm, info = _lu(a)
    inverse = _lu_solve_left(lu, perm, _eye_like(a), adjoint=False)
    return (inverse, info), jnp.logical_and(check_errors, jnp.any(info > 0))


def _is_vector_rhs(a: jax.Array, b: jax.Array) -> bool:
    """PyTorch's rule (linalg_solve_is_vector_rhs) for a vector right-hand side."""
    return b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])


@lowers(aten._linalg_solve_ex.default, index_error=(RuntimeError, _ERRORS["solve"]))
def linalg_solve_ex(a, b, *, left=True, check_errors=False):
    # PyTorch factors A itself here (its backward solves with adjoint=True on these factors).
    lu, pivots, perm, info = _lu(a)
    vector = _is_vector_rhs(a, b)
    rhs = b[..., None] if vector else b
    x = _lu_solve(lu, perm, rhs, left, adjoint=False)
    if vector:
        x = x[..., 0]
    return (x, lu, pivots, info), jnp.logical_and(check_errors, jnp.any(info > 0))


# For det and slogdet PyTorch factors A^T when A is contiguous and real (det(A^T) = det(A))
# and its backward formulas then solve with the factors as A^T's: the factors returned must
# be those of the same matrix. `A_contiguous` comes from the runtime (see Lowering.contiguity).


def _factor_for_det(a: jax.Array, a_contiguous: bool):
    use_transpose = a_contiguous and not jnp.iscomplexobj(a)
    lu, pivots, _perm, _info = _lu(jnp.swapaxes(a, -1, -2) if use_transpose else a)
    return lu, pivots


@lowers(aten._linalg_det.default, contiguity=("A",))
def linalg_det(a, *, A_contiguous=False):
    lu, pivots = _factor_for_det(a, A_contiguous)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    det = jnp.prod(diag, axis=-1) * _pivots_sign(pivots, a.dtype)
    return det, lu, pivots


@lowers(aten._linalg_slogdet.default, contiguity=("A",))
def linalg_slogdet(a, *, A_contiguous=False):
    lu, pivots = _factor_for_det(a, A_contiguous)
    diag = jnp.diagonal(lu, axis1=-2, axis2=-1)
    # sgn: z / |z| (0 for 0) for complex, -1/0/1 for real
    sign = jnp.prod(jnp.sign(diag), axis=-1) * _pivots_sign(pivots, a.dtype)
    logabsdet = jnp.sum(jnp.log(jnp.abs(diag)), axis=-1)
    return sign, logabsdet, lu, pivots


# ----------------------------------------------------------------------------------------
# Cholesky-based solves


def _cholesky_solve(b: jax.Array, factor: jax.Array, upper: bool) -> jax.Array:
    """Solve (L L^H) X = B for L = factor (lower) or (U^H U) X = B for U = factor (upper)."""
    factor, b = _broadcast_batch(factor, b, cores=(2, 2))
    if factor.size == 0 or b.size == 0:
        return jnp.zeros(b.shape, jnp.result_type(factor, b))
    first = dict(left_side=True, lower=not upper, transpose_a=upper, conjugate_a=upper)
    second = dict(left_side=True, lower=not upper, transpose_a=not upper, conjugate_a=not upper)
    y = lax_linalg.triangular_solve(factor, b, **first)
    return lax_linalg.triangular_solve(factor, y, **second)


@lowers(aten._cholesky_solve_helper.default)
def cholesky_solve_helper(b, a, upper):
    return _cholesky_solve(b, a, upper)


@lowers(aten.cholesky_inverse.default)
def cholesky_inverse(factor, upper=False):
    return _cholesky_solve(_eye_like(factor), factor, upper)


# ----------------------------------------------------------------------------------------
# Matrix exponential


@lowers(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    if a.size == 0:
        return a
    if a.shape[-1] == 1:
        return jnp.exp(a)
    batch = a.shape[:-2]
    flat = a.reshape((-1,) + a.shape[-2:])
    out = jax.vmap(lambda m: jsl.expm(m))(flat)
    return out.reshape(batch + a.shape[-2:])

