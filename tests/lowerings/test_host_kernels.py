"""PyTorch's CPU convolution kernels inside XLA CPU programs (lowerings/host_kernels.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest
import torch

import torchneuron
from torchneuron.lowerings import convolution, host_kernels
from torchneuron.runtime import _native, disk_cache

aten = torch.ops.aten
DEV = "neuron"

# (spatial dims, transposed, groups, kernel, stride, dilation, padding, output_padding)
CASES = [
    (1, False, 1, 3, 1, 1, 1, 0),
    (1, True, 2, 3, 2, 1, 0, 1),
    (2, False, 1, 3, 1, 1, 1, 0),
    (2, False, 2, 3, 2, 2, 1, 0),
    (2, True, 1, 3, 2, 1, 1, 1),
    (2, True, 2, 2, 1, 2, 0, 0),
    (3, False, 2, 2, 1, 1, 0, 0),
    (3, True, 1, 3, 2, 1, 1, 0),
]


def _conv_args(dims, transposed, groups, k, s, d, p, op, dtype, bias):
    g = torch.Generator().manual_seed(dims * 100 + groups * 10 + k)
    cin, cout = 4, 6
    x = torch.randn(2, cin, *[7] * dims, generator=g, dtype=dtype)
    shape = (cin, cout // groups) if transposed else (cout, cin // groups)
    w = torch.randn(*shape, *[k] * dims, generator=g, dtype=dtype)
    b = torch.randn(cout, generator=g, dtype=dtype) if bias else None
    return x, w, b, ([s] * dims, [p] * dims, [d] * dims, transposed, [op] * dims, groups)


def _forward_and_grads(x, w, b, params):
    leaves = [t.detach().requires_grad_() for t in (x, w, b) if t is not None]
    out = aten.convolution(leaves[0], leaves[1], leaves[2] if b is not None else None, *params)
    grad_out = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape)
    grads = torch.autograd.grad(out, leaves, grad_out.to(out.device))
    return [out, *grads]


def test_registered_on_the_cpu_platform_with_the_library():
    assert _native.build_error() is None
    assert host_kernels.available("convolution")
    assert host_kernels.available("convolution_backward")


def _lowered_text(dtype) -> str:
    x = jnp.ones((2, 3, 8, 8), dtype)
    w = jnp.ones((4, 3, 3, 3), dtype)
    params = ([1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    fn = jax.jit(lambda x, w: convolution.convolution(x, w, None, *params))
    return fn.lower(x, w).as_text()


def test_float_convolutions_call_the_host_kernel_and_halves_keep_lax():
    assert "torchneuron_host_convolution" in _lowered_text(jnp.float32)
    assert "torchneuron_host_convolution" in _lowered_text(jnp.float64)
    half = _lowered_text(jnp.bfloat16)
    assert "torchneuron_host_convolution" not in half and "convolution" in half


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}d{'T' if c[1] else ''}g{c[2]}k{c[3]}s{c[4]}"
                                             for c in CASES])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_forward_and_gradients_match_cpu(case, dtype, bias):
    x, w, b, params = _conv_args(*case, dtype, bias)
    expected = _forward_and_grads(x, w, b, params)
    got = _forward_and_grads(x.to(DEV), w.to(DEV), None if b is None else b.to(DEV), params)
    # The same kernel as CPU's, run with one OpenMP thread less: float32 sums may be
    # associated differently, float64 too, by far less.
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g.cpu(), e, **tol)


def test_compiled_conv_step_matches_eager():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3, stride=2)).to(DEV)
    x = torch.randn(4, 3, 12, 12).to(DEV)

    def loss_and_grads(fn):
        model.zero_grad()
        loss = fn(x).square().mean()
        loss.backward()
        return [loss.detach().cpu()] + [p.grad.cpu() for p in model.parameters()]

    compiled = torch.compile(model, backend="neuron")
    torchneuron.compiler.reset_compile_stats()
    got = loss_and_grads(compiled)
    assert torchneuron.compile_stats()["eager_fallbacks"] == 0
    for g, e in zip(got, loss_and_grads(model), strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_on_disk_programs_are_keyed_by_the_host_kernels(monkeypatch):
    with_kernels = disk_cache.build_digest()
    monkeypatch.setattr(host_kernels, "_registered", {})
    assert disk_cache.build_digest() != with_kernels


def _run_child(script: str, **env) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script)],
                          env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_without_host_kernels_convolutions_keep_lax():
    out = _run_child("""
        import torch, torch.nn.functional as F
        import torchneuron
        from torchneuron.lowerings import host_kernels
        x, w = torch.randn(2, 3, 9, 9), torch.randn(5, 3, 3, 3)
        diff = (F.conv2d(x.to("neuron"), w.to("neuron"), padding=1).cpu()
                - F.conv2d(x, w, padding=1)).abs().max().item()
        print("AVAILABLE", host_kernels.available("convolution"), "CLOSE", diff < 1e-4)
    """, TORCHNEURON_HOST_KERNELS="0")
    assert "AVAILABLE False CLOSE True" in out


def test_kernel_ignores_the_calling_threads_modes():
    # With synchronous launches a recorded program runs on the Python thread at the sync
    # point, here inside the user's dispatch mode: the kernel's own ATen calls (the
    # convolution, the copy into XLA's buffer) must not reach that mode.
    out = _run_child("""
        import torch, torch.nn.functional as F
        from torch.utils._python_dispatch import TorchDispatchMode
        import torchneuron
        from torchneuron.lowerings import host_kernels

        class Seen(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.ops = []
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.ops.append(str(func))
                return func(*args, **(kwargs or {}))

        x, w = torch.randn(2, 3, 9, 9), torch.randn(5, 3, 3, 3)
        expected = F.conv2d(x, w, padding=1)
        got = F.conv2d(x.to("neuron"), w.to("neuron"), padding=1)  # recorded, not run yet
        with Seen() as mode:
            torch.neuron.synchronize()  # runs the program here
        diff = (got.cpu() - expected).abs().max().item()
        print("AVAILABLE", host_kernels.available("convolution"), "SEEN", mode.ops,
              "CLOSE", diff < 1e-4)
    """, TORCHNEURON_ASYNC_DISPATCH="0")
    assert "AVAILABLE True SEEN [] CLOSE True" in out
