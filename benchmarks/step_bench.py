"""MLP training step (10 x Linear 256 + ReLU, batch 64, AdamW): neuron compiled vs a jitted JAX step.

Configurations, interleaved round-robin in one process:

- `neuron compiled model`: `torch.compile(model, backend="neuron")`, the optimizer eager;
- `neuron compiled step`: `torch.compile(step, backend="neuron")` of the whole step (zero_grad,
  forward, loss, backward, AdamW): three executables per step, parameters and optimizer state
  updated in place (donated buffers);
- `jax jit step`: the same model, loss and AdamW written in JAX, one `jax.jit` with the
  parameters and optimizer state donated. It stands for torchax's jitted step, which is the
  same program: torchax 0.0.13, the newest on PyPI, does not import with torch 2.13
  (`aten.prod.dim_Dimname` is gone).

    python benchmarks/step_bench.py [--rounds 7] [--steps 20] [--write]

`--write` replaces the "MLP step against a jitted JAX step" section of docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "BENCHMARKS.md"
SECTION = "## MLP step against a jitted JAX step"

if __name__ == "__main__":
    os.environ.setdefault("TORCHNEURON_CACHE_DIR", tempfile.mkdtemp(prefix="step_bench_"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import torchneuron  # noqa: E402

LAYERS, WIDTH, BATCH, CLASSES = 10, 256, 64, 10
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01


def make_model() -> nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, CLASSES))


def make_batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, WIDTH, generator=g), torch.randint(0, CLASSES, (BATCH,), generator=g)


def torch_step(model, compile_what: str):
    model = copy.deepcopy(model).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    x, y = (t.to("neuron") for t in make_batch())
    run = torch.compile(model, backend="neuron") if compile_what == "model" else model

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(run(x), y)
        loss.backward()
        opt.step()
        return loss

    step = torch.compile(step, backend="neuron") if compile_what == "step" else step
    return step, lambda: torch.neuron.synchronize()


def jax_step(model):
    params = [(jnp.asarray(m.weight.detach().numpy()), jnp.asarray(m.bias.detach().numpy()))
              for m in model if isinstance(m, nn.Linear)]
    state = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params),
             jnp.zeros((), jnp.int32))
    x, y = (jnp.asarray(t.numpy()) for t in make_batch())

    def loss_fn(params, x, y):
        h = x
        for i, (w, b) in enumerate(params):
            h = h @ w.T + b
            if i < len(params) - 1:
                h = jax.nn.relu(h)
        logp = jax.nn.log_softmax(h)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], 1))

    def update(params, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        m, v, t = state
        t = t + 1
        b1, b2 = BETAS
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, m, grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, v, grads)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t

        def apply(p, m, v):
            p = p * (1 - LR * WD)
            return p - LR * (m / c1) / (jnp.sqrt(v / c2) + EPS)

        return jax.tree.map(apply, params, m, v), (m, v, t), loss

    jitted = jax.jit(update, donate_argnums=(0, 1))
    box = {"params": params, "state": state}

    def step():
        box["params"], box["state"], loss = jitted(box["params"], box["state"], x, y)
        return loss

    return step, lambda: jax.block_until_ready(box["params"])


CONFIGS = ("neuron compiled model", "neuron compiled step", "jax jit step")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    model = make_model()
    steps = {"neuron compiled model": torch_step(model, "model"),
             "neuron compiled step": torch_step(model, "step"),
             "jax jit step": jax_step(model)}
    first = {}
    for name, (step, sync) in steps.items():
        start = time.perf_counter()
        for _ in range(3):
            step()
        sync()
        first[name] = time.perf_counter() - start
    wall = {name: [] for name in steps}
    cpu = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, (step, sync) in steps.items():
            w, c = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                step()
            sync()
            wall[name].append((time.perf_counter() - w) / args.steps * 1e3)
            cpu[name].append((time.process_time() - c) / args.steps * 1e3)
    load_end = os.getloadavg()[0]
    med = {n: statistics.median(wall[n]) for n in steps}
    lines = [
        f"- load average (1 min) at start {load_start:.2f}, at end {load_end:.2f} "
        f"({os.cpu_count()} cores)",
        f"- torch {torch.__version__}, jax {jax.__version__}, torchneuron {torchneuron.__version__}",
        f"- method: {args.rounds} rounds round-robin, {args.steps} steps per round, after 3 warm-up "
        "steps; median over rounds; wall ms per step (process CPU ms per step, all threads)",
        "- command: `python benchmarks/step_bench.py" + (" --write" if args.write else "") + "`",
        f"- date: {datetime.date.today().isoformat()}",
        "",
        "| configuration | ms per step | jax jit step / this |",
        "|---|---:|---:|",
    ]
    for name in steps:
        lines.append(f"| {name} | {med[name]:.2f} ({statistics.median(cpu[name]):.2f}) | "
                     f"{med['jax jit step'] / med[name]:.2f} |")
    lines += ["", "First 3 steps (compilation included): " + ", ".join(
        f"{n} {first[n]:.1f} s" for n in steps)]
    print("\n".join(lines))
    if args.write:
        text = DOC.read_text()
        section = "\n".join([SECTION, "", *lines]) + "\n"
        if SECTION in text:
            before, rest = text.split(SECTION, 1)
            nxt = rest.find("\n#")
            text = before + section + (rest[nxt:] if nxt >= 0 else "")
        else:
            text = text.rstrip("\n") + "\n\n" + section
        DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
