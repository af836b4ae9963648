"""Regression tests for bugs found by PyTorch's own test files (make upstream-tests,
docs/COVERAGE.md): each compares the neuron result with CPU PyTorch's."""

from __future__ import annotations

import warnings

import pytest
import torch

import torchneuron  # noqa: F401
from torchneuron.runtime import fusion

DEV = "neuron"


def test_flip_of_a_zero_dim_tensor_is_the_identity():
    # test_shape_ops test_flip: jnp.flip raised ValueError for dim 0 of a 0-d tensor.
    x = torch.tensor(3.5)
    for dims in ((0,), (-1,), ()):
        out = x.to(DEV).flip(dims)
        assert out.shape == ()
        torch.testing.assert_close(out.cpu(), x.flip(dims))


def test_byte_mask_index_selects_and_warns_as_cpu():
    # test_indexing test_byte_mask*/test_bool_indices: PyTorch's meta kernel rejected uint8
    # masks ("tensors used as indices must be ..."); CPU treats them as masks and warns.
    x = torch.arange(15.0).view(5, 3)
    mask = torch.tensor([1, 0, 1, 1, 0], dtype=torch.uint8)
    with warnings.catch_warnings(record=True) as cpu_w:
        warnings.simplefilter("always")
        expected = x[mask]
    with warnings.catch_warnings(record=True) as dev_w:
        warnings.simplefilter("always")
        out = x.to(DEV)[mask.to(DEV)]
    torch.testing.assert_close(out.cpu(), expected)

    def deprecations(ws):
        return [w for w in ws if "torch.uint8 is now deprecated" in str(w.message)]

    assert len(deprecations(dev_w)) == len(deprecations(cpu_w)) == 1

    # One warning per byte mask (test_multiple_byte_mask).
    v = torch.randn(5, 7, 3)
    mask2 = torch.tensor([1, 1, 1], dtype=torch.uint8)
    with warnings.catch_warnings(record=True) as cpu_w:
        warnings.simplefilter("always")
        expected = v[mask, :, mask2]
    with warnings.catch_warnings(record=True) as dev_w:
        warnings.simplefilter("always")
        out = v.to(DEV)[mask.to(DEV), :, mask2.to(DEV)]
    torch.testing.assert_close(out.cpu(), expected)
    assert len(deprecations(dev_w)) == len(deprecations(cpu_w)) == 2

    # index_put_ and x[mask] = v warn too (test_byte_tensor_assignment, _mask_accumulate).
    for accumulate in (False, True):
        counts = []
        for device in ("cpu", DEV):
            y = torch.zeros(5, 3, device=device)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                y.index_put_((mask.to(device),), torch.ones(3, device=device), accumulate)
                y[mask.to(device)] = torch.ones(3, device=device)
            counts.append(len(deprecations(caught)))
        assert counts[1] == counts[0] == 2


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16])
def test_index_of_a_dtype_cpu_rejects_raises(dtype):
    # An int8 index was taken as integer positions on neuron; CPU raises IndexError.
    x = torch.arange(6.0).view(2, 3)
    idx = torch.tensor([1, 0], dtype=dtype)
    with pytest.raises(IndexError, match="tensors used as indices must be long, int, byte or bool"):
        x[idx]
    with pytest.raises(IndexError, match="tensors used as indices must be long, int, byte or bool"):
        x.to(DEV)[idx.to(DEV)]


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_values_must_broadcast_to_the_indexed_part(accumulate):
    # test_indexing test_index_put_accumulate_empty: values of more dimensions than the
    # indexed part (leading unit ones too) were squeezed and written; CPU raises.
    cases = [
        (torch.zeros(3), (torch.tensor([0, 1]),), torch.ones(1, 2)),
        (torch.rand([]), (), torch.ones(1)),
        (torch.zeros(2, 3), (torch.tensor([True, False]),), torch.ones(1, 1, 3)),
    ]
    for x, indices, values in cases:
        with pytest.raises(RuntimeError):  # CPU: "shape mismatch" (or a masked_fill_ message)
            x.clone().index_put_(indices, values, accumulate=accumulate)
        dev_indices = tuple(i.to(DEV) for i in indices)
        with pytest.raises(RuntimeError, match="shape mismatch"):
            x.to(DEV).index_put_(dev_indices, values.to(DEV), accumulate=accumulate)


