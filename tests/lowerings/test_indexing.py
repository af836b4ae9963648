"""Indexing lowerings (lowerings/indexing.py) against CPU PyTorch.

Every test runs with TORCHNEURON_STRICT=1 (a CPU fallback raises) and checks that the named
ATen overloads ran natively. Values of every dtype and all indices must match exactly.
"""

from __future__ import annotations

import pytest
import torch
from lowering_checks import assert_native

from torchneuron.runtime import fusion

DEV = "neuron"


pytestmark = pytest.mark.usefixtures("strict")  # tests/lowerings/conftest.py


def _data(dtype, shape=(3, 4, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-50, 50, shape, generator=g).to(dtype)


def L(*values):
    return torch.tensor(values)


def _assert_same(dev, cpu):
    if isinstance(cpu, tuple | list):
        assert len(dev) == len(cpu)
        for d, c in zip(dev, cpu, strict=True):
            _assert_same(d, c)
        return
    assert dev.device.type == DEV
    assert dev.dtype == cpu.dtype, (dev.dtype, cpu.dtype)
    assert dev.shape == cpu.shape, (dev.shape, cpu.shape)
    tol = {"atol": 1e-5, "rtol": 1e-5} if cpu.dtype.is_floating_point else {"atol": 0, "rtol": 0}
    torch.testing.assert_close(dev.cpu(), cpu, equal_nan=True, **tol)


def check(fn, *inputs, native=(), grad=()):
    """fn on CPU and on neuron with the same inputs (cloned, so fn may mutate them); outputs
    and the gradients of the inputs at positions `grad` must agree."""
    cpu_in = [t.clone().requires_grad_(i in grad) if isinstance(t, torch.Tensor) else t
              for i, t in enumerate(inputs)]
    dev_in = [t.detach().to(DEV).requires_grad_(i in grad) if isinstance(t, torch.Tensor) else t
              for i, t in enumerate(inputs)]
    expected = fn(*cpu_in)
    got = fn(*dev_in)
    _assert_same(got, expected)
    if grad:
        g = torch.Generator().manual_seed(1)
        seed = torch.randn(expected.shape, generator=g, dtype=expected.dtype)
        expected.backward(seed)
        got.backward(seed.to(DEV))
        for i in grad:
            torch.testing.assert_close(dev_in[i].grad.cpu(), cpu_in[i].grad, atol=1e-5, rtol=1e-5)
    assert_native(*native)
    return got


def raises_like_cpu(fn, *inputs, match=None, device_type=None):
    """fn raises on CPU and on neuron; the neuron error has the CPU error's type (or
    `device_type` where the runtime's index check cannot choose it, see the report)."""
    with pytest.raises(Exception) as cpu_err:
        fn(*[t.clone() for t in inputs])
    expected = device_type or type(cpu_err.value)
    with pytest.raises(expected, match=match):
        fn(*[t.to(DEV) for t in inputs])
        torch.neuron.synchronize()  # an index out of range raises at the next sync point


DTYPES = [torch.float32, torch.float64, torch.int64, torch.bool]


# ---- advanced indexing -------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_integer(dtype):
    x = _data(dtype)
    check(lambda t, i: t[i], x, L(2, 0, -1, 2), native=["aten.index.Tensor"])
    check(lambda t, i, j: t[i, :, j], x, L(2, 0), L(-1, 3))  # split: advanced dims in front
    check(lambda t, i, j: t[:, i, j], x, L(2, 0), L(-1, 3))  # adjacent: stay in place
    check(lambda t, i, j: t[i, j], x, L([0], [2]), L(1, 3, 0))  # index tensors broadcast
    check(lambda t, i: t[None, i, ..., None], x, L([1, 0], [0, 2]))
    check(lambda t, i: t[..., i], x, L(4))  # 0-d index tensor


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_bool_mask(dtype):
    x = _data(dtype)
    m = _data(torch.bool, seed=5)
    check(lambda t, mm: t[mm], x, m, native=["aten.index.Tensor"])
    check(lambda t, mm: t[mm, 1], x, m[:, :, 0])
    check(lambda t, mm, i: t[mm, i], x, m[:, 0, 0], L(3))


def test_index_bool_mask_inner_dimension():
    # A result of more than one dimension whose size depends on the mask.
    x = _data(torch.float32)
    check(lambda t, mm: t[:, mm], x, L(True, False, True, True))


def test_index_bool_mask_count_changes_between_calls():
    x = torch.arange(5.0)
    for threshold in (2.0, 3.0, 0.0):
        check(lambda t, th=threshold: t[t > th], x)


def test_index_non_contiguous():
    x = _data(torch.float32, (4, 6, 5))
    check(lambda t, i: t.transpose(0, 2)[i], x, L(4, 0))
    check(lambda t, i: t[:, ::2][:, i], x, L(2, 0, -1))


def test_index_errors_like_cpu():
    x = _data(torch.float32)
    raises_like_cpu(lambda t, i: t[i], x, L(1, 3),
                    match="index 3 is out of bounds for dimension 0 with size 3")
    raises_like_cpu(lambda t, i: t[:, i], x, L(-5),
                    match="index -5 is out of bounds for dimension 1 with size 4")
    raises_like_cpu(lambda t, m: t[m], x, torch.ones(2, 4, dtype=torch.bool),
                    match="shape of the mask")
    # PyTorch's meta kernel raises RuntimeError here; the runtime re-asks CPU for its type.
    raises_like_cpu(lambda t, i: t[i], x, L(0.0, 1.0),
                    match="tensors used as indices must be long, int, byte or bool")


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_put(dtype):
    x = _data(dtype)
    v = _data(dtype, (2, 4, 5), seed=1)
    check(lambda t, i, s: t.index_put((i,), s), x, L(2, 0), v, native=["aten.index_put.default"])
    check(lambda t, i, j, s: torch.ops.aten.index_put(t, [i, None, j], s[:, :, 0]),
          x, L(2, -3), L(1, 4), v)
    acc = _data(dtype, (4, 4, 5), seed=2)
    check(lambda t, i, s: t.index_put((i,), s, accumulate=True), x, L(2, 0, 2, -1), acc)


@pytest.mark.parametrize("dtype", DTYPES)
def test_setitem(dtype):
    x = _data(dtype)
    m = _data(torch.bool, seed=5)
    value = _data(dtype, (1,), seed=3)

    def set_index(t, i, v):
        t[i] = v
        return t

    check(set_index, x, L(1, -1), value, native=["aten.index_put_.default"])

    def set_mask(t, mm, v):
        t[mm] = v
        return t

    check(set_mask, x, m, value)
    check(set_mask, x, m, _data(dtype, (int(m.sum()),), seed=4))

    def add_mask(t, mm):
        t[mm] += 1
        return t

    if dtype != torch.bool:
        check(add_mask, x, m)

    def set_transposed(t, i):
        t.transpose(0, 1)[i] = 0
        return t

    check(set_transposed, x, L(3, 0))


@pytest.mark.parametrize("dtype", DTYPES + [torch.complex64])
def test_mask_fill_is_one_program_whatever_the_count(dtype, xla_compilations):
    # `x[mask] = v` with one boolean mask and one value is a `where` (registry.eager_form):
    # traced, cached and fused, where host-side nonzero and a scatter compiled once per count
    # of set elements (the upstream test_view_ops spent 360 s so) before.
    value = {torch.bool: True, torch.int64: 7, torch.complex64: complex("nan")}.get(
        dtype, float("nan"))

    def fill(t, mm, inner):
        t[mm] = value
        t[:, inner] = value  # a mask over the inner dimensions, after a full slice
        t.index_put_((mm,), torch.tensor(value, dtype=t.dtype), accumulate=dtype != torch.bool)
        return t

    for seed in range(6):  # a different count of set elements each time
        if seed == 1:
            xla_compilations.clear()  # the first call compiles its transfers and its program
        m = _data(torch.bool, seed=10 + seed)
        inner = _data(torch.bool, (4, 5), seed=20 + seed)
        x = _data(dtype, seed=seed)
        x = x.to(torch.complex64) if dtype.is_complex else x
        expected, got = fill(x.clone(), m, inner), fill(x.to(DEV), m, inner)
        torch.testing.assert_close(got.cpu(), expected, equal_nan=True, rtol=0, atol=0)
    assert xla_compilations == []  # the same program for every count


def test_mask_fill_errors_like_cpu():
    x = _data(torch.float32)
    raises_like_cpu(lambda t, m: t.index_put_((m,), torch.tensor(1.0)), x,
                    torch.ones(2, 4, dtype=torch.bool), match="shape of the mask")
    raises_like_cpu(lambda t, m: t.index_put_((m,), torch.tensor(1.0)), x,
                    torch.ones(3, 1, dtype=torch.bool), match="shape of the mask")


def test_index_put_errors_like_cpu():
    def set_index(t, i):
        t[i] = 1.0
        return t

    raises_like_cpu(set_index, torch.zeros(3), L(1, 3),
                    match="index 3 is out of bounds for dimension 0 with size 3")
    raises_like_cpu(lambda t, i: t.index_put_((i,), torch.ones((), device=t.device),
                                              accumulate=True),
                    torch.zeros(3), L(-4), match="out of bounds")


# ---- gather / scatter ------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather(dtype):
    x = _data(dtype)
    idx = torch.randint(0, 4, (2, 3, 5), generator=torch.Generator().manual_seed(0))
    check(lambda t, i: t.gather(1, i), x, idx, native=["aten.gather.default"])
    check(lambda t, i: t.gather(-1, i), x, idx)
    check(lambda t, i: t.transpose(0, 2).gather(0, i), x, idx.transpose(0, 2)[:, :2, :2])
    check(lambda t, i: t.gather(0, i), torch.tensor(2.0), torch.tensor(0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter(dtype):
    x = _data(dtype, (3, 5))
    src = _data(dtype, (2, 5), seed=1)
    idx = L([0, 1, 2, 0, 0], [2, 0, 0, 1, 2])  # no duplicates along dim 0
    check(lambda t, i, s: t.scatter(0, i, s), x, idx, src, native=["aten.scatter.src"])
    check(lambda t, i: t.scatter(1, i, 1), x, L([0], [2], [4]), native=["aten.scatter.value"])
    if dtype != torch.bool:
        check(lambda t, i, s: t.scatter_add(0, i, s), x, idx, src,
              native=["aten.scatter_add.default"])
        dup = L([0, 1, 2, 0, 0], [0, 1, 2, 0, 0], [2, 0, 0, 1, 2])
        check(lambda t, i, s: t.scatter_add(0, i, s), x, dup, _data(dtype, (3, 5), seed=4))
        check(lambda t, i, s: t.scatter(0, i, s, reduce="add"), x, dup,
              _data(dtype, (3, 5), seed=4))
        check(lambda t, i, s: t.scatter(0, i, s, reduce="multiply"), x, dup,
              _data(dtype, (3, 5), seed=4))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    idx = L(0, 1, 0, 1, 3, 0)
    for dtype in (torch.float32, torch.int64):
        x = _data(dtype, (5,))
        src = _data(dtype, (6,), seed=1)
        check(lambda t, i, s: t.scatter_reduce(0, i, s, reduce, include_self=include_self),
              x, idx, src, native=["aten.scatter_reduce.two"])
    # 2-d, along dim 1, with a smaller index
    x = _data(torch.float64, (3, 4))
    src = _data(torch.float64, (3, 5), seed=2)
    check(lambda t, i, s: t.scatter_reduce(1, i, s, reduce, include_self=include_self),
          x, L([0, 0, 3], [1, 2, 1]), src)


def test_scatter_inplace_and_out():
    def scatter_inplace(t, i, s):
        t.scatter_(1, i, s)
        return t

    check(scatter_inplace, torch.zeros(3, 4), L([0, 1], [2, 3], [1, 0]), torch.ones(3, 2))

    def scatter_transposed(t, i, s):
        t.t().scatter_add_(0, i, s)
        return t

    check(scatter_transposed, torch.zeros(4, 3), L([0, 1, 0], [2, 2, 2]), torch.ones(2, 3))

    def gather_out(t, i):
        out = torch.empty(0, device=t.device)
        torch.gather(t, 1, i, out=out)
        return out

    check(gather_out, torch.randn(3, 4), L([0, 1], [2, 3], [1, 0]))


def test_gather_scatter_errors():
    x = _data(torch.float32, (3, 4))
    for bad in (L([4]), L([-1])):
        raises_like_cpu(lambda t, i: t.gather(1, i), x, bad, match="out of bounds")
        raises_like_cpu(lambda t, i: t.scatter(1, i, 1.0), x, bad)
        raises_like_cpu(lambda t, i, s: t.scatter_add(1, i, s), x, bad, x[:1, :1])
        raises_like_cpu(lambda t, i, s: t.scatter_reduce(1, i, s, "amax"), x, bad, x[:1, :1])


# ---- index_select / index_add / index_copy / index_fill / index_reduce ------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_select(dtype):
    x = _data(dtype)
    check(lambda t, i: t.index_select(1, i), x, L(3, 0, 0, -0),
          native=["aten.index_select.default"])
    check(lambda t, i: t.index_select(-1, i), x, torch.tensor(2))
    check(lambda t, i: t.transpose(0, 2).index_select(0, i), x, L(4, 1))
    check(lambda t, i: t.index_select(0, i), torch.tensor(3.0), L(0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_add_copy_fill(dtype):
    x = _data(dtype)
    src = _data(dtype, (3, 3, 5), seed=1)
    if dtype != torch.bool:
        check(lambda t, i, s: t.index_add(1, i, s), x, L(3, 0, 3), src,
              native=["aten.index_add.default"])
        check(lambda t, i, s: t.index_add(1, i, s, alpha=2), x, L(3, 0, 1), src)
    check(lambda t, i, s: t.index_copy(1, i, s), x, L(3, 0, 1), src,
          native=["aten.index_copy.default"])
    value = True if dtype == torch.bool else 7
    check(lambda t, i: t.index_fill(2, i, value), x, L(-1, 0),
          native=["aten.index_fill.int_Scalar"])
    check(lambda t, i, v: t.index_fill(0, i, v), x, L(1), _data(dtype, (), seed=2),
          native=["aten.index_fill.int_Tensor"])


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
def test_index_reduce(reduce):
    x = _data(torch.float32)
    src = _data(torch.float32, (3, 4, 5), seed=1)
    for include_self in (True, False):
        check(lambda t, i, s, inc=include_self: t.index_reduce(0, i, s, reduce, include_self=inc),
              x, L(0, 0, 2), src, native=["aten.index_reduce.default"])


def test_index_ops_inplace_and_out():
    def index_add_inplace(t, i, s):
        t[:, ::2].index_add_(0, i, s)
        return t

    check(index_add_inplace, torch.zeros(3, 4), L(0, 2), torch.ones(2, 2))

    def index_fill_inplace(t, i):
        t.t().index_fill_(1, i, 3)
        return t

    check(index_fill_inplace, torch.zeros(3, 4), L(0, 2))

    def index_copy_inplace(t, i, s):
        t.index_copy_(1, i, s)
        return t

    check(index_copy_inplace, torch.zeros(3, 4), L(3, 1), torch.ones(3, 2))

    def index_select_out(t, i):
        out = torch.empty(1, device=t.device)
        torch.index_select(t, 0, i, out=out)
        return out

    check(index_select_out, torch.randn(3, 4), L(2, 0))


def test_index_ops_errors_like_cpu():
    x = _data(torch.float32, (3, 4))
    raises_like_cpu(lambda t, i: t.index_select(0, i), x, L(3), match="index out of range")
    raises_like_cpu(lambda t, i: t.index_select(0, i), x, L(-1), match="index out of range")
    index_add = lambda t, i, s: t.index_add(0, i, s)  # noqa: E731
    raises_like_cpu(index_add, x, L(3), x[:1], match="index out of range.*index_add")
    # Run op by op, the error raises at the call, in CPU's words.
    before = fusion.recording()
    fusion.set_enabled(False)
    try:
        with pytest.raises(RuntimeError, match="index 3 is out of bounds for dimension 0 with size 3"):
            index_add(x.to(DEV), L(3).to(DEV), x[:1].to(DEV))
    finally:
        fusion.set_enabled(before)
    raises_like_cpu(lambda t, i, s: t.index_copy(0, i, s), x, L(-1), x[:1], match="index_copy")
    raises_like_cpu(lambda t, i: t.index_fill(1, i, 0.0), x, L(-5))
    raises_like_cpu(lambda t, i, s: t.index_reduce(0, i, s, "prod"), x, L(3), x[:1])


# ---- masked ops, nonzero ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_select_scatter(dtype):
    x = _data(dtype)
    m = _data(torch.bool, seed=5)
    check(lambda t, mm: t.masked_select(mm), x, m, native=["aten.masked_select.default"])
    check(lambda t, mm: t.masked_select(mm), x, m[0, 0])  # mask broadcasts
    source = _data(dtype, (70,), seed=6)
    check(lambda t, mm, s: t.masked_scatter(mm, s), x, m, source,
          native=["aten.masked_scatter.default"])

    def masked_scatter_inplace(t, mm, s):
        t.transpose(0, 1).masked_scatter_(mm, s)
        return t

    check(masked_scatter_inplace, x, m.transpose(0, 1), source)


def test_masked_select_count_changes_between_calls():
    x = _data(torch.float32)
    for threshold in (0.0, 1.0, -0.5):
        check(lambda t, th=threshold: t.masked_select(t > th), x)


def test_masked_scatter_too_few_source_elements():
    raises_like_cpu(lambda t, m, s: t.masked_scatter(m, s), torch.zeros(3),
                    torch.ones(3, dtype=torch.bool), torch.ones(2),
                    match="Number of elements of source")


@pytest.mark.parametrize("dtype", DTYPES)
def test_nonzero(dtype):
    x = _data(dtype)
    check(lambda t: t.nonzero(), x, native=["aten.nonzero.default"])
    check(lambda t: torch.argwhere(t), x)
    check(lambda t: torch.where(t), x)
    check(lambda t: t.transpose(0, 2).nonzero(), x)
    check(lambda t: (t.nonzero(), t.nonzero()), torch.ones((), dtype=dtype))
    check(lambda t: t.nonzero(), torch.zeros((), dtype=dtype))
    check(lambda t: t.nonzero(), torch.zeros(0, 3, dtype=dtype))


def test_nonzero_count_changes_between_calls():
    for seed in range(3):
        check(lambda t: t.nonzero(), _data(torch.bool, (4, 5), seed=seed))


def test_nonzero_static():
    x = _data(torch.int64, (3, 4))
    x[x.abs() < 40] = 0
    check(lambda t: torch.nonzero_static(t, size=12), x, native=["aten.nonzero_static.default"])
    check(lambda t: torch.nonzero_static(t, size=2, fill_value=7), x)


# ---- take / put ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_take_put(dtype):
    x = _data(dtype)
    check(lambda t, i: t.take(i), x, L([0, -1], [59, 3]), native=["aten.take.default"])
    check(lambda t, i: t.transpose(0, 2).take(i), x, L(1, 7, -2))
    src = _data(dtype, (3,), seed=1)
    check(lambda t, i, s: t.put(i, s), x, L(0, -1, 7), src, native=["aten.put.default"])

    def put_inplace(t, i, s):
        t.put_(i, s, accumulate=True)
        return t

    if dtype != torch.bool:
        check(put_inplace, x, L(0, -1, 0), src, native=["aten.put_.default"])


def test_take_put_errors_like_cpu():
    x = _data(torch.float32, (3, 4))
    raises_like_cpu(lambda t, i: t.take(i), x, L(12), match="out of range")
    raises_like_cpu(lambda t, i: t.take(i), x, L(-13), match="out of range")
    raises_like_cpu(lambda t, i, s: t.put(i, s), x, L(12), x[0, :1], match="out of range")


# ---- gradients --------------------------------------------------------------------------


def _g(shape, seed=0):
    return _data(torch.float32, shape, seed)


@pytest.mark.parametrize("name,fn,inputs", [
    ("index", lambda t, i: t[i], (_g((3, 4, 5)), L(2, 0, 2))),
    ("index2", lambda t, i, j: t[i, :, j], (_g((3, 4, 5)), L(2, 0, 2), L(1, 1, 4))),
    ("mask", lambda t, m: t[m], (_g((3, 4, 5)), _data(torch.bool, seed=5))),
    ("gather", lambda t, i: t.gather(1, i),
     (_g((3, 4, 5)), torch.randint(0, 4, (2, 3, 5), generator=torch.Generator().manual_seed(0)))),
    ("index_select", lambda t, i: t.index_select(1, i), (_g((3, 4, 5)), L(3, 0, 0))),
    ("take", lambda t, i: t.take(i), (_g((3, 4)), L(3, 0, 0, -1))),
    ("masked_select", lambda t, m: t.masked_select(m), (_g((3, 4)), _data(torch.bool, (3, 4)))),
    ("scatter_src", lambda s, i: torch.zeros(3, 4, device=s.device).scatter(1, i, s),
     (_g((3, 2)), L([0, 2], [1, 3], [3, 0]))),
    ("scatter_add", lambda s, i: torch.zeros(3, 4, device=s.device).scatter_add(1, i, s),
     (_g((3, 3)), L([0, 2, 0], [1, 1, 3], [3, 0, 3]))),
    ("scatter_reduce_amax",
     lambda s, i: torch.zeros(3, 4, device=s.device).scatter_reduce(1, i, s, "amax"),
     (_g((3, 3)), L([0, 2, 1], [1, 3, 2], [3, 0, 1]))),
    ("index_add", lambda s, i: torch.zeros(2, 5, device=s.device).index_add(0, i, s),
     (_g((4, 5)), L(0, 1, 0, 1))),
    ("index_copy", lambda s, i: torch.zeros(5, 2, device=s.device).index_copy(0, i, s),
     (_g((3, 2)), L(4, 0, 2))),
    ("index_put_acc", lambda s, i: torch.zeros(5, 4, device=s.device).index_put((i,), s, True),
     (_g((3, 4)), L(0, 4, 0))),
    ("masked_scatter", lambda s, m: torch.zeros(3, 4, device=s.device).masked_scatter(m, s),
     (_g((12,)), _data(torch.bool, (3, 4)))),
])
def test_gradients(name, fn, inputs):
    check(fn, *inputs, grad=(0,))


# ---- repeat_interleave(repeats) ----------------------------------------------------------


@pytest.mark.parametrize("repeats", [L(1, 0, 3), L(2, 1).to(torch.int32), L(3), torch.tensor([], dtype=torch.int64)])
def test_repeat_interleave_tensor(repeats):
    check(torch.repeat_interleave, repeats, native=("aten.repeat_interleave.Tensor",))
    check(lambda r: torch.repeat_interleave(r, output_size=int(repeats.sum())), repeats)


def test_repeat_interleave_tensor_errors():
    for bad in (L(-1, 2), torch.tensor([[1, 2]])):
        raises_like_cpu(torch.repeat_interleave, bad)
    raises_like_cpu(lambda r: torch.repeat_interleave(r, output_size=5), L(1, 2))


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin"])
def test_scatter_reduce_bool_is_logical_like_cpu(reduce, include_self):
    # CPU's bool sum/prod are logical or/and; JAX's scatter-add/multiply reject bool.
    g = torch.Generator().manual_seed(3)
    x = torch.rand(10, 5, generator=g) > 0.5
    src = torch.rand(5, 5, generator=g) > 0.5
    index = torch.randint(0, 10, (5, 5), generator=g)
    cpu = x.scatter_reduce(0, index, src, reduce, include_self=include_self)
    dev = x.to(DEV).scatter_reduce(0, index.to(DEV), src.to(DEV), reduce, include_self=include_self)
    torch.testing.assert_close(dev.cpu(), cpu, rtol=0, atol=0)
    assert_native("aten.scatter_reduce.two")


def _idx(*values, device):
    return torch.tensor(values, device=device)


# Checks of CPU's kernels that PyTorch's meta kernels lack: JAX would broadcast the source or
# cast it silently.
@pytest.mark.parametrize("fn", [
    lambda d: torch.ones(3, 2, device=d).index_add(0, _idx(0, 1, device=d), torch.ones(2, device=d)),
    lambda d: torch.zeros(3, device=d).index_add(0, _idx(0, device=d), torch.tensor(1.0, device=d)),
    lambda d: torch.zeros((), device=d).index_add(0, _idx(0, device=d), torch.ones(1, device=d)),
    lambda d: torch.zeros(3, 2, device=d).index_add_(0, _idx(0, 1, device=d), torch.ones(2, device=d)),
    lambda d: torch.zeros(3, 2, device=d).index_add(0, _idx(0, device=d),
                                                    torch.ones(1, 2, dtype=torch.float64, device=d)),
    lambda d: torch.zeros(3, 2, device=d).index_reduce(0, _idx(0, 1, device=d),
                                                       torch.ones(2, device=d), "prod"),
    lambda d: torch.zeros(3, 2, device=d).index_reduce(0, _idx(0, device=d),
                                                       torch.ones(1, 2, dtype=torch.float64, device=d),
                                                       "prod"),
    lambda d: torch.zeros(3, 2, device=d).index_copy(0, _idx(0, device=d),
                                                     torch.ones(1, 2, dtype=torch.float64, device=d)),
    lambda d: torch.zeros(3, device=d).put(_idx(0, device=d), torch.ones(1, dtype=torch.float64, device=d)),
    lambda d: torch.ones(3, 2, device=d).index_select(0, torch.tensor([[0, 1]], device=d)),
    lambda d: torch.zeros(5, device=d).index_put_((_idx(0, device=d),), torch.tensor([1], device=d)),
    lambda d: torch.zeros(5, device=d).index_put_((_idx(0, device=d),),
                                                  torch.ones(1, dtype=torch.float64, device=d),
                                                  accumulate=True),
    lambda d: torch.zeros(5, device=d).__setitem__(_idx(0, device=d),
                                                   torch.tensor(1.0, dtype=torch.float64)),
], ids=["index_add_shape", "index_add_0d_source", "index_add_0d_self", "index_add_inplace",
        "index_add_dtype", "index_reduce_shape", "index_reduce_dtype", "index_copy_dtype",
        "put_dtype", "index_select_2d_index", "index_put_dtype", "index_put_accumulate_dtype",
        "setitem_dtype"])
def test_source_checks_raise_as_on_cpu(fn):
    with pytest.raises(Exception) as cpu:
        fn("cpu")
    with pytest.raises(type(cpu.value)) as dev:
        fn(DEV)
    assert str(dev.value) == str(cpu.value)


def test_index_add_source_of_matching_shape_still_runs():
    x, src = _data(torch.float32, (3, 2)), _data(torch.float32, (3, 3), seed=1)
    idx = L(0, 1, 1)
    _assert_same(x.to(DEV).index_add(1, idx.to(DEV), src.to(DEV)), x.index_add(1, idx, src))
    zero = torch.zeros(())
    _assert_same(zero.to(DEV).index_add(0, L(0).to(DEV), torch.tensor(2.0).to(DEV)),
                 zero.index_add(0, L(0), torch.tensor(2.0)))
