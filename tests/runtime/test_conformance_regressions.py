"""Runtime-level conformance regressions found by the OpInfo sweep (tests/conformance): each
compares the neuron device with CPU PyTorch on the sample that failed."""

from __future__ import annotations

import warnings

import pytest
import torch

import torchneuron  # noqa: F401  (registers the neuron device)


@pytest.fixture
def strict(monkeypatch):
    """No silent CPU fallback: an op that would run on CPU raises instead."""
    monkeypatch.setenv("TORCHNEURON_STRICT", "1")


def _same(neuron_result: torch.Tensor, cpu_result: torch.Tensor) -> None:
    assert neuron_result.device.type == "neuron"
    assert neuron_result.stride() == cpu_result.stride()
    torch.testing.assert_close(neuron_result.cpu(), cpu_result)


_NCHW = torch.randn(2, 3, 2, 3)


@pytest.mark.parametrize(
    "src",
    [_NCHW, _NCHW.contiguous(memory_format=torch.channels_last), _NCHW.transpose(1, 3)],
    ids=["contiguous", "channels_last", "transposed"],
)
@pytest.mark.parametrize(
    "kwargs",
    [
        {"dtype": torch.float64, "memory_format": torch.channels_last},
        {"dtype": torch.float16},
        {"dtype": torch.int32, "memory_format": torch.contiguous_format},
    ],
    ids=["channels_last", "preserve", "contiguous"],
)
def test_to_copy_memory_format(strict, src: torch.Tensor, kwargs: dict) -> None:
    expected = src.to(**kwargs)
    _same(src.to("neuron").to(**kwargs), expected)  # neuron -> neuron
    _same(src.to("neuron", **kwargs), expected)  # cpu -> neuron
    back = src.to("neuron").to("cpu", **kwargs)  # neuron -> cpu
    assert back.stride() == expected.stride()
    torch.testing.assert_close(back, expected)


def test_to_copy_channels_last_needs_rank_4() -> None:
    with pytest.raises(RuntimeError, match="rank 4"):
        torch.randn(3, 4, device="neuron").to(torch.float64, memory_format=torch.channels_last)


@pytest.mark.parametrize(
    "fn",
    [
        lambda t, out: torch.linalg.vector_norm(t, ord=6, out=out),
        lambda t, out: torch.norm(t, p="fro", out=out),
        lambda t, out: torch.norm(t, p=float("inf"), out=out),
    ],
    ids=["vector_norm_ord6", "fro", "inf"],
)
def test_norm_out_static_ord(strict, fn) -> None:
    # out= runs the functional lowering, which needs `ord` as a Python value.
    x = torch.randn(3, 4)
    out = torch.empty(0, device="neuron")
    result = fn(x.to("neuron"), out)
    assert result is out
    torch.testing.assert_close(out.cpu(), fn(x, torch.empty(0)))


@pytest.mark.parametrize("training", [False, True])
def test_native_batch_norm_legit_matches_cpu(strict, training: bool) -> None:
    # In evaluation mode CPU returns empty save_mean/save_invstd (its meta kernel says (C,)).
    aten = torch.ops.aten
    x, w, b = torch.randn(3, 2, 4), torch.randn(2), torch.randn(2)
    rm, rv = torch.randn(2), torch.rand(2)

    def run(device: str, out: bool):
        stats = rm.to(device), rv.to(device)
        args = (x.to(device), w.to(device), b.to(device), *stats, training, -1.2, 1e-5)
        if out:
            outs = [torch.empty(0, device=device) for _ in range(3)]
            result = aten._native_batch_norm_legit.out(
                *args, out=outs[0], save_mean=outs[1], save_invstd=outs[2])
            assert all(r is o for r, o in zip(result, outs))
        else:
            result = aten._native_batch_norm_legit(*args)
        return [t.cpu() for t in (*result, *stats)]

    for out in (False, True):
        for got, expected in zip(run("neuron", out), run("cpu", out)):
            torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_mode_out(strict, dtype: torch.dtype) -> None:
    # mode.values' composite kernel refuses non-CPU/CUDA devices; the runtime runs it.
    x = torch.randint(0, 3, (5, 5, 5)).to(dtype)
    values = torch.empty(0, dtype=dtype, device="neuron")
    indices = torch.empty(0, dtype=torch.long, device="neuron")
    result = torch.mode(x.to("neuron"), 1, out=(values, indices))
    assert result[0] is values and result[1] is indices
    expected = torch.mode(x, 1)
    torch.testing.assert_close(values.cpu(), expected.values)
    torch.testing.assert_close(indices.cpu(), expected.indices)