def test_setitem_still_strips_leading_unit_dims_of_the_value():
    # Python's x[i] = v strips v's leading unit dimensions before calling index_put_.
    value = torch.arange(3.0).view(1, 1, 1, 3)
    for index in (torch.tensor([0]), torch.tensor([True, False])):
        x = torch.zeros(2, 3)
        x[index] = value
        d = torch.zeros(2, 3, device=DEV)
        d[index.to(DEV)] = value.to(DEV)
        torch.testing.assert_close(d.cpu(), x)


@pytest.mark.parametrize("alpha", [False, True, 0, 1, 2])
def test_bool_add_applies_alpha(alpha):
    # bool + bool * alpha is `x or (y and alpha)` on CPU; alpha=False was ignored (x or y).
    # (With an int alpha the runtime promotes the bool tensors to int64 first, counting alpha
    # as an operand, so alpha=-1 still differs: a runtime bug, in the upstream report.)
    x = torch.tensor([True, False, True, False])
    y = torch.tensor([True, True, False, False])
    expected = torch.add(x, y, alpha=alpha)
    out = torch.add(x.to(DEV), y.to(DEV), alpha=alpha)
    assert out.dtype == torch.bool
    torch.testing.assert_close(out.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32])
def test_add_with_a_float_alpha_raises_for_integral_results(dtype):
    # test_type_promotion test_alpha_mismatch: bool + bool with alpha=1.1 computed all True.
    x = torch.ones(4, dtype=dtype)
    with pytest.raises(RuntimeError, match="alpha must not be a floating point number"):
        torch.add(x, x, alpha=1.1)
    with pytest.raises(RuntimeError, match="alpha must not be a floating point number"):
        torch.add(x.to(DEV), x.to(DEV), alpha=1.1)
    if dtype != torch.bool:  # CPU: "Boolean alpha only supported for Boolean results."
        with pytest.raises(RuntimeError, match="Boolean alpha only supported"):
            torch.add(x, x, alpha=True)
        with pytest.raises(RuntimeError, match="Boolean alpha only supported"):
            torch.add(x.to(DEV), x.to(DEV), alpha=True)


@pytest.mark.parametrize("accumulate", [False, True])
def test_index_put_requires_matching_dtypes(accumulate):
    # test_type_promotion test_indexing_fail: int values were cast into a double tensor;
    # CPU raises (PyTorch's meta kernel does not check).
    x = torch.ones(5, 2, dtype=torch.double)
    indices = (torch.arange(5).view(5, 1), torch.tensor([1]))
    values = torch.zeros(5, 1, dtype=torch.int)
    match = "Index put requires the source and destination dtypes match, got Double for the "\
        "destination and Int for the source"
    with pytest.raises(RuntimeError, match=match):
        x.clone().index_put_(indices, values, accumulate=accumulate)
    with pytest.raises(RuntimeError, match=match):
        x.to(DEV).index_put_(tuple(i.to(DEV) for i in indices), values.to(DEV),
                             accumulate=accumulate)


def test_index_put_checks_the_shape_before_the_dtype():
    # test_indexing NumpyTests test_boolean_assignment_value_mismatch: values of another
    # dtype and shape raise CPU's shape error (make_index_put_iterator checks shape first).
    def assign(device):
        a = torch.arange(4, device=device)
        a[a > -1] = torch.tensor([1.0, 2.0, 3.0], device=device)

    with pytest.raises(RuntimeError, match="shape mismatch"):
        assign("cpu")
    with pytest.raises(RuntimeError, match="shape mismatch: value tensor of shape \\[3\\]"):
        assign(DEV)


@pytest.mark.parametrize("fn", [
    lambda b, f: f - b, lambda b, f: b - 1, lambda b, f: f - True, lambda b, f: True - f,
    lambda b, f: torch.rsub(b, 1), lambda b, f: torch._foreach_sub([b], 1)])
