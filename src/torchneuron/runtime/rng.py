"""Random number generators of the neuron device.

A generator's state is (seed, offset): each random op draws the key
`fold_in(key(seed), offset)` and bumps the offset, so a seeded program is reproducible and
consecutive calls differ. The key is derived on the host in Python (`split_draw`, no JAX
call) and enters the op's executable as two uint32 words. `get_state()` is 16 bytes, seed
then offset (native-endian uint64 each), for every kind of generator below, so states are
interchangeable.

Two implementations of the same state, one per process:

- With the C++ library (`runtime/_native`), the default generator of each device is the
  `torch.Generator` ATen knows as the device's default (`getDefaultGenerator`), and
  `torch.Generator(device="neuron")` makes more of the same kind. `torch.manual_seed` reaches
  the defaults through `torch.neuron.manual_seed_all`.
- Without it, `DeviceGenerator` (pure Python, the same methods as `torch.Generator`) holds
  each device's default state, and explicit device generators cannot be created.

`next_draw(explicit)` serves both: the generator passed to the op, else the default one.
"""

from __future__ import annotations

import functools
import random
import threading
import weakref
from typing import Any

import jax
import numpy as np
import torch

from . import _native as native_library
from . import platform

_DEFAULT_SEED = 67280421310721  # c10's default_rng_seed_val, as for CPU and CUDA
_MASK = 0xFFFF_FFFF_FFFF_FFFF
_STATE_BYTES = 16

# Serializes draws from torch.Generator objects (read seed and offset, then advance).
_lock = threading.Lock()
# Explicit generators already found to be neuron generators (`.device` costs ~1 us a call).
_checked: weakref.WeakSet = weakref.WeakSet()


def _unsigned_seed(seed: Any) -> int:
    seed = int(seed)
    if not -(1 << 63) <= seed <= _MASK:
        raise RuntimeError("Overflow when unpacking long")
    return seed & _MASK


def _state_bytes(state: Any) -> torch.Tensor:
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"expected a torch.ByteTensor as the RNG state, but got {type(state).__name__}")
    if state.device.type != "cpu" or not state.is_contiguous():
        state = state.detach().to("cpu").contiguous()
    return state


class DeviceGenerator:
    """The pure-Python default generator of one neuron device (used without the C++ library).

    Offers the RNG methods of `torch.Generator`, with the same state layout.
    """

    def __init__(self, index: int = 0, seed: int = _DEFAULT_SEED) -> None:
        self.lock = threading.Lock()
        self.index = index
        self._seed = seed
        self._offset = 0

    @property
    def device(self) -> torch.device:
        return torch.device("neuron", self.index)

    def manual_seed(self, seed: Any) -> DeviceGenerator:
        value = _unsigned_seed(seed)
        with self.lock:
            self._seed, self._offset = value, 0
        return self

    def seed(self) -> int:
        value = random.SystemRandom().getrandbits(64)
        with self.lock:
            self._seed, self._offset = value, 0
        return value

    def initial_seed(self) -> int:
        return self._seed

    def get_offset(self) -> int:
        return self._offset

    def set_offset(self, offset: int) -> DeviceGenerator:
        with self.lock:
            self._offset = int(offset) & _MASK
        return self

    def draw(self) -> tuple[int, int]:
        with self.lock:
            draw = (self._seed, self._offset)
            self._offset = (self._offset + 1) & _MASK
            return draw

    def get_state(self) -> torch.Tensor:
        with self.lock:
            words = [self._seed, self._offset]
        return torch.tensor(words, dtype=torch.uint64).view(torch.uint8)

    def set_state(self, new_state: torch.Tensor) -> DeviceGenerator:
        state = _state_bytes(new_state)
        if state.dtype != torch.uint8 or state.numel() != _STATE_BYTES:
            raise RuntimeError(
                f"neuron RNG state must be a contiguous CPU uint8 tensor of {_STATE_BYTES} "
                "bytes (seed, offset)"
            )
        seed, offset = state.view(torch.uint64).tolist()
        with self.lock:
            self._seed, self._offset = int(seed), int(offset)
        return self


# ----------------------------------------------------------------------------------------
# Default generators

_native = False  # True once the C++ hooks are registered: defaults are torch.Generators
_DEFAULTS: dict[int, Any] = {}


def install() -> bool:
    """Register the C++ hooks if the library can be had; called once, before the device's
    Python hooks would be registered. True when explicit device generators are available."""
    global _native
    _native = native_library.register_hooks()
    _DEFAULTS.clear()
    return _native


def native() -> bool:
    """Whether `torch.Generator(device="neuron")` is supported in this process."""
    return _native


def unavailable_reason() -> str | None:
    return None if _native else (native_library.build_error() or "the C++ hooks are not registered")


