"""Rank-side programs for test_faults.py: one rank dies or hangs, the other must fail fast."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist


def peer_fails(outdir, arg):
    """arg "die": rank 1 exits abruptly; "hang": rank 1 stops calling collectives."""
    rank = dist.get_rank()
    t = torch.ones(1000, device="neuron")
    dist.all_reduce(t)  # both ranks are up and connected
    if rank == 1:
        if arg == "die":
            os._exit(17)
        time.sleep(600)  # the test kills this process
    start = time.monotonic()
    try:
        for _ in range(1000):
            dist.all_reduce(t)
    except Exception as err:  # noqa: BLE001 - any error is the point; its text is checked
        (outdir / "rank0.error").write_text(f"{time.monotonic() - start:.1f}\n{type(err).__name__}: {err}")
        os._exit(3)
    (outdir / "rank0.error").write_text("no error")
    os._exit(0)