def test_subtraction_with_a_bool_operand_raises(fn):
    # test_foreach test_binary_op_scalar_with_overlapping_tensors (_foreach_sub, bool):
    # PyTorch's meta kernels reject bool - bool only, CPU any bool operand.
    b, f = torch.ones(3, dtype=torch.bool), torch.ones(3)
    match = "Subtraction, the `-` operator, with a bool tensor is not supported"
    with pytest.raises(RuntimeError, match=match):
        fn(b, f)
    with pytest.raises(RuntimeError, match=match):
        fn(b.to(DEV), f.to(DEV))


# ---- random_ and uniform_: CPU's ranges, errors and warnings (test_tensor_creation_ops
# test_random_default/_to/_from_to/_full_range, test_uniform_from_to) -------------------------


@pytest.mark.parametrize("dtype, top", [
    (torch.float32, 2**24), (torch.float16, 2**11), (torch.bfloat16, 2**8),
    (torch.float64, 2**53), (torch.int8, 127), (torch.int64, 2**63 - 1), (torch.bool, 1)])
def test_random_default_covers_cpus_range(dtype, top):
    # Floating dtypes drew from [0, 2**(digits - 1)], half of CPU's [0, 2**digits]; integer
    # dtypes missed their largest value.
    t = torch.empty(4000, dtype=dtype, device=DEV).random_().cpu().double()
    assert t.min() >= 0 and t.max() <= top
    assert t.max() >= (top if top < 200 else 0.9 * top)


def _outcome(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn()
            result = "ok"
        except Exception as err:  # the comparison is the point: type and message
            result = f"{type(err).__name__}: {err}"
    return result, [str(w.message).split(" (Triggered")[0] for w in caught
                    if "out of bounds" in str(w.message)]


@pytest.mark.parametrize("dtype, args", [
    (torch.int8, (200,)), (torch.int8, (-200, 5)), (torch.int8, (5, 5)),
    (torch.uint8, (-5, None)), (torch.bool, (0, 3)), (torch.bool, (0, 2)),
    (torch.float16, (0, 70000)), (torch.float32, (0, 2**30)), (torch.float32, (-(2**30), 5)),
    (torch.int16, (-(2**63), None)), (torch.int64, (-(2**63), None))])
def test_random_range_errors_and_warnings_match_cpu(dtype, args):
    def run(device):
        t = torch.empty(16, dtype=dtype, device=device)
        return _outcome(lambda: t.random_(*args))

    cpu = run("cpu")
    if cpu[0].startswith("RuntimeError: random_full_64_bits"):
        cpu = ("RuntimeError: random_ over the full 64-bit range handles only int64, double, "
               "float and bfloat16", cpu[1])
    assert run(DEV) == cpu
    # Errors and the precision warnings come on every call, as on CPU (also when the
    # executable is reused).
    assert run(DEV) == cpu


@pytest.mark.parametrize("dtype, bounds", [
    (torch.float32, (2.0, 1.0)), (torch.float16, (-70000.0, 0.0)), (torch.float16, (0.0, 7e4)),
    (torch.float32, (torch.finfo(torch.float).min, torch.finfo(torch.float).max)),
    (torch.float64, (-42.0, 42.0))])
def test_uniform_bounds_checks_match_cpu(dtype, bounds):
    def run(device):
        return _outcome(lambda: torch.empty(8, dtype=dtype, device=device).uniform_(*bounds))

    assert run(DEV) == run("cpu")


@pytest.mark.parametrize("fn", [torch.linspace, torch.logspace])
@pytest.mark.parametrize("bounds, dtype", [
    ((1 + 2j, 3 + 4j, 5), None), ((1 + 2j, 3 + 4j, 1), None), ((1.0, 2j, 3), None),
    ((1 + 2j, 3 + 4j, 5), torch.complex128)])
def test_linspace_logspace_keep_complex_bounds(fn, bounds, dtype):
    # SILENT WRONG VALUES before: complex bounds without a dtype computed in the default
    # float dtype (imaginary parts dropped; steps=1 raised TypeError), and logspace, which
    # decomposes into linspace(dtype=None), dropped them even with a complex dtype.
    # (test_tensor_creation_ops test_linspace_vs_numpy_complex, test_logspace_vs_numpy_complex)
    expected = fn(*bounds, dtype=dtype)
    out = fn(*bounds, dtype=dtype, device=DEV)
    assert out.dtype == expected.dtype
    torch.testing.assert_close(out.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64, torch.uint8])
