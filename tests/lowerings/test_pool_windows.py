"""Pooling windows larger than their input (EfficientNet's `AvgPool2d(hidden_dim,
ceil_mode=True)` over a 1x1 map): kernel offsets that read only padding are skipped, so the
lowering neither unrolls k*k slices nor pads the input to k*k (a 1280 kernel took minutes to
trace and ~half a GiB per call). Values, indices and gradients still match CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F
from lowering_checks import assert_native

from torchneuron.lowerings import pooling

DEV = "neuron"

pytestmark = pytest.mark.usefixtures("strict")  # tests/lowerings/conftest.py


def _compare(fn, x):
    c = x.clone().requires_grad_(True)
    d = x.clone().to(DEV).requires_grad_(True)
    out_c, out_d = fn(c), fn(d)
    out_c = out_c if isinstance(out_c, tuple) else (out_c,)
    out_d = out_d if isinstance(out_d, tuple) else (out_d,)
    for a, b in zip(out_c, out_d, strict=True):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-6, atol=1e-6)
    g = torch.randn(out_c[0].shape)
    out_c[0].backward(g)
    out_d[0].backward(g.to(DEV))
    torch.testing.assert_close(d.grad.cpu(), c.grad, rtol=1e-6, atol=1e-6)
    return out_c, out_d


@pytest.mark.parametrize(
    "shape, kw", [
        ((3, 20, 1, 1), {"kernel_size": 40, "ceil_mode": True}),
        ((2, 4, 3, 5), {"kernel_size": 6, "stride": 4, "ceil_mode": True}),
        ((2, 4, 7, 6), {"kernel_size": 4, "stride": 5, "padding": 2, "ceil_mode": True}),
        ((2, 4, 7, 6), {"kernel_size": 5, "stride": 4, "padding": 2, "count_include_pad": False,
                        "ceil_mode": True}),
    ],
)
def test_avg_pool_window_larger_than_input(shape, kw):
    _compare(lambda x: F.avg_pool2d(x, **kw), torch.randn(shape))
    assert_native("aten.avg_pool2d.default", "aten.avg_pool2d_backward.default")


@pytest.mark.parametrize(
    "shape, kw", [
        ((3, 20, 1, 1), {"kernel_size": 40, "ceil_mode": True}),
        ((2, 4, 3, 7), {"kernel_size": (6, 5), "stride": 4, "ceil_mode": True}),
        ((2, 4, 7, 6), {"kernel_size": 4, "stride": 5, "padding": 2, "ceil_mode": True}),
    ],
)
def test_max_pool_window_larger_than_input(shape, kw):
    out_c, out_d = _compare(lambda x: F.max_pool2d(x, return_indices=True, **kw), torch.randn(shape))
    assert torch.equal(out_d[1].cpu(), out_c[1])


def test_only_offsets_that_reach_the_input_are_traced():
    x = jnp.ones((2, 8, 1, 1), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda x: pooling.avg_pool2d(x, [40, 40], [], 0, True))(x)
    slices = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "slice"]
    assert len(slices) == 1  # was 40 * 40 = 1600, over a (2, 8, 40, 40) padded copy
    pads = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "pad"]
    assert all(tuple(e.outvars[0].aval.shape) == (2, 8, 1, 1) for e in pads)
