"""Reduction, scan and sort lowerings (lowerings/reduction.py) against CPU PyTorch.

Every test runs with TORCHNEURON_STRICT=1 (a CPU fallback raises) and checks that the named
ATen overloads ran natively. Integer results and indices must match exactly.
"""

from __future__ import annotations

import math

import pytest
import torch
from lowering_checks import assert_native

DEV = "neuron"
NAN = math.nan
INF = math.inf


pytestmark = pytest.mark.usefixtures("strict")  # tests/lowerings/conftest.py


def _data(dtype, shape=(3, 4, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-4, 5, shape, generator=g).to(dtype)


def _assert_same(dev, cpu):
    if isinstance(cpu, tuple | list):
        assert len(dev) == len(cpu)
        for d, c in zip(dev, cpu, strict=True):
            _assert_same(d, c)
        return
    assert dev.device.type == DEV
    assert dev.dtype == cpu.dtype, (dev.dtype, cpu.dtype)
    if cpu.dtype.is_floating_point:
        torch.testing.assert_close(dev.cpu(), cpu, equal_nan=True, atol=1e-5, rtol=1e-5)
    else:
        torch.testing.assert_close(dev.cpu(), cpu, atol=0, rtol=0)


def check(fn, *inputs, native=(), grad=False):
    """fn on CPU and on neuron with the same inputs; outputs (and input grads) must agree."""
    cpu_in = [t.clone().requires_grad_(grad) if isinstance(t, torch.Tensor) else t for t in inputs]
    dev_in = [
        t.detach().to(DEV).requires_grad_(grad) if isinstance(t, torch.Tensor) else t
        for t in cpu_in
    ]
    expected = fn(*cpu_in)
    got = fn(*dev_in)
    _assert_same(got, expected)
    if grad:
        outs_c = expected if isinstance(expected, tuple) else (expected,)
        outs_d = got if isinstance(got, tuple) else (got,)
        pairs = [(c, d) for c, d in zip(outs_c, outs_d, strict=True) if c.requires_grad]
        g = torch.Generator().manual_seed(1)
        seeds = [torch.randn(c.shape, generator=g, dtype=c.dtype) for c, _ in pairs]
        torch.autograd.backward([c for c, _ in pairs], seeds)
        torch.autograd.backward([d for _, d in pairs], [s.to(DEV) for s in seeds])
        for c, d in zip(cpu_in, dev_in, strict=True):
            if isinstance(c, torch.Tensor):
                torch.testing.assert_close(d.grad.cpu(), c.grad, atol=1e-5, rtol=1e-4)
    assert_native(*native)
    return got


ALL = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool]
FLOATS = [torch.float32, torch.float64]


# ---- sums, means, products --------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL)
def test_sum(dtype):
    x = _data(dtype)
    check(lambda t: t.sum(), x, native=["aten.sum.default"])
    check(lambda t: t.sum(1), x, native=["aten.sum.dim_IntList"])
    check(lambda t: t.sum((0, -1), keepdim=True), x)
    check(lambda t: t.sum([]), x)
    check(lambda t: t.sum(1, dtype=torch.float64), x)


def test_sum_half_and_empty():
    # three half values sum exactly in float32, so CPU's result does not depend on its order
    check(lambda t: t.sum(0), _data(torch.float16))
    check(lambda t: (t.sum(), t.sum(0), t.sum(1)), torch.empty(0, 3))
    check(lambda t: t.sum(0), torch.tensor(2.5))


@pytest.mark.parametrize("dtype", FLOATS)
def test_mean(dtype):
    x = _data(dtype)
    check(lambda t: t.mean(), x, native=["aten.mean.default"])
    check(lambda t: t.mean((-1, 0), keepdim=True), x, native=["aten.mean.dim"])
    check(lambda t: t.mean(1, dtype=torch.float64), x)
    check(lambda t: t.mean(0), torch.empty(0, 2))  # nan, as on CPU


def test_mean_of_integers_raises_like_cpu():
    with pytest.raises(RuntimeError, match="mean"):
        _data(torch.int64).to(DEV).mean()


@pytest.mark.parametrize("dtype", ALL)
def test_prod(dtype):
    x = _data(dtype, (2, 3, 4))
    check(lambda t: t.prod(), x, native=["aten.prod.default"])
    check(lambda t: t.prod(-1, keepdim=True), x, native=["aten.prod.dim_int"])
    check(lambda t: t.prod(1, dtype=torch.float64), x)