def test_right_shift_out_of_range_fills_with_the_sign(dtype):
    # SILENT WRONG VALUES before: x >> negative returned x (the shift was clipped to 0); CPU
    # fills with the sign bit, as for shifts past the width (test_binary_ufuncs
    # test_shift_limits). uint8 >> 8 gave 1 for 255 (clipped to 7); CPU gives 0.
    x = torch.tensor([-5, -1, 0, 1, 5], dtype=torch.int64).to(dtype)
    for shift in (-100, -3, -1, 7, 8, 31, 64, 100):
        torch.testing.assert_close((x.to(DEV) >> shift).cpu(), x >> shift)
        torch.testing.assert_close((x.to(DEV) << shift).cpu(), x << shift)
    shifts = torch.tensor([-70, -1, 0, 3, 8, 63, 64, 70]).to(dtype)
    y = torch.full(shifts.shape, 5, dtype=dtype)
    torch.testing.assert_close((y.to(DEV) >> shifts.to(DEV)).cpu(), y >> shifts)


@pytest.mark.parametrize("x_dtype, v_dtype", [
    (torch.float32, torch.float32), (torch.float16, torch.float16), (torch.int8, torch.int8),
    (torch.float16, torch.float32), (torch.int64, torch.int32), (torch.bool, torch.bool),
    (torch.complex64, torch.complex64)])
def test_heaviside_matches_cpu_and_requires_one_dtype(x_dtype, v_dtype):
    # test_binary_ufuncs test_heaviside: the decomposition computed for mixed dtypes (CPU
    # raises), in-place and out= included.
    x = torch.tensor([-2, 0, 3, 0]).to(x_dtype)
    v = torch.tensor([5, 7, 1, 0]).to(v_dtype)
    calls = [lambda a, b: torch.heaviside(a, b), lambda a, b: a.clone().heaviside_(b),
             lambda a, b: torch.heaviside(a, b, out=torch.empty_like(a))]
    for call in calls:
        try:
            expected = call(x, v)
        except RuntimeError as err:
            with pytest.raises(RuntimeError, match=str(err)):
                call(x.to(DEV), v.to(DEV))
            continue
        torch.testing.assert_close(call(x.to(DEV), v.to(DEV)).cpu(), expected)


@pytest.mark.parametrize("fn", [torch.maximum, torch.minimum, torch.max, torch.min,
                                torch.fmax, torch.fmin])
@pytest.mark.parametrize("other", [torch.complex64, torch.float32, torch.int64])
def test_elementwise_max_min_reject_complex(fn, other):
    # test_binary_ufuncs test_maximum_minimum_complex: jnp orders complex numbers
    # lexicographically and computed; CPU raises.
    a, b = torch.ones(2, dtype=torch.complex64), torch.ones(2, dtype=other)
    with pytest.raises(RuntimeError, match="not implemented for complex tensors"):
        fn(a, b)
    with pytest.raises(RuntimeError, match="not implemented for complex tensors"):
        fn(a.to(DEV), b.to(DEV))


@pytest.mark.parametrize("dtype", [torch.complex64, torch.complex128])
def test_complex_random_fills_both_parts(dtype):
    # SILENT WRONG VALUES before: uniform_/normal_ (rand, randn) of complex tensors drew the
    # real part only (imaginary parts 0). CPU draws both; normal_ gives each part std/sqrt(2).
    torch.manual_seed(0)
    u = torch.empty(20000, dtype=dtype, device=DEV).uniform_(-1.0, 3.0).cpu()
    for part in (u.real, u.imag):
        assert part.min() >= -1.0 and part.max() < 3.0 and abs(part.mean().item() - 1.0) < 0.05
    n = torch.empty(20000, dtype=dtype, device=DEV).normal_(2.0, 3.0).cpu()
    for part in (n.real, n.imag):
        assert abs(part.mean().item() - 2.0) < 0.1
        assert abs(part.std().item() - 3.0 / 2**0.5) < 0.1
    r = torch.randn(20000, dtype=dtype, device=DEV).cpu()
    assert r.dtype == dtype and abs(r.imag.std().item() - 0.5**0.5) < 0.03


