"""Per-op eager cost on the neuron device and on the CPU, for small tensors.

Each case is warmed up (which also compiles its XLA executables), then timed in rounds of
`--iters` calls with time.perf_counter; the device is synchronized before the clock stops.
The figure reported is the median over `--rounds` rounds, in microseconds per call.

    python benchmarks/eager_ops.py [--rounds 30] [--iters 50] [--write]

The neuron device is measured twice per case, right after CPU: with adaptive eager (the
default: ops are recorded and each round's ops run as one program at the synchronize) and op
by op (fusion off for the case, as `TORCHNEURON_FUSION=0`: every call runs its executable at
once, the synchronous path).

`--write` also writes the table to docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import jax
import torch
from torch import nn

import torchneuron
from torchneuron.runtime import fusion

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "BENCHMARKS.md"


def synchronize(device: str) -> None:
    if device.startswith("neuron"):
        torch.neuron.synchronize()


@contextlib.contextmanager
def fusion_off(off: bool):
    """Adaptive eager off for the block (op by op), as TORCHNEURON_FUSION=0 does."""
    before = fusion.recording()
    fusion.set_enabled(before and not off)
    try:
        yield
    finally:
        fusion.set_enabled(before)


# Each case builds its state on `device` and returns the callable to time, and how many
# calls of it one timed iteration stands for (always 1 here).
def case_add(device: str) -> Callable[[], object]:
    a, b = torch.randn(64, 64).to(device), torch.randn(64, 64).to(device)
    return lambda: a + b


def case_matmul(device: str) -> Callable[[], object]:
    a, b = torch.randn(64, 64).to(device), torch.randn(64, 64).to(device)
    return lambda: a @ b


def case_relu_(device: str) -> Callable[[], object]:
    a = torch.randn(64, 64).to(device)
    return lambda: a.relu_()


def case_mlp_step(device: str) -> Callable[[], object]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(32, 64).to(device)
    y = torch.randint(0, 10, (32,)).to(device)

    def step() -> object:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


CASES = {
    "add 64x64": case_add,
    "matmul 64x64": case_matmul,
    "relu_ 64x64 (in place)": case_relu_,
    "MLP train step (64-128-10, batch 32, SGD)": case_mlp_step,
}


def measure(build: Callable[[str], Callable[[], object]], device: str, rounds: int, iters: int):
    fn = build(device)
    for _ in range(max(10, iters // 2)):  # warm-up: compile and fill caches
        fn()
    synchronize(device)
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        synchronize(device)
        samples.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(samples)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def header(command: str, load: float) -> list[str]:
    return [
        f"- machine: {os.cpu_count()} cores, {cpu_model()}, {platform.system()} {platform.machine()}; "
        f"torch intra-op threads {torch.get_num_threads()}; load average at start "
        f"{load:.2f} (other processes share these cores when it is above 0)",
        f"- python {platform.python_version()}, torch {torch.__version__}, jax {jax.__version__}, "
        f"torchneuron {torchneuron.__version__}, PJRT platform `{torchneuron.platform_name()}`",
        f"- command: `{command}`",
        f"- date: {datetime.date.today().isoformat()}",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--iters", type=int, default=50, help="calls per timed round")
    parser.add_argument("--write", action="store_true", help=f"also write {DOC.relative_to(REPO)}")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    command = "python " + " ".join(
        shlex.quote(a) for a in [f"benchmarks/{Path(__file__).name}", *sys.argv[1:]]
    )

    rows = [
        "| case | cpu (us/call) | neuron (us/call) | neuron op by op (us/call) | neuron / cpu "
        "| op by op / cpu |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, build in CASES.items():
        iters = args.iters if "step" not in name else max(1, args.iters // 10)
        cpu = measure(build, "cpu", args.rounds, iters)
        times, ratios = [], []
        for op_by_op in (False, True):
            try:
                with fusion_off(op_by_op):
                    neuron = measure(build, "neuron", args.rounds, iters)
                times.append(f"{neuron:.1f}")
                ratios.append(f"{neuron / cpu:.1f}x")
            except Exception as err:  # a missing lowering must not hide the other rows
                times.append(f"error: {type(err).__name__}")
                ratios.append("-")
        rows.append(f"| {name} | {cpu:.1f} | {' | '.join(times)} | {' | '.join(ratios)} |")

    fallbacks = torchneuron.fallback_ops()
    notes = [
        f"- median of {args.rounds} rounds; {args.iters} calls per round "
        f"({max(1, args.iters // 10)} for the training step), after warm-up; per case CPU, "
        "then neuron (adaptive eager, the default), then neuron op by op (fusion off)",
        f"- load average at end {os.getloadavg()[0]:.2f}",
        "- ops that fell back to CPU during the run: "
        + (", ".join(f"`{k}` ({v})" for k, v in sorted(fallbacks.items())) or "none"),
    ]
    if load >= 1.0:
        notes.append(
            f"- the machine was busy (load average {load:.2f} on {os.cpu_count()} cores): "
            "multi-threaded CPU kernels (the training step) wait for busy cores, so their "
            "figures are inflated; rerun on an idle machine before drawing conclusions"
        )
    text = "\n".join([*header(command, load), "", *rows, "", *notes])
    print(text)
    if args.write:
        section = (
            "# Eager per-op benchmarks\n\n"
            "Produced by `benchmarks/eager_ops.py --write` (`make bench` prints it without writing). "
            "Small tensors, so these figures are per-op overhead (dispatch, Python, PJRT call), "
            "not throughput. Absolute times drift between runs on shared machines; compare the "
            "ratios within one run.\n\n" + text + "\n"
        )
        # Replace only this section: the file's other sections (the next heading onwards)
        # belong to the other benchmark scripts.
        old = DOC.read_text() if DOC.exists() else ""
        rest = ""
        lines = old.splitlines(keepends=True)
        for i, line in enumerate(lines[1:], start=1):
            if line.startswith("#"):
                rest = "".join(lines[i:])
                break
        DOC.write_text(section + ("\n" + rest if rest else ""))
        print(f"\nwrote {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