def generator(index: int = 0):
    """The default generator of neuron:`index` (a torch.Generator, or a DeviceGenerator)."""
    gen = _DEFAULTS.get(index)
    if gen is None:
        if not 0 <= index < max(platform.device_count(), 1):
            raise RuntimeError(f"Invalid device ordinal neuron:{index}")
        gen = native_library.default_generator(index) if _native else DeviceGenerator(index)
        gen = _DEFAULTS.setdefault(index, gen)
    return gen


def default_generators() -> tuple:
    return tuple(generator(i) for i in range(platform.device_count()))


def next_draw(explicit=None, device_index: int = 0) -> tuple[int, int]:
    """(seed, offset) for one random op, advancing the generator it came from: `explicit`
    (the torch.Generator passed to the op) or the default generator of `device_index`."""
    gen = explicit
    if gen is None:
        gen = _DEFAULTS.get(device_index)
        if gen is None:
            gen = generator(device_index)
    elif gen not in _checked:
        if gen.device.type != "neuron":
            raise RuntimeError(
                f"Expected a 'neuron' device type for generator but found '{gen.device.type}'"
            )
        _checked.add(gen)
    if type(gen) is DeviceGenerator:
        return gen.draw()
    with _lock:
        seed = gen.initial_seed()
        offset = gen.get_offset()
        gen.set_offset((offset + 1) & _MASK)
    return seed, offset


def manual_seed(seed: Any, index: int = 0) -> None:
    generator(index).manual_seed(_unsigned_seed(seed))


def seed_fresh(index: int = 0) -> int:
    return generator(index).seed()


def initial_seed(index: int = 0) -> int:
    return generator(index).initial_seed()


def get_state(index: int = 0) -> torch.Tensor:
    return generator(index).get_state()


def set_state(new_state: torch.Tensor, index: int = 0) -> None:
    generator(index).set_state(_state_bytes(new_state))


# ----------------------------------------------------------------------------------------
# Draws as executable inputs


# Threefry-2x32 (Salmon et al., 2011), the block function of JAX's default PRNG, for one
# block on Python ints: the key of each draw is derived here, so that a random op's program
# holds only the draw of its bits. (Deriving it inside the program cost about 30% of the
# XLA compile time of every program with a random op; the keys, hence the streams, are
# the same: tests/runtime/test_rng.py checks them against JAX's own derivation.)
_U32 = 0xFFFF_FFFF
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_PARITY = 0x1BD1_1BDA


def _threefry2x32(k0: int, k1: int, x0: int, x1: int) -> tuple[int, int]:
    k2 = k0 ^ k1 ^ _KEY_PARITY
    x0, x1 = (x0 + k0) & _U32, (x1 + k1) & _U32
    # five groups of four rounds, each followed by a key injection
    for inject0, inject1, count, rotations in ((k1, k2, 1, _ROTATIONS[0]), (k2, k0, 2, _ROTATIONS[1]),
                                               (k0, k1, 3, _ROTATIONS[0]), (k1, k2, 4, _ROTATIONS[1]),
                                               (k2, k0, 5, _ROTATIONS[0])):
        for r in rotations:
            x0 = (x0 + x1) & _U32
            x1 = ((x1 << r | x1 >> (32 - r)) & _U32) ^ x0
        x0 = (x0 + inject0) & _U32
        x1 = (x1 + inject1 + count) & _U32
    return x0, x1


@functools.lru_cache(maxsize=16)
def _seed_key(seed: int) -> tuple[int, int]:
    """`fold_in(key(seed_lo), seed_hi)`: the part of a draw's key that only the seed decides
    (cached: a process draws from few seeds)."""
    return _threefry2x32(0, seed & _U32, 0, (seed >> 32) & _U32)


DRAW_WORDS = 2  # executable inputs per random op: the two uint32 words of its key


def split_draw(draw: tuple[int, int]) -> tuple:
    """The key of a (seed, offset) draw as executable inputs: the two uint32 words of
    `fold_in(fold_in(fold_in(key(seed_lo), seed_hi), offset_lo), offset_hi)` (JAX threefry
    key; `key(w)` of a uint32 is the pair (0, w), `fold_in(k, w)` is threefry(k, (0, w)))."""
    seed, offset = draw
    key = _threefry2x32(*_seed_key(seed), 0, offset & _U32)
    k0, k1 = _threefry2x32(*key, 0, (offset >> 32) & _U32)
    return np.uint32(k0), np.uint32(k1)


def fold_key(words):
    """The JAX key for one draw, from `split_draw`'s words; traced inside an executable."""
    data = jax.numpy.stack([jax.numpy.asarray(w, jax.numpy.uint32) for w in words])
    return jax.random.wrap_key_data(data, impl="threefry2x32")
