"""torch.save / torch.load of neuron tensors and state_dicts, and printing them.

Loading onto the device (default map_location or "neuron") runs in a child process: if it
crashes the interpreter, that is reported as this test's failure instead of ending the run.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

N = torch.device("neuron")

DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
    torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex64, torch.complex128,
]


def sample(dtype: torch.dtype, n: int = 12) -> torch.Tensor:
    """CPU values that make bit-exactness matter: extremes, signed zero, inf, NaN payloads."""
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if dtype.is_floating_point:
        t = (torch.randn(n, generator=g, dtype=torch.float64) * 1e3).to(dtype)
        info = torch.finfo(dtype)
        t[:6] = torch.tensor([-0.0, float("inf"), float("-inf"), float("nan"), info.tiny, info.max]).to(dtype)
        return t
    if dtype.is_complex:
        real = torch.randn(n, 2, generator=g, dtype=torch.float64)
        real[0] = torch.tensor([-0.0, float("nan")])
        return torch.view_as_complex(real).to(dtype)
    info = torch.iinfo(dtype)
    t = torch.randint(max(info.min, -(2**40)), min(info.max, 2**40), (n,), generator=g, dtype=torch.int64).to(dtype)
    t[0], t[1] = info.min, info.max
    return t


def raw(t: torch.Tensor) -> bytes:
    """The exact bytes of a tensor's logical value (NaN payloads and -0.0 included)."""
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def save_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def load_bytes(data: bytes, **kwargs):
    return torch.load(io.BytesIO(data), **kwargs)


# ----------------------------------------------------------------------------------------
# In this process: saving, loading to CPU, printing


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_save_and_load_to_cpu_is_bit_exact_and_keeps_views_shared(dtype):
    base = sample(dtype)
    n = base.to(N)
    obj = {"full": n, "view": n[2:9], "strided": n[::3], "last": n[-1]}
    out = load_bytes(save_bytes(obj), map_location="cpu")
    for key in obj:
        assert out[key].device.type == "cpu"
        assert out[key].dtype == dtype and out[key].shape == obj[key].shape
        assert out[key].stride() == obj[key].stride()
        assert out[key].storage_offset() == obj[key].storage_offset()
        assert raw(out[key]) == raw(obj[key].cpu()), key
    assert raw(out["full"]) == raw(base)
    ptrs = {out[k].untyped_storage().data_ptr() for k in out}
    assert len(ptrs) == 1, "views must be saved once and restored sharing one storage"
    out["full"][2] = out["full"][5]
    assert raw(out["view"][0]) == raw(out["full"][2])


def test_save_records_the_neuron_location():
    n = torch.arange(6.0, device=N)
    seen = []

    def remember(storage, location):
        seen.append(location)
        return storage

    out = load_bytes(save_bytes(n), map_location=remember)
    assert seen == ["neuron:0"]
    assert torch.equal(out, torch.arange(6.0))


def test_state_dict_to_cpu_round_trip():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to(N)
    sd = model.state_dict()
    out = load_bytes(save_bytes(sd), map_location="cpu")
    assert list(out) == list(sd)
    for key, value in sd.items():
        assert out[key].device.type == "cpu" and out[key].dtype == value.dtype
        assert raw(out[key]) == raw(value), key
    cpu_model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    cpu_model.load_state_dict(out)
    assert torch.equal(cpu_model[0].weight, model[0].weight.cpu())


def test_save_to_a_file(tmp_path):
    path = tmp_path / "t.pt"
    n = sample(torch.float32).to(N)
    torch.save(n, path)
    assert raw(torch.load(path, map_location="cpu")) == raw(n)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_printing_a_neuron_tensor_matches_cpu_formatting(dtype):
    base = sample(dtype, 6)
    n = base.to(N)
    text = repr(n)
    assert "device='neuron:0'" in text
    assert str(n) == text
    assert _without_device(text) == _without_device(repr(base))
    big = torch.arange(2000, device=N).reshape(40, 50).to(dtype)
    assert _without_device(repr(big)) == _without_device(repr(big.cpu()))
    assert _without_device(repr(n[1:5:2])) == _without_device(repr(base[1:5:2]))


