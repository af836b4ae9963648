"""Rank-side training runs for test_training.py (the char GPT of examples/, a tiny config)."""

from __future__ import annotations

import json

import ddp_gpt

TINY = {"n_layer": 1, "n_head": 2, "d_model": 32, "block_size": 16, "batch_size": 8}
STEPS = 10


def run(outdir, arg):
    """arg: JSON {"mode": ..., "device": ..., extra train() keywords}."""
    spec = json.loads(arg)
    mode = spec.pop("mode")
    device = spec.pop("device", "neuron")
    steps = spec.pop("steps", STEPS)
    for key in ("checkpoint", "resume"):
        if key in spec:
            spec[key] = str(outdir.parent / spec[key])
    return ddp_gpt.train(device, mode, steps, seed=0, **spec, **TINY)


def run_core(outdir, arg):
    """DDP and FSDP2 with a sharded checkpoint, in one launch (the ranks' compiled ops are
    reused across modes): the fast slice `make test` runs."""
    results = {}
    results["ddp"] = ddp_gpt.train("neuron", "ddp", STEPS, seed=0, **TINY)
    ckpt = str(outdir / "ckpt")
    results["fsdp"] = ddp_gpt.train("neuron", "fsdp", STEPS, seed=0, checkpoint=ckpt, save_at=5, **TINY)
    results["fsdp_resumed"] = ddp_gpt.train("neuron", "fsdp", STEPS, seed=0, resume=ckpt, **TINY)
    return results


def run_more(outdir, arg):
    """Tensor parallel and FSDP2 with a bf16 mixed-precision policy (`make test-slow`)."""
    return {
        "tp": ddp_gpt.train("neuron", "tp", STEPS, seed=0, **TINY),
        "fsdp_bf16": ddp_gpt.train("neuron", "fsdp", STEPS, seed=0, mixed_precision=True, **TINY),
    }
