"""`torch.load` onto the neuron device.

PyTorch's generic loader for a PrivateUse1 device allocates `UntypedStorage(n, device=...)`,
which needs a C++ allocator this pure-Python backend does not have. This loader, registered
ahead of it, builds the device storage from the loaded host bytes instead.
"""

from __future__ import annotations

import re

import torch

from . import storage

_LOCATION = re.compile(r"^neuron(:(\d+))?$")
# PyTorch's own PrivateUse1 loader is registered at priority 23; lower runs first.
_PRIORITY = 19


def _tag(obj) -> str | None:
    return None  # PyTorch's tagger already writes "neuron:N"


def _restore(obj, location: str):
    match = _LOCATION.match(location)
    if match is None:
        return None
    index = int(match.group(2) or 0)
    if obj.device.type == "neuron":
        return obj
    nbytes = obj.nbytes()
    buf = None
    if nbytes:
        host = torch.empty(0, dtype=torch.uint8).set_(obj.cpu())
        buf = storage.host_to_buffer(host.numpy())
    return storage.new_storage(nbytes, torch.uint8, buf, index)


def install() -> None:
    torch.serialization.register_package(_PRIORITY, _tag, _restore)
