"""Meta execution: PyTorch's own checks and output metadata for a call, and its type promotion.

Running an op on meta tensors (sizes, strides and dtypes only) raises PyTorch's errors for bad
input and reports the dtype, shape and strides of every output; the eager runtime does it once
per argument signature, when it builds the executable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from .plan import NEURON, SCALAR, TENSOR, TENSOR_LIST, OpPlan

OpOverload = torch._ops.OpOverload


def to_meta(value: Any) -> Any:
    """Neuron tensors (and neuron devices) of a call as meta ones; other values as they are."""
    if isinstance(value, torch.Tensor):
        if value.device.type == NEURON:
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        return value.to("meta") if value.dim() == 0 else value
    if isinstance(value, list | tuple):
        return type(value)(to_meta(v) for v in value)
    if isinstance(value, torch.device) and value.type == NEURON:
        return torch.device("meta")
    return value


def callable_for(op: OpOverload, args: tuple, kwargs: dict) -> Any:
    """`op`, or its overload packet when a Tensor slot holds a Python number: the boxed
    fallback receives PyTorch's wrapped scalars as numbers (`fmod(x, 4, out=o)` reaches
    `fmod.Tensor_out` with other=4), which an OpOverload called from Python refuses for most
    ops; the packet picks the overload that takes a Scalar, as Python's argument parser does."""
    schema_args = op._schema.arguments
    for a, v in zip(schema_args, args):
        if isinstance(v, int | float | complex) and str(a.type) in _TENSOR_TYPES:
            return op.overloadpacket
    if kwargs:
        for a in schema_args:
            if isinstance(kwargs.get(a.name), int | float | complex) and str(a.type) in _TENSOR_TYPES:
                return op.overloadpacket
    return op


_TENSOR_TYPES = ("Tensor", "Optional[Tensor]")


def meta_outputs(op: OpOverload, args: tuple, kwargs: dict, kernel: Callable | None = None) -> Any:
    """Run `op` (or `kernel`, a lowering's own meta kernel) on meta tensors: PyTorch's checks
    and output metadata, or None if there is no meta kernel."""
    meta_args = to_meta(args)
    meta_kwargs = {k: to_meta(v) for k, v in kwargs.items()}
    try:
        return (kernel or callable_for(op, args, kwargs))(*meta_args, **meta_kwargs)
    except NotImplementedError:
        return None
    except RuntimeError as err:
        text = str(err).lower()
        if "meta" in text and ("not implemented" in text or "no kernel" in text or "could not run" in text):
            return None
        if "data-dependent" in text or "cannot" in text and "data" in text:
            return None
        raise


def flatten_results(result) -> list:
    """An op's results as one flat list (lists of tensors inlined)."""
    if isinstance(result, tuple | list):
        flat = []
        for r in result:
            if isinstance(r, list | tuple):
                flat.extend(r)
            else:
                flat.append(r)
        return flat
    return [result]


def promotion_operands(plan: OpPlan, examples: list, include_out: bool = True) -> list:
    """The operands PyTorch's elementwise type promotion looks at, from a call's bound
    values given as examples (meta or fake tensors, Python numbers); `alpha` is not one, and
    out= tensors only with `include_out`."""
    operands = []
    skip = set() if include_out else set(plan.out_args)
    for i, (kind, value) in enumerate(zip(plan.kinds, examples)):
        if value is None or i in skip or plan.arg_names[i] == "alpha":
            continue
        if kind == TENSOR:
            operands.append(value)
        elif kind == SCALAR and not isinstance(value, torch.Tensor):
            operands.append(value)
        elif kind == TENSOR_LIST:
            operands.extend(value)
    return operands


def promotion_dtype(kind: ELEMENTWISE_TYPE_PROMOTION_KIND, operands: list) -> torch.dtype | None:
    """The computation dtype PyTorch uses for these operands (None without any)."""
    if not operands:
        return None
    compute, _ = elementwise_dtypes(*operands, type_promotion_kind=kind)
    return compute
