"""Pallas kernels as PyTorch operators: the example flash attention (examples/kernels) in eager
mode, under autograd and compiled, plus the interpret-mode choice. Sizes stay small: the CPU
client interprets Pallas kernels."""

from __future__ import annotations

import jax
import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from jax.experimental import pallas as pl
from kernels.flash_attention import flash_attention, sdpa_override
from torch import Tensor

import torchneuron
import torchneuron.library as tnlib

NEURON = "neuron"


@pytest.fixture(autouse=True)
def _fresh(fresh_compile_state):
    """A new cache directory, Dynamo state and compile counters per test (tests/conftest.py)."""


def _qkv(shape=(1, 2, 32, 8), dtype=torch.float32, device=NEURON, requires_grad=False):
    torch.manual_seed(0)
    return [torch.randn(shape, dtype=dtype, device=device, requires_grad=requires_grad)
            for _ in range(3)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("device", ["cpu", NEURON])
def test_forward_matches_sdpa(device, causal):
    q, k, v = _qkv(device=device)
    out, lse = flash_attention(q, k, v, causal, 0.35)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.35)
    torch.testing.assert_close(out.cpu(), expected.cpu())
    scores = (q @ k.transpose(-1, -2)) * 0.35
    if causal:
        scores = scores.masked_fill(~torch.ones(32, 32, dtype=torch.bool, device=device).tril(),
                                    float("-inf"))
    torch.testing.assert_close(lse.cpu(), torch.logsumexp(scores, -1).cpu())


@pytest.mark.parametrize("device", ["cpu", NEURON])
def test_gradcheck_through_the_registered_backward(device):
    q, k, v = _qkv((1, 1, 16, 4), torch.float64, device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: flash_attention(q, k, v, True, 0.5)[0],
                                    (q, k, v))


def test_gradients_match_sdpa_on_neuron():
    q, k, v = _qkv(requires_grad=True)
    g = torch.randn(1, 2, 32, 8, device=NEURON)
    ours = torch.autograd.grad(flash_attention(q, k, v, True, 0.35)[0], (q, k, v), g)
    expected = torch.autograd.grad(
        F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.35), (q, k, v), g)
    for a, b in zip(ours, expected):
        torch.testing.assert_close(a.cpu(), b.cpu())


def test_compiled_training_step_with_the_kernel(monkeypatch):
    from torchneuron.compiler import graph

    seen = []
    original = graph.CompiledGraph.__init__

    def spy(self, gm, options):
        seen.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        original(self, gm, options)

    monkeypatch.setattr(graph.CompiledGraph, "__init__", spy)
    q, k, v = _qkv(requires_grad=True)

    def loss(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).square().sum()

    with sdpa_override():
        grads = torch.autograd.grad(torch.compile(loss, backend="neuron")(q, k, v), (q, k, v))
    expected = torch.autograd.grad(loss(q, k, v), (q, k, v))
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a.cpu(), b.cpu())
    stats = torchneuron.compile_stats()
    assert stats["eager_fallbacks"] == 0 and stats["xla_compilations"] == 2
    assert "kernels.flash_attention.default" in seen[0]
    assert "kernels.flash_attention_backward.default" in seen[1]


def _scale_kernel(x_ref, o_ref):
    o_ref[...] = x_ref[...] * 3.0


@tnlib.custom_op("tn_pallas_test::triple")
def triple(x: Tensor) -> Tensor:
    return pl.pallas_call(_scale_kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                          interpret=tnlib.pallas_interpret())(x)


def test_a_pallas_op_without_backward_says_how_to_add_one():
    x = torch.randn(4, device=NEURON, requires_grad=True)
    torch.testing.assert_close(triple(x).detach().cpu(), x.detach().cpu() * 3)
    with pytest.raises(RuntimeError, match="register_autograd"):
        triple(x).sum().backward()


interpret_seen = []


@tnlib.custom_op("tn_pallas_test::records_interpret")
def records_interpret(x: Tensor) -> Tensor:
    interpret_seen.append(tnlib.pallas_interpret())
    return x + 1


def test_interpret_mode_follows_the_client_being_traced_for(monkeypatch):
    assert tnlib.pallas_interpret()  # the neuron device runs on JAX's CPU client here
    monkeypatch.setenv("TORCHNEURON_PLATFORM", "cuda")  # only read, never used, below
    assert not tnlib.pallas_interpret()
    interpret_seen.clear()
    records_interpret(torch.ones(2))  # a CPU tensor: traced for JAX's CPU client
    assert interpret_seen == [True]


def test_sdpa_override_keeps_unsupported_calls_on_the_built_in_path():
    q, k, v = _qkv()
    mask = torch.rand(32, 32, device=NEURON) > 0.5
    torchneuron.reset_op_counts()
    with sdpa_override():
        masked = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        plain = F.scaled_dot_product_attention(q, k, v)
    assert torchneuron.op_counts()["native"]["kernels.flash_attention.default"] == 1
    torch.testing.assert_close(masked, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    torch.testing.assert_close(plain, F.scaled_dot_product_attention(q, k, v))
