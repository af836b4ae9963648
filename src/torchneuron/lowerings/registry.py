"""The lowering table: ATen overload -> one `Lowering` record (a pure JAX function and all
that the runtime and the compiler need to know about calling it).

A lowering receives the op's arguments as the ATen schema names them, with every tensor
replaced by a `jax.Array` (already type-promoted when `promote=` is given) and returns
`jax.Array`s (a tuple for multi-output ops). It knows nothing of storages or dispatch; the
eager runtime and the compiler both read this table through the same op-call core
(`runtime/opcall.py`). docs/LOWERINGS.md describes every field.

A second, small table holds the project's own decompositions (`@decomposes`): ops computed
from other ATen ops where PyTorch's decomposition is missing or differs from CPU's kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import jax.numpy as jnp
import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND

OpOverload = torch._ops.OpOverload

# PyTorch's own enum of elementwise type-promotion kinds (`promote=Promotion.DEFAULT`).
Promotion = ELEMENTWISE_TYPE_PROMOTION_KIND

_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


@dataclass(frozen=True)
class Lowering:
    fn: Callable
    # Tensor inputs are cast to the computation dtype PyTorch's elementwise type promotion
    # of this kind gives, before `fn` runs (None: inputs keep their dtypes).
    promote: ELEMENTWISE_TYPE_PROMOTION_KIND | None = None
    # Non-tensor arguments whose Python value the function needs (shapes, dims, modes);
    # int/bool/list/str/dtype arguments are always static; Scalar/float ones are traced
    # unless named here, so a changing learning rate does not recompile.
    static: frozenset[str] = field(default_factory=frozenset)
    # False for ops whose output shape depends on values (nonzero, masked_select): they run
    # op by op on concrete arrays instead of under jax.jit (and never inside graphs).
    jit: bool = True
    # True: the function takes a `key=` jax PRNG key drawn from the device generator.
    rng: bool = False
    # The function returns (result, bad) where `bad` is a boolean scalar; the runtime
    # raises IndexError(index_error) when it is set, so out-of-range indices never wrap.
    # A (exception class, message) pair raises that class instead.
    index_error: str | tuple[type[Exception], str] | None = None
    # A replacement for PyTorch's meta kernel (called with meta tensors) where that kernel
    # reports another layout or dtype than CPU's kernel gives.
    meta: Callable | None = None
    # Tensor arguments whose contiguity the function needs: it receives `<name>_contiguous=`
    # (a bool) for each (det/slogdet factor A^T for a contiguous real A on CPU).
    contiguity: tuple[str, ...] = ()
    # True: half/bfloat16 arguments are computed in float32 and the results rounded once,
    # as PyTorch's CPU kernels do ("opmath"); `fn` is registered wrapped accordingly.
    opmath: bool = False
    # A predicate on the call's arguments ({schema name: value}): the lowering serves only
    # the calls it accepts; the others run the op's project decomposition, else CPU's kernel.
    only_when: Callable[[dict], bool] | None = None
    # A predicate on the call's arguments: True when `only_when` accepts every call with this
    # call's signature (dtypes, shapes, static arguments), whatever its scalar values; the
    # C++ fast path may then reuse this call's executable for them (addmm in floating types).
    signature_decides: Callable[[dict], bool] | None = None
    # Arguments the op writes although its schema does not mark them mutable (e.g.
    # native_batch_norm's running statistics): after the outputs, `fn` returns their new
    # values (None: left alone), and the CPU fallback copies them back too.
    writes: tuple[str, ...] = ()
    # True: the result shares the input's storage although the schema does not say so
    # (`_unsafe_view`); eager mode runs it as a view (metadata over the same storage).
    aliases_input: bool = False
    # Extra overloads of the same op (out= variants) that need a kernel of their own at
    # PrivateUse1 because PyTorch's composite kernel refuses unknown devices.
    direct_kernels: tuple[OpOverload, ...] = ()
    # True: lowered only inside compiled graphs; eager mode reaches the op by other paths.
    graph_only: bool = False
    # For `jit=False` ops: the strides of the result given its shape, where CPU's kernel
    # returns another layout than contiguous (nonzero's (n, ndim) result has strides (1, n)).
    result_strides: Callable[[tuple[int, ...]], tuple[int, ...]] | None = None
    # For `jit=False` ops: the record compiled graphs use instead (a traceable function for
    # the calls its `only_when` accepts: `index.Tensor` with integer indices), from
    # `graph_form(...)`.
    graph_form: Lowering | None = None
    # For `jit=False` ops: a traced record eager mode runs instead for the calls its
    # `only_when` accepts, which must follow from the signature alone (`x[mask] = 0`: one
    # boolean mask and one value need no data-dependent shape), from `eager_form(...)`.
    eager_form: Lowering | None = None


LOWERINGS: dict[OpOverload, Lowering] = {}


def lowers(
    *ops: OpOverload,
    promote: ELEMENTWISE_TYPE_PROMOTION_KIND | None = None,
    static: tuple[str, ...] = (),
    jit: bool = True,
    rng: bool = False,
    index_error: str | tuple[type[Exception], str] | None = None,
    meta: Callable | None = None,
    contiguity: tuple[str, ...] = (),
    opmath: bool = False,
    only_when: Callable[[dict], bool] | None = None,
    signature_decides: Callable[[dict], bool] | None = None,
    writes: tuple[str, ...] = (),
    aliases_input: bool = False,
    direct_kernels: tuple[OpOverload, ...] = (),
    graph_only: bool = False,
    result_strides: Callable[[tuple[int, ...]], tuple[int, ...]] | None = None,
    graph_form: Lowering | None = None,
    eager_form: Lowering | None = None,
) -> Callable[[Callable], Callable]:
    """Register `fn` as the lowering of each ATen overload in `ops` (fields: see `Lowering`)."""
    if promote is not None and not isinstance(promote, ELEMENTWISE_TYPE_PROMOTION_KIND):
        raise TypeError(f"promote= takes a Promotion kind, not {promote!r}")

    def register(fn: Callable) -> Callable:
        entry = Lowering(
            in_opmath(fn) if opmath else fn, promote, frozenset(static), jit, rng, index_error,
            meta, tuple(contiguity), opmath, only_when, signature_decides, tuple(writes),
            aliases_input, tuple(direct_kernels), graph_only, result_strides, graph_form,
            eager_form,
        )
        for op in ops:
            if op in LOWERINGS:
                raise RuntimeError(f"torchneuron: two lowerings registered for {op}")
            LOWERINGS[op] = entry
        return fn

    return register


def graph_form(
    fn: Callable,
    *,
    index_error: str | tuple[type[Exception], str] | None = None,
    only_when: Callable[[dict], bool] | None = None,
) -> Lowering:
    """The traceable record of a `jit=False` op for compiled graphs (`lowers(graph_form=)`):
    `fn` takes the op's arguments as the eager function does."""
    return Lowering(fn, index_error=index_error, only_when=only_when, graph_only=True)


