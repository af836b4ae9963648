"""The per-device random number generator.

State is (seed, offset): each random op draws the key `fold_in(key(seed), offset)` and bumps
the offset, so a seeded program is reproducible and consecutive calls differ. The key is built
inside the op's executable from two integers, so drawing costs no eager JAX step.
"""

from __future__ import annotations

import random
import threading

import torch

_DEFAULT_SEED = 67280421310721


class DeviceGenerator:
    def __init__(self, seed: int = _DEFAULT_SEED) -> None:
        self.lock = threading.Lock()
        self.seed = seed
        self.offset = 0

    def manual_seed(self, seed: int) -> None:
        with self.lock:
            self.seed = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
            self.offset = 0

    def next_draw(self) -> tuple[int, int]:
        with self.lock:
            draw = (self.seed, self.offset)
            self.offset += 1
            return draw

    def get_state(self) -> torch.Tensor:
        with self.lock:
            return torch.tensor([self.seed, self.offset], dtype=torch.uint64).view(torch.uint8)

    def set_state(self, state: torch.Tensor) -> None:
        if not isinstance(state, torch.Tensor) or state.dtype != torch.uint8 or state.numel() != 16:
            raise RuntimeError("neuron RNG state must be a uint8 tensor of 16 bytes")
        seed, offset = state.cpu().view(torch.uint64).tolist()
        with self.lock:
            self.seed, self.offset = int(seed), int(offset)


GENERATORS: list[DeviceGenerator] = [DeviceGenerator()]


def generator(index: int = 0) -> DeviceGenerator:
    while len(GENERATORS) <= index:
        GENERATORS.append(DeviceGenerator())
    return GENERATORS[index]


def next_draw(explicit=None) -> tuple[int, int]:
    """(seed, offset) for one random op: from `explicit` (a torch.Generator passed to the op)
    or from the current device's default generator."""
    if explicit is not None:
        raise RuntimeError("torchneuron: explicit torch.Generator objects are not supported yet")
    return generator(0).next_draw()


def seed_fresh(index: int = 0) -> int:
    seed = random.getrandbits(63)
    generator(index).manual_seed(seed)
    return seed


def split_draw(draw: tuple[int, int]) -> tuple:
    """The four uint32 words of a (seed, offset) draw, as executable inputs."""
    import numpy as np

    seed, offset = draw
    mask = 0xFFFF_FFFF
    return tuple(
        np.uint32(v) for v in (seed & mask, (seed >> 32) & mask, offset & mask, offset >> 32)
    )


def fold_key(words):
    """The JAX key for one draw, from `split_draw`'s words; traced inside an executable."""
    import jax

    key = jax.random.key(words[0])
    for word in words[1:]:
        key = jax.random.fold_in(key, word)
    return key
