"""Pad-safety analysis: may an FX graph with symbolic sizes run on inputs padded to a bucket?

A graph traced with symbolic sizes (Dynamo's `dynamic=True`, `mark_dynamic`, automatic dynamic)
is run on inputs whose dynamic dimensions are padded up to a bucket size (compiler/buckets.py).
This module proves, node by node, that the *true region* of every value (the indices below
the true sizes) is computed exactly as in the unpadded graph, and says what each node must do
to the padding to keep it so. Nothing is assumed about what the padding holds: it may be any
value, NaN and inf included, except where the analysis knows it is exactly zero.

Terms:

- A *layout* describes a value's dimensions: one *dim* per tensor dimension, each a tuple of
  *factors* in row-major order (a dimension flattened from `(batch, seq)` has two). A factor is
  an integer or `s + c` for a bucketed size symbol `s`; a size-1 dimension has no factors.
  The padded value has each factor at its bucket size; its true region is the set of indices
  whose every factor coordinate is below the factor's true size.
- Ops that compute each element from elements at the same position (pointwise ops, views,
  layer norm over static dims, matmuls that do not contract over a padded dim) need nothing.
- Ops that combine elements along a padded dim (reductions, contractions, softmax, scatter-adds,
  the parameter gradients of layer norm) first replace that dim's padding by the neutral
  element (`where(mask, x, neutral)`), and means and variances divide by the true count.
- Index arguments have their padding replaced by a valid index (0), or by `ignore_index` for
  losses, so that neither the gathers nor the bounds checks see the padding.
- Symbolic sizes used as sizes (view shapes, `arange` bounds, `full`) take the bucket value;
  used as numbers (a division by a count, a fill value) they take the true value.

Any op without a rule here, or whose rule cannot prove its case safe, raises `NotPadSafe`
naming the op and the reason; the graph then keeps one executable per shape.

Layout: `core` (sizes, layouts, the analyzer, the rewrites' trace-time helpers, the rule table)
and one module of rules per op family (`elementwise`, `shapes`, `reductions`, `indexing`);
importing the package registers every rule.
"""

from __future__ import annotations

from . import elementwise, indexing, reductions, shapes  # noqa: F401  (register the rules)
from .core import (
    RULES,
    Analysis,
    Analyzer,
    NotPadSafe,
    Trace,
    _same,
    dim_size,
    evaluate,
    expr_of,
    is_padded,
    padded_dims,
)

__all__ = ["RULES", "Analysis", "Analyzer", "NotPadSafe", "Trace", "_same", "dim_size",
           "evaluate", "expr_of", "is_padded", "padded_dims"]
