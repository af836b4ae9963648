"""Every registered lowering can be called the way the runtime calls it."""

from __future__ import annotations

import inspect

from torchneuron.lowerings import LOWERINGS


def test_lowering_signatures_accept_their_schemas():
    problems = []
    for op, lowering in LOWERINGS.items():
        params = inspect.signature(lowering.fn).parameters
        positional = [
            p for p in params.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        has_var_positional = any(p.kind == p.VAR_POSITIONAL for p in params.values())
        has_var_keyword = any(p.kind == p.VAR_KEYWORD for p in params.values())
        schema_args = op._schema.arguments
        out_names = {
            a.name for a in schema_args if a.kwarg_only and a.alias_info and a.alias_info.is_write
        }
        n_positional = sum(1 for a in schema_args if not a.kwarg_only)
        if n_positional > len(positional) and not has_var_positional:
            problems.append(f"{op}: takes {len(positional)} positional, schema has {n_positional}")
        for arg in schema_args:
            if not arg.kwarg_only or arg.name in out_names:
                continue
            if arg.name not in params and not has_var_keyword:
                problems.append(f"{op}: no parameter for keyword-only argument {arg.name!r}")
        if lowering.rng and "key" not in params:
            problems.append(f"{op}: rng lowering without a `key` parameter")
    assert not problems, "\n".join(problems)
