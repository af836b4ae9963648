"""The `neuron` c10d backend: `torch.distributed` collectives on neuron tensors.

Importing this module registers the backend (torchneuron's package import does so), after
which `dist.init_process_group("neuron")`, `"cpu:gloo,neuron:neuron"` or a plain
`dist.init_process_group()` (the accelerator is `neuron`) give a `ProcessGroupNeuron`.
See docs/DISTRIBUTED.md.
"""

from __future__ import annotations

import torch.distributed as dist

from .process_group import ProcessGroupNeuron, create_process_group
from .transport import GlooTransport, Transport

BACKEND_NAME = "neuron"
_registered = False


def register() -> None:
    """Register the `neuron` backend with torch.distributed; safe to call more than once."""
    global _registered
    if _registered or not dist.is_available():
        return
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        # `cpu` too: the process group replaces the whole default group, so CPU tensors
        # (object collectives, DCP planning, DDP's checks) must go through it as well.
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, devices=["neuron", "cpu"])
        # register_backend only fills an empty slot; cpu stays gloo's for `init_process_group()`
        # on a machine without an accelerator, neuron becomes ours.
        dist.Backend.default_device_backend_map[BACKEND_NAME] = BACKEND_NAME
    import torch

    from . import streams

    streams.install(torch.neuron)  # FSDP2 asks the device module for streams and events
    _registered = True


register()

__all__ = ["BACKEND_NAME", "GlooTransport", "ProcessGroupNeuron", "Transport", "register"]