@pytest.mark.parametrize("fill", [lambda t: t.uniform_(), lambda t: t.normal_()])
def test_random_fill_of_integer_tensors_raises(fill):
    # test_tensor_creation_ops test_tensor_factories_empty: torch.rand(dtype=int) computed.
    with pytest.raises(NotImplementedError):
        fill(torch.empty(3, dtype=torch.int64))
    with pytest.raises(NotImplementedError):
        fill(torch.empty(3, dtype=torch.int64, device=DEV))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_addmm_gelu_is_the_exact_gelu(dtype):
    # SILENT WRONG VALUES before (up to 5e-4 here): the lowering used GELU's tanh
    # approximation; CPU's _addmm_activation applies the exact one (test_linalg
    # test_addmm_gelu).
    torch.manual_seed(0)
    bias, m1, m2 = torch.randn(10, dtype=dtype), torch.randn(25, 10, dtype=dtype) * 3, \
        torch.randn(10, 10, dtype=dtype)
    expected = torch._addmm_activation(bias, m1, m2, use_gelu=True)
    out = torch._addmm_activation(bias.to(DEV), m1.to(DEV), m2.to(DEV), use_gelu=True)
    torch.testing.assert_close(out.cpu(), expected)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.bool, torch.uint8])
@pytest.mark.parametrize("dims, mode", [
    (1, "linear"), (1, "nearest"), (1, "nearest-exact"), (2, "bilinear"), (2, "bicubic"),
    (2, "nearest"), (2, "nearest-exact"), (3, "trilinear"), (3, "nearest"),
])
def test_interpolate_refuses_the_dtypes_cpu_refuses(dtype, dims, mode):
    # test_nn test_upsamplingBiMode2d_nonsupported_dtypes: PyTorch's decompositions and the
    # lowerings computed integer images CPU's kernels are not dispatched over.
    outcomes = []
    for device in ("cpu", DEV):
        x = torch.ones(1, 2, *([6] * dims), dtype=dtype, device=device)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the CPU-kernel route's own warning
                out = torch.nn.functional.interpolate(x, size=[3] * dims, mode=mode)
            outcomes.append(out.cpu())
        except NotImplementedError as err:
            outcomes.append(str(err))
    if isinstance(outcomes[0], str):
        assert outcomes[1] == outcomes[0]
    else:
        torch.testing.assert_close(outcomes[1], outcomes[0])


@pytest.mark.parametrize("dtype, n", [
    (torch.int8, 129), (torch.uint8, 257), (torch.int16, 32769), (torch.float16, 2050),
    (torch.int8, 128), (torch.float16, 2049), (torch.bfloat16, 3000)])
@pytest.mark.parametrize("with_out", [False, True], ids=["dtype", "out"])
def test_randperm_refuses_a_dtype_too_narrow_for_n(dtype, n, with_out):
    # SILENT WRONG VALUES before: randperm(200, dtype=torch.int8) wrapped around
    # (test_tensor_creation_ops test_randperm); CPU refuses it.
    def run(device):
        def call():
            if with_out:
                out = torch.empty(0, dtype=dtype, device=device)
                torch.randperm(n, out=out)
                return out
            return torch.randperm(n, dtype=dtype, device=device)
        return _outcome(lambda: sorted(call().cpu().tolist()) == list(range(n)) or 1 / 0)

    assert run(DEV) == run("cpu")


@pytest.mark.parametrize("dtype, n", [(torch.float32, 2**24 + 2), (torch.float64, 2**53 + 2)])
def test_randperm_refuses_more_values_than_a_float_holds(dtype, n):
    # Checked before anything is allocated, on CPU as here (test_randperm's large_n cases).
    def run(device):
        return _outcome(lambda: torch.randperm(n, out=torch.empty(0, dtype=dtype, device=device)))

    assert run(DEV) == run("cpu")


def test_randperm_out_becomes_one_dimensional_as_on_cpu():
    # CPU's kernel resizes out to (n,) whatever its shape (test_randperm's non-contiguous out).
    for device in ("cpu", DEV):
        out = torch.zeros((2, 3), dtype=torch.long, device=device).t()
        torch.randperm(6, out=out)
        assert out.shape == (6,) and out.stride() == (1,)
        assert sorted(out.cpu().tolist()) == list(range(6))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int64])
