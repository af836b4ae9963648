"""What a new shape costs on the neuron device: first calls of small ops at shapes not seen
before, for an elementwise op and for random ops (every PyTorch test makes its inputs with
them, so they dominate the compile time of the upstream test files, issue 12).

Each case runs at `--shapes` shapes never used before in the process (and an empty on-disk
cache, a fresh temporary directory), timing the call and the read of its result with
time.perf_counter; the figure is the median over the shapes, in milliseconds. To compare two
checkouts, run this script from each in turn, alternating, on the same machine.

    python benchmarks/new_shape_compile.py [--shapes 10]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

# an empty compile cache for this process, before the backend loads
os.environ["TORCHNEURON_CACHE_DIR"] = tempfile.mkdtemp(prefix="tn-new-shape-")

import torch  # noqa: E402

import torchneuron  # noqa: E402

CASES: dict[str, Callable[[tuple[int, int]], torch.Tensor]] = {
    "add (x * 2 + 1)": lambda s: torch.ones(s, device="neuron") * 2 + 1,
    "uniform_": lambda s: torch.empty(s, device="neuron").uniform_(-9, 9),
    "randint": lambda s: torch.randint(-9, 9, s, device="neuron"),
    "randn (float64)": lambda s: torch.randn(s, device="neuron", dtype=torch.float64),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", type=int, default=10)
    args = parser.parse_args()
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    (torch.ones(3, device="neuron") + 1).cpu()  # the runtime's own first-use costs
    for offset, (name, case) in enumerate(CASES.items()):
        times = []
        for i in range(args.shapes):
            shape = (2 + i, 3 + offset)  # a (rows, cols) no other case uses
            start = time.perf_counter()
            case(shape).cpu()
            times.append(time.perf_counter() - start)
        print(f"{name:18s} new shape: median {statistics.median(times) * 1e3:7.1f} ms"
              f" (min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}; {args.shapes} shapes)")
    stats = torchneuron.fusion_stats()
    print(f"XLA compilations {stats['compilations'] + stats['op_compilations']},"
          f" compile seconds {stats['compile_seconds']:.2f}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
