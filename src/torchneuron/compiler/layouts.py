"""Operand layouts that XLA's CPU backend multiplies fast.

XLA's CPU compiler sends a dot to YNNPACK only when its operands are row-major and the left
operand contracts on its last dimension; other dots run through Eigen, 20-35% slower at the
sizes of a small transformer's weight gradients (dW = X^T dY contracts X on dimension 0).
XLA folds a transpose into the dot's dimension numbers, so the transposed left operand of
`mm`/`bmm`/`addmm`/`baddbmm` (a PyTorch view whose last dimension is not contiguous) is
materialized here as a physical transpose that XLA keeps: the transposed values are written
out flat behind an optimization barrier, then viewed in their shape (a free reshape). The copy
costs one pass over the smaller of the operands the backward multiplies.

Measured (process CPU time, jax 0.10.2, 2 cores at load average 11): dW 256x256 over 1024
rows 1090 -> 853 us, 1024x256 over 1024 rows 5384 -> 3616 us, 256x768 2372 -> 2379 us
(unchanged), batched 128x128^T @ 128x64 (32 heads) 563 -> 538 us.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from ..runtime import platform

aten = torch.ops.aten

# op -> the schema name of its left matrix operand
DOT_LHS = {
    aten.mm.default: "self",
    aten.bmm.default: "self",
    aten.addmm.default: "mat1",
    aten.baddbmm.default: "batch1",
}


def physical_transpose_wanted(example) -> bool:
    """Whether a left operand (its fake tensor) is a transposed view: its last dimension is
    not the contiguous one."""
    if not isinstance(example, torch.Tensor) or example.dim() < 2:
        return False
    try:
        return int(example.stride(-1)) != 1 and int(example.shape[-1]) > 1 and \
            int(example.shape[-2]) > 1
    except (TypeError, ValueError, RuntimeError):  # symbolic strides
        return False


def kept_row_major(value):
    """`value` as the same logical array, laid out row-major by a copy XLA keeps."""
    flat = lax.optimization_barrier(jnp.reshape(value, (-1,)))
    return jnp.reshape(flat, value.shape)


def prepare_dot_operands(target, plan, values: list, examples: list) -> list:
    """The call's values with a transposed left operand of a dot materialized (CPU only)."""
    name = DOT_LHS.get(target)
    if name is None or platform.platform_name() != "cpu":
        return values
    i = plan.arg_names.index(name)
    if not physical_transpose_wanted(examples[i]):
        return values
    values = list(values)
    values[i] = kept_row_major(values[i])
    return values
