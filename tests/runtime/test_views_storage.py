"""Storages and views on the neuron device behave as PyTorch specifies (checked against CPU)."""

from __future__ import annotations

import pytest
import torch

DEV = "neuron"


def both(make):
    """The same construction on CPU and on neuron."""
    cpu = make("cpu")
    return cpu, make(DEV)


def test_fresh_tensor_has_real_storage_and_unique_address():
    a = torch.empty(10, device=DEV)
    b = torch.empty(10, device=DEV)
    assert a.untyped_storage().nbytes() == 40
    assert a.data_ptr() != 0 and b.data_ptr() != 0
    # address ranges of live storages never overlap
    lo_a, lo_b = a.data_ptr(), b.data_ptr()
    assert lo_a + 40 <= lo_b or lo_b + 40 <= lo_a
    assert a.device == torch.device("neuron:0")


@pytest.mark.parametrize(
    "view",
    [
        lambda t: t[1],
        lambda t: t[:, 1:3],
        lambda t: t.t(),
        lambda t: t.view(12),
        lambda t: t.reshape(2, 6),
        lambda t: t.unsqueeze(0).expand(2, 3, 4),
        lambda t: t[::2, ::3],
        lambda t: t.permute(1, 0)[1:],
        lambda t: t.narrow(1, 1, 2),
        lambda t: t.diagonal(),
        lambda t: t.as_strided((2, 2), (1, 4), 1),
        lambda t: t.unfold(1, 2, 1),
    ],
)
def test_view_metadata_matches_cpu(view):
    cpu, dev = both(lambda d: torch.arange(12.0, device=d).reshape(3, 4))
    vc, vd = view(cpu), view(dev)
    assert vd.shape == vc.shape
    assert vd.stride() == vc.stride()
    assert vd.storage_offset() == vc.storage_offset()
    assert vd.is_contiguous() == vc.is_contiguous()
    root = dev._base if dev._base is not None else dev
    assert vd._base is root
    assert vd.untyped_storage().data_ptr() == dev.untyped_storage().data_ptr()
    assert vd.data_ptr() - dev.data_ptr() == vc.data_ptr() - cpu.data_ptr()
    torch.testing.assert_close(vd.cpu(), vc)


def test_inplace_write_through_view_reaches_base_and_other_views():
    cpu, dev = both(lambda d: torch.zeros(4, 5, device=d))
    for t in (cpu, dev):
        col = t[:, 2]
        row = t[1]
        col.add_(3)
        row.mul_(2)
        t.t()[4].fill_(7)
        t[2:, 1:3] = torch.ones(2, 2, device=t.device) * 5
    torch.testing.assert_close(dev.cpu(), cpu)


def test_inplace_on_base_visible_in_views():
    base = torch.arange(6.0, device=DEV)
    view = base[2:5]
    base.mul_(10)
    torch.testing.assert_close(view.cpu(), torch.tensor([20.0, 30.0, 40.0]))


def test_out_resizes_like_cpu_and_warns_when_nonempty():
    x = torch.randn(3, 4)
    out_cpu = torch.empty(0)
    out_dev = torch.empty(0, device=DEV)
    torch.add(x, 1, out=out_cpu)
    torch.add(x.to(DEV), 1, out=out_dev)
    assert out_dev.shape == out_cpu.shape == (3, 4)
    torch.testing.assert_close(out_dev.cpu(), out_cpu)
    wrong = torch.empty(5, device=DEV)
    with pytest.warns(UserWarning, match="resized"):
        torch.add(x.to(DEV), 1, out=wrong)
    assert wrong.shape == (3, 4)
    torch.testing.assert_close(wrong.cpu(), x + 1)


def test_out_into_a_view_writes_through():
    base = torch.zeros(4, 4, device=DEV)
    torch.mul(torch.ones(4, device=DEV), 3, out=base[:, 1])
    expected = torch.zeros(4, 4)
    expected[:, 1] = 3
    torch.testing.assert_close(base.cpu(), expected)


def test_out_dtype_cast_error_like_cpu():
    x = torch.randn(3)
    with pytest.raises(RuntimeError) as cpu_err:
        torch.add(x, 1.5, out=torch.empty(3, dtype=torch.long))
    with pytest.raises(RuntimeError) as dev_err:
        torch.add(x.to(DEV), 1.5, out=torch.empty(3, dtype=torch.long, device=DEV))
    # PyTorch's meta kernel raises it on neuron, so the wording is PyTorch's own
    assert "cast" in str(dev_err.value) and "cast" in str(cpu_err.value)


def test_resize_keeps_prefix_and_grows():
    t = torch.arange(4.0, device=DEV)
    t.resize_(2, 3)
    assert t.shape == (2, 3)
    torch.testing.assert_close(t.cpu().view(-1)[:4], torch.arange(4.0))


