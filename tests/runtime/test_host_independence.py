"""float16 results do not depend on the host's instruction set: torchneuron caps XLA's CPU
code generation below AVX512-FP16, where LLVM would fuse float16 multiply-adds (one rounding
instead of two) on some x86-64 processors and not on others."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from torchneuron.runtime.platform import HOST_INDEPENDENT_ISA_FLAG, with_host_independent_isa

X86 = platform.machine().lower() in ("x86_64", "amd64")


def test_isa_cap_is_added_once_and_a_users_choice_is_kept() -> None:
    assert with_host_independent_isa("", "x86_64") == HOST_INDEPENDENT_ISA_FLAG
    dump = "--xla_dump_to=/tmp/d"
    assert with_host_independent_isa(dump, "AMD64") == f"{dump} {HOST_INDEPENDENT_ISA_FLAG}"
    assert with_host_independent_isa("--xla_cpu_max_isa=AVX2", "x86_64") == "--xla_cpu_max_isa=AVX2"
    assert with_host_independent_isa(dump, "aarch64") == dump  # the ISA names are x86's


@pytest.mark.skipif(not X86, reason="the cap applies to x86-64 hosts only")
def test_xla_compiles_with_the_isa_cap(tmp_path: Path) -> None:
    # XLA reads XLA_FLAGS when its CPU client starts; the dump of a compiled program records
    # the options it was compiled with.
    script = "import torch, torchneuron; (torch.ones(3, device='neuron') * 2).cpu()"
    env = dict(os.environ, XLA_FLAGS=f"--xla_dump_to={tmp_path}")
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=300)
    options = [p.read_text() for p in tmp_path.glob("*.debug_options")]
    assert options, "XLA dumped no program"
    assert all('xla_cpu_max_isa: "AVX512_BF16"' in text for text in options)


@pytest.mark.skipif(not X86, reason="the cap applies to x86-64 hosts only")
def test_jax_started_first_warns() -> None:
    script = ("import jax.numpy as jnp; (jnp.ones(2) + 1).block_until_ready()\n"
              "import torch, torchneuron")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "float16 results may depend on this host" in result.stderr