def test_nansum_nanmean_count_nonzero():
    x = torch.tensor([[1.0, NAN, 2.0, NAN], [1.0, 4.0, 2.0, 3.0], [NAN] * 4])
    check(lambda t: (t.nansum(), t.nansum(1), t.nanmean(1)), x, native=["aten.nansum.default"])
    xi = _data(torch.int64)
    check(lambda t: (torch.count_nonzero(t), torch.count_nonzero(t, 1),
                     torch.count_nonzero(t, (0, 2))), xi,
          native=["aten.count_nonzero.default", "aten.count_nonzero.dim_IntList"])


# ---- variance ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_var_std(dtype):
    x = _data(dtype)
    check(lambda t: (t.var(), t.std()), x,
          native=["aten.var.correction", "aten.std.correction"])
    check(lambda t: (t.var(1), t.std(1, unbiased=False)), x)
    check(lambda t: (t.var((0, 2), correction=2, keepdim=True),
                     t.std(-1, correction=0, keepdim=True)), x)
    check(lambda t: torch.var_mean(t, 1), x, native=["aten.var_mean.correction"])
    check(lambda t: torch.std_mean(t, (0, 1), keepdim=True), x,
          native=["aten.std_mean.correction"])
    # Fewer elements than the correction: inf/nan as on CPU.
    check(lambda t: (t.var(0), t.std(0, correction=3)), _data(dtype, (1, 3)))


