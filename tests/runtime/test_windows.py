"""Views of growing buffers (runtime/windows.py, strided.canonical): a loop that reads the
newest element of a buffer that grows at every step compiles a bounded number of programs,
and gives CPU's values, strides and errors at every step."""

from __future__ import annotations

import collections

import pytest
import torch

import torchneuron
from torchneuron.runtime import fusion, platform, strided
from torchneuron.runtime.plan import plan_for

pytestmark = pytest.mark.skipif(fusion.Pending is None,
                                reason="fusion needs the C++ library, which this process could not build")

DEV = "neuron"
aten = torch.ops.aten


def _stats() -> dict:
    return dict(torchneuron.fusion_stats())


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


def test_a_shared_program_gives_its_warnings_for_every_signature(fused):
    # (5, 1) tensors with strides (1, 1) and (1, 5): one program, traced once, and CPU warns
    # at every call for both.
    for t in (torch.empty(5, 1, device=DEV), torch.empty(1, 5, device=DEV).t()):
        for _ in range(2):
            with pytest.warns(UserWarning, match="out of bounds"):
                t.random_(0, 2**25)


def _generation_loop(device: str, steps: int):
    """`ids[:, -1:]` of a token buffer that grows by one each step, read after a sync point,
    as Hugging Face's generate() reads its last token."""
    g = torch.Generator().manual_seed(0)
    table = torch.randn(64, 8, generator=g).to(device)
    ids = torch.randint(0, 64, (1, 5), generator=g).to(device)
    tokens = []
    for _ in range(steps):
        last = ids[:, -1:].clone(memory_format=torch.contiguous_format)
        before = ids[:, -2:-1].clone()  # a second view of the same buffer
        h = torch.nn.functional.embedding(last, table) + torch.nn.functional.embedding(before, table)
        nxt = (h.sum(-1).abs() * 7).long() % 64
        tokens.append(int(nxt.item()))
        ids = torch.cat([ids, nxt.view(1, 1)], dim=-1)
        bool((ids == 99).any())  # a stopping check reads the grown buffer
    return tokens, ids.cpu()


@pytest.mark.skipif(platform.platform_name() != "cpu", reason="windows are host copies")
def test_a_growing_buffer_read_through_views_does_not_compile_per_length(fused):
    first_half = _stats()
    _generation_loop(DEV, 12)
    second_half = _stats()
    tokens, ids = _generation_loop(DEV, 24)
    after = _stats()
    cpu_tokens, cpu_ids = _generation_loop("cpu", 24)
    assert tokens == cpu_tokens
    assert torch.equal(ids, cpu_ids)

    def compiled(a, b):
        return (b["compilations"] - a["compilations"]
                + b["op_compilations"] - a["op_compilations"])

    # The second loop meets 12 new lengths and compiles no program per length (before: the
    # trace of the views compiled at every length); at most two traces are compiled again
    # to take their scalars packed, at their 17th run (runtime/packing.py).
    assert compiled(second_half, after) <= 2, (first_half, second_half, after)


def test_views_of_buffers_also_read_whole_or_written_give_cpu_values(fused):
    # Buffers the trace also reads whole or writes are passed whole: the results, at each
    # length, are CPU's.
    for device in (DEV, "cpu"):
        ids = torch.arange(4, device=device).view(1, 4)
        out = []
        for step in range(6):
            tail = ids[:, -2:].clone()
            total = ids.sum()  # read whole in the same trace
            ids[:, -1:].add_(step)  # written through a view
            out.append((tail.cpu().tolist(), int(total.item()), ids.cpu().tolist()))
            ids = torch.cat([ids, ids[:, -1:] + 1], dim=-1)
            bool((ids < 0).any())
        if device == DEV:
            neuron_out = out
    assert neuron_out == out


def test_an_index_error_through_a_window_is_reported_as_before(fused):
    table = torch.randn(10, 4, device=DEV)
    ids = torch.arange(5, device=DEV).view(1, 5)
    for _ in range(3):
        torch.nn.functional.embedding(ids[:, -1:].clone(), table).cpu()
        ids = torch.cat([ids, ids[:, -1:] + 1], dim=-1)
        bool((ids < 0).any())
    bad = torch.cat([ids, torch.full((1, 1), 50, device=DEV)], dim=-1)
    bool((bad < 0).any())
    with pytest.raises(IndexError, match="index out of range"):
        torch.nn.functional.embedding(bad[:, -1:].clone(), table).cpu()


@pytest.mark.skipif(platform.platform_name() != "cpu", reason="windows are host copies")
def test_a_failing_window_leaves_the_trace_as_before(fused, monkeypatch):
    from torchneuron.runtime import windows

    def broken(self, externals):
        raise ValueError("broken window")

    monkeypatch.setattr(windows.Windows, "narrow", broken)
    monkeypatch.setattr(fusion, "_PROGRAMS", collections.OrderedDict())  # decided afresh
    with pytest.warns(UserWarning, match="could not be passed as windows"):
        tokens, ids = _generation_loop(DEV, 6)
    cpu_tokens, cpu_ids = _generation_loop("cpu", 6)
    assert tokens == cpu_tokens
    assert torch.equal(ids, cpu_ids)