@pytest.mark.parametrize("form", ["op", "inplace", "out"])
def test_integer_tensor_to_a_negative_int_power_is_refused(dtype, form):
    # SILENT WRONG VALUE before: int_tensor ** -1 gave 0 (test_binary_ufuncs test_pow); the
    # exponent is traced, so the check runs per call; x.pow_(-1) also mapped to pow.Scalar.
    def run(device):
        x = torch.full((3,), 2, dtype=dtype, device=device)
        calls = {"op": lambda: x ** -2, "inplace": lambda: x.pow_(-1),
                 "out": lambda: torch.pow(x, -1, out=torch.empty(0, dtype=dtype, device=device))}
        return _outcome(calls[form])

    assert run(DEV) == run("cpu") == ("RuntimeError: Integers to negative integer powers are "
                                      "not allowed.", [])
    x = torch.full((3,), 2, dtype=dtype, device=DEV)
    assert (x ** 3).cpu().tolist() == [8, 8, 8]  # a non-negative power still computes


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
def test_a_bool_exponent_is_zero_or_one(dtype):
    # SILENT WRONG VALUE before: int_tensor ** True cast the base to bool and gave 1s.
    x = torch.tensor([2, 3], dtype=dtype)
    for exponent in (True, False, torch.tensor([True, False])):
        on_device = exponent.to(DEV) if isinstance(exponent, torch.Tensor) else exponent
        torch.testing.assert_close((x.to(DEV) ** on_device).cpu(), x ** exponent)


@pytest.mark.parametrize("call", [
    lambda d, std: torch.normal(0.0, std),
    lambda d, std: torch.normal(torch.zeros(3, device=d), std),
    lambda d, std: torch.normal(torch.zeros(3, device=d), std, out=torch.empty(3, device=d)),
], ids=["float_Tensor", "Tensor_Tensor", "Tensor_Tensor_out"])
@pytest.mark.parametrize("bad", [-1.0, float("nan")], ids=["negative", "nan"])
def test_normal_refuses_a_std_tensor_with_a_negative_element(call, bad):
    # test_tensor_creation_ops test_normal_std_error: drawn with the negative std before.
    for device in ("cpu", DEV):
        std = torch.tensor([1.0, bad, 2.0], device=device)
        with pytest.raises(RuntimeError, match=r"normal expects all elements of std >= 0\.0"):
            call(device, std).cpu()
    good = call(DEV, torch.tensor([1.0, 0.0, 2.0], device=DEV)).cpu()
    assert good[1] == 0.0 and good.isfinite().all()


@pytest.mark.parametrize("call", [
    lambda d, std: torch.empty(3, device=d).normal_(0.0, std),
    lambda d, std: torch.normal(0.0, std, (3,), device=d),
    lambda d, std: torch.normal(torch.zeros(3, device=d), std),
], ids=["normal_", "float_float", "Tensor_float"])
def test_normal_refuses_a_negative_std_at_every_call(call):
    # std reaches the lowering traced: once an executable existed for the signature, a
    # negative std drew values (negated normals) where CPU raises.
    for std in (1.0, 2.0, -1.0, float("nan"), -1e-10):
        messages = []
        for device in ("cpu", DEV):
            try:
                call(device, std).cpu()
                messages.append(None)
            except RuntimeError as err:
                messages.append(str(err))
        assert messages[1] == messages[0]
        assert (messages[0] is None) == (std >= 0)


def test_an_empty_integer_tensor_takes_normal_as_on_cpu():
    # test_foreach test_add_scalar_with_empty_list_and_empty_tensor: torch.randn(0,
    # dtype=int16) raised PyTorch's meta kernel's dtype error; CPU returns the empty tensor.
    for dtype in (torch.int16, torch.int64, torch.bool):
        out = torch.randn(0, dtype=dtype, device=DEV)
        assert out.dtype == dtype and out.shape == (0,)
        with pytest.raises(NotImplementedError, match="normal_kernel_cpu"):
            torch.randn(2, dtype=dtype, device=DEV)