def eager_form(fn: Callable, *, only_when: Callable[[dict], bool]) -> Lowering:
    """The traced record of a `jit=False` op for the eager calls `only_when` accepts
    (`lowers(eager_form=)`); `only_when` must depend on the call's signature only (dtypes,
    shapes, static arguments), as the executable is kept per signature."""
    return Lowering(fn, only_when=only_when, signature_decides=only_when)


class CheckedAtCall(tuple):
    """An `index_error` (exception class, message) whose failed check raises at the call, not
    at the next sync point: a check that CUDA's kernels read back at once too (a singular
    matrix, a bad distribution), which code catches to retry. Out-of-range indices, which
    CUDA reports by device-side asserts, are read at the next sync point."""


def at_call(cls: type[Exception], message: str) -> CheckedAtCall:
    """`index_error=at_call(cls, message)`: see `CheckedAtCall`."""
    return CheckedAtCall((cls, message))


def index_exception(index_error: str | tuple[type[Exception], str]) -> Exception:
    """The exception a failed index check raises."""
    if isinstance(index_error, tuple):
        cls, message = index_error
        return cls(message)
    return IndexError(index_error)


# ----------------------------------------------------------------------------------------
# Half precision


def upcast_half(x):
    """float16/bfloat16 arrays widened to float32 (CPU kernels' "opmath"); others as they are."""
    if x is not None and getattr(x, "dtype", None) in _HALF:
        return x.astype(jnp.float32)
    return x


