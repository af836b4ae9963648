"""Sparse COO tensors on the device (runtime/sparse.py): neuron indices and values, PyTorch's
own sparse bookkeeping, computed on CPU visibly."""

from __future__ import annotations

import warnings

import pytest
import torch

import torchneuron
from torchneuron.runtime import cpu_fallback

DEV = "neuron"


def _sparse(device) -> torch.Tensor:
    indices = torch.tensor([[0, 1, 1, 0], [2, 0, 2, 2]])  # (0, 2) twice: uncoalesced
    values = torch.tensor([3.0, 4.0, 5.0, -1.0])
    return torch.sparse_coo_tensor(indices, values, (2, 3)).to(device)


def _same(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.device.type == DEV
    assert actual.layout == expected.layout and actual.shape == expected.shape
    if expected.layout == torch.sparse_coo:
        assert actual.is_coalesced() == expected.is_coalesced()
        assert actual._indices().device.type == DEV and actual._values().device.type == DEV
        torch.testing.assert_close(actual._indices().cpu(), expected._indices())
        torch.testing.assert_close(actual._values().cpu(), expected._values())
    else:
        torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize("fn", [
    lambda s, d: s,
    lambda s, d: s.coalesce(),
    lambda s, d: s.to_dense(),
    lambda s, d: s.to_dense().to_sparse(),
    lambda s, d: s + s,
    lambda s, d: s * 2.5,
    lambda s, d: s / 2,
    lambda s, d: s.clone().add_(s),
    lambda s, d: s.t(),
    lambda s, d: torch.ones(2, 3, device=d) + s,
    lambda s, d: torch.ones(2, 3, device=d).add_(s),
    lambda s, d: torch.sparse.mm(s, torch.arange(6.0, device=d).view(3, 2)),
    lambda s, d: torch.mv(s, torch.ones(3, device=d)),
    lambda s, d: torch.sparse.sum(s),
    lambda s, d: s.index_select(1, torch.tensor([0, 2], device=d)),
    lambda s, d: torch.zeros((2, 3), layout=torch.sparse_coo, device=d),
    lambda s, d: torch.empty((2, 3), layout=torch.sparse_coo, device=d).copy_(s),
    lambda s, d: s.clone().zero_(),
    lambda s, d: s.to(torch.float64),
], ids=["create", "coalesce", "to_dense", "to_sparse", "add", "mul", "div", "add_", "t",
        "dense_add", "dense_add_", "sparse_mm", "mv", "sum", "index_select", "zeros", "copy_",
        "zero_", "to_double"])
def test_sparse_coo_ops_equal_cpu(fn):
    # Every sparse tensor raised "returns a torch.sparse_coo tensor; the neuron device
    # supports only strided tensors" (test_type_promotion's test_sparse_*).
    expected = fn(_sparse("cpu"), "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        actual = fn(_sparse(DEV), DEV)
    _same(actual, expected)


def test_sparse_gradients_equal_cpu():
    grads = []
    for device in ("cpu", DEV):
        s = _sparse(device).coalesce().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.sparse.mm(s, torch.ones(3, 2, device=device)).sum().backward()
        grads.append(s.grad)
    _same(grads[1], grads[0])


def test_sparse_ops_are_a_visible_counted_fallback(monkeypatch):
    monkeypatch.setattr(cpu_fallback, "_warned", set())
    s = _sparse(DEV)
    before = torchneuron.fallback_ops().get("aten.mul.Tensor", 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s * 2
    assert torchneuron.fallback_ops().get("aten.mul.Tensor", 0) == before + 1
    assert any("sparse tensors are stored on the neuron device but computed on CPU"
               in str(w.message) for w in caught)
    monkeypatch.setenv("TORCHNEURON_STRICT", "1")
    with pytest.raises(NotImplementedError, match="sparse"):
        s * 2


def test_invariant_checks_refuse_as_on_cpu():
    # PyTorch's tests turn sparse invariant checks on; they ran a DispatchStub kernel that
    # only CPU and CUDA have ("DispatchStub: missing kernel for neuron").
    messages = []
    with torch.sparse.check_sparse_tensor_invariants():
        for device in ("cpu", DEV):
            indices = torch.tensor([[0, 1], [1, 5]], device=device)
            values = torch.tensor([3.0, 4.0], device=device)
            with pytest.raises(RuntimeError) as caught:
                torch.sparse_coo_tensor(indices, values, (2, 2))
            messages.append(str(caught.value))
            good = torch.sparse_coo_tensor(indices, values, (2, 6))
            assert good.device.type == device
            dense = torch.tensor([[0, 1.0], [2, 0]], device=device).to_sparse().to_dense()
            assert dense.cpu().tolist() == [[0, 1.0], [2, 0]]
    assert messages[1] == messages[0]


@pytest.mark.parametrize("layout", ["csr", "csc", "bsr", "bsc"])
def test_compressed_layouts_are_refused_clearly(layout):
    # PyTorch's device-generic .to() builds a compressed tensor with neuron members; each op
    # on it raised a dispatcher error naming a "SparseCsrneuron" backend, or a RuntimeError
    blocked = layout in ("bsr", "bsc")  # block layouts take a block size
    cpu = getattr(torch.eye(4), f"to_sparse_{layout}")(*([(2, 2)] if blocked else []))
    moved = cpu.to(DEV)
    for use in (lambda: moved * 2, lambda: moved.to_dense(), lambda: moved.values(),
                lambda: torch.mm(moved, torch.ones(4, 4, device=DEV)), lambda: str(moved)):
        with pytest.raises(NotImplementedError, match=f"sparse_{layout} tensor; the neuron "
                           "device supports strided and sparse COO tensors only"):
            use()