@pytest.mark.parametrize("call", [
    lambda d: torch.ones(2, dtype=torch.bool, device=d).sub_(True),
    lambda d: torch._foreach_sub_([torch.ones(2, dtype=torch.bool, device=d)], True),
    lambda d: torch.ones(2, device=d).sub_(True),
    lambda d: torch.ones(2, dtype=torch.int32, device=d).sub_(True),
], ids=["bool_bool", "foreach_bool_bool", "float_bool", "int_bool"])
def test_in_place_subtraction_refuses_bool_operands(call):
    # test_foreach test_binary_op_scalar_with_overlapping_tensors__foreach_sub_bool: the
    # in-place overloads ran PyTorch's meta kernel of their own, which lets a bool scalar pass.
    messages = []
    for device in ("cpu", DEV):
        with pytest.raises(RuntimeError) as caught:
            call(device)
        messages.append(str(caught.value))
    assert messages[1] == messages[0]
    assert messages[0].startswith("Subtraction, the `-` operator, with")


@pytest.mark.parametrize("call", [
    lambda t, m: t * m, lambda t, m: m * t, lambda t, m: m.float() * t,
    lambda t, m: m.to(torch.float16) * t.half(), lambda t, m: m.double() * t.double(),
    lambda t, m: torch.xlogy(m, t), lambda t, m: m.to(torch.complex64) * t,
], ids=["float_times_mask", "mask_times_float", "cast_mask", "half", "double", "xlogy",
        "complex"])
def test_a_bool_operand_keeps_nan_and_inf(call):
    # test_binary_ufuncs test_xlogy_xlog1py_*_bool: XLA rewrites convert(bool) * y into
    # select(bool, y, 0), so False * nan (and False * inf) gave 0 where CPU gives nan.
    t = torch.tensor([float("nan"), float("inf"), -float("inf"), 2.0, float("nan")])
    mask = torch.tensor([False, False, False, True, True])
    expected = call(t, mask)
    for _ in range(2):  # the first call and a cached executable
        torch.testing.assert_close(call(t.to(DEV), mask.to(DEV)).cpu(), expected,
                                   equal_nan=True)


def test_inv_ex_check_errors_raises_linalg_error():
    # test_linalg test_inv_ex_singular: RuntimeError where CPU raises torch.linalg.LinAlgError
    # (a subclass), then CPU's type without its element number: a failed value check now
    # raises CPU's own error for the call, worded as CPU words it.
    a = torch.eye(3, dtype=torch.float64)
    a[-1, -1] = 0
    assert torch.linalg.inv_ex(a.to(DEV)).info.item() == torch.linalg.inv_ex(a).info.item() == 3
    with pytest.raises(torch.linalg.LinAlgError, match="diagonal element 3 is zero"):
        torch.linalg.inv_ex(a.to(DEV), check_errors=True)
    batch = torch.eye(3, dtype=torch.float64).repeat(5, 1, 1)
    batch[3, -2, -2] = 0
    with pytest.raises(torch.linalg.LinAlgError,
                       match=r"\(Batch element 3\): The diagonal element 2 is zero"):
        torch.linalg.inv_ex(batch.to(DEV), check_errors=True)


def test_a_failed_index_check_raises_cpus_message_and_names_the_call():
    x = torch.arange(6.0).reshape(2, 3)
    index = torch.tensor([[0, 5]])
    with pytest.raises(RuntimeError, match="index 5 is out of bounds for dimension 0 with size 2"):
        torch.gather(x, 0, index)
    # Run op by op, at the call in CPU's words; recorded (the default), at the next sync point
    # in the check's words. Both name the op and the call's line.
    before = fusion.recording()
    fusion.set_enabled(False)
    try:
        with pytest.raises(RuntimeError, match=r"index 5 is out of bounds for dimension 0 with "
                                               r"size 2 \(in aten.gather.default, called at .*\.py"):
            torch.gather(x.to(DEV), 0, index.to(DEV))
    finally:
        fusion.set_enabled(before)
    with pytest.raises(RuntimeError, match=r"gather\(\): index out of bounds .* \(in "
                                           r"aten.gather.default, called at .*\.py"):
        torch.gather(x.to(DEV), 0, index.to(DEV)).cpu()