def _is_weak(v) -> bool:
    """A traced Python scalar (alpha, value=...): it takes the tensors' dtype in arithmetic."""
    return bool(getattr(v, "weak_type", False) or getattr(getattr(v, "aval", None), "weak_type", False))


def _common_half(values) -> jnp.dtype | None:
    """The half/bfloat16 dtype when every floating tensor argument has it, else None."""
    half = None
    for v in values:
        dtype = getattr(v, "dtype", None)
        if dtype is None or _is_weak(v) or not jnp.issubdtype(dtype, jnp.floating):
            continue
        dtype = jnp.dtype(dtype)
        if dtype not in _HALF or (half is not None and dtype != half):
            return None
        half = dtype
    return half


def in_opmath(fn: Callable) -> Callable:
    """`fn` run on float32 copies of half/bfloat16 arguments, its results rounded once.

    PyTorch's CPU kernels compute half and bfloat16 in float32 and round the result; XLA
    computes each step of a formula in the narrow type (and several of its transcendental
    expansions in half are less accurate), so results would differ by an ulp or more."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        half = _common_half(list(args) + list(kwargs.values()))
        if half is None:
            return fn(*args, **kwargs)

        def up(v):
            dtype = getattr(v, "dtype", None)
            return v.astype(jnp.float32) if dtype is not None and jnp.dtype(dtype) == half else v

        def down(r):
            return r.astype(half) if getattr(r, "dtype", None) == jnp.float32 else r

        result = fn(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()})
        if isinstance(result, tuple | list):
            return type(result)(down(r) for r in result)
        return down(result)

    return run


# ----------------------------------------------------------------------------------------
# Overloads without a lowering of their own

# op -> predicate on the call's arguments: calls it rejects run CPU's kernel (visibly), not
# PyTorch's decomposition. For the few overloads whose decomposition differs from CPU's kernel
# in some modes and that have no lowering to carry an `only_when` (e.g. upsample_bicubic2d on
# uint8 images: CPU runs a fixed-point kernel).
CPU_KERNEL_UNLESS: dict[OpOverload, Callable[[dict], bool]] = {}


def cpu_kernel_unless(predicate: Callable[[dict], bool], *ops: OpOverload) -> None:
    """Run CPU's kernel for the calls of each op in `ops` that `predicate` rejects."""
    for op in ops:
        if op in LOWERINGS:
            raise RuntimeError(f"torchneuron: {op} has a lowering: give it only_when= instead")
        CPU_KERNEL_UNLESS[op] = predicate


# ----------------------------------------------------------------------------------------
# The project's decompositions


@dataclass(frozen=True)
class Decomposition:
    fn: Callable
    # True: also used by the compiler (added to AOTAutograd's decomposition table).
    in_graphs: bool = False


DECOMPOSITIONS: dict[OpOverload, Decomposition] = {}


def decomposes(*ops: OpOverload, in_graphs: bool = False) -> Callable[[Callable], Callable]:
    """Register `fn` (written with ATen ops on tensors, like `torch._decomp`'s entries) as
    the way to compute each op in `ops` on the device. It takes precedence over PyTorch's
    decomposition, and serves the calls a lowering's `only_when` turns away."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            if op in DECOMPOSITIONS:
                raise RuntimeError(f"torchneuron: two decompositions registered for {op}")
            DECOMPOSITIONS[op] = Decomposition(fn, in_graphs)
        return fn

    return register
