"""Command-line plumbing shared by the examples: device choice and the per-step log line."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch


def default_device() -> str:
    """The current accelerator (`neuron` once torchneuron is installed), else the CPU.

    Code written like this needs no change to run on the neuron device.
    """
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    return accelerator.type if accelerator is not None else "cpu"


def main(train: Callable[..., list[float]], description: str, default_steps: int) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", default=default_device(), help="default: %(default)s")
    parser.add_argument("--steps", type=int, default=default_steps, help="default: %(default)s")
    parser.add_argument("--seed", type=int, default=0, help="default: %(default)s")
    args = parser.parse_args()
    print(f"device {args.device}")
    train(args.device, args.steps, args.seed, log=True)


def log_step(step: int, loss: float) -> None:
    print(f"step {step} loss {loss:.6f}", flush=True)
