"""Linear solvers and LU-based ops: triangular solves, LU factor/unpack/solve, inverse,
solve, determinants, Cholesky solves, matrix exponential.

PyTorch's conventions are kept exactly where they are visible: LU pivots are LAPACK's
1-based int32 row swaps, `info` is LAPACK's (`i > 0`: `U[i-1, i-1]` is exactly zero), and
the LU factors returned alongside a result are those PyTorch's backward formulas expect.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax
from jax.lax import linalg as lax_linalg

from .registry import at_call, lowers

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


@lowers(aten.lu_unpack.default, index_error=at_call(RuntimeError, _ERRORS["unpack"]))
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


@lowers(aten.linalg_inv_ex.default, index_error=at_call(torch.linalg.LinAlgError, _ERRORS["inv"]))
def linalg_inv_ex(a, *, check_errors=False):
    lu, _pivots, perm, info = _lu(a)
    inverse = _lu_solve_left(lu, perm, _eye_like(a), adjoint=False)
    return (inverse, info), jnp.logical_and(check_errors, jnp.any(info > 0))


def _is_vector_rhs(a: jax.Array, b: jax.Array) -> bool:
    """PyTorch's rule (linalg_solve_is_vector_rhs) for a vector right-hand side."""
    return b.ndim == 1 or (b.ndim == a.ndim - 1 and b.shape == a.shape[:-1])


@lowers(aten._linalg_solve_ex.default, index_error=at_call(torch.linalg.LinAlgError, _ERRORS["solve"]))
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
#
# PyTorch's algorithm (Bader, Blanes, Casas 2019: optimized Taylor polynomials of degree
# 1, 2, 4, 8, 12, 18, chosen per matrix by its 1-norm, with scaling and squaring beyond the
# last one). Even so float32/complex64 results differ from CPU's beyond the OpInfo
# tolerance on matrices with a large norm (each squaring doubles the matmul rounding
# differences between XLA and MKL, and CPU's own float32 result is off by up to ~1e-3 there):
# those dtypes run on CPU; float64/complex128 agree to ~1e-14.

_MEXP_THETAS = {
    "single": (1.192092800768788e-07, 5.978858893805233e-04, 5.116619363445086e-02,
               5.800524627688768e-01, 1.461661507209034e00, 3.010066362817634e00),
    "double": (2.220446049250313e-16, 2.580956802971767e-08, 3.397168839976962e-04,
               4.991228871115323e-02, 2.996158913811580e-01, 1.090863719290036e00),
}

# Coefficients of the degree-12 and degree-18 polynomials (the paper's Table; rows combine
# the powers I, A, A^2, A^3 (and A^6 for degree 18)).
_T12_COEFFS = (
    (9.0198e-16, 0.46932117595418237389, -0.20099424927047284052, -0.04623946134063071740),
    (5.31597895759871264183, 1.19926790417132231573, 0.01179296240992997031,
     0.01108844528519167989),
    (0.18188869982170434744, 0.05502798439925399070, 0.09351590770535414968,
     0.00610700528898058230),
    (-2.0861320e-13, -0.13181061013830184015, -0.02027855540589259079,
     -0.00675951846863086359),
)
_T18_COEFFS = (
    (0.0, -1.00365581030144618291e-01, -8.02924648241156932449e-03,
     -8.92138498045729985177e-04, 0.0),
    (0.0, 3.97849749499645077844e-01, 1.36783778460411720168e00, 4.98289622525382669416e-01,
     -6.37898194594723280150e-04),
    (-1.09676396052962061844e01, 1.68015813878906206114e00, 5.71779846478865511061e-02,
     -6.98210122488052056106e-03, 3.34975017086070470649e-05),
    (-9.04316832390810593223e-02, -6.76404519071381882256e-02, 6.75961301770459654925e-02,
     2.95552570429315521194e-02, -1.39180257516060693404e-05),
    (0.0, 0.0, -9.23364619367118555360e-02, -1.69364939002081722752e-02,
     -1.40086798182036094347e-05),
)


def _mm(x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST)


def _combine(coeffs, mats, real_dtype) -> jax.Array:
    """sum_k coeffs[k] * mats[k], coefficients rounded to the real dtype as PyTorch's are."""
    out = None
    for c, m in zip(coeffs, mats):
        term = m * np.asarray(c, real_dtype)
        out = term if out is None else out + term
    return out