def _without_device(text: str) -> str:
    """A repr with the device field and line wrapping taken out (the suffix moves the wrap)."""
    return re.sub(r"\s+", "", text).replace(",device='neuron:0'", "")


def test_printing_keeps_grad_fn_and_requires_grad():
    leaf = torch.tensor([1.5, -2.0], device=N, requires_grad=True)
    assert repr(leaf) == "tensor([ 1.5000, -2.0000], device='neuron:0', requires_grad=True)"
    assert repr(leaf * 2) == "tensor([ 3., -4.], device='neuron:0', grad_fn=<MulBackward0>)"


# ----------------------------------------------------------------------------------------
# In a child process: loading onto the device


_LOAD_TO_DEVICE = """
    import io, json, sys
    import torch
    sys.path.insert(0, {here!r})
    from test_serialization import DTYPES, raw, sample


    def load(buf, map_location):
        return torch.load(buf) if map_location == "default" else \\
            torch.load(buf, map_location=eval(map_location))


    def check(map_location):
        failures = []
        for dtype in DTYPES:
            base = sample(dtype)
            n = base.to("neuron")
            buf = io.BytesIO()
            torch.save({{"full": n, "view": n[2:9], "strided": n[::3]}}, buf)
            buf.seek(0)
            out = load(buf, map_location)
            for key, ref in (("full", base), ("view", base[2:9]), ("strided", base[::3])):
                t = out[key]
                if t.device != torch.device("neuron", 0):
                    failures.append(f"{{dtype}} {{key}}: on {{t.device}}")
                elif t.dtype != dtype or t.shape != ref.shape or t.stride() != ref.stride():
                    failures.append(f"{{dtype}} {{key}}: {{t.dtype}} {{tuple(t.shape)}} {{t.stride()}}")
                elif raw(t) != raw(ref):
                    failures.append(f"{{dtype}} {{key}}: bytes differ")
            if len({{out[k].untyped_storage().data_ptr() for k in out}}) != 1:
                failures.append(f"{{dtype}}: views not restored sharing one storage")
            out["full"][2] = out["full"][5]
            if raw(out["view"][0]) != raw(out["full"][5]):
                failures.append(f"{{dtype}}: write through the restored base not seen by the view")

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("neuron")
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        buf.seek(0)
        sd = load(buf, map_location)
        clone = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("neuron")
        clone.load_state_dict(sd)
        for (k, a), b in zip(model.state_dict().items(), clone.state_dict().values()):
            if b.device.type != "neuron" or raw(a) != raw(b):
                failures.append(f"state_dict {{k}} differs")
        x = torch.randn(5, 4, device="neuron")
        model.eval(), clone.eval()
        if raw(model(x)) != raw(clone(x)):
            failures.append("reloaded model computes different outputs")
        return failures


    # the default map_location first, while nothing else has been loaded in this process
    print("FAILURES", json.dumps({{m: check(m) for m in {map_locations!r}}}))
"""

MAP_LOCATIONS = ["default", "'neuron'", "torch.device('neuron')", "'neuron:0'"]


@pytest.fixture(scope="module")
def loaded_in_child() -> dict[str, list[str]]:
    """Every map_location's failures, from one child process (one interpreter start, not four)."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = textwrap.dedent(_LOAD_TO_DEVICE).format(here=here, map_locations=MAP_LOCATIONS)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    if proc.returncode < 0:
        pytest.fail(
            f"torch.load onto the device killed the interpreter with signal "
            f"{-proc.returncode}; stderr tail:\n{proc.stderr[-2500:]}"
        )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.split("FAILURES", 1)[1])


@pytest.mark.parametrize("map_location", MAP_LOCATIONS)
def test_load_onto_the_device_round_trips(loaded_in_child, map_location):
    assert loaded_in_child[map_location] == []
