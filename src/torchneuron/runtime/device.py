"""Registration of the `neuron` device and the `torch.neuron` module."""

from __future__ import annotations

import gc
import os
import threading
from collections import namedtuple
from typing import Any

import torch

from .. import config
from ..lowerings import host_kernels
from . import (
    _native,
    autocast,
    dispatch,
    module_conversion,
    platform,
    rng,
    serialization,
    sparse,
    storage,
)

DEVICE_NAME = "neuron"
_lock = threading.Lock()
_registered = False
_current_device = 0


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, device_index: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _DeviceGuard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


_DeviceProperties = namedtuple(
    "_DeviceProperties", ["name", "platform", "total_memory", "jax_device"]
)


def _index(device: Any = None) -> int:
    if device is None:
        return _current_device
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != DEVICE_NAME:
        raise ValueError(f"Expected a neuron device, but got: {device}")
    return _current_device if device.index is None else device.index


class NeuronModule:
    """`torch.neuron`: what `torch.cuda` users reach for, for the neuron device."""

    class device:  # noqa: N801 - mirrors torch.cuda.device
        """Context manager that changes the current neuron device."""

        def __init__(self, device: Any) -> None:
            self.index = _index(device)
            self.previous = 0

        def __enter__(self):
            global _current_device
            self.previous = _current_device
            set_device(self.index)
            return self

        def __exit__(self, *exc) -> None:
            set_device(self.previous)

    @staticmethod
    def is_available() -> bool:
        return is_available()

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def device_count() -> int:
        return device_count()

    @staticmethod
    def current_device() -> int:
        return _current_device

    @staticmethod
    def set_device(device: Any) -> None:
        set_device(device)

    @staticmethod
    def synchronize(device: Any = None) -> None:
        synchronize(device)

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return get_device_properties(device).name

    @staticmethod
    def get_device_properties(device: Any = None):
        return get_device_properties(device)

    @staticmethod
    def get_device_capability(device: Any = None) -> tuple[int, int]:
        return (1, 0)

    @staticmethod
    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return True

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]

    # -- random numbers --------------------------------------------------------------
    # State lives in runtime/rng.py: C++ default generators when the generator library is
    # loaded, pure-Python ones otherwise. torch.manual_seed/torch.seed reach these through
    # manual_seed_all (torch.random._seed_custom_device, with _is_in_bad_fork).
    @property
    def default_generators(self) -> tuple:
        return rng.default_generators()

    @staticmethod
    def manual_seed(seed: int) -> None:
        rng.manual_seed(seed, _current_device)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        for i in range(device_count()):
            rng.manual_seed(seed, i)

    @staticmethod
    def seed() -> None:
        rng.seed_fresh(_current_device)

    @staticmethod
    def seed_all() -> None:
        seed = rng.seed_fresh(_current_device)
        for i in range(device_count()):
            if i != _current_device:
                rng.manual_seed(seed, i)

    @staticmethod
    def initial_seed() -> int:
        return rng.initial_seed(_current_device)

    @staticmethod
    def get_rng_state(device: Any = "neuron") -> torch.Tensor:
        return rng.get_state(_index(device))

    @staticmethod
    def set_rng_state(new_state: torch.Tensor, device: Any = "neuron") -> None:
        rng.set_state(new_state, _index(device))

    @staticmethod
    def get_rng_state_all() -> list[torch.Tensor]:
        return [rng.get_state(i) for i in range(device_count())]

    @staticmethod
    def set_rng_state_all(new_states) -> None:
        for i, state in enumerate(new_states):
            rng.set_state(state, i)

    # -- memory ----------------------------------------------------------------------
    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return storage.memory_stats()[0]

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        return storage.memory_stats()[1]

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        storage.reset_peak_memory()

    @staticmethod
    def memory_reserved(device: Any = None) -> int:
        return storage.memory_stats()[0]

    @staticmethod
    def max_memory_reserved(device: Any = None) -> int:
        return storage.memory_stats()[1]

    @staticmethod
    def memory_stats(device: Any = None) -> dict[str, int]:
        allocated, peak, num_alloc, num_free = storage.memory_stats()
        return {
            "allocated_bytes.all.current": allocated,
            "allocated_bytes.all.peak": peak,
            "allocation.all.allocated": num_alloc,
            "allocation.all.freed": num_free,
            "allocation.all.current": num_alloc - num_free,
        }

    @staticmethod
    def empty_cache() -> None:
        # Buffers are freed with their storages; nothing is cached beyond live tensors.
        gc.collect()


def is_available() -> bool:
    return platform.device_count() > 0


device_count = platform.device_count


def set_device(device: Any) -> None:
    global _current_device
    index = _index(device)
    if not 0 <= index < device_count():
        raise RuntimeError(f"Invalid device ordinal neuron:{index}")
    _current_device = index


def synchronize(device: Any = None) -> None:
    """Wait until the device has finished all work queued so far."""
    storage.wait_for_pending()


def get_device_properties(device: Any = None):
    index = _index(device)
    jdev = platform.jax_device(index)
    kind = getattr(jdev, "device_kind", jdev.platform)
    total = 0
    try:
        stats = jdev.memory_stats() or {}
        total = int(stats.get("bytes_limit", 0))
    except Exception:  # the CPU client has no memory stats
        total = 0
    if not total:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return _DeviceProperties(f"neuron ({platform.platform_name()}: {kind})", jdev.platform, total, str(jdev))


def _backward_in_calling_thread() -> None:
    """PyTorch's autograd engine hands the backward pass of a graph on an accelerator to a
    thread of that device and waits for it: two thread hand-offs per `backward()`, ~100 us on
    these machines (a 10-layer MLP's backward 405 -> 337 us), for no gain here, where every
    device op is recorded or launched by the host. With multithreading off (on the importing
    thread, where training loops run), the backward runs on the calling thread, as CPU's
    does; the results are the same. TORCHNEURON_AUTOGRAD_DEVICE_THREAD=1 keeps PyTorch's way."""
    if not config.flag("TORCHNEURON_AUTOGRAD_DEVICE_THREAD"):
        torch._C._set_multithreading_enabled(False)


def _install_host_kernels() -> None:
    """PyTorch's CPU convolution kernels inside programs on XLA's CPU client
    (lowerings/host_kernels.py): 2-5x faster than XLA's, and CPU's results."""
    if platform.platform_name() != "cpu" or not config.flag("TORCHNEURON_HOST_KERNELS"):
        return
    kernels = _native.host_kernels()
    if kernels:
        # The loaded library's file name carries its build key (sources, torch, jaxlib).
        identity = _native.loaded_path().name
        for name, handler in kernels.items():
            host_kernels.register(name, handler, identity=identity)


def register() -> None:
    """Register the device with PyTorch; safe to call any number of times."""
    global _registered
    with _lock:
        if _registered:
            return
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        if torch._C._get_privateuse1_backend_name() == DEVICE_NAME and hasattr(torch, DEVICE_NAME):
            _registered = True
            return
        module = NeuronModule()
        # C++ hooks (explicit torch.Generator support) go first when they can be built;
        # the Python hooks below are then skipped by PyTorch (one set per process).
        rng.install()
        _install_host_kernels()
        _setup_privateuseone_for_python_backend(
            DEVICE_NAME, backend_module=module, hook=_Hooks(), device_guard=_DeviceGuard()
        )
        dispatch.install()
        _backward_in_calling_thread()
        autocast.install()
        module_conversion.install()  # Module.to keeps shared parameters shared
        serialization.install()
        sparse.install()
        _registered = True
