"""torchneuron.library.override: a built-in op's lowering, or a PyTorch function, replaced
within a scope, in eager mode and in compiled graphs."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch import Tensor

import torchneuron
import torchneuron.library as tnlib
from torchneuron.lowerings import LOWERINGS

aten = torch.ops.aten
NEURON = "neuron"


@pytest.fixture(autouse=True)
def _fresh(fresh_compile_state):
    """A new cache directory, Dynamo state and compile counters per test (tests/conftest.py)."""


def _cos(x):
    return jnp.cos(x)


def test_eager_lowering_override_and_its_scope_ending():
    x = torch.linspace(-2, 2, 7, device=NEURON)
    builtin = LOWERINGS[aten.sin.default]
    torch.testing.assert_close(torch.sin(x).cpu(), x.cpu().sin())  # an executable is cached
    with tnlib.override(aten.sin.default, _cos):
        torch.testing.assert_close(torch.sin(x).cpu(), x.cpu().cos())
        out = torch.empty_like(x)
        torch.sin(x, out=out)  # the out= and in-place variants follow their functional op
        torch.testing.assert_close(out.cpu(), x.cpu().cos())
        y = x.clone()
        y.sin_()
        torch.testing.assert_close(y.cpu(), x.cpu().cos())
    assert LOWERINGS[aten.sin.default] is builtin
    torch.testing.assert_close(torch.sin(x).cpu(), x.cpu().sin())


def test_overrides_stack_and_may_end_in_any_order():
    x = torch.tensor([0.5, 1.0], device=NEURON)
    outer = tnlib.override(aten.sin.default, _cos)
    inner = tnlib.override(aten.sin.default, lambda x: x * 10)
    outer.__enter__()
    inner.__enter__()
    torch.testing.assert_close(torch.sin(x).cpu(), x.cpu() * 10)
    outer.__exit__(None, None, None)  # ends first: the inner override stays in force
    torch.testing.assert_close(torch.sin(x).cpu(), x.cpu() * 10)
    inner.__exit__(None, None, None)
    torch.testing.assert_close(torch.sin(x).cpu(), x.cpu().sin())


def test_decorator_form():
    @tnlib.override(aten.sin.default, _cos)
    def f(x):
        return torch.sin(x)

    x = torch.tensor([0.3], device=NEURON)
    torch.testing.assert_close(f(x).cpu(), x.cpu().cos())
    torch.testing.assert_close(torch.sin(x).cpu(), x.cpu().sin())


def test_autograd_keeps_the_built_in_formula():
    x = torch.tensor([0.3, 1.2], device=NEURON, requires_grad=True)
    with tnlib.override(aten.sin.default, _cos):
        torch.sin(x).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), x.detach().cpu().cos())  # d sin / dx, as PyTorch


def test_an_op_without_lowering_runs_natively_within_the_scope():
    # tn_test::cpu_only_scale (tests/conftest.py) has only a CPU kernel: it falls back to CPU.
    op = torch.ops.tn_test.cpu_only_scale.default
    x = torch.arange(4.0, device=NEURON)
    torchneuron.reset_op_counts()
    with tnlib.override(op, lambda x, s: x * s + 1):
        torch.testing.assert_close(op(x, 2.0).cpu(), torch.arange(4.0) * 2 + 1)
    assert torchneuron.op_counts()["native"]["tn_test.cpu_only_scale.default"] == 1
    assert "tn_test.cpu_only_scale.default" not in torchneuron.fallback_ops()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.testing.assert_close(op(x, 2.0).cpu(), torch.arange(4.0) * 2)
    assert torchneuron.fallback_ops()["tn_test.cpu_only_scale.default"] == 1


_lib = torch.library.Library("tn_override_test", "DEF")
_lib.define("twice.vec(Tensor x) -> Tensor")
_lib.impl("twice.vec", lambda x: x * 2, "CompositeExplicitAutograd")


def test_an_op_with_a_composite_kernel_reaches_the_override():
    # A CompositeExplicitAutograd kernel would serve the neuron device too (no fallback):
    # the scope registers a kernel of its own for the overload, and removes it at the end.
    op = torch.ops.tn_override_test.twice.vec
    x = torch.arange(3.0, device=NEURON)
    with tnlib.override(op, lambda x: x * 5):
        torch.testing.assert_close(op(x).cpu(), torch.arange(3.0) * 5)
    torch.testing.assert_close(op(x).cpu(), torch.arange(3.0) * 2)
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "PrivateUse1")


def test_compiled_graphs_follow_the_scope():
    def f(x):
        return torch.sin(x) * 2

    x = torch.linspace(-1, 1, 5, device=NEURON)
    compiled = torch.compile(f, backend="neuron", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x).cpu(), x.cpu().sin() * 2)  # compiled outside
        with tnlib.override(aten.sin.default, _cos):
            torch.testing.assert_close(compiled(x).cpu(), x.cpu().cos() * 2)
        torch.testing.assert_close(compiled(x).cpu(), x.cpu().sin() * 2)
    stats = torchneuron.compile_stats()
    # One graph; one executable per set of overrides (the on-disk key hashes the program,
    # so the override's executable is never one stored for the built-in lowering).
    assert stats["graphs_compiled"] == 1 and stats["xla_compilations"] == 2
    assert stats["memory_cache_hits"] == 1 and stats["eager_fallbacks"] == 0


def test_compiled_inside_the_scope():
    x = torch.linspace(-1, 1, 5, device=NEURON)
    with torch.no_grad(), tnlib.override(aten.sin.default, _cos):
        out = torch.compile(lambda t: torch.sin(t) + 1, backend="neuron")(x)
    torch.testing.assert_close(out.cpu(), x.cpu().cos() + 1)


def test_targets_that_cannot_be_overridden():
    with pytest.raises(TypeError, match="CompositeImplicitAutograd.*scaled_dot_product_attention"):
        tnlib.override(aten.scaled_dot_product_attention.default, _cos)
    with pytest.raises(TypeError, match="one overload"):
        tnlib.override(aten.sin, _cos)
    with pytest.raises(TypeError, match="cannot override"):
        tnlib.override(42, _cos)


# -- PyTorch functions: scaled_dot_product_attention -------------------------------------


@tnlib.custom_op("tn_override_test::plain_attention")
def plain_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    s = jnp.einsum("...qd,...kd->...qk", q, k) * scale
    p = jnp.exp(s - s.max(axis=-1, keepdims=True))
    return jnp.einsum("...qk,...kd->...qd", p / p.sum(axis=-1, keepdims=True), v)


calls = []


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
    if attn_mask is not None or dropout_p or is_causal or enable_gqa:
        return NotImplemented  # the built-in path
    calls.append(query.shape)
    return plain_attention(query, key, value, scale or query.shape[-1] ** -0.5)


def _qkv(device=NEURON, requires_grad=False):
    torch.manual_seed(0)
    return [torch.randn(2, 2, 8, 4, device=device, requires_grad=requires_grad) for _ in range(3)]


def test_function_override_in_eager_mode():
    q, k, v = _qkv(requires_grad=True)
    calls.clear()
    with tnlib.override(F.scaled_dot_product_attention, attention):
        out = F.scaled_dot_product_attention(q, k, v)
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # NotImplemented
    assert len(calls) == 1
    assert "plain_attention" in type(out.grad_fn).__name__
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    torch.testing.assert_close(causal, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    expected = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v).sum(), (q, k, v))
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a.cpu(), b.cpu())


def test_function_override_leaves_cpu_tensors_alone():
    q, k, v = _qkv("cpu")
    calls.clear()
    with tnlib.override(F.scaled_dot_product_attention, attention):
        F.scaled_dot_product_attention(q, k, v)
    assert calls == []


def test_function_override_in_compiled_graphs(monkeypatch):
    from torchneuron.compiler import graph

    seen = []
    original = graph.CompiledGraph.__init__

    def spy(self, gm, options):
        seen.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        original(self, gm, options)

    monkeypatch.setattr(graph.CompiledGraph, "__init__", spy)
    q, k, v = _qkv()

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v) * 2

    compiled = torch.compile(f, backend="neuron", fullgraph=True)
    with torch.no_grad():
        builtin = compiled(q, k, v)
        with tnlib.override(F.scaled_dot_product_attention, attention):
            ours = compiled(q, k, v)  # Dynamo guards on the mode: recompiled in the scope
        again = compiled(q, k, v)  # and the first graph serves again outside it
    torch.testing.assert_close(ours.cpu(), builtin.cpu())
    torch.testing.assert_close(again.cpu(), builtin.cpu())
    assert len(seen) == 2
    assert "tn_override_test.plain_attention.default" in seen[1]
    assert not any("plain_attention" in t for t in seen[0])
    stats = torchneuron.compile_stats()
    assert stats["eager_fallbacks"] == 0 and stats["xla_compilations"] == 2
