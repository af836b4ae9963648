"""`module.to("neuron")` and back keep shared parameters shared, with no setting.

The problem. `nn.Module._apply` (behind `.to`, `.cuda`, `.cpu`, `.half`, `.to_empty` and the
generated `.neuron()`) converts a module tree one module at a time. For the built-in dense
devices it assigns `param.data = converted` in place, so a Parameter held by two modules
(GPT-2's `wte.weight` and `lm_head.weight`) is still one object afterwards, with its hooks and
its place in optimizers built earlier. For a PrivateUse1 device
`torch._has_compatible_shallow_copy_type` is false (c10's list of dense backends has no
PrivateUse1, and C++ refuses `param.data = t` for the same reason), so `_apply` makes a new
Parameter per module: tied weights come apart silently, get two gradients and two optimizer
updates. PyTorch's swap mode (`torch.__future__.set_swap_module_params_on_conversion(True)`)
keeps identity, but it is process-wide and it also changes `load_state_dict`, which then fails
for `nn.LSTM`/`nn.GRU` (they hold weak references to their parameters) on every device.

What this module does. `install()` wraps `nn.Module._apply` once. The outermost call of a
conversion decides whether the conversion involves the neuron device: a parameter, gradient or
buffer of the tree is on neuron (`.cpu()`, `.to(dtype)`, `.half()` of a moved model), or the
conversion function puts the first tensor that `_apply` converts on neuron (`.to("neuron")`,
`.neuron()`, `.cuda()` under `torchneuron run`, `.to_empty(device="neuron")`). To learn the
target without converting anything twice, the wrapper converts that first tensor itself, in
`_apply`'s own order and grad mode, and hands the result back when `_apply` asks for it.

Only such a conversion runs in swap mode, for its duration (the flag is restored afterwards,
also on error): `torch.utils.swap_tensors` replaces each Parameter's contents in place, so
identity, `requires_grad` and `.grad` are kept. The wrapper then repairs what swap mode loses
or never did:

- parameter hooks (`register_hook`, `register_post_accumulate_grad_hook`): their C++ side lives
  on the swapped-out TensorImpl, so they are installed again from the Parameter's hook dicts
  (the handles they returned keep working);
- buffers shared by several modules: `_apply` converts a buffer once per module (on every
  device), which unties them; here a shared buffer is converted once and every module gets
  the same tensor, as before the move.

A conversion within the device (every tensor on neuron already: `.half()`, `.to(dtype)`,
`.to(memory_format=...)` of a moved model) needs no swap: PyTorch's `param.data = ...` works
between two neuron tensors, so it runs `_apply` as it is, shared buffers kept shared.

Every other conversion (CPU to CPU, any other device) runs PyTorch's `_apply` unchanged, and
`load_state_dict` never sees swap mode, so LSTM/GRU load as before. Swap mode's own limits
apply to neuron conversions: a Parameter that something holds a weak reference to, or that a
live autograd graph still uses (moving a model between forward and backward), cannot be
swapped, and `_apply` raises PyTorch's `RuntimeError("_apply(): Couldn't swap ...")`. The flag
is process-wide while a conversion runs, so a `load_state_dict` in another thread at that
moment would see swap mode.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

DEVICE_TYPE = "neuron"
_state = threading.local()
_UNSET = object()


def install() -> None:
    """Wrap `nn.Module._apply` (idempotent); see the module docstring."""
    original = nn.Module._apply
    if getattr(original, "_torchneuron_original", None) is not None:
        return

    @functools.wraps(original)
    def _apply(self: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True):
        if getattr(_state, "converting", False):
            return original(self, fn, recurse)
        _state.converting = True
        try:
            return _convert(original, self, fn, recurse)
        finally:
            _state.converting = False

    _apply._torchneuron_original = original  # type: ignore[attr-defined]
    nn.Module._apply = _apply  # type: ignore[method-assign]


def _convert(original: Callable, root: nn.Module, fn: Callable, recurse: bool) -> nn.Module:
    modules = list(root.modules()) if recurse else [root]
    first = _first_converted(root, recurse)
    if first is None:
        return original(root, fn, recurse)
    first_tensor, is_param = first
    on_neuron = [t.device.type == DEVICE_TYPE for t in _tensors(modules)]
    # _apply converts parameters under no_grad and buffers without it; so does the probe.
    with torch.no_grad() if is_param else contextlib.nullcontext():
        first_result = fn(first_tensor)
    to_neuron = isinstance(first_result, torch.Tensor) and first_result.device.type == DEVICE_TYPE
    if not any(on_neuron) and not to_neuron:
        return original(root, _handing_back(fn, first_tensor, first_result, {}), recurse)

    shared_buffers = _shared_buffers(modules)
    if all(on_neuron) and to_neuron:
        # Within the device (.to(dtype), .half(), .to(memory_format)): two neuron tensors
        # have compatible TensorImpls, so _apply's own `param.data = ...` keeps every
        # Parameter, its hooks and its .grad, also while an autograd graph uses it (where a
        # swap is refused).
        return original(root, _handing_back(fn, first_tensor, first_result, shared_buffers),
                        recurse)
    hooked = [p for p in _unique_parameters(modules) if _has_hooks(p)]
    # Swapping refuses a parameter that something else still references; an autograd graph
    # of an earlier forward that only the cycle collector frees is such a reference (seen
    # once in CI with nn.GRU): collect it first.
    gc.collect()
    previous = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        result = original(root, _handing_back(fn, first_tensor, first_result, shared_buffers), recurse)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(previous)
    for param in hooked:
        _reinstall_hooks(param)
    return result


def _handing_back(fn: Callable, first: torch.Tensor, first_result: Any, shared: dict) -> Callable:
    """`fn`, except that the probe's result is returned for the first call with `first`, and a
    shared buffer is converted once (`shared`: id -> the buffer, kept alive so ids stay unique)."""
    pending = [first_result]
    converted: dict[int, Any] = {}

    def convert(t: torch.Tensor) -> Any:
        key = id(t)
        if key in converted:
            return converted[key]
        if pending and t is first:
            out = pending.pop()
        else:
            out = fn(t)
        if key in shared:
            converted[key] = out
        return out

    return convert


def _first_converted(module: nn.Module, recurse: bool) -> tuple[torch.Tensor, bool] | None:
    """The first tensor `Module._apply` hands to its function: children first (depth first),
    then a module's parameters, then its buffers. (tensor, is_parameter), or None."""
    if recurse:
        for child in module.children():
            found = _first_converted(child, True)
            if found is not None:
                return found
    for param in module._parameters.values():
        if param is not None:
            return param, True
    for buf in module._buffers.values():
        if buf is not None:
            return buf, False
    return None