def test_group_norm_of_an_empty_batch():
    # test_ops test_numpy_ref_nn_functional_group_norm: reshape(N, group, -1) of N = 0
    # raised ZeroDivisionError.
    x = torch.zeros(0, 2, 3, dtype=torch.float64, requires_grad=True)
    w = torch.ones(2, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(2, dtype=torch.float64)
    expected = torch.nn.functional.group_norm(x, 1, w, b)
    xd = x.detach().to(DEV).requires_grad_()
    wd = w.detach().to(DEV).requires_grad_()
    out = torch.nn.functional.group_norm(xd, 1, wd, b.to(DEV))
    assert out.shape == expected.shape
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(wd.grad.cpu(), w.grad)
    assert xd.grad.shape == x.shape


def test_complex_pow_of_large_values_as_cpu():
    # test_binary_ufuncs reference_numerics_large (pow, float_power): XLA's complex power
    # squares |x| first and overflowed to NaN; CPU runs its sqrt/product/reciprocal kernels
    # for the exponents 0.5, 2, 3, -0.5, -1, -2 (0 and 1 fill and copy) and exp(y log x)
    # otherwise, with 0 for a zero base when Re(y) > 0.
    # (Not 2 or 3 at values whose square overflows: CPU's vectorized and scalar complex
    # products differ there, by the element's position in the tensor.)
    parts = [0.0, 2.5, -2.5, 1e10, 1e19, -1e19, 1e20]
    x = torch.tensor([complex(a, b) for a in parts for b in parts], dtype=torch.complex64)
    for exponent in (0.0, 1.0, 0.5, 1.5, 2 + 1j):  # parts compared apart: inf - inf is NaN
        torch.testing.assert_close(torch.view_as_real(torch.pow(x.to(DEV), exponent).cpu()),
                                   torch.view_as_real(torch.pow(x, exponent)),
                                   equal_nan=True, rtol=1e-4, atol=0)
    small = x[x.abs() < 1e11]
    torch.testing.assert_close(torch.pow(small.to(DEV), 2.0).cpu(), torch.pow(small, 2.0))
    y = (x.flip(0) * 1e-19).to(torch.complex128)
    x = x.to(torch.complex128)
    torch.testing.assert_close(torch.pow(x.to(DEV), y.to(DEV)).cpu(), torch.pow(x, y),
                               equal_nan=True)


def test_real_division_into_a_complex_out():
    # test_binary_ufuncs test_type_promotion_floor_divide: floats into a complex out= were
    # computed in complex arithmetic (TypeError from floor); CPU computes in the inputs'
    # dtype and casts.
    a = torch.tensor([5.5, -7.0, 3.25])
    b = torch.tensor([2.0, 2.0, -0.5], dtype=torch.float64)
    for op in (torch.floor_divide, torch.remainder, torch.atan2):
        for dtype in (torch.complex64, torch.complex128):
            expected = op(a, b, out=torch.empty(3, dtype=dtype))
            out = torch.empty(3, dtype=dtype, device=DEV)
            op(a.to(DEV), b.to(DEV), out=out)
            torch.testing.assert_close(out.cpu(), expected)


def test_exp2_is_exact_at_whole_numbers():
    # test_ops test_python_ref__refs_logspace uint8: refs.pow(2, x) is exp2(x), and XLA's
    # exp(x * ln 2) gave 15.999999999999998 for 2**4, which the uint8 cast truncated to 15.
    for dtype in (torch.float32, torch.float64):
        x = torch.arange(-120.0, 120.0, dtype=dtype)
        assert torch.equal(torch.exp2(x.to(DEV)).cpu(), torch.exp2(x))
        frac = torch.linspace(-20, 20, 97, dtype=dtype)
        torch.testing.assert_close(torch.exp2(frac.to(DEV)).cpu(), torch.exp2(frac))
    special = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e10, -1e10])
    torch.testing.assert_close(torch.exp2(special.to(DEV)).cpu(), torch.exp2(special),
                               equal_nan=True)
    from torch._prims.context import TorchRefsMode

    with TorchRefsMode():
        result = torch._refs.logspace(0, 4, 2, 2.0, dtype=torch.uint8, device=DEV)
    assert result.cpu().tolist() == [1, 16]
