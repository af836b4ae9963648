"""Process-wide JAX settings made by runtime/platform.py."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from jax._src.lib import _jax

import torchneuron  # noqa: F401


def test_arrays_carry_no_python_stack_by_default() -> None:
    # Each op's result is a JAX array; recording the stack at its creation cost 0.3-0.5 us of
    # an 8 us op (benchmarks/eager_ops.py) for a memory profile no torchneuron user reads.
    assert _jax.tracebacks_enabled() is False
    (torch.ones(4, device="neuron") + 1).cpu()
    assert _jax.tracebacks_enabled() is False


def test_jax_tracebacks_can_be_kept() -> None:
    script = ("import torchneuron; from jax._src.lib import _jax; "
              "print('TRACEBACKS', _jax.tracebacks_enabled())")
    env = dict(os.environ, TORCHNEURON_JAX_TRACEBACKS="1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "TRACEBACKS True" in proc.stdout