def test_view_dtype_reinterprets_bytes():
    cpu = torch.tensor([1.0, -2.0, 0.5])
    dev = cpu.to(DEV)
    torch.testing.assert_close(dev.view(torch.int32).cpu(), cpu.view(torch.int32))
    torch.testing.assert_close(dev.view(torch.uint8).cpu(), cpu.view(torch.uint8))


def test_bool_view_of_bytes_above_one_reads_as_cpu_does():
    # test_ops test_non_standard_bool_values: a bool view of uint8 values 2..255 reached XLA
    # as predicates other than 0/1, and maximum/heaviside/fftshift gave other values than CPU.
    def run(device):
        raw = torch.tensor([0, 37, 1, 200, 0, 2], dtype=torch.uint8, device=device)
        flags = raw.view(torch.bool)
        other = torch.tensor([True, False, True, True, False, False], device=device)
        results = (torch.maximum(flags, other), flags & other, torch.heaviside(flags, other),
                   flags.sum(), torch.where(flags, 1.0, 0.0))
        kept = raw.clone()  # the bytes stay readable through the uint8 tensor
        return [r.cpu() for r in results] + [kept.cpu()]

    for cpu, dev in zip(run("cpu"), run(DEV)):
        torch.testing.assert_close(dev, cpu)


def test_complex_views():
    cpu = torch.randn(3, 2)
    dev = cpu.to(DEV)
    torch.testing.assert_close(torch.view_as_complex(dev).cpu(), torch.view_as_complex(cpu))
    z = torch.randn(4, dtype=torch.complex64)
    torch.testing.assert_close(torch.view_as_real(z.to(DEV)).cpu(), torch.view_as_real(z))


ALL_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128,
]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_copies_round_trip_every_dtype(dtype):
    if dtype.is_complex or dtype.is_floating_point:
        cpu = torch.randn(5, 3, dtype=dtype)
    elif dtype == torch.bool:
        cpu = torch.rand(5, 3) > 0.5
    else:
        info = torch.iinfo(dtype)
        cpu = torch.randint(info.min, info.max, (5, 3), dtype=dtype)
    dev = cpu.to(DEV)
    assert dev.dtype == dtype and dev.device.type == "neuron"
    assert torch.equal(dev.cpu(), cpu)
    # non-contiguous source, non_blocking, and copy_ both ways
    assert torch.equal(cpu.t().to(DEV, non_blocking=True).cpu(), cpu.t())
    target = torch.empty_like(cpu, device=DEV)
    target.copy_(cpu)
    back = torch.empty_like(cpu)
    back.copy_(target)
    assert torch.equal(back, cpu)
    # device-to-device copy into a view
    big = torch.zeros(5, 6, dtype=dtype, device=DEV)
    big[:, ::2].copy_(dev)
    expected = torch.zeros(5, 6, dtype=dtype)
    expected[:, ::2] = cpu
    assert torch.equal(big.cpu(), expected)


def test_copy_with_dtype_conversion_and_broadcast():
    src = torch.tensor([1.7, -2.2, 3.9])
    dst = torch.empty(2, 3, dtype=torch.int32, device=DEV)
    dst.copy_(src.to(DEV))
    torch.testing.assert_close(dst.cpu(), src.to(torch.int32).expand(2, 3))


def test_item_and_scalar_outputs():
    t = torch.tensor([[2.5]], device=DEV)
    assert t.item() == 2.5
    assert torch.tensor(True, device=DEV).item() is True
    with pytest.raises(RuntimeError, match="elements cannot be converted"):
        torch.ones(2, device=DEV).item()


def test_printing_a_neuron_tensor():
    text = repr(torch.arange(3.0, device=DEV))
    assert "device='neuron:0'" in text and "0., 1., 2." in text


def test_host_source_is_copied_not_aliased():
    host = torch.zeros(3)
    dev = host.to(DEV)
    target = torch.empty(3, device=DEV)
    target.copy_(host)
    host.add_(1)
    assert torch.equal(dev.cpu(), torch.zeros(3))
    assert torch.equal(target.cpu(), torch.zeros(3))


def test_accelerator_synchronize_and_storage_made_by_pytorch():
    from torchneuron.runtime import rng

    if not rng.native():
        pytest.fail(f"the C++ runtime library did not load: {rng.unavailable_reason()}")
    torch.ones(4, device=DEV).add_(1)
    torch.accelerator.synchronize()
    st = torch.UntypedStorage(16, device=DEV)
    assert st.nbytes() == 16 and st.device.type == "neuron"
    t = torch.empty(0, device=DEV).set_(st, 0, (4,), (1,))
    t.fill_(2.5)
    assert torch.equal(t.cpu(), torch.full((4,), 2.5))


