"""Bad input the neuron device must refuse as CPU refuses it (issue 10, point 4): each case
runs on CPU and on the device, and both must raise the same exception type, with CPU's
message where the device's own check raises it."""

from __future__ import annotations

import pytest
import torch

import torchneuron  # noqa: F401  (registers the neuron device)


def _raises_like_cpu(fn, match: str | None = None) -> None:
    """fn(device) raises on the device exactly when, and with the type that, it raises on CPU."""
    errors = []
    for device in ("cpu", "neuron"):
        try:
            fn(device)
            errors.append(None)
        except Exception as err:  # noqa: BLE001 - the type is what is compared
            errors.append(err)
    cpu, neuron = errors
    assert cpu is not None, "the case must be one CPU refuses"
    assert type(neuron) is type(cpu), f"CPU raised {cpu!r}, neuron {neuron!r}"
    if match is not None:
        assert match in str(neuron), str(neuron)


_OVERLAP = "refer to a single memory location"


@pytest.mark.parametrize(
    "fn",
    [
        lambda d: (lambda x: torch.cat([x, torch.ones(4, 6, device=d)], 0, out=x))(
            torch.ones(4, 6, device=d)),
        lambda d: (lambda x: torch.cat([torch.ones(2, 6, device=d), x], 0, out=x[:2]))(
            torch.ones(4, 6, device=d)),
        lambda d: (lambda x: torch.cat([x, torch.ones(3, device=d)], out=x))(
            torch.empty(0, device=d)),
        lambda d: (lambda x: torch.stack([x, x], out=x))(torch.ones(3, device=d)),
    ],
    ids=["cat_out_is_input", "cat_out_overlaps_input", "cat_out_is_empty_input", "stack"],
)
def test_out_overlapping_a_listed_input(fn) -> None:
    _raises_like_cpu(fn, _OVERLAP)


def test_out_identical_to_empty_input_allowed_for_elementwise() -> None:
    x = torch.empty(0, device="neuron")
    assert torch.add(x, 1, out=x).shape == (0,)


def _empty(shape, dtype, device):
    return torch.empty(shape, dtype=dtype, device=device)


@pytest.mark.parametrize(
    "fn, message",
    [
        (lambda d: torch.neg(torch.ones(3, device=d), out=_empty(3, torch.float64, d)),
         "Found dtype Double but expected Float"),
        (lambda d: torch.neg(torch.ones(3, device=d), out=_empty(3, torch.int64, d)),
         "Found dtype Long but expected Float"),
        (lambda d: torch.complex(torch.ones(2, device=d), torch.ones(2, device=d),
                                 out=_empty(2, torch.complex128, d)),
         "Expected object of scalar type ComplexFloat"),
        (lambda d: torch.aminmax(torch.ones(3, 3, device=d), dim=0,
                                 out=(_empty(3, torch.float64, d), _empty(3, torch.float64, d))),
         "Expected out tensor to have dtype float, but got double"),
        (lambda d: torch.nonzero(torch.ones(3, device=d), out=_empty(0, torch.float32, d)),
         "Expected out tensor to have scalar type Long"),
        (lambda d: torch.mm(torch.ones(2, 2, device=d), torch.ones(2, 2, device=d),
                            out=_empty((2, 2), torch.float64, d)),
         "Expected out tensor to have dtype float"),
        (lambda d: torch.clamp(torch.ones(3, device=d, dtype=torch.half), 0, 1,
                               out=_empty(3, torch.float32, d)),
         "Found dtype Float but expected Half"),
    ],
    ids=["neg_double", "neg_long", "complex", "aminmax", "nonzero", "mm", "clamp_half"],
)
def test_out_of_a_dtype_cpu_refuses(fn, message: str) -> None:
    _raises_like_cpu(fn, message)


def _halves(dtype, other, device):
    return torch.ones(2, dtype=dtype, device=device), torch.ones(2, dtype=other, device=device)


