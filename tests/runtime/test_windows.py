"""Views of growing buffers (strided.canonical): views that differ only in the strides of
size-1 dimensions share one program, and keep CPU's strides."""

from __future__ import annotations

import pytest
import torch

from torchneuron.runtime import fusion, strided
from torchneuron.runtime.plan import plan_for

pytestmark = pytest.mark.skipif(fusion.Pending is None,
                                reason="fusion needs the C++ library, which this process could not build")

DEV = "neuron"
aten = torch.ops.aten


@pytest.fixture
def fused():
    before = fusion.recording()
    fusion.set_enabled(True)
    yield
    fusion.set_enabled(before)


def test_canonical_spec_only_changes_strides_of_size_one_dims():
    spec = strided.ViewSpec((1, 1), (40, 1), strided.SLICE)
    assert strided.canonical(spec) == strided.ViewSpec((1, 1), (1, 1), strided.SLICE)
    spec = strided.ViewSpec((3, 1, 4), (4, 77, 1), strided.FULL)
    assert strided.canonical(spec).stride == (4, 4, 1)
    spec = strided.ViewSpec((4, 3), (1, 4), strided.STRIDED)  # no size-1 dimension
    assert strided.canonical(spec) is spec
    assert strided.span(strided.ViewSpec((2, 3), (10, 2), strided.STRIDED)) == 15
    assert strided.span(strided.ViewSpec((0, 3), (3, 1), strided.SLICE)) == 0


def test_views_differing_in_size_one_strides_share_one_program_and_keep_cpu_strides(fused):
    plan = plan_for(aten.clone.default)
    for length in (5, 9, 17):
        cpu = torch.arange(float(length)).view(1, length)[:, -1:]
        x = torch.arange(float(length), device=DEV).view(1, length)[:, -1:]
        assert x.stride() == cpu.stride() == (length, 1)
        y = x.clone()  # preserves the input's layout, the size-1 stride included
        assert y.stride() == cpu.clone().stride() == (length, 1)
        assert y.cpu().tolist() == cpu.clone().tolist()
        z = x.clone(memory_format=torch.contiguous_format)
        assert z.stride() == (1, 1)
        assert z.cpu().tolist() == [[length - 1.0]]
    fns = {id(ex.fn) for key, ex in plan.cache.items()  # clone() with no memory format
           if key[0][0][0] == torch.float32 and key[0][0][1].shape == (1, 1)
           and key[0][1] is None}
    assert len(fns) == 1  # one jitted program for every length
