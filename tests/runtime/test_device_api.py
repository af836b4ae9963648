"""The `torch.neuron` module and the device's registration with PyTorch."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchneuron

N = torch.device("neuron")
MIB = 1 << 20


def test_availability_and_count():
    assert torch.neuron.is_available() is True
    assert torch.neuron.is_initialized() is True
    count = torch.neuron.device_count()
    assert isinstance(count, int) and count >= 1
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() >= 1


def test_current_device_and_set_device():
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device(0)
    torch.neuron.set_device("neuron:0")
    torch.neuron.set_device(torch.device("neuron", 0))
    assert torch.neuron.current_device() == 0
    bad = torch.neuron.device_count()
    with pytest.raises(RuntimeError, match=f"Invalid device ordinal neuron:{bad}"):
        torch.neuron.set_device(bad)
    with pytest.raises(RuntimeError, match="Invalid device ordinal"):
        torch.neuron.set_device(-1)
    with pytest.raises(ValueError, match="Expected a neuron device"):
        torch.neuron.set_device("cpu")
    assert torch.neuron.current_device() == 0  # a refused set_device changes nothing


def test_device_context_manager():
    with torch.neuron.device(0) as ctx:
        assert torch.neuron.current_device() == 0
        assert ctx.index == 0
        x = torch.ones(2, device=N)
    assert x.device == torch.device("neuron", 0)
    assert torch.neuron.current_device() == 0
    with pytest.raises(RuntimeError, match="Invalid device ordinal"):
        with torch.neuron.device(torch.neuron.device_count()):
            pass
    assert torch.neuron.current_device() == 0


def test_synchronize_waits_for_queued_work():
    x = torch.randn(256, 256, device=N)
    y = x @ x
    assert torch.neuron.synchronize() is None
    torch.neuron.synchronize(0)
    torch.neuron.synchronize(N)
    assert torch.allclose(y.cpu(), x.cpu() @ x.cpu(), rtol=1e-4, atol=1e-3)


def test_synchronize_waits_for_everything_launched_before_it():
    # Programs launch asynchronously; the device runs them in launch order, so waiting for
    # the latest result (a small, independent one) waits for the long one launched first.
    from torchneuron.runtime import fusion

    x = torch.randn(700, 700, device=N)
    torch.neuron.synchronize()
    big = x @ x @ x @ x
    fusion.flush()  # launched as a program of its own; nothing waits for it
    small = torch.ones(3, device=N) + 1
    torch.neuron.synchronize()  # waits for the latest result: small's
    assert big.untyped_storage()._neuron_payload.buf.is_ready()
    assert small.cpu().tolist() == [2.0, 2.0, 2.0]


_BACKWARD_THREAD = """
    import threading, torch, torchneuron
    x = torch.ones(3, device="neuron", requires_grad=True)
    seen = []
    x.register_hook(lambda grad: seen.append(threading.get_ident()))
    (x * 2).sum().backward()
    print("SAME_THREAD", seen == [threading.get_ident()], x.grad.cpu().tolist())
