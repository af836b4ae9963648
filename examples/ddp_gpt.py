"""The character-level GPT of char_gpt.py trained on several processes: DDP, FSDP2 or tensor parallel.

One device per process. Each step draws the same global batch as char_gpt.py; with DDP and
FSDP2 every rank trains on its slice of it, with tensor parallelism every rank sees all of it
and holds part of each MLP. The printed loss is that of the global batch, so the curve can be
compared with `python examples/char_gpt.py` step by step.

    torchrun --nproc-per-node=2 examples/ddp_gpt.py --mode ddp --steps 30
    torchrun --nproc-per-node=2 examples/ddp_gpt.py --mode fsdp --mixed-precision
    torchrun --nproc-per-node=2 examples/ddp_gpt.py --mode tp

`--device cpu` runs the same program on CPU tensors (Gloo), for comparison.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
import torch.distributed as dist

try:
    from char_gpt import CharGPT, Config, get_batch, load_text
    from example_utils import default_device, log_step
except ImportError:  # imported as examples.ddp_gpt
    from .char_gpt import CharGPT, Config, get_batch, load_text
    from .example_utils import default_device, log_step


def build(device: str, mode: str, seed: int, mixed_precision: bool = False, **overrides):
    """The model (wrapped for `mode`), its optimizer and its config, identical on every rank."""
    data, chars = load_text()
    cfg = Config(vocab_size=len(chars), **overrides)
    torch.manual_seed(seed)
    model = CharGPT(cfg).to(device)
    world = dist.get_world_size()
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        # small buckets so that even the tiny test model is reduced in several buckets
        model = DDP(model, bucket_cap_mb=0.05)
    elif mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device, (world,))
        mp = MixedPrecisionPolicy()
        if mixed_precision:
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
    elif mode == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        mesh = init_device_mesh(device, (world,))
        for block in model.blocks:
            # the MLP: first Linear column-sharded, second row-sharded (one all-reduce)
            parallelize_module(block.mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    elif mode != "single":
        raise ValueError(f"unknown mode {mode!r}")
    # With TP only some parameters are DTensors; foreach kernels cannot mix the two kinds.
    foreach = False if mode == "tp" else None
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=foreach)
    return model, opt, cfg, data


def local_batch(x: torch.Tensor, y: torch.Tensor, mode: str):
    """This rank's part of the global batch: a slice for data parallelism, all of it for TP."""
    if mode in ("tp", "single"):
        return x, y
    rank, world = dist.get_rank(), dist.get_world_size()
    per = x.shape[0] // world
    return x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]


def train_step(model, opt, x, y, device: str, mode: str) -> float:
    """One optimizer step; returns the loss of the global batch (the same on every rank)."""
    x, y = local_batch(x, y, mode)
    _, loss = model(x.to(device), y.to(device))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    loss = loss.detach()
    if mode in ("ddp", "fsdp"):
        dist.all_reduce(loss, op=dist.ReduceOp.AVG)
    return loss.item()


def train(
    device: str, mode: str, steps: int, seed: int = 0, log: bool = False,
    mixed_precision: bool = False, checkpoint: str | None = None, resume: str | None = None,
    save_at: int | None = None, **overrides,
) -> list[float]:
    """Train for `steps` steps; optionally save a sharded checkpoint after step `save_at`
    (`checkpoint` directory) or start from one (`resume`). Returns every step's loss."""
    model, opt, cfg, data = build(device, mode, seed, mixed_precision, **overrides)
    gen = torch.Generator().manual_seed(seed)
    start = 0
    if resume is not None:
        start = load_checkpoint(model, opt, gen, resume)
    losses = []
    for step in range(start, steps):
        x, y = get_batch(data, cfg, gen)
        losses.append(train_step(model, opt, x, y, device, mode))
        if log and dist.get_rank() == 0:
            log_step(step, losses[-1])
        if checkpoint is not None and save_at is not None and step + 1 == save_at:
            save_checkpoint(model, opt, gen, step + 1, checkpoint)
    return losses


def save_checkpoint(model, opt, gen: torch.Generator, step: int, path: str) -> None:
    """A sharded checkpoint with torch.distributed.checkpoint: each rank writes its shards."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
    if dist.get_rank() == 0:
        torch.save({"step": step, "rng": gen.get_state()}, Path(path) / "progress.pt")
    dist.barrier()


def load_checkpoint(model, opt, gen: torch.Generator, path: str) -> int:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    progress = torch.load(Path(path) / "progress.pt")
    gen.set_state(progress["rng"])
    return progress["step"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=default_device(), help="default: %(default)s")
    parser.add_argument("--mode", choices=["ddp", "fsdp", "tp"], default="ddp")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mixed-precision", action="store_true", help="FSDP2: bf16 params, fp32 reduce")
    parser.add_argument("--checkpoint", help="directory for a sharded checkpoint (with --save-at)")
    parser.add_argument("--save-at", type=int, help="save the checkpoint after this many steps")
    parser.add_argument("--resume", help="resume from this checkpoint directory")
    args = parser.parse_args()
    # A plain init_process_group() picks the `neuron` backend when neuron is the accelerator.
    backend = None if args.device != "cpu" else "gloo"
    dist.init_process_group(backend)
    if dist.get_rank() == 0:
        print(f"device {args.device} mode {args.mode} world {dist.get_world_size()} "
              f"process group {type(dist.group.WORLD).__name__} "
              f"(LOCAL_WORLD_SIZE={os.environ.get('LOCAL_WORLD_SIZE')})")
    train(args.device, args.mode, args.steps, args.seed, log=True, mixed_precision=args.mixed_precision,
          checkpoint=args.checkpoint, resume=args.resume, save_at=args.save_at)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
