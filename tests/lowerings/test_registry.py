"""Every registered lowering can be called the way the runtime calls it, and so can the
examples in docs/LOWERINGS.md."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import torch

from torchneuron.lowerings import LOWERINGS
from torchneuron.lowerings.registry import Promotion, lowers

DOC = Path(__file__).resolve().parents[2] / "docs" / "LOWERINGS.md"


def signature_problems(op, fn, rng: bool) -> list[str]:
    problems = []
    params = inspect.signature(fn).parameters
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    has_var_positional = any(p.kind == p.VAR_POSITIONAL for p in params.values())
    has_var_keyword = any(p.kind == p.VAR_KEYWORD for p in params.values())
    schema_args = op._schema.arguments
    out_names = {a.name for a in schema_args if a.kwarg_only and a.alias_info and a.alias_info.is_write}
    n_positional = sum(1 for a in schema_args if not a.kwarg_only)
    if n_positional > len(positional) and not has_var_positional:
        problems.append(f"{op}: takes {len(positional)} positional, schema has {n_positional}")
    for arg in schema_args:
        if not arg.kwarg_only or arg.name in out_names:
            continue
        if arg.name not in params and not has_var_keyword:
            problems.append(f"{op}: no parameter for keyword-only argument {arg.name!r}")
    if rng and "key" not in params:
        problems.append(f"{op}: rng lowering without a `key` parameter")
    return problems


def test_lowering_signatures_accept_their_schemas():
    problems = []
    for op, lowering in LOWERINGS.items():
        problems += signature_problems(op, lowering.fn, lowering.rng)
    assert not problems, "\n".join(problems)


def test_lowering_guide_examples_pass_the_signature_test():
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    registered = []

    def recording_lowers(*ops, **options):
        def register(fn):
            registered.extend((op, fn, options.get("rng", False)) for op in ops)
            return fn
        return register

    examples = [b for b in blocks if "@lowers(" in b]
    assert len(examples) >= 2
    for block in examples:
        code = block.replace("from .registry import Promotion, lowers\n", "").replace(
            "from .registry import lowers\n", "")
        exec(code, {"aten": torch.ops.aten, "lowers": recording_lowers, "Promotion": Promotion,
                    "jax": jax, "jnp": jnp})
    assert registered
    problems = [p for op, fn, rng in registered for p in signature_problems(op, fn, rng)]
    assert not problems, "\n".join(problems)


def test_the_signature_test_can_fail():
    # add.Scalar's alpha is positional: a keyword-only `alpha` does not accept the call.
    assert signature_problems(torch.ops.aten.add.Scalar, lambda x, y, *, alpha=1: x, False)


def test_promotion_is_an_enum_not_a_string():
    with pytest.raises(TypeError, match="Promotion"):
        lowers(torch.ops.aten.add.Tensor, promote="DEFAULT")