# ---- max / min / argmax ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL)
def test_amax_amin_max_min(dtype):
    x = _data(dtype)
    check(lambda t: (t.amax(), t.amin(1), t.amax((0, 2), keepdim=True)), x,
          native=["aten.amax.default", "aten.amin.default"])
    check(lambda t: (t.max(), t.min()), x, native=["aten.max.default", "aten.min.default"])
    check(lambda t: (t.max(1), t.min(-1, keepdim=True)), x,
          native=["aten.max.dim", "aten.min.dim"])
    check(lambda t: torch.aminmax(t, dim=0), x, native=["aten.aminmax.default"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_argmax_argmin(dtype):
    x = _data(dtype)
    check(lambda t: (t.argmax(), t.argmin(), t.argmax(keepdim=True)), x,
          native=["aten.argmax.default", "aten.argmin.default"])
    check(lambda t: (t.argmax(1), t.argmin(-1, keepdim=True)), x)


def test_argmax_of_bool_raises_like_cpu():
    with pytest.raises(RuntimeError, match="bool"):
        _data(torch.bool).to(DEV).argmax()


def test_max_min_nan_and_ties():
    x = torch.tensor([[1.0, NAN, 3.0, NAN], [3.0, 1.0, 3.0, 0.0], [0.0, 0.0, -1.0, -1.0]])
    check(lambda t: (t.max(1), t.min(1), t.amax(1), t.amin(0), t.max(), t.min()), x)
    check(lambda t: (t.argmax(1), t.argmin(1), t.argmax(), t.argmin()), x)
    xi = torch.tensor([[2, 5, 5, 1], [1, 1, 0, 0]])
    check(lambda t: (t.max(1), t.min(1), t.argmax(1), t.argmin(0)), xi)


def test_max_min_zero_dim():
    x = torch.tensor(3.5)
    check(lambda t: (t.max(0), t.min(-1, keepdim=True), t.argmax(0), t.amax(0)), x)


def test_empty_max_errors_like_cpu():
    with pytest.raises(RuntimeError, match="Expected reduction dim"):
        torch.empty(0).max()
    with pytest.raises(RuntimeError, match="Expected reduction dim"):
        torch.empty(0, device=DEV).max()
    with pytest.raises(RuntimeError, match="Expected reduction dim"):
        torch.empty(0, device=DEV).min()
    with pytest.raises(IndexError, match="non-zero size"):
        torch.empty(0, 3, device=DEV).max(0)
    with pytest.raises(RuntimeError):
        torch.empty(0, device=DEV).amax()
    # Reducing the non-empty dimension of an empty tensor is fine.
    check(lambda t: t.max(1), torch.empty(0, 3))


@pytest.mark.parametrize("op", [
    lambda t: t.sum(3), lambda t: t.mean(-4), lambda t: t.max(3), lambda t: t.argmax(5),
    lambda t: t.cumsum(3), lambda t: t.sort(3), lambda t: t.amax(7), lambda t: t.var(3),
])
def test_bad_dim_raises_index_error(op):
    x = _data(torch.float32)
    with pytest.raises(IndexError, match="Dimension out of range"):
        op(x)
    with pytest.raises(IndexError, match="Dimension out of range"):
        op(x.to(DEV))


# ---- all / any --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.float32, torch.uint8])
def test_all_any(dtype):
    x = _data(dtype) if dtype != torch.uint8 else _data(torch.int64).abs().to(torch.uint8)
    check(lambda t: (t.all(), t.any()), x, native=["aten.all.default", "aten.any.default"])
    check(lambda t: (t.all(1), t.any(-1, keepdim=True)), x,
          native=["aten.all.dim", "aten.any.dim"])
    check(lambda t: (t.all((0, 2)), t.any((0, 1), keepdim=True)), x,
          native=["aten.all.dims", "aten.any.dims"])
    check(lambda t: (t.all(), t.any(), t.all(0)), torch.empty(0, 2, dtype=dtype))


# ---- logsumexp, norms -------------------------------------------------------------------


def test_logsumexp():
    x = _data(torch.float32)
    check(lambda t: (t.logsumexp(1), t.logsumexp((0, 2), keepdim=True)), x,
          native=["aten.logsumexp.default"])
    check(lambda t: t.logsumexp(1), _data(torch.int64))
    special = torch.tensor([[-INF, -INF], [INF, 1.0], [INF, -INF], [NAN, 0.0]])
    check(lambda t: t.logsumexp(1), special)
    check(lambda t: t.logsumexp(0), torch.empty(0, 3))


@pytest.mark.parametrize("ord", [2, 1, INF, -INF, 0, 3.5, -1])
def test_vector_norm(ord):
    x = _data(torch.float32)
    x[0, 0, :2] = 0
    check(lambda t: torch.linalg.vector_norm(t, ord), x,
          native=["aten.linalg_vector_norm.default"])
    check(lambda t: torch.linalg.vector_norm(t, ord, dim=(0, 2), keepdim=True), x)
    check(lambda t: torch.linalg.vector_norm(t, ord, dim=1, dtype=torch.float64), x)


def test_norm_overloads():
    x = _data(torch.float64)
    check(lambda t: (t.norm(), t.norm(1), t.norm(p=3, dim=1), t.norm(dim=(0, 2), keepdim=True),
                     torch.norm(t.float(), dim=1, dtype=torch.float64)), x)
    assert_native("aten.linalg_vector_norm.default")


# ---- scans ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ALL)
def test_cumsum_cumprod(dtype):
    x = _data(dtype, (3, 4))
    check(lambda t: (t.cumsum(1), t.cumsum(0), t.cumprod(-1)), x,
          native=["aten.cumsum.default", "aten.cumprod.default"])
    check(lambda t: (t.cumsum(1, dtype=torch.float64), t.cumprod(0, dtype=torch.float32)), x)


def test_cumulative_zero_dim_and_empty():
    check(lambda t: (t.cumsum(0), t.cumprod(-1), t.cummax(0), t.logcumsumexp(0)),
          torch.tensor(1.5))
    check(lambda t: (t.cumsum(0), t.cummax(0), t.logcumsumexp(0)), torch.empty(0, 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_cummax_cummin(dtype):
    x = _data(dtype, (3, 6))
    check(lambda t: (t.cummax(1), t.cummin(0)), x,
          native=["aten.cummax.default", "aten.cummin.default"])


def test_cummax_cummin_nan_and_ties():
    x = torch.tensor([1.0, 3.0, 3.0, NAN, 2.0, NAN, 5.0, 0.0])
    check(lambda t: (t.cummax(0), t.cummin(0)), x)
    x = torch.tensor([[2, 2, 1, 2, 3, 3], [0, 0, 0, -1, -1, 5]])
    check(lambda t: (t.cummax(1), t.cummin(1)), x)


def test_logcumsumexp():
    x = _data(torch.float32)
    check(lambda t: (t.logcumsumexp(1), t.logcumsumexp(-1)), x,
          native=["aten.logcumsumexp.default"])
    check(lambda t: t.logcumsumexp(0), torch.tensor([-INF, 1.0, -INF, INF, 2.0]))


# ---- sort, topk, kthvalue, median, mode -------------------------------------------------


@pytest.mark.parametrize("dtype", ALL)
def test_sort_argsort(dtype):
    x = _data(dtype, (3, 8))
    check(lambda t: (t.sort(stable=True), t.sort(dim=0, descending=True, stable=True)), x,
          native=["aten.sort.stable"])
    check(lambda t: (t.argsort(dim=1, stable=True), t.argsort(dim=0, descending=True, stable=True)), x)


def test_sort_nan_and_signed_zero():
    x = torch.tensor([1.0, NAN, 0.0, -0.0, 1.0, NAN, -INF, INF])
    check(lambda t: (t.sort(stable=True), t.sort(descending=True, stable=True)), x)
    check(lambda t: t.sort(), torch.randperm(10).float())
    assert_native("aten.sort.default")


@pytest.mark.parametrize("largest", [True, False])
def test_topk(largest):
    g = torch.Generator().manual_seed(3)
    x = torch.randperm(60, generator=g).float().reshape(3, 4, 5)  # no ties: indices exact
    check(lambda t: (t.topk(2, largest=largest), t.topk(3, 1, largest=largest)), x,
          native=["aten.topk.default"])
    check(lambda t: t.topk(0, 1, largest=largest), x)
    check(lambda t: t.topk(2, largest=largest), torch.tensor([1.0, NAN, 3.0, -1.0]))


def test_topk_ties_pick_tied_positions():
    x = torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0])
    d = x.to(DEV)
    values, indices = d.topk(2)
    torch.testing.assert_close(values.cpu(), torch.tensor([3.0, 3.0]))
    assert set(indices.cpu().tolist()) <= {1, 2, 4}
    assert len(set(indices.cpu().tolist())) == 2
    with pytest.raises(RuntimeError):
        d.topk(6)


def test_kthvalue_median_mode():
    g = torch.Generator().manual_seed(4)
    x = torch.randperm(60, generator=g).double().reshape(3, 4, 5)
    check(lambda t: (t.kthvalue(2), t.kthvalue(3, 1, keepdim=True)), x,
          native=["aten.kthvalue.default"])
    check(lambda t: (t.median(), t.median(1), t.median(-1, keepdim=True)), x,
          native=["aten.median.default", "aten.median.dim"])
    check(lambda t: (t.nanmedian(), t.nanmedian(0)), x,
          native=["aten.nanmedian.default", "aten.nanmedian.dim"])
    with_nan = torch.tensor([[1.0, NAN, 2.0, NAN], [1.0, 4.0, 2.0, 3.0], [NAN, 1.0, NAN, NAN]])
    check(lambda t: (t.median(1), t.median(), t.nanmedian(1), t.nanmedian()), with_nan)
    check(lambda t: t.median(), torch.empty(0))
    modes = torch.tensor([[3, 1, 3, 1, 2], [5, 5, 5, 0, 0], [4, 3, 2, 1, 0]])
    check(lambda t: (t.mode(), t.mode(1, keepdim=True), t.mode(0)), modes,
          native=["aten.mode.default"])
    check(lambda t: t.mode(0), torch.tensor([1.5, -2.0, 1.5, 7.0]))


# ---- layouts, in-place, out= ------------------------------------------------------------


def test_non_contiguous_inputs():
    x = _data(torch.float32, (4, 6, 5))
    check(lambda t: t.transpose(0, 2).sum(1), x)
    check(lambda t: t[:, ::2].max(1), x)
    check(lambda t: t.permute(2, 0, 1).cumsum(2), x)
    check(lambda t: t[1:, 1:4].sort(dim=1, stable=True), x)
    check(lambda t: t.transpose(1, 2)[..., 1].var(0), x)
    check(lambda t: t.transpose(0, 1).argmax(1), x)


def test_inplace_and_out_variants():
    x = _data(torch.float32, (3, 4))

    def cumsum_inplace(t):
        t = t.clone()
        t.t().cumsum_(1)
        return t

    check(cumsum_inplace, x)

    def outs(t):
        s = torch.empty(0, device=t.device)
        v = torch.empty(0, device=t.device)
        i = torch.empty(0, dtype=torch.long, device=t.device)
        sv = torch.empty(0, device=t.device)
        si = torch.empty(0, dtype=torch.long, device=t.device)
        torch.sum(t, 1, out=s)
        torch.max(t, 0, out=(v, i))
        torch.sort(t, 1, descending=True, out=(sv, si))
        return s, v, i, sv, si

    check(outs, x)


# ---- gradients --------------------------------------------------------------------------


@pytest.mark.parametrize("name,fn", [
    ("sum", lambda t: t.sum(1)),
    ("mean", lambda t: t.mean((0, 2))),
    ("prod", lambda t: t.prod(1)),
    ("var", lambda t: t.var(1)),
    ("std_mean", lambda t: torch.std_mean(t, 1)),
    ("amax", lambda t: t.amax(1)),
    ("max_all", lambda t: t.max()),
    ("max_dim", lambda t: t.max(1)[0]),
    ("min_dim", lambda t: t.min(-1, keepdim=True)[0]),
    ("logsumexp", lambda t: t.logsumexp(1)),
    ("norm2", lambda t: torch.linalg.vector_norm(t, dim=1)),
    ("norm_inf", lambda t: torch.linalg.vector_norm(t, INF, dim=0)),
    ("cumsum", lambda t: t.cumsum(1)),
    ("cumprod", lambda t: t.cumprod(2)),
    ("cummax", lambda t: t.cummax(1)[0]),
    ("logcumsumexp", lambda t: t.logcumsumexp(1)),
    ("sort", lambda t: t.sort(1)[0]),
    ("topk", lambda t: t.topk(2, 1)[0]),
    ("kthvalue", lambda t: t.kthvalue(2, 0)[0]),
    ("median", lambda t: t.median(1)[0]),
    ("nansum", lambda t: t.nansum(1)),
])
def test_gradients(name, fn):
    check(fn, _data(torch.float32), grad=True)


# ---- searchsorted, bucketize, bincount, unique ------------------------------------------


def test_searchsorted_bucketize():
    boundaries = torch.tensor([-1.0, 0.0, 0.0, 0.5, 2.0])
    x = _data(torch.float32, (3, 4)).round(decimals=1)
    check(lambda b, t: (torch.searchsorted(b, t), torch.searchsorted(b, t, right=True),
                        torch.searchsorted(b, t, side="right", out_int32=True)),
          boundaries, x, native=["aten.searchsorted.Tensor"])
    check(lambda b: torch.searchsorted(b, 0.0), boundaries, native=["aten.searchsorted.Scalar"])
    rows = torch.sort(_data(torch.float64, (3, 6)), dim=1).values
    check(lambda b, t: torch.searchsorted(b, t), rows, _data(torch.float64, (3, 4), seed=1))
    check(lambda b, t, s: torch.searchsorted(b, t, sorter=s),
          torch.tensor([3.0, 1.0, 2.0]), x, torch.tensor([1, 2, 0]))
    check(lambda t, b: (torch.bucketize(t, b), torch.bucketize(t, b, right=True)), x, boundaries,
          native=["aten.bucketize.Tensor"])


def test_bincount():
    x = torch.tensor([1, 3, 3, 0, 7, 3])
    check(lambda t: (torch.bincount(t), torch.bincount(t, minlength=10)), x,
          native=["aten.bincount.default"])
    for w in (_data(torch.float32, (6,)), torch.arange(6), _data(torch.float64, (6,))):
        check(lambda t, ww: torch.bincount(t, ww), x, w)
    check(lambda t: torch.bincount(t, minlength=3), torch.tensor([], dtype=torch.long))
    for bad in (torch.tensor([-1, 2]), torch.zeros(2, 2, dtype=torch.long)):
        with pytest.raises(RuntimeError, match="bincount only supports"):
            torch.bincount(bad.to(DEV))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_unique(dtype):
    x = _data(dtype, (3, 4)) if dtype != torch.float32 else _data(dtype, (3, 4)).round()
    check(lambda t: torch.unique(t), x, native=["aten._unique2.default"])
    check(lambda t: torch.unique(t, return_inverse=True, return_counts=True), x)



def test_unique_keeps_each_nan_and_handles_empty_and_scalars():
    # CPU: NaN never equals NaN, so each NaN is its own value (jnp.unique merges them).
    nan = float("nan")
    x = torch.tensor([nan, 1.0, nan, -0.0, 0.0, 1.0])
    values, counts = torch.unique(x.to(DEV), return_counts=True)
    assert values.shape == (4,) and counts.cpu().tolist() == [2, 2, 1, 1]
    assert torch.equal(values[:2].cpu(), torch.tensor([0.0, 1.0])) and values[2:].isnan().all()
    for t in (torch.tensor(3), torch.tensor([]), torch.zeros(0, 3, dtype=torch.int8)):
        check(lambda a: torch.unique(a, return_inverse=True, return_counts=True), t)

def test_histc():
    x = _data(torch.float32, (50,))
    check(lambda t: (torch.histc(t), torch.histc(t, bins=7, min=-1, max=1)), x,
          native=["aten.histc.default"])
    check(lambda t: torch.histc(t, bins=4), torch.tensor([2.0, 2.0, 2.0]))
    check(lambda t: torch.histc(t, bins=5, min=0, max=4), torch.tensor([0.0, 1, 2, 3, 4, 5, -1]))


# ---- equal, unique_consecutive, cummax/cummin out= ----------------------------------------


def test_equal():
    a = torch.tensor([1.0, 2.0, NAN])
    cases = [
        (a[:2], a[:2].clone()),  # equal
        (a, a.clone()),  # NaN != NaN
        (a[:2], a[:1]),  # shapes differ
        (torch.ones(2, 1), torch.ones(2)),
        (torch.ones(2), torch.ones(2, dtype=torch.int64)),  # mixed dtypes compare promoted
        (torch.tensor([0.5]), torch.tensor([0])),
    ]
    for x, y in cases:
        assert torch.equal(x.to(DEV), y.to(DEV)) is torch.equal(x, y)
    assert_native("aten.equal.default")


@pytest.mark.parametrize("dim", [None, 0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_unique_consecutive(dim, dtype):
    x = torch.tensor([[1, 1, 0], [1, 1, 0], [2, 3, 0], [2, 3, 0], [1, 1, 1]]).to(dtype)
    for inverse in (False, True):
        for counts in (False, True):
            check(lambda t, i=inverse, c=counts: torch.ops.aten.unique_consecutive.default(
                t, i, c, dim), x, native=("aten.unique_consecutive.default",))


def test_unique_consecutive_nan_and_scalar():
    op = torch.ops.aten.unique_consecutive.default
    check(lambda t: op(t, True, True), torch.tensor([NAN, NAN, 1.0, 1.0]))
    check(lambda t: op(t, True, True), torch.tensor(3.0),
          native=("aten.unique_consecutive.default",))


@pytest.mark.parametrize("fn", [torch.cummax, torch.cummin])
def test_cummax_cummin_out(fn):
    x = _data(torch.float32)
    x[1, 2, 3] = NAN
    values = torch.empty(0, device=DEV)
    indices = torch.empty(0, dtype=torch.int64, device=DEV)
    got = fn(x.to(DEV), 1, out=(values, indices))
    assert got[0] is values and got[1] is indices
    _assert_same((values, indices), tuple(fn(x, 1)))
    assert_native(f"aten._{fn.__name__}_helper.default")


# ---- segment_reduce ------------------------------------------------------------------------

SEG_DATA = [1.0, 2.0, 3.0, 3.0, 0.0, -1.0, 0.0, 2.0]


@pytest.mark.parametrize("reduce", ["sum", "mean", "max", "min", "prod"])
@pytest.mark.parametrize("initial", [None, 2.0])
def test_segment_reduce(reduce, initial):
    nan_data = torch.tensor(SEG_DATA)
    nan_data[2] = NAN
    cases = [  # (data, lengths, offsets, axis); with ties, zeros, empty segments, NaN
        (torch.tensor(SEG_DATA), torch.tensor([2, 0, 3, 1, 2]), None, 0),
        (torch.tensor(SEG_DATA), None, torch.tensor([0, 2, 2, 5, 6, 8]), 0),
        (nan_data, torch.tensor([2, 0, 3, 1, 2]), None, 0),
        (torch.randn(5, 4, 3), torch.tensor([[1, 3], [0, 4], [2, 2], [4, 0], [1, 3]]), None, 1),
    ]
    for data, lengths, offsets, axis in cases:
        check(lambda d, lengths=lengths, offsets=offsets, axis=axis: torch.segment_reduce(
            d, reduce, lengths=lengths, offsets=offsets, axis=axis, initial=initial)
            if d.device.type == "cpu" else torch.segment_reduce(
            d, reduce, lengths=None if lengths is None else lengths.to(DEV),
            offsets=None if offsets is None else offsets.to(DEV), axis=axis, initial=initial),
            data, grad=not bool(data.isnan().any()),  # (check compares grads without NaN)
            native=("aten.segment_reduce.default",))
    assert_native("aten._segment_reduce_backward.default")
