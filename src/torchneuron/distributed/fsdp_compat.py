"""FSDP2 on neuron: freeing and re-allocating unsharded parameters without `storage.resize_`.

FSDP2 frees an unsharded parameter between uses with `untyped_storage().resize_(0)` and
allocates it again with `resize_(nbytes)`. Resizing a neuron storage in place is not supported
by the runtime (PyTorch asks the C++ PrivateUse1 hooks for `resizePrivateUse1Bytes`, which the
neuron hooks do not implement). Here FSDP2's two helpers are wrapped: for a neuron tensor,
freeing drops the device buffer (the storage keeps its size and reads as zeros until the next
all-gather writes it) and allocating is then a no-op. Other devices are untouched.
"""

from __future__ import annotations

import torch

_installed = False


def _free(original):
    def free_storage(tensor: torch.Tensor) -> None:
        if tensor.device.type != "neuron":
            return original(tensor)
        from ..runtime import storage

        storage.payload_of(tensor.untyped_storage()).buf = None

    return free_storage


def _alloc(original):
    def alloc_storage(tensor: torch.Tensor) -> None:
        if tensor.device.type != "neuron":
            return original(tensor)
        st = tensor.untyped_storage()
        if st.nbytes() < tensor.numel() * tensor.itemsize:
            raise RuntimeError("torchneuron: FSDP2 parameter storage is smaller than its tensor")

    return alloc_storage


def install() -> None:
    global _installed
    if _installed:
        return
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    free, alloc = _free(_fsdp_param.free_storage), _alloc(_fsdp_param.alloc_storage)
    _fsdp_param.free_storage = free
    _fsdp_param.alloc_storage = alloc
    _fsdp_param_group.alloc_storage = alloc
    _installed = True
