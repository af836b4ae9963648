"""Run a worker function on N ranks, each in its own process, with a hard time limit.

    python tests/distributed/launch.py MODULE:FUNC RANK WORLD PORT OUTDIR [ARG]

`run_ranks` starts the processes; each calls `init_process_group` over TCP on 127.0.0.1 and
then `FUNC(outdir, arg)`, whose return value is saved to OUTDIR/rank{RANK}.pt.
"""

from __future__ import annotations

import datetime
import importlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankResult:
    def __init__(self, rank: int, returncode: int | None, output: str, value) -> None:
        self.rank, self.returncode, self.output, self.value = rank, returncode, output, value


def run_ranks(
    target: str, outdir: Path, world: int = 2, timeout: float = 120.0, arg: str = "",
    env: dict | None = None, expect_ok: bool = True, wait_for: list[int] | None = None,
) -> list[RankResult]:
    """Start `world` ranks of `target` ("module:function"); kill them all after `timeout` s,
    or as soon as the ranks in `wait_for` (default: all) have exited."""
    import torch

    port = free_port()
    outdir.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ)
    full_env.update({"PYTHONPATH": f"{HERE}{os.pathsep}{REPO / 'examples'}{os.pathsep}" + os.environ.get("PYTHONPATH", ""),
                     "OMP_NUM_THREADS": "1"})
    full_env.update(env or {})
    procs = []
    logs = []
    for rank in range(world):
        log = open(outdir / f"rank{rank}.log", "w+")
        logs.append(log)
        procs.append(subprocess.Popen(
            [sys.executable, str(HERE / "launch.py"), target, str(rank), str(world), str(port), str(outdir), arg],
            stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=str(REPO),
        ))
    deadline = time.monotonic() + timeout
    for rank, p in enumerate(procs):
        if wait_for is not None and rank not in wait_for:
            continue
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    results = []
    for rank, (p, log) in enumerate(zip(procs, logs)):
        log.seek(0)
        output = log.read()
        log.close()
        path = outdir / f"rank{rank}.pt"
        value = torch.load(path, weights_only=False) if path.exists() else None
        results.append(RankResult(rank, p.returncode, output, value))
    if expect_ok:
        for r in results:
            assert r.returncode == 0, f"rank {r.rank} exited with {r.returncode}:\n{r.output[-4000:]}"
    return results


def _main() -> None:
    target, rank, world, port, outdir = sys.argv[1:6]
    arg = sys.argv[6] if len(sys.argv) > 6 else ""
    import torch
    import torch.distributed as dist

    timeout = float(os.environ.get("TORCHNEURON_TEST_PG_TIMEOUT", "60"))
    dist.init_process_group(
        os.environ.get("TORCHNEURON_TEST_BACKEND", "neuron"),
        init_method=f"tcp://127.0.0.1:{port}", rank=int(rank), world_size=int(world),
        timeout=datetime.timedelta(seconds=timeout),
    )
    module, func = target.split(":")
    value = getattr(importlib.import_module(module), func)(Path(outdir), arg)
    torch.save(value, Path(outdir) / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    _main()