def test_gather_empty_index(strict) -> None:
    x, index = torch.randn(5), torch.empty(2, 0, dtype=torch.long)
    result = torch.gather(x.to("neuron"), 0, index.to("neuron"))
    assert result.shape == torch.gather(x, 0, index).shape == (2, 0)


def test_masked_scatter_broadcasts_self_and_mask(strict) -> None:
    x, mask, source = torch.randn(5), torch.rand(5, 5) > 0.5, torch.randn(5, 5)
    xc, sc = x.clone().requires_grad_(), source.clone().requires_grad_()
    xn, sn = x.to("neuron").requires_grad_(), source.to("neuron").requires_grad_()
    expected = torch.masked_scatter(xc, mask, sc)
    result = torch.masked_scatter(xn, mask.to("neuron"), sn)
    torch.testing.assert_close(result.cpu(), expected)
    expected.sum().backward()
    result.sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), xc.grad)
    torch.testing.assert_close(sn.grad.cpu(), sc.grad)
    # In place, self cannot grow: CPU raises RuntimeError (not JAX's ValueError).
    with pytest.raises(RuntimeError):
        x.to("neuron").masked_scatter_(mask.to("neuron"), source.to("neuron"))
    with pytest.raises(RuntimeError, match="boolean masks"):
        torch.masked_scatter(x.to("neuron"), mask.to(torch.uint8).to("neuron"), source.to("neuron"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_frexp(strict, dtype: torch.dtype) -> None:
    # Subnormals included: jnp.frexp (XLA CPU) flushes them, CPU decomposes them exactly.
    values = [0.0, -0.0, 1.0, -3.5, float("inf"), -float("inf"), float("nan"), 1e-40, 1e-310, 6e-8]
    x = torch.cat([torch.tensor(values, dtype=torch.float64), torch.randn(20) * 1e3]).to(dtype)
    mantissa, exponent = torch.frexp(x.to("neuron"))
    expected = torch.frexp(x)
    torch.testing.assert_close(mantissa.cpu(), expected.mantissa, equal_nan=True)
    torch.testing.assert_close(exponent.cpu(), expected.exponent)
    outs = (torch.empty(0, dtype=dtype, device="neuron"),
            torch.empty(0, dtype=torch.int32, device="neuron"))
    assert torch.frexp(x.to("neuron"), out=outs)[0] is outs[0]
    torch.testing.assert_close(outs[0].cpu(), expected.mantissa, equal_nan=True)
    torch.testing.assert_close(outs[1].cpu(), expected.exponent)


def test_frexp_grad(strict) -> None:
    x = torch.randn(5, 5) * 100
    xc, xn = x.clone().requires_grad_(), x.to("neuron").requires_grad_()
    torch.frexp(xc).mantissa.sum().backward()
    torch.frexp(xn).mantissa.sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), xc.grad)


@pytest.mark.parametrize("shape", [(5, 5), (3, 4, 5), (7,), ()])
def test_nonzero_layout(strict, shape: tuple) -> None:
    # CPU returns nonzero's (n, ndim) result with strides (1, n); argwhere hands it on.
    x = torch.randn(shape) > 0
    for fn in (torch.nonzero, torch.argwhere):
        expected, result = fn(x), fn(x.to("neuron"))
        assert result.stride() == expected.stride()
        torch.testing.assert_close(result.cpu(), expected)
    out = torch.empty(0, dtype=torch.long, device="neuron")
    assert torch.nonzero(x.to("neuron"), out=out) is out
    torch.testing.assert_close(out.cpu(), torch.nonzero(x))


def test_masked_select_out(strict) -> None:
    x, mask = torch.randn(6), torch.rand(6) > 0.5
    out = torch.empty(0, device="neuron")
    torch.masked_select(x.to("neuron"), mask.to("neuron"), out=out)
    torch.testing.assert_close(out.cpu(), torch.masked_select(x, mask))


def _raises_like_cpu(fn) -> None:
    """fn(device) raises on neuron exactly when, and with the type that, it raises on CPU."""
    errors = []
    for device in ("cpu", "neuron"):
        try:
            fn(device)
            errors.append(None)
        except Exception as err:  # noqa: BLE001 - the type is what is compared
            errors.append(type(err))
    assert errors[1] is errors[0], f"CPU raised {errors[0]}, neuron {errors[1]}"


_F = torch.nn.functional