def _mexp_taylor(a: jax.Array, degree: int, real_dtype) -> jax.Array:
    eye = jnp.broadcast_to(jnp.eye(a.shape[-1], dtype=a.dtype), a.shape)
    if degree == 1:
        return eye + a
    a2 = _mm(a, a)
    if degree == 2:
        return eye + a + a2 / 2
    if degree == 4:
        inner = _combine((1 / 2.0, 1 / 6.0, 1 / 24.0), (eye, a, a2), real_dtype)
        return _combine((1.0, 1.0, 1.0), (eye, a, _mm(a2, inner)), real_dtype)
    if degree == 8:
        f = real_dtype.type
        sqrt_177 = f(0.1330413469565007072504e2)
        x3 = f(2.0 / 3.0)
        x1 = f(float(x3) * ((1.0 + float(sqrt_177)) / 88.0))
        x2 = f(float(x3) * ((1.0 + float(sqrt_177)) / 352.0))
        x4 = f((-271.0 + 29.0 * float(sqrt_177)) / (315.0 * float(x3)))
        x5 = f((-11.0 + 11.0 * float(sqrt_177)) / (1260.0 * float(x3)))
        x6 = f((-99.0 + 11.0 * float(sqrt_177)) / (5040.0 * float(x3)))
        x7 = f((89.0 - float(sqrt_177)) / (5040.0 * float(x3)))
        y2 = f((857.0 - 58.0 * float(sqrt_177)) / 630.0)
        a4 = _mm(a2, _combine((x1, x2), (a, a2), real_dtype))
        a8 = _mm(_combine((x3, 1.0), (a2, a4), real_dtype),
                 _combine((x4, x5, x6, x7), (eye, a, a2, a4), real_dtype))
        return _combine((1.0, 1.0, y2, 1.0), (eye, a, a2, a8), real_dtype)
    a3 = _mm(a, a2)
    if degree == 12:
        powers = (eye, a, a2, a3)
        b = [_combine(row, powers, real_dtype) for row in _T12_COEFFS]
        b2 = b[2] + _mm(b[3], b[3])
        return b[0] + _mm(b[1] + b2, b2)
    a6 = _mm(a3, a3)
    powers = (eye, a, a2, a3, a6)
    b = [_combine(row, powers, real_dtype) for row in _T18_COEFFS]
    b3 = b[3] + _mm(b[0], b[4])
    return b[1] + _mm(b[2] + b3, b3)


def _mexp(a: jax.Array) -> jax.Array:
    real_dtype = np.dtype(jnp.finfo(a.dtype).dtype)
    thetas = _MEXP_THETAS["single" if real_dtype == np.float32 else "double"]
    thetas = [real_dtype.type(t) for t in thetas]
    norm = jnp.max(jnp.sum(jnp.abs(a), axis=-2), axis=-1)  # operator 1-norm, per matrix
    norm_b = norm[..., None, None]
    # A NaN norm matches no interval: the result stays NaN, as PyTorch's.
    result = jnp.full(a.shape, jnp.nan, a.dtype)
    lower = real_dtype.type(-1)
    for degree, theta in zip((1, 2, 4, 8, 12), thetas[:5]):
        chosen = (lower < norm_b) & (norm_b <= theta)
        result = jnp.where(chosen, _mexp_taylor(a, degree, real_dtype), result)
        lower = theta
    # Large norms: degree 18 on A / 2^s, then s squarings.
    s = jnp.maximum(0, jnp.ceil(jnp.log2(norm / thetas[5])))
    s = jnp.where(norm >= thetas[4], s, 0).astype(jnp.int32)
    scaled = a / jnp.exp2(s.astype(real_dtype))[..., None, None].astype(a.dtype)
    squared = _mexp_taylor(scaled, 18, real_dtype)

    def square(state):
        p, m = state
        return p + 1, jnp.where((p < s)[..., None, None], _mm(m, m), m)

    _, squared = jax.lax.while_loop(lambda st: st[0] < jnp.max(s), square,
                                    (jnp.zeros((), jnp.int32), squared))
    return jnp.where(norm_b >= thetas[4], squared, result)


def _double_precision(arguments: dict) -> bool:
    a = arguments["self"]
    value = a.meta.get("val") if isinstance(a, torch.fx.Node) else a
    return getattr(value, "dtype", None) in (torch.float64, torch.complex128)


@lowers(aten.linalg_matrix_exp.default, only_when=_double_precision)
def linalg_matrix_exp(a):
    if a.size == 0:
        return a
    if a.shape[-1] == 1:
        return jnp.exp(a)
    return _mexp(a)


# ----------------------------------------------------------------------------------------
# LDL (Bunch-Kaufman), as LAPACK's unblocked sytf2/sytrs with uplo='L'
#
# The pivot choices and the compact LD layout are LAPACK's, step for step. The complex
# Hermitian variants (hetrf/hetrs) are not lowered (only_when on the two lowerings below).