@pytest.mark.parametrize("op", [torch.complex, torch.polar], ids=["complex", "polar"])
@pytest.mark.parametrize(
    "fn, message",
    [
        (lambda op, d: op(*_halves(torch.float32, torch.float64, d)),
         "Expected object of scalar type Float but got scalar type Double for second argument"),
        (lambda op, d: op(*_halves(torch.float32, torch.float32, d),
                          out=_empty(2, torch.float32, d)),
         "Expected object of scalar type ComplexFloat but got scalar type Float for argument 'out'"),
        (lambda op, d: op(*_halves(torch.int64, torch.int64, d)),
         "Expected both inputs to be Half, Float or Double tensors but got Long and Long"),
    ],
    ids=["mixed_inputs", "real_out", "integer_inputs"],
)
def test_decomposed_op_raises_cpus_check(op, fn, message: str) -> None:
    # Both run PyTorch's Python refs on the device, whose checks are worded apart from CPU's
    # kernels' (and polar's check its out= dtype before its inputs').
    _raises_like_cpu(lambda d: fn(op, d), message)


@pytest.mark.parametrize("fn", [
    lambda d: torch.empty_strided((2, 3), (3,), device=d),
    lambda d: torch.ones(3, device=d).new_empty_strided((2, 3), (3,)),
], ids=["empty_strided", "new_empty_strided"])
def test_sizes_and_strides_of_different_lengths(fn) -> None:
    _raises_like_cpu(fn, "dimensionality of sizes (2) must match dimensionality of strides (1)")


@pytest.mark.parametrize("call", [
    lambda c: c < c, lambda c: c.ge(1), lambda c: c.max(), lambda c: c.amax(0), lambda c: c.argmax(),
    lambda c: c.sort(), lambda c: c.topk(1), lambda c: c.clamp(0, 1), lambda c: c.sign(),
    lambda c: c.floor(), lambda c: torch.maximum(c, c), lambda c: c.cummax(0), lambda c: c % 2,
    lambda c: c.median(), lambda c: c.kthvalue(1),
], ids=["lt", "ge_scalar", "max", "amax", "argmax", "sort", "topk", "clamp", "sign", "floor",
        "maximum", "cummax", "remainder", "median", "kthvalue"])
def test_complex_inputs_cpu_refuses_are_refused(call):
    # Ordering and rounding complex numbers: CPU refuses; the lowerings computed (comparing
    # real parts, or JAX's lexicographic order) before.
    for dtype in (torch.complex64, torch.complex128):
        c = torch.tensor([1 + 2j, -1j, 3.0], dtype=dtype)
        with pytest.raises(Exception) as on_cpu:
            call(c)
        with pytest.raises(type(on_cpu.value)) as on_device:
            call(c.to("neuron"))
        assert str(on_device.value) == str(on_cpu.value)


@pytest.mark.parametrize("call", [
    lambda d: torch.lerp(torch.ones(3, dtype=torch.int32, device=d), torch.zeros(3, dtype=torch.int32, device=d), 0.5),
    lambda d: torch.baddbmm(*(torch.ones(2, 2, 2, dtype=torch.bool, device=d),) * 3),
    lambda d: torch.cumsum(torch.ones(3, dtype=torch.bool, device=d), 0, dtype=torch.bool),
    lambda d: torch.nn.functional.logsigmoid(torch.ones(3, dtype=torch.int32, device=d)),
], ids=["lerp_int", "baddbmm_bool", "cumsum_to_bool", "logsigmoid_int"])
def test_integer_and_bool_inputs_cpu_has_no_kernel_for_are_refused(call):
    # test_ops test_dtypes: "lerp_kernel_scalar" not implemented for 'Int' and the like; the
    # lowerings (and decompositions) computed something before.
    with pytest.raises(NotImplementedError) as on_cpu:
        call("cpu")
    for _ in range(2):  # the first call, and one whose verdict is remembered
        with pytest.raises(NotImplementedError) as on_device:
            call("neuron")
        assert str(on_device.value) == str(on_cpu.value)
