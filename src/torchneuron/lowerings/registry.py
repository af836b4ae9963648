"""The lowering table: ATen overload -> pure JAX function.

A lowering receives the op's arguments as the ATen schema names them, with every tensor
replaced by a `jax.Array` (already type-promoted when `promote=` is given) and returns
`jax.Array`s (a tuple for multi-output ops). It knows nothing of storages or dispatch; the
eager runtime and the compiler both read this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

OpOverload = torch._ops.OpOverload


@dataclass(frozen=True)
class Lowering:
    fn: Callable
    # torch._prims_common.ELEMENTWISE_TYPE_PROMOTION_KIND name, or None: tensor inputs are
    # cast to the computation dtype PyTorch would use before `fn` runs.
    promote: str | None = None
    # Non-tensor arguments whose Python value the function needs (shapes, dims, modes);
    # int/bool/list/str/dtype arguments are always static; Scalar/float ones are traced
    # unless named here, so a changing learning rate does not recompile.
    static: frozenset[str] = field(default_factory=frozenset)
    # False for ops whose output shape depends on values (nonzero, masked_select): they run
    # op by op on concrete arrays instead of under jax.jit.
    jit: bool = True
    # True: the function takes a `key=` jax PRNG key drawn from the device generator.
    rng: bool = False
    # True: the function returns (result, bad) where `bad` is a boolean scalar; the runtime
    # raises IndexError(index_error) when it is set, so out-of-range indices never wrap.
    # A (exception class, message) pair raises that class instead (CPU raises RuntimeError
    # for some ops, e.g. gather).
    index_error: str | tuple[type[Exception], str] | None = None
    # A replacement for PyTorch's meta kernel, called with meta tensors, where that kernel
    # reports another layout than CPU's (the fft kernels assume CUDA for meta tensors).
    meta: Callable | None = None
    # Tensor arguments whose contiguity the function needs: it receives `<name>_contiguous=`
    # (a bool) for each. A few CPU kernels choose what they compute by layout (det/slogdet
    # factor A^T for a contiguous real A, and their backward formulas rely on that choice).
    contiguity: tuple[str, ...] = ()


LOWERINGS: dict[OpOverload, Lowering] = {}


def lowers(
    *ops: OpOverload,
    promote: str | None = None,
    static: tuple[str, ...] = (),
    jit: bool = True,
    rng: bool = False,
    index_error: str | tuple[type[Exception], str] | None = None,
    contiguity: tuple[str, ...] = (),
    meta: Callable | None = None,
) -> Callable[[Callable], Callable]:
    """Register `fn` as the lowering of each ATen overload in `ops`."""

    def register(fn: Callable) -> Callable:
        entry = Lowering(fn, promote, frozenset(static), jit, rng, index_error, meta,
                         contiguity=tuple(contiguity))
        for op in ops:
            if op in LOWERINGS:
                raise RuntimeError(f"torchneuron: two lowerings registered for {op}")
            LOWERINGS[op] = entry
        return fn

    return register


def lowering_for(op: OpOverload) -> Lowering | None:
    return LOWERINGS.get(op)


def index_exception(index_error: str | tuple[type[Exception], str]) -> Exception:
    """The exception a failed index check raises."""
    if isinstance(index_error, tuple):
        cls, message = index_error
        return cls(message)
    return IndexError(index_error)


# op -> predicate on the call's arguments ({schema name: value}; tensors as they are passed):
# False sends that call down the op's other paths (decomposition, CPU) instead of the
# lowering. For ops whose lowering is exact only for some modes: an SVD's singular vectors
# are unique only up to sign, and JAX's LAPACK picks other signs than PyTorch's, so
# `_linalg_svd` is lowered only when no vectors are asked for.
LIMITS: dict[OpOverload, Callable[[dict], bool]] = {}


def lowered_only_when(predicate: Callable[[dict], bool], *ops: OpOverload) -> None:
    """Use the lowering of each op in `ops` only for calls where `predicate(arguments)`."""
    for op in ops:
        LIMITS[op] = predicate


def lowering_applies(op: OpOverload, arguments: dict) -> bool:
    predicate = LIMITS.get(op)
    return predicate is None or bool(predicate(arguments))