def test_resize_past_the_storage_grows_it_for_every_view():
    # CPU grows the StorageImpl itself: the base (and any other view) sees the new size.
    cpu, dev = both(lambda d: torch.arange(4.0, device=d))
    for t in (cpu, dev):
        view = t[3:]
        view.resize_(3)
        view.fill_(7.0)
    assert dev.untyped_storage().nbytes() == cpu.untyped_storage().nbytes() == 24
    full_cpu = torch.empty(0).set_(cpu.untyped_storage())
    full_dev = torch.empty(0, device=DEV).set_(dev.untyped_storage())
    torch.testing.assert_close(full_dev.cpu(), full_cpu)


@pytest.mark.parametrize("memory_format", [None, torch.preserve_format, torch.contiguous_format,
                                           torch.channels_last])
@pytest.mark.parametrize("template", [
    lambda d: torch.empty(2, 3, 4, 5, device=d).to(memory_format=torch.channels_last),
    lambda d: torch.empty(2, 3, 4, 5, device=d),
    lambda d: torch.empty(3, 2, device=d).t(),
], ids=["channels_last", "contiguous", "transposed"])
def test_resize_as_memory_format(template, memory_format):
    results = []
    for device in ("cpu", DEV):
        t, other = torch.empty(3, device=device), template(device)
        try:
            t.resize_as_(other, memory_format=memory_format)
            results.append((tuple(t.shape), t.stride()))
        except RuntimeError as err:  # channels_last of a 2-d template: both refuse
            results.append(type(err))
    assert results[1] == results[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, torch.bfloat16, torch.complex64])
def test_dlpack_capsule_of_a_neuron_tensor_aliases_it(dtype):
    # The tensor torch.from_dlpack/torch.asarray wrap around a neuron capsule is a second
    # storage at the same synthetic address: it reads the original's values and writes
    # through either are seen by both, as on CUDA (they read zeros before h6).
    x = (torch.arange(25, device=DEV) * 3).to(dtype).reshape(5, 5)
    expected = x.cpu()
    y = torch.asarray(torch.utils.dlpack.to_dlpack(x), device=DEV)
    assert y.device == x.device and y.data_ptr() == x.data_ptr()
    assert torch.equal(y.cpu(), expected)
    y.add_(1)
    assert torch.equal(x.cpu(), expected + 1)
    x.mul_(2)
    assert torch.equal(y.cpu(), (expected + 1) * 2)
    z = torch.from_dlpack(torch.utils.dlpack.to_dlpack(x)).to(torch.float64)
    assert torch.equal(z.cpu(), ((expected + 1) * 2).to(torch.float64))


def test_dlpack_capsule_of_an_offset_view_raises_instead_of_reading_wrong_values():
    # A view starting inside its storage cannot share the storage's payload: refused at the
    # first read, never a copy that silently stops aliasing.
    x = torch.arange(10.0, device=DEV)
    y = torch.from_dlpack(torch.utils.dlpack.to_dlpack(x[2:]))
    for use in (lambda: y.cpu(), lambda: y + 1, lambda: y.add_(1)):
        with pytest.raises(RuntimeError, match="DLPack"):
            use()
    # memory from PyTorch's allocator for the device is still the device's own
    t = torch.empty(0, device=DEV).set_(torch.UntypedStorage(16, device=DEV))
    assert t.cpu().tolist() == [0.0] * 4


@pytest.mark.parametrize("native", [True, False], ids=["c_library", "python"])
def test_output_tensors_with_and_without_the_c_library(native, monkeypatch):
    # An executable's outputs (compiled graphs, the Python path) are made by the C++ library
    # where it is built: the same tensor, storage and accounting as the Python construction.
    import gc

    import jax.numpy as jnp

    from torchneuron.runtime import storage

    if native and storage._NATIVE is None:
        pytest.skip("the C++ library is not built here")
    # Payloads are the library's wherever it is built, whichever way the tensor is made.
    allocated = storage.memory_stats if storage._NATIVE is None else storage._NATIVE.memory_stats
    if not native:
        monkeypatch.setattr(storage, "_NATIVE", None)
    gc.collect()
    before = allocated()[0]
    t = storage.output_tensor((3, 2), (1, 3), 24, torch.float32,
                              jnp.arange(6, dtype=jnp.float32))
    assert t.device == torch.device("neuron:0") and t.dtype == torch.float32
    assert t.shape == (3, 2) and t.stride() == (1, 3) and t.storage_offset() == 0
    assert t.untyped_storage().nbytes() == 24 and t.data_ptr() != 0
    assert allocated()[0] - before == 24
    torch.testing.assert_close(t.cpu(), torch.arange(6.0).reshape(2, 3).t())
    t.add_(1)
    torch.testing.assert_close(t.cpu(), torch.arange(1.0, 7.0).reshape(2, 3).t())
    never_written = storage.output_tensor((4,), (1,), 16, torch.int32, None)
    assert torch.equal(never_written.cpu(), torch.zeros(4, dtype=torch.int32))
    del t, never_written
    gc.collect()
    assert allocated()[0] == before