"""


@pytest.mark.parametrize("env,same", [({}, True), ({"TORCHNEURON_AUTOGRAD_DEVICE_THREAD": "1"}, False)])
def test_backward_runs_on_the_calling_thread(env, same):
    inherited = {k: v for k, v in os.environ.items() if k != "TORCHNEURON_AUTOGRAD_DEVICE_THREAD"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_BACKWARD_THREAD)],
                          env={**inherited, **env}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"SAME_THREAD {same} [2.0, 2.0, 2.0]" in proc.stdout


def test_device_name_and_properties():
    name = torch.neuron.get_device_name()
    assert isinstance(name, str) and name.startswith("neuron")
    assert torch.neuron.get_device_name(0) == name == torch.neuron.get_device_name(N)
    props = torch.neuron.get_device_properties(0)
    assert props.name == name
    assert isinstance(props.total_memory, int) and props.total_memory > 0
    assert props.platform == torchneuron.platform_name()
    with pytest.raises(RuntimeError, match="Invalid device ordinal"):
        torch.neuron.get_device_properties(torch.neuron.device_count())
    assert torch.neuron.get_device_capability() == (1, 0)


def test_bf16_and_amp_dtypes():
    assert torch.neuron.is_bf16_supported() is True
    assert torch.bfloat16 in torch.neuron.get_amp_supported_dtype()


def test_memory_figures_follow_allocations():
    gc.collect()
    before = torch.neuron.memory_allocated()
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == before
    x = torch.empty(MIB // 4, dtype=torch.float32, device=N)  # exactly 1 MiB
    during = torch.neuron.memory_allocated()
    assert during - before >= MIB
    assert torch.neuron.max_memory_allocated() >= during
    y = torch.ones(MIB // 4, dtype=torch.float32, device=N)  # a materialized one, too
    assert torch.neuron.memory_allocated() - before >= 2 * MIB
    peak = torch.neuron.max_memory_allocated()
    stats = torch.neuron.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.neuron.memory_allocated()
    assert stats["allocated_bytes.all.peak"] == peak
    assert stats["allocation.all.current"] >= 2
    del x, y
    gc.collect()
    after = torch.neuron.memory_allocated()
    assert after <= before, f"1+1 MiB freed, but memory_allocated went {before} -> {after}"
    assert torch.neuron.max_memory_allocated() == peak  # the peak stays until reset
    torch.neuron.empty_cache()
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == torch.neuron.memory_allocated()
    assert torch.neuron.memory_reserved() >= 0 and torch.neuron.max_memory_reserved() >= 0


def test_views_do_not_count_twice():
    gc.collect()
    before = torch.neuron.memory_allocated()
    x = torch.zeros(MIB // 4, device=N)
    views = [x[1:], x.view(512, 512), x[::2]]
    assert torch.neuron.memory_allocated() - before < 2 * MIB
    del x, views
    gc.collect()
    assert torch.neuron.memory_allocated() <= before


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, **env),
    )


def test_plain_import_torch_autoloads_the_device():
    proc = _run("import torch; print(torch.accelerator.current_accelerator())")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "neuron"


def test_autoload_can_be_turned_off():
    proc = _run(
        "import torch; print(torch.accelerator.current_accelerator()); "
        "print(torch._C._get_privateuse1_backend_name())",
        TORCH_DEVICE_BACKEND_AUTOLOAD="0",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "neuron" not in proc.stdout


def test_registration_is_idempotent():
    import importlib

    from torchneuron.runtime import device

    module = torch.neuron
    torchneuron._autoload()
    torchneuron._autoload()
    device.register()
    importlib.import_module("torchneuron")
    assert torch.neuron is module
    assert torch._C._get_privateuse1_backend_name() == "neuron"
    assert torch.randn(2, device=N).device.type == "neuron"
    assert (torch.ones(2, device=N) + 1).cpu().tolist() == [2.0, 2.0]


def test_importing_twice_in_a_fresh_process():
    code = (
        "import torch, importlib, torchneuron\n"
        "import torchneuron as again\n"
        "torchneuron._autoload(); torchneuron._autoload()\n"
        "importlib.reload(torchneuron)\n"
        "x = torch.arange(3.0, device='neuron') * 2\n"
        "x.requires_grad_(); (x * x).sum().backward()\n"
        "print(torch.accelerator.current_accelerator(), x.grad.cpu().tolist())\n"
    )
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "neuron [0.0, 4.0, 8.0]"


def test_tensor_methods_and_device_module_lookup():
    assert torch.get_device_module("neuron") is torch.neuron
    assert torch.ones(2).neuron().device.type == "neuron"
    assert torch.ones(2, device=N).is_neuron
    assert torch.device("neuron").type == "neuron"
