"""`make demo`: train the character-level GPT on the CPU and on the neuron device from the same
initial weights and batches, and print both loss curves side by side.

    python examples/demo.py [--steps 30] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import time

import torch

import torchneuron

try:
    import char_gpt
except ImportError:  # imported as examples.demo
    from . import char_gpt


def rel_diff(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), 1e-12)


def timed(device: str, steps: int, seed: int) -> tuple[list[float], float]:
    start = time.perf_counter()
    losses = char_gpt.train(device, steps, seed)
    return losses, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    print(
        f"torch {torch.__version__}, torchneuron {torchneuron.__version__}, "
        f"PJRT platform '{torchneuron.platform_name()}'"
    )
    print(f"char_gpt: {args.steps} AdamW steps, seed {args.seed}\n")
    torchneuron.reset_op_counts()
    cpu, cpu_s = timed("cpu", args.steps, args.seed)
    try:
        neuron, neuron_s = timed("neuron", args.steps, args.seed)
    except Exception as err:
        print(f"training on neuron failed: {type(err).__name__}: {str(err)[:500]}")
        report_fallbacks()
        return 1

    print(f"{'step':>4}  {'cpu loss':>10}  {'neuron loss':>11}  {'rel diff':>9}")
    worst = 0.0
    for step, (a, b) in enumerate(zip(cpu, neuron, strict=True)):
        diff = rel_diff(a, b)
        worst = max(worst, diff) if not math.isnan(diff) else math.inf
        print(f"{step:>4}  {a:>10.6f}  {b:>11.6f}  {diff:>9.2e}")
    print(f"\nlargest relative difference: {worst:.3e}")
    print(f"wall time: cpu {cpu_s:.2f} s, neuron {neuron_s:.2f} s (includes XLA compilation)")

    report_fallbacks()
    return 0


def report_fallbacks() -> None:
    fallbacks = torchneuron.fallback_ops()
    if fallbacks:
        print("ops that fell back to CPU (calls):")
        for name, calls in sorted(fallbacks.items()):
            print(f"  {name}: {calls}")
    else:
        print("ops that fell back to CPU: none")


if __name__ == "__main__":
    raise SystemExit(main())
