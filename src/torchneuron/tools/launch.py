"""Run an unmodified script with CUDA calls sent to another device (`neuron`, or `cpu`).

Used in-process by `torchneuron run` and `torchneuron ops SCRIPT`, and as a child process
(run by file path) by `torchneuron verify`. This file must not import torchneuron at module
level: verify's CPU run executes it with the neuron backend not loaded.

What is remapped (and nothing else; see docs/CLI.md):

- device arguments: a `device=` keyword of any torch function or Tensor method, and the
  positional device of `Tensor.to` / `Module.to`, when it is "cuda", "cuda:N",
  `torch.device("cuda"[, N])` (or, with `remap_neuron`, the same for "neuron");
- `Tensor.cuda()` / `Module.cuda()`, and `Tensor.is_cuda` (true on the target device);
- `torch.cuda`: availability, device count/index/name/properties, `device(...)`,
  `set_device`, `synchronize`, seeding and RNG state, memory queries and `empty_cache`,
  `is_bf16_supported`, and `torch.cuda.amp` (`autocast`, `GradScaler`, `custom_fwd/bwd`);
  any other `torch.cuda` name is the real one (streams, events, graphs, nvtx fail as on a
  machine without CUDA);
- `torch.autocast("cuda")`, `torch.amp.autocast("cuda")`, `torch.amp.GradScaler("cuda")`
  (also the default `GradScaler()`), `torch.set_default_device("cuda")`,
  `torch.load(map_location="cuda")`.

`Module.cuda()` keeps tied parameters tied without any switch: the runtime converts modules
to and from the neuron device with identity-preserving swaps (runtime/module_conversion.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import sys
import time
import types
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_CUDA = "cuda"


class Remap:
    """Maps CUDA (and optionally neuron) device specs to `target`."""

    def __init__(self, target: str, remap_neuron: bool = False) -> None:
        self.target = target
        self.sources = {_CUDA, "neuron"} if remap_neuron else {_CUDA}
        self.sources.discard(target)

    def device(self, value: Any) -> Any:
        if isinstance(value, str):
            kind, _, index = value.partition(":")
            if kind in self.sources:
                return self._make(int(index) if index else None)
            return value
        if isinstance(value, torch.device) and value.type in self.sources:
            return self._make(value.index)
        return value

    def index_device(self, value: Any) -> Any:
        """`.cuda(0)` / `set_device(0)` style: an int (or None) means a CUDA index."""
        if value is None:
            return self._make(None)
        if isinstance(value, int) and not isinstance(value, bool):
            return self._make(value)
        return self.device(value)

    def _make(self, index: int | None) -> torch.device:
        if self.target == "cpu" or index is None:
            return torch.device(self.target)
        return torch.device(self.target, index)


class _DeviceMode(TorchFunctionMode):
    def __init__(self, remap: Remap) -> None:
        super().__init__()
        self.remap = remap
        self.positional = {torch.Tensor.to, torch._C._nn._parse_to}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        remap = self.remap
        if func is torch.Tensor.cuda:
            tensor, *rest = args
            device = rest[0] if rest else kwargs.get("device")
            non_blocking = rest[1] if len(rest) > 1 else kwargs.get("non_blocking", False)
            return tensor.to(remap.index_device(device), non_blocking=non_blocking)
        if getattr(func, "__name__", "") == "__get__" and getattr(func, "__self__", None) is torch.Tensor.is_cuda:
            return args[0].device.type == remap.target
        if func in self.positional:
            args = tuple(remap.device(a) for a in args)
        if "device" in kwargs:
            kwargs = {**kwargs, "device": remap.device(kwargs["device"])}
        return func(*args, **kwargs)


def _cuda_module(remap: Remap, real: types.ModuleType) -> types.ModuleType:
    """A stand-in for `torch.cuda`: listed names act on the target device, the rest are real."""
    target = remap.target
    on_cpu = target == "cpu"
    dev_mod = None if on_cpu else getattr(torch, target)

    class CudaShim(types.ModuleType):
        def __getattr__(self, name):
            return getattr(real, name)

    shim = CudaShim("torch.cuda", f"torch.cuda remapped to {target} by torchneuron")
    shim.__file__ = getattr(real, "__file__", None)
    shim.__path__ = getattr(real, "__path__", [])  # submodules (torch.cuda.amp) still import

    def index_of(device: Any = None) -> int:
        d = remap.index_device(device)
        return d.index or 0 if isinstance(d, torch.device) else 0

    def forward(name: str, cpu_value: Any = None, with_device: bool = False):
        if on_cpu:
            return lambda *a, **k: cpu_value
        fn = getattr(dev_mod, name)
        if with_device:
            return lambda device=None, *a, **k: fn(index_of(device), *a, **k)
        return fn

    shim.is_available = lambda: True
    shim.is_initialized = lambda: True
    shim.init = lambda: None
    shim._lazy_init = lambda: None
    shim._is_in_bad_fork = lambda: False
    shim.device_count = (lambda: 1) if on_cpu else dev_mod.device_count
    shim.current_device = (lambda: 0) if on_cpu else dev_mod.current_device
    shim.set_device = (lambda d: None) if on_cpu else (lambda d: dev_mod.set_device(index_of(d)))
    shim.device = (
        (lambda d: contextlib.nullcontext()) if on_cpu else (lambda d: dev_mod.device(index_of(d)))
    )
    shim.synchronize = forward("synchronize", with_device=True)
    shim.get_device_name = (lambda d=None: "cpu") if on_cpu else (lambda d=None: dev_mod.get_device_name(index_of(d)))
    shim.get_device_properties = (
        (lambda d=None: None) if on_cpu else (lambda d=None: dev_mod.get_device_properties(index_of(d)))
    )
    shim.get_device_capability = (
        (lambda d=None: (0, 0)) if on_cpu else (lambda d=None: dev_mod.get_device_capability(index_of(d)))
    )
    shim.is_bf16_supported = lambda *a, **k: True
    for name in ("manual_seed", "manual_seed_all", "seed", "seed_all"):
        setattr(shim, name, forward(name))
    shim.initial_seed = (lambda: torch.initial_seed()) if on_cpu else dev_mod.initial_seed
    if on_cpu:
        shim.get_rng_state = lambda device=None: torch.get_rng_state()
        shim.set_rng_state = lambda state, device=None: None
        shim.get_rng_state_all = lambda: [torch.get_rng_state()]
        shim.set_rng_state_all = lambda states: None
    else:
        shim.get_rng_state = lambda device=target: dev_mod.get_rng_state(remap.index_device(device))
        shim.set_rng_state = lambda state, device=target: dev_mod.set_rng_state(state, remap.index_device(device))
        shim.get_rng_state_all = dev_mod.get_rng_state_all
        shim.set_rng_state_all = dev_mod.set_rng_state_all
    for name in (
        "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
        "reset_peak_memory_stats",
    ):
        setattr(shim, name, forward(name, cpu_value=0 if "reset" not in name else None))
    shim.reset_max_memory_allocated = shim.reset_peak_memory_stats
    shim.memory_stats = forward("memory_stats", cpu_value={})
    shim.empty_cache = forward("empty_cache")

    def mem_get_info(device=None):
        if on_cpu:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            return total, total
        total = dev_mod.get_device_properties(index_of(device)).total_memory
        return total - dev_mod.memory_allocated(), total

    shim.mem_get_info = mem_get_info

    import torch.cuda.amp as real_amp

    class AmpShim(types.ModuleType):
        def __getattr__(self, name):
            return getattr(real_amp, name)

    amp = AmpShim("torch.cuda.amp", f"torch.cuda.amp remapped to {target} by torchneuron")
    amp.__path__ = getattr(real_amp, "__path__", [])

    def amp_autocast(enabled=True, dtype=torch.float16, cache_enabled=True):
        return torch.amp.autocast(target, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    amp.autocast = amp_autocast
    amp.GradScaler = lambda *a, **k: torch.amp.GradScaler(target, *a, **k)
    amp.custom_fwd = lambda fwd=None, **k: torch.amp.custom_fwd(fwd, device_type=target, **k)
    amp.custom_bwd = lambda bwd=None: torch.amp.custom_bwd(bwd, device_type=target)
    shim.amp = amp
    return shim


_installed: dict[str, Any] | None = None


def install(target: str = "neuron", remap_neuron: bool = False) -> Remap:
    """Send CUDA calls in this process to `target` (see the module docstring)."""
    global _installed
    if _installed is not None:
        raise RuntimeError("torchneuron: the CUDA remapping is already installed")
    remap = Remap(target, remap_neuron)
    saved = {
        "torch.cuda": torch.cuda,
        "sys.cuda": sys.modules.get("torch.cuda"),
        "sys.amp": sys.modules.get("torch.cuda.amp"),
        "autocast": torch.autocast,
        "amp.autocast": torch.amp.autocast,
        "GradScaler": torch.amp.GradScaler,
        "set_default_device": torch.set_default_device,
        "load": torch.load,
    }
    real_autocast = torch.amp.autocast
    real_scaler = torch.amp.GradScaler

    class autocast(real_autocast):  # noqa: N801 - stands in for torch.autocast
        def __init__(self, device_type, *args, **kwargs):
            mapped = remap.device(device_type)
            super().__init__(mapped.type if isinstance(mapped, torch.device) else mapped, *args, **kwargs)

    class GradScaler(real_scaler):
        def __init__(self, device="cuda", *args, **kwargs):
            mapped = remap.device(device)
            super().__init__(mapped.type if isinstance(mapped, torch.device) else mapped, *args, **kwargs)

    real_set_default = torch.set_default_device
    real_load = torch.load

    def set_default_device(device):
        return real_set_default(remap.device(device))

    def load(*args, **kwargs):
        if "map_location" in kwargs:
            kwargs["map_location"] = remap.device(kwargs["map_location"])
        return real_load(*args, **kwargs)

    shim = _cuda_module(remap, torch.cuda)
    torch.cuda = shim
    sys.modules["torch.cuda"] = shim
    sys.modules["torch.cuda.amp"] = shim.amp
    torch.autocast = torch.amp.autocast = autocast
    torch.amp.GradScaler = GradScaler
    torch.set_default_device = set_default_device
    torch.load = load
    mode = _DeviceMode(remap)
    mode.__enter__()
    saved["mode"] = mode
    _installed = saved
    return remap


def uninstall() -> None:
    global _installed
    if _installed is None:
        return
    saved, _installed = _installed, None
    saved["mode"].__exit__(None, None, None)
    torch.cuda = saved["torch.cuda"]
    for key, name in (("sys.cuda", "torch.cuda"), ("sys.amp", "torch.cuda.amp")):
        if saved[key] is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = saved[key]
    torch.autocast = saved["autocast"]
    torch.amp.autocast = saved["amp.autocast"]
    torch.amp.GradScaler = saved["GradScaler"]
    torch.set_default_device = saved["set_default_device"]
    torch.load = saved["load"]


def run_script(script: str, args: list[str]) -> int:
    """Run `script` as __main__ with `args`; return its exit status."""
    path = os.path.abspath(script)
    old_argv = sys.argv
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(path))
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exit_:
        code = exit_.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    finally:
        sys.argv = old_argv
        if sys.path and sys.path[0] == os.path.dirname(path):
            sys.path.pop(0)
    return 0


def op_counts() -> dict[str, dict[str, int]] | None:
    """torchneuron's per-path op counts, or None if the backend is not loaded."""
    tn = sys.modules.get("torchneuron")
    return tn.op_counts() if tn is not None else None