def _cabs1(x: jax.Array) -> jax.Array:
    """LAPACK's magnitude for pivot search: |x| for real, |re| + |im| for complex."""
    if jnp.iscomplexobj(x):
        return jnp.abs(jnp.real(x)) + jnp.abs(jnp.imag(x))
    return jnp.abs(x)


def _first_argmax(values: jax.Array) -> jax.Array:
    return jnp.argmax(values).astype(jnp.int32)  # argmax returns the first maximum, as i?amax


def _sytf2_lower(a: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    n = a.shape[-1]
    real = jnp.finfo(a.dtype).dtype
    alpha = jnp.asarray((1.0 + np.sqrt(17.0)) / 8.0, real)
    idx = jnp.arange(n, dtype=jnp.int32)
    row, col = idx[:, None], idx[None, :]

    def body(state):
        k, s, ipiv, info = state
        # Only the lower triangle is meaningful (as LAPACK reads it): mirror it first.
        low = jnp.tril(s)
        s = low + jnp.swapaxes(jnp.tril(s, -1), -1, -2)
        absakk = _cabs1(s[k, k])
        colabs = jnp.where(idx > k, _cabs1(s[:, k]), -1)
        imax = _first_argmax(colabs)
        colmax = jnp.where(k < n - 1, colabs[imax], 0).astype(real)
        singular = (jnp.maximum(absakk, colmax) == 0) | jnp.isnan(absakk)
        rowvals = jnp.where((idx >= k) & (idx < imax), _cabs1(s[imax, :]), -1)
        rowmax = rowvals[_first_argmax(rowvals)]
        below = jnp.where(idx > imax, _cabs1(s[:, imax]), -1)
        rowmax = jnp.where(imax < n - 1, jnp.maximum(rowmax, jnp.max(below)), rowmax).astype(real)
        keep = absakk >= alpha * colmax
        keep2 = absakk >= alpha * colmax * (colmax / rowmax)
        one_at_imax = _cabs1(s[imax, imax]) >= alpha * rowmax
        kp = jnp.where(singular | keep | keep2, k, imax)
        kstep = jnp.where(singular | keep | keep2 | one_at_imax, 1, 2)
        kk = k + kstep - 1
        # Interchange rows and columns kk and kp of the trailing block (earlier columns of
        # L are left alone; sytrs applies the swaps in sequence).
        perm = jnp.where(idx == kk, kp, jnp.where(idx == kp, kk, idx))
        trailing = (row >= k) & (col >= k)
        s = jnp.where(trailing, s[perm][:, perm], s)

        # 1x1 pivot: rank-1 update of the trailing block, then scale the column.
        d11 = 1 / s[k, k]
        x = jnp.where(idx > k, s[:, k], 0)
        upd1 = s + x[:, None] * (-d11 * x)[None, :]
        upd1 = jnp.where((row > k) & (col > k), upd1, s)
        upd1 = upd1.at[:, k].set(jnp.where(idx > k, s[:, k] * d11, s[:, k]))
        # 2x2 pivot: rank-2 update with the block's inverse.
        k1 = jnp.minimum(k + 1, n - 1)
        d21 = s[k1, k]
        e11 = s[k1, k1] / d21
        e22 = s[k, k] / d21
        t = 1 / (e11 * e22 - 1)
        d21 = t / d21
        far = idx > k1
        wk = jnp.where(far, d21 * (e11 * s[:, k] - s[:, k1]), 0)
        wkp1 = jnp.where(far, d21 * (e22 * s[:, k1] - s[:, k]), 0)
        upd2 = s - (s[:, k][:, None] * wk[None, :] + s[:, k1][:, None] * wkp1[None, :])
        upd2 = jnp.where(far[:, None] & far[None, :], upd2, s)
        upd2 = upd2.at[:, k].set(jnp.where(far, wk, s[:, k]))
        upd2 = upd2.at[:, k1].set(jnp.where(far, wkp1, s[:, k1]))

        s = jnp.where(singular, s, jnp.where(kstep == 1, upd1, upd2))
        pivot = jnp.where(kstep == 1, kp + 1, -(kp + 1)).astype(jnp.int32)
        ipiv = ipiv.at[k].set(pivot)
        ipiv = jnp.where((kstep == 2) & (idx == k + 1), pivot, ipiv)
        info = jnp.where(singular & (info == 0), k + 1, info)
        return k + kstep, s, ipiv, info

    init = (jnp.zeros((), jnp.int32), a, jnp.zeros((n,), jnp.int32), jnp.zeros((), jnp.int32))
    _, s, ipiv, info = lax.while_loop(lambda st: st[0] < n, body, init)
    return jnp.tril(s), ipiv, info


def _batched(fn, *arrays: jax.Array, cores: tuple[int, ...]):
    """Apply a single-matrix function over the (broadcast) batch dimensions."""
    arrays = _broadcast_batch(*arrays, cores=cores)
    batch = arrays[0].shape[: arrays[0].ndim - cores[0]]
    flat = [x.reshape((-1,) + x.shape[x.ndim - c :]) for x, c in zip(arrays, cores)]
    out = jax.vmap(fn)(*flat)
    return jax.tree_util.tree_map(lambda o: o.reshape(batch + o.shape[1:]), out)


def _not_complex_hermitian(arguments: dict) -> bool:
    if not arguments.get("hermitian"):
        return True
    first = arguments.get("self", arguments.get("LD"))
    value = first.meta.get("val") if isinstance(first, torch.fx.Node) else first
    return not getattr(value, "is_complex", lambda: True)()


@lowers(aten.linalg_ldl_factor_ex.default, only_when=_not_complex_hermitian)
def linalg_ldl_factor_ex(a, *, hermitian=False, check_errors=False):
    n = a.shape[-1]
    batch = a.shape[:-2]
    if a.size == 0:
        return a, jnp.zeros(batch + (n,), jnp.int32), jnp.zeros(batch, jnp.int32)
    return _batched(_sytf2_lower, a, cores=(2,))


def _sytrs_lower(ld: jax.Array, ipiv: jax.Array, b: jax.Array) -> jax.Array:
    n = ld.shape[-1]
    idx = jnp.arange(n, dtype=jnp.int32)

    def swap(b, i, j):
        perm = jnp.where(idx == i, j, jnp.where(idx == j, i, idx))
        return b[perm]

    # L D Y = P^T B, forwards
    def forward(state):
        k, b = state
        p = ipiv[k]
        one = p > 0
        # 1x1 block
        b1 = swap(b, k, p - 1)
        b1 = b1 - jnp.where((idx > k)[:, None], ld[:, k][:, None] * b1[k][None, :], 0)
        b1 = b1.at[k].set(b1[k] / ld[k, k])
        # 2x2 block
        k1 = jnp.minimum(k + 1, n - 1)
        b2 = swap(b, k1, -p - 1)
        far = (idx > k1)[:, None]
        b2 = b2 - jnp.where(far, ld[:, k][:, None] * b2[k][None, :], 0)
        b2 = b2 - jnp.where(far, ld[:, k1][:, None] * b2[k1][None, :], 0)
        akm1k = ld[k1, k]
        akm1 = ld[k, k] / akm1k
        ak = ld[k1, k1] / akm1k
        denom = akm1 * ak - 1
        bkm1 = b2[k] / akm1k
        bk = b2[k1] / akm1k
        b2 = b2.at[k].set((ak * bkm1 - bk) / denom).at[k1].set((akm1 * bk - bkm1) / denom)
        return k + jnp.where(one, 1, 2), jnp.where(one, b1, b2)

    _, b = lax.while_loop(lambda st: st[0] < n, forward, (jnp.zeros((), jnp.int32), b))

    # L^T P^T X = Y, backwards
    def backward(state):
        k, b = state
        p = ipiv[k]
        one = p > 0
        below = jnp.where((idx > k)[:, None], b, 0)
        b1 = b.at[k].add(-(ld[:, k] @ below))
        b1 = swap(b1, k, p - 1)
        km1 = jnp.maximum(k - 1, 0)
        b2 = b.at[k].add(-(ld[:, k] @ below)).at[km1].add(-(ld[:, km1] @ below))
        b2 = swap(b2, k, -p - 1)
        return k - jnp.where(one, 1, 2), jnp.where(one, b1, b2)

    _, b = lax.while_loop(lambda st: st[0] >= 0, backward, (jnp.asarray(n - 1, jnp.int32), b))
    return b


@lowers(aten.linalg_ldl_solve.default, only_when=_not_complex_hermitian)
def linalg_ldl_solve(ld, pivots, b, *, hermitian=False):
    if ld.size == 0 or b.size == 0:
        ld, pivots, b = _broadcast_batch(ld, pivots, b, cores=(2, 1, 2))
        return jnp.zeros(b.shape, jnp.result_type(ld, b))
    return _batched(_sytrs_lower, ld, pivots, b, cores=(2, 1, 2))