@pytest.mark.parametrize(
    "fn",
    [
        lambda d: _F.conv1d(torch.randn(1, 1, 4, device=d), torch.randn(1, 1, 2, device=d),
                            dilation=(-1,)),
        lambda d: _F.embedding(torch.ones(2, 2, dtype=torch.long, device=d),
                               torch.tensor(1.0, device=d)),
        lambda d: torch.narrow_copy(torch.randn(10, 5, 20, device=d), 3, 0, 0),
        lambda d: torch.amax(torch.randn(5, 0, 5, device=d), dim=1),
        lambda d: torch.bucketize(torch.randn(5, 5, 5, device=d), torch.randn(5, 5, device=d)),
    ],
    ids=["conv_dilation", "embedding_0d_weight", "narrow_copy_dim", "amax_empty_dim",
         "bucketize_2d_boundaries"],
)
def test_error_types_match_cpu(fn) -> None:
    _raises_like_cpu(fn)


def test_narrow_copy(strict) -> None:
    x = torch.randn(4, 5)
    xc, xn = x.clone().requires_grad_(), x.to("neuron").requires_grad_()
    expected, result = torch.narrow_copy(xc, 1, 1, 2), torch.narrow_copy(xn, 1, 1, 2)
    torch.testing.assert_close(result.cpu(), expected)
    expected.sum().backward()
    result.sum().backward()
    torch.testing.assert_close(xn.grad.cpu(), xc.grad)


_idx = [0, 1, 2]


@pytest.mark.parametrize(
    "fn",
    [
        # out= with internal overlap
        lambda d: torch.gather(torch.arange(6.0, device=d), 0, torch.tensor(_idx, device=d),
                               out=torch.empty(1, device=d).expand(3)),
        lambda d: torch.arange(6.0, device=d)[:1].expand(3).add_(1),
        # out= the input itself: refused by gather and masked_select, fine for add
        lambda d: (lambda a: torch.gather(a, 0, torch.tensor(_idx, device=d), out=a))(
            torch.arange(6.0, device=d)),
        lambda d: (lambda a: torch.masked_select(a, a > 2, out=a))(torch.arange(6.0, device=d)),
        lambda d: (lambda a: torch.add(a, a, out=a))(torch.arange(6.0, device=d)),
        # partial overlap of out= and an input
        lambda d: (lambda a: torch.add(a[:3], 1, out=a[1:4]))(torch.arange(6.0, device=d)),
        lambda d: (lambda a: a[:4].view(2, 2).add_(a[:4].view(2, 2).t()))(
            torch.arange(6.0, device=d)),
        # in place, self read and written: fine
        lambda d: (lambda a: a.add_(a))(torch.arange(6.0, device=d)),
    ],
)
def test_overlapping_writes_raise_like_cpu(fn) -> None:
    _raises_like_cpu(fn)


def test_add_out_self_matches_cpu() -> None:
    a, b = torch.arange(6.0), torch.arange(6.0, device="neuron")
    torch.add(a, a, out=a)
    torch.add(b, b, out=b)
    torch.testing.assert_close(b.cpu(), a)


def test_compressed_sparse_results_raise_clearly(monkeypatch) -> None:
    # sparse COO tensors live on the device (tests/runtime/test_sparse.py); CSR does not
    monkeypatch.delenv("TORCHNEURON_STRICT", raising=False)
    with pytest.raises(NotImplementedError, match="sparse_csr"):
        torch.randn(5, 5, device="neuron").to_sparse_csr()


def test_non_dense_results_keep_cpu_layout():
    # lstsq's solution is a narrowed column-major buffer on CPU (non-dense strides); the
    # neuron result has the same sizes, strides and values (it was re-laid out densely).
    a, b = torch.randn(2, 3, dtype=torch.float64), torch.randn(2, 3, dtype=torch.float64)
    expected = torch.linalg.lstsq(a, b, driver="gels").solution
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = torch.linalg.lstsq(a.to("neuron"), b.to("neuron"), driver="gels").solution
    assert got.stride() == expected.stride()
    torch.testing.assert_close(got.cpu(), expected)
    torch.testing.assert_close((got * 2).cpu(), expected * 2)


def test_error_for_more_than_64_dims_keeps_pytorchs_type():
    # 65 dims: PyTorch's meta kernel of the reduction and CPU's kernel both raise RuntimeError
    # over the 64-dim limit, worded apart; the device raises CPU's, of the same type.
    with pytest.raises(RuntimeError) as on_cpu:
        torch.amax(torch.zeros([1] * 65), dim=-1)
    x = torch.zeros([1] * 65, device="neuron")
    with pytest.raises(RuntimeError) as on_device:
        torch.amax(x, dim=-1)
    assert str(on_device.value) == str(on_cpu.value)
