"""XLA's CPU kernels against PyTorch's on the pieces of the MLP training step (issue 13).

The compiled MLP step of benchmarks/compile_bench.py (10 x Linear 256 + ReLU, batch 64, AdamW)
trails inductor; this script asks how much of that is XLA's own code for the step's pieces,
with no torchneuron in the way: each piece as one `jax.jit` executable against the same
computation in PyTorch eager on CPU (default threads, and 1 thread).

- the three dots of a Linear layer (forward x @ W^T, weight gradient dY^T @ X, input gradient
  dY @ W);
- the 10-layer forward (dots and ReLUs) in one executable;
- the convolutions of compile_bench's CNN (3x3, padding 1, batch 32: 3 -> 16 channels at 32x32
  and 16 -> 32 at 16x16), forward and weight gradient, against `torch.nn.functional.conv2d`
  and `torch.nn.grad.conv2d_weight`;
- the AdamW update of the 10 weight matrices (655,360 parameters), in one executable (writing
  fresh buffers, and with the parameters and moments donated, as the compiled step does),
  against `torch.optim.AdamW` with `foreach=True` and with `fused=True`.

Method: per piece, rounds alternate between the configurations (interleaved); each round times
a loop of calls (`block_until_ready` for JAX); the best round is reported, in microseconds per
call. The load average is printed at the start and the end.

    python benchmarks/xla_kernels.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

BATCH, WIDTH, LAYERS = 64, 256, 10


def _per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def _interleaved(configs: dict, rounds: int, calls: int) -> dict:
    for fn in configs.values():  # warm up (compiles the executables)
        for _ in range(10):
            fn()
    best = {name: float("inf") for name in configs}
    for _ in range(rounds):
        for name, fn in configs.items():
            best[name] = min(best[name], _per_call_us(fn, calls))
    return best


def _torch_threads(fn, threads: int):
    def run():
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            fn()
        finally:
            torch.set_num_threads(previous)
    return run


def _adamw_jax(params, grads, ms, vs, step):
    b1, b2, lr, eps, wd = 0.9, 0.999, 1e-3, 1e-8, 1e-2
    out = []
    for p, g, m, v in zip(params, grads, ms, vs):
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr * (m / (1 - b1 ** step)) / (jnp.sqrt(v / (1 - b2 ** step)) + eps)
        out.append((p, m, v))
    return out


def _dot(a, b, f, rounds: int) -> dict:
    jf, ja, jb = jax.jit(f), jnp.asarray(a), jnp.asarray(b)
    ta, tb = torch.from_numpy(a.copy()), torch.from_numpy(b.copy())
    return _interleaved({"jax": lambda: jf(ja, jb).block_until_ready(),
                         "torch": lambda: f(ta, tb),
                         "torch1": _torch_threads(lambda: f(ta, tb), 1)}, rounds, 1000)


def _convolutions(image, kernel, grad_out, rounds: int) -> dict:
    """Forward and weight gradient of a 3x3 convolution with padding 1, per configuration."""
    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                            dimension_numbers=("NCHW", "OIHW", "NCHW"))

    forward = jax.jit(conv)
    weight_grad = jax.jit(lambda x, w, g: jax.vjp(lambda k: conv(x, k), w)[1](g)[0])
    jx, jw, jg = (jnp.asarray(v) for v in (image, kernel, grad_out))
    tx, tw, tg = (torch.from_numpy(v.copy()) for v in (image, kernel, grad_out))

    def torch_forward():
        return torch.nn.functional.conv2d(tx, tw, padding=1)

    def torch_weight_grad():
        return torch.nn.grad.conv2d_weight(tx, tw.shape, tg, padding=1)

    return {
        "forward": _interleaved({"jax": lambda: forward(jx, jw).block_until_ready(),
                                 "torch": torch_forward,
                                 "torch1": _torch_threads(torch_forward, 1)}, rounds, 100),
        "weight gradient": _interleaved({
            "jax": lambda: weight_grad(jx, jw, jg).block_until_ready(),
            "torch": torch_weight_grad,
            "torch1": _torch_threads(torch_weight_grad, 1)}, rounds, 100),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"# load average at start {os.getloadavg()[0]:.2f}; torch {torch.__version__}, "
          f"jax {jax.__version__}, torch threads {torch.get_num_threads()}")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, WIDTH), dtype=np.float32)
    w = rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) * 0.05
    print("| piece | jax.jit us | torch us | torch 1 thread us | torch / jax |")
    print("|---|---:|---:|---:|---:|")
    dots = {
        "forward x @ W^T (64x256, 256x256)": (x, w, lambda a, b: a @ b.T),
        "weight gradient dY^T @ X (64x256, 64x256)": (x, x, lambda a, b: a.T @ b),
        "input gradient dY @ W (64x256, 256x256)": (x, w, lambda a, b: a @ b),
    }
    for name, (a, b, f) in dots.items():
        r = _dot(a, b, f, args.rounds)
        print(f"| {name} | {r['jax']:.1f} | {r['torch']:.1f} | {r['torch1']:.1f} "
              f"| {r['torch'] / r['jax']:.2f} |", flush=True)

    for cin, cout, size in ((3, 16, 32), (16, 32, 16)):
        image = rng.standard_normal((32, cin, size, size), dtype=np.float32)
        kernel = rng.standard_normal((cout, cin, 3, 3), dtype=np.float32) * 0.1
        grad_out = rng.standard_normal((32, cout, size, size), dtype=np.float32)
        for label, r in _convolutions(image, kernel, grad_out, args.rounds).items():
            print(f"| conv {cin} -> {cout} at {size}x{size}, {label} | {r['jax']:.1f} "
                  f"| {r['torch']:.1f} | {r['torch1']:.1f} | {r['torch'] / r['jax']:.2f} |",
                  flush=True)

    weights = [rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) * 0.05
               for _ in range(LAYERS)]
    jw, jx = [jnp.asarray(v) for v in weights], jnp.asarray(x)
    tw, tx = [torch.from_numpy(v.copy()) for v in weights], torch.from_numpy(x.copy())

    @jax.jit
    def forward_jax(h, ws):
        for v in ws:
            h = jax.nn.relu(h @ v.T)
        return h

    def forward_torch():
        h = tx
        for v in tw:
            h = torch.relu(h @ v.T)
        return h

    r = _interleaved({"jax": lambda: forward_jax(jx, jw).block_until_ready(),
                      "torch": forward_torch,
                      "torch1": _torch_threads(forward_torch, 1)}, args.rounds, 300)
    print(f"| {LAYERS}-layer forward | {r['jax']:.1f} | {r['torch']:.1f} | {r['torch1']:.1f} "
          f"| {r['torch'] / r['jax']:.2f} |", flush=True)

    grads = [v * 0.01 for v in jw]
    ms = [v * 0.001 for v in jw]  # distinct buffers: the update is bound by memory traffic
    vs = [v * v * 0.001 for v in jw]
    adamw = jax.jit(_adamw_jax)
    step = jnp.float32(3.0)
    optimizers = {}
    for kind in ("foreach", "fused"):
        params = [torch.nn.Parameter(torch.from_numpy(v.copy())) for v in weights]
        for p in params:
            p.grad = p.detach() * 0.01
        optimizers[kind] = torch.optim.AdamW(params, lr=1e-3, **{kind: True})
    # Donated: the parameters and the moments are written in place (as the compiled step
    # does), instead of into fresh output buffers.
    state = {"p": [v + 0 for v in jw], "m": [v + 0 for v in ms], "v": [v + 0 for v in vs]}

    def update(p, m, v, g, t):
        out = _adamw_jax(p, g, m, v, t)
        return [o[0] for o in out], [o[1] for o in out], [o[2] for o in out]

    donated = jax.jit(update, donate_argnums=(0, 1, 2))

    def in_place():
        state["p"], state["m"], state["v"] = donated(state["p"], state["m"], state["v"], grads,
                                                     step)
        jax.block_until_ready(state["p"])

    r = _interleaved({"jax": lambda: jax.block_until_ready(adamw(jw, grads, ms, vs, step)),
                      "donated": in_place,
                      "foreach": optimizers["foreach"].step,
                      "fused": optimizers["fused"].step}, args.rounds, 200)
    print()
    print("| AdamW update | jax.jit us | jax.jit, donated us | torch foreach us | torch fused us "
          "| fused / donated |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| {LAYERS} x {WIDTH}x{WIDTH} weights ({LAYERS * WIDTH * WIDTH} parameters) "
          f"| {r['jax']:.1f} | {r['donated']:.1f} | {r['foreach']:.1f} | {r['fused']:.1f} "
          f"| {r['fused'] / r['donated']:.2f} |")
    print(f"# load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