def _child_main(argv: list[str]) -> int:
    """verify's child: `launch.py DEVICE RECORD_JSON CALL_EXPR SCRIPT ARGS...`."""
    target, record_path, call, script, *args = argv
    if target != "cpu":
        import torchneuron  # noqa: F401  (registers the device if autoload is off)
    install(target, remap_neuron=True)
    record: dict[str, Any] = {"device": target, "status": None, "returned": None}
    start = time.perf_counter()
    try:
        if call:
            sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
            namespace = runpy.run_path(os.path.abspath(script), run_name="__torchneuron_verify__")
            namespace["device"] = target
            sys.argv = [script, *args]
            value = eval(call, namespace)  # noqa: S307 - the user's own expression
            record["returned"] = _numbers(value)
            status = 0
        else:
            status = run_script(script, args)
    except BaseException as err:  # report, then fail
        import traceback

        traceback.print_exc()
        record["error"] = f"{type(err).__name__}: {err}"
        status = 1
    finally:
        sys.stdout.flush()
    record["status"] = status
    record["wall_s"] = time.perf_counter() - start
    record["op_counts"] = op_counts() if target != "cpu" else None
    with open(record_path, "w") as f:
        json.dump(record, f)
    return status


def _numbers(value: Any) -> list[float]:
    if isinstance(value, torch.Tensor):
        return [float(v) for v in value.detach().cpu().reshape(-1).tolist()]
    if isinstance(value, dict):
        for key in ("loss", "losses", "train_loss"):
            if key in value:
                return _numbers(value[key])
        raise TypeError(f"--call returned a dict without a 'loss'/'losses' key: {sorted(value)}")
    if isinstance(value, list | tuple):
        out = []
        for v in value:
            out.extend(_numbers(v))
        return out
    return [float(value)]


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
