"""Packed scalar inputs (runtime/packing.py): a program fed packed scalars computes what it
computes when fed the scalars themselves, with the same types (weak for Python numbers)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch  # noqa: F401 - torchneuron's JAX settings (x64) come with the package

import torchneuron  # noqa: F401
from torchneuron.runtime.packing import ScalarPacking


def _ops(x32, i8, offset, scale, flag, rotation, word, big):
    # Weak Python numbers keep the arrays' dtypes; a strong uint32 word does not.
    return (x32 * scale + offset, i8 * offset, jnp.where(flag, x32, -x32), x32 * rotation,
            i8 + word, x32 + big)


EXTERNALS = (jnp.arange(4, dtype=jnp.float32), jnp.arange(4, dtype=jnp.int8), 3, 0.1,
             True, 1 + 2j, np.uint32(4_000_000_000), 2.0**70)


def test_packed_scalars_give_the_same_types_and_values():
    packing = ScalarPacking(tuple(map(type, EXTERNALS)))
    arguments = packing.pack(EXTERNALS)
    assert len(arguments) == 2 + 5  # two arrays, then int, float, bool, complex, uint32
    direct = jax.jit(_ops)
    packed = jax.jit(lambda *a: _ops(*packing.unpack(a)))
    expected = direct(*EXTERNALS)
    got = packed(*arguments)
    assert [r.dtype for r in got] == [r.dtype for r in expected]
    assert [r.weak_type for r in got] == [r.weak_type for r in expected]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(e))
    # The same traced computation: packing only changes where the scalars come from.
    assert direct.trace(*EXTERNALS).jaxpr.out_avals == packed.trace(*arguments).jaxpr.out_avals


def test_a_trace_without_scalars_packs_nothing():
    externals = (jnp.ones(3), jnp.zeros(2))
    packing = ScalarPacking(tuple(map(type, externals)))
    assert packing.pack(externals) == externals
    assert packing.unpack(externals) == list(externals)


def test_a_python_int_out_of_int64_range_raises_as_jax_does():
    with pytest.raises(OverflowError):
        jax.jit(lambda v: v)(2**64)
    with pytest.raises(OverflowError):
        ScalarPacking((int,)).pack((2**64,))