def _tensors(modules: list[nn.Module]) -> Iterator[torch.Tensor]:
    for module in modules:
        for param in module._parameters.values():
            if param is not None:
                yield param
                if param.grad is not None:
                    yield param.grad
        for buf in module._buffers.values():
            if buf is not None:
                yield buf


def _unique_parameters(modules: list[nn.Module]) -> list[nn.Parameter]:
    seen: dict[int, nn.Parameter] = {}
    for module in modules:
        for param in module._parameters.values():
            if param is not None:
                seen.setdefault(id(param), param)
    return list(seen.values())


def _shared_buffers(modules: list[nn.Module]) -> dict[int, torch.Tensor]:
    """Buffers that more than one module slot holds (id -> buffer)."""
    count: dict[int, int] = {}
    tensors: dict[int, torch.Tensor] = {}
    for module in modules:
        for buf in module._buffers.values():
            if buf is not None:
                count[id(buf)] = count.get(id(buf), 0) + 1
                tensors[id(buf)] = buf
    return {key: tensors[key] for key, n in count.items() if n > 1}


def _has_hooks(param: torch.Tensor) -> bool:
    return bool(param._backward_hooks) or bool(param._post_accumulate_grad_hooks)


def _reinstall_hooks(param: torch.Tensor) -> None:
    # Assigning the dicts registers their C++ hooks on the tensor's current TensorImpl.
    backward, post = param._backward_hooks, param._post_accumulate_grad_hooks
    if backward:
        param._backward_hooks = backward
    if post:
        param._post_accumulate_grad_hooks = post

