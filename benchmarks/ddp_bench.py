"""DDP step time of the char GPT (examples/char_gpt.py) on 1 and 2 processes: neuron vs CPU/Gloo.

Weak scaling: every rank trains on `--batch` sequences per step, so 2 processes process twice
the global batch. Scaling efficiency = (step time on 1 process) / (step time on 2 processes).

    python benchmarks/ddp_bench.py            # print the table
    python benchmarks/ddp_bench.py --write    # also record it in docs/BENCHMARKS.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Distributed: DDP step time (benchmarks/ddp_bench.py)"


def _rank_main(args) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(REPO / "examples"))
    from char_gpt import CharGPT, Config, get_batch, load_text
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo" if args.device == "cpu" else "neuron")
    data, chars = load_text()
    cfg = Config(vocab_size=len(chars), batch_size=args.batch)
    torch.manual_seed(0)
    model = DDP(CharGPT(cfg).to(args.device))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(dist.get_rank())
    times = []
    for step in range(args.warmup + args.steps):
        x, y = get_batch(data, cfg, gen)
        start = time.perf_counter()
        _, loss = model(x.to(args.device), y.to(args.device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()  # waits for the step to finish on the device
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    if dist.get_rank() == 0:
        Path(args.result).write_text(json.dumps({"median_s": statistics.median(times)}))
    dist.destroy_process_group()


def _run(device: str, nproc: int, args) -> float:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        procs = []
        for rank in range(nproc):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--rank-main", "--device", device, "--batch", str(args.batch),
                 "--steps", str(args.steps), "--warmup", str(args.warmup), "--result", str(result)],
                env=env,
            ))
        for p in procs:
            if p.wait(timeout=900) != 0:
                raise RuntimeError(f"{device} x{nproc}: a rank exited with {p.returncode}")
        return json.loads(result.read_text())["median_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16, help="sequences per rank per step")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--device", default="neuron", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        _rank_main(args)
        return
    load = os.getloadavg()[0]
    rows = []
    for device, label in (("cpu", "cpu / gloo"), ("neuron", "neuron / neuron backend")):
        t1 = _run(device, 1, args)
        t2 = _run(device, 2, args)
        rows.append(f"| {label} | {t1 * 1e3:.1f} | {t2 * 1e3:.1f} | {t1 / t2:.2f} |")
        print(rows[-1], flush=True)
    import jax
    import torch

    lines = [
        SECTION,
        "",
        "Char GPT of examples/char_gpt.py (default config: 2 layers, d_model 64, block 32), AdamW, "
        f"DDP with default buckets; {args.batch} sequences per rank per step (weak scaling); median "
        f"of {args.steps} steps after {args.warmup} warm-up steps; processes on one machine, "
        "connected over 127.0.0.1.",
        "",
        f"- machine: {os.cpu_count()} cores, {platform.machine()}; load average at start {load:.2f}",
        f"- torch {torch.__version__}, jax {jax.__version__}; OMP_NUM_THREADS=1 per process",
        f"- command: `python benchmarks/ddp_bench.py{' --write' if args.write else ''}`",
        f"- date: {time.strftime('%Y-%m-%d')}",
        "",
        "| device / backend | 1 process (ms/step) | 2 processes (ms/step) | scaling efficiency (t1/t2) |",
        "|---|---:|---:|---:|",
        *rows,
        "",
        "- the neuron backend stages every collective through host memory and Gloo and checks "
        "the ranks agree on each call (one extra 256-byte all-gather); set "
        "`TORCHNEURON_DIST_CHECK=0` to skip the check",
        "- with 2 processes on 2 cores each process has one core; on a busier machine the "
        "2-process figures are inflated",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        path = REPO / "docs" / "BENCHMARKS.md"
        current = path.read_text()
        if SECTION in current:
            head, rest = current.split(SECTION, 1)
            nxt = rest.find("\n## ")
            tail = rest[nxt + 1 :] if nxt >= 0 else ""
            current = head + text + ("\n" + tail if tail else "")
        else:
            current = current.rstrip("\n") + "\n\n" + text
        path.write_text(current)


if __name__ == "__main__":
    main()
