"""The op-call core: one lowering called on traced values, with PyTorch's calling convention.

Every path that runs a lowering comes through `call_lowering`: eager executables
(runtime/executable.py), compiled graphs (compiler/graph.py) and, later, fused eager traces.
What it does around the lowering's own function:

- tensor arguments cast to the computation dtype of the lowering's type promotion;
- positional and keyword arguments split as the schema says, `out=` arguments dropped;
- `key=` (a JAX PRNG key from the draw of the device generator) for random ops;
- `<name>_contiguous=` flags for lowerings whose result depends on layout;
- the index check of gather/scatter-style lowerings split from their result.

`cast_results` casts results to the dtypes PyTorch reports for them (meta kernels in eager
mode, fake tensors in graphs).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..lowerings import Lowering
from ..lowerings.dtypes import cast, to_jax_dtype
from . import rng
from .plan import TENSOR, TENSOR_LIST, OpPlan


def call_lowering(
    plan: OpPlan,
    lowering: Lowering,
    values: list,
    *,
    compute_dtype: torch.dtype | None = None,
    draw: Any = None,
    contiguous: dict[str, bool] | None = None,
) -> tuple[Any, Any]:
    """`lowering.fn` on a call's values (schema order of `plan`, tensors as JAX values):
    (its result, the index check's `bad` flag or None)."""
    if compute_dtype is not None:
        values = _cast_tensors(plan, values, to_jax_dtype(compute_dtype))
    n = plan.num_positional
    args = values[:n]
    out_names = plan.out_names
    kwargs = {name: v for name, v in zip(plan.arg_names[n:], values[n:]) if name not in out_names}
    if lowering.rng:
        kwargs["key"] = rng.fold_key(draw)
    if contiguous:
        for name, flag in contiguous.items():
            kwargs[f"{name}_contiguous"] = flag
    result = lowering.fn(*args, **kwargs)
    if lowering.index_error is not None:
        result, bad = result
        return result, bad
    return result, None


def contiguity_flags(plan: OpPlan, lowering: Lowering, examples: list) -> dict[str, bool]:
    """`<name>_contiguous` values for the tensors the lowering asks about (from examples:
    real, meta or fake tensors of the call)."""
    return {name: examples[plan.arg_names.index(name)].is_contiguous() for name in lowering.contiguity}


def _cast_tensors(plan: OpPlan, values: list, dtype: np.dtype) -> list:
    out = []
    for kind, v in zip(plan.kinds, values):
        if kind == TENSOR and v is not None and hasattr(v, "dtype") and v.dtype != dtype:
            v = cast(v, dtype)
        elif kind == TENSOR_LIST:
            v = [x if x is None or x.dtype == dtype else cast(x, dtype) for x in v]
        out.append(v)
    return out


def cast_to(value: Any, dtype: torch.dtype) -> jax.Array:
    """A result as a JAX array of PyTorch's dtype for it."""
    value = jnp.asarray(value)
    jdtype = to_jax_dtype(dtype)
    return value if value.dtype == jdtype else cast(value, jdtype)


def cast_results(result: Any, meta: Any) -> Any:
    """Results cast to the dtypes of `meta` (a tensor, or nested lists/tuples of tensors and
    other values, as PyTorch's meta kernel or a graph node's fake value gives them)."""
    if isinstance(meta, torch.Tensor):
        return None if result is None else cast_to(result, meta.dtype)
    if isinstance(meta, list | tuple) and isinstance(result, list | tuple):
        return type(result)(cast_results(r, m) for r, m in zip(result, meta))
    return result
