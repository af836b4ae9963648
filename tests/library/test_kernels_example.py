"""examples/kernels/transformer.py: the transformer trains on neuron with the custom kernels
(fused RMSNorm in JAX, Pallas flash attention through an SDPA override), eager and compiled,
and its losses match the same model on built-in ops."""

from __future__ import annotations

import math

import pytest
import torch
import torch._dynamo
from kernels import transformer

import torchneuron

STEPS = 3


@pytest.fixture(autouse=True)
def _fresh(fresh_compile_state):
    """A new cache directory, Dynamo state and compile counters per test (tests/conftest.py)."""


def _assert_matches(custom, builtin):
    assert all(math.isfinite(loss) for loss in custom), custom
    assert custom[-1] < custom[0], f"loss did not go down: {custom}"
    torch.testing.assert_close(torch.tensor(custom, dtype=torch.float64),
                               torch.tensor(builtin, dtype=torch.float64), rtol=1e-4, atol=0)


def test_custom_kernels_train_like_the_built_in_ops():
    torchneuron.reset_op_counts()
    custom = transformer.train("neuron", STEPS, seed=1, kernels=True)
    native = torchneuron.op_counts()["native"]
    for op in ("kernels.rms_norm.default", "kernels.rms_norm_backward.default",
               "kernels.flash_attention.default", "kernels.flash_attention_backward.default"):
        assert native.get(op, 0) > 0, op
    _assert_matches(custom, transformer.train("neuron", STEPS, seed=1, kernels=False))


def test_compiled_training_with_custom_kernels():
    custom = transformer.train("neuron", STEPS, seed=1, kernels=True, compile=True)
    stats = torchneuron.compile_stats()
    assert stats["eager_fallbacks"] == 0
    assert stats["graphs_compiled"] == 2 and stats["xla_compilations"] == 2  # forward, backward
    _assert_matches(custom, transformer.train("neuron", STEPS, seed=1, kernels=False))
