"""`override`: a scoped replacement of a built-in op on the neuron device."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ..lowerings import overrides as _overrides
from ..lowerings.registry import Lowering, in_opmath
from ..runtime import dispatch
from ..runtime.plan import NEURON, forget_plans
from .kernels import flat_tensors


class _FunctionOverrides(TorchFunctionMode):
    """Routes calls of overridden PyTorch functions on neuron tensors to their replacement.
    A TorchFunctionMode: Dynamo traces through it and guards on it, so a compiled function
    is recompiled inside the scope and its earlier graph is used again outside."""

    def __init__(self, function: Callable, replacement: Callable) -> None:
        super().__init__()
        self.function = function
        self.replacement = replacement

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is self.function and _on_neuron(args, kwargs):
            result = self.replacement(*args, **kwargs)
            if result is not NotImplemented:
                return result
        return func(*args, **kwargs)


def _on_neuron(args: tuple, kwargs: dict) -> bool:
    for value in (*args, *kwargs.values()):
        for t in flat_tensors(value):
            if t.device.type == NEURON:
                return True
    return False


class override(contextlib.ContextDecorator):
    """Within its scope (a `with` block, or calls of a decorated function) use `fn` for `target`
    on neuron tensors, in eager mode and in graphs compiled with `backend="neuron"`.

    - `target` an ATen OpOverload (`torch.ops.aten._softmax.default`): `fn` is a JAX function
      taking the op's arguments as its lowering does (docs/LOWERINGS.md; the built-in
      lowering's promotion and static arguments apply), and replaces that lowering. The op's
      autograd formula stays PyTorch's.
    - `target` a PyTorch function (`torch.nn.functional.scaled_dot_product_attention`): `fn`
      takes the same arguments (torch tensors) and returns the result, typically from a
      `custom_op`, or `NotImplemented` to keep the built-in path for that call.

    Lowering overrides are process-wide while active; function overrides follow PyTorch's
    (per-thread) mode stack.
    """

    def __init__(self, target: Any, fn: Callable) -> None:
        self.target = target
        self.fn = fn
        self._active: list[Any] = []
        if isinstance(target, torch._ops.OpOverload):
            if torch._C._dispatch_has_kernel_for_dispatch_key(target.name(),
                                                              "CompositeImplicitAutograd"):
                raise TypeError(
                    f"torchneuron.library.override: {target} is CompositeImplicitAutograd: it "
                    "decomposes into other ops before reaching a lowering, so overriding its "
                    "lowering would change nothing. Override the PyTorch function instead, e.g. "
                    "override(torch.nn.functional.scaled_dot_product_attention, fn)"
                )
        elif isinstance(target, torch._ops.OpOverloadPacket):
            raise TypeError(f"torchneuron.library.override: name one overload of {target} "
                            f"(e.g. {target}.default)")
        elif not callable(target):
            raise TypeError(f"torchneuron.library.override: cannot override {target!r}")

    def __enter__(self) -> override:
        if isinstance(self.target, torch._ops.OpOverload):
            self._active.append(self._install_lowering())
        else:
            mode = _FunctionOverrides(self.target, self.fn)
            mode.__enter__()
            self._active.append(mode)
        return self

    def __exit__(self, *exc) -> None:
        state = self._active.pop()
        if isinstance(state, _FunctionOverrides):
            state.__exit__(*exc)
            return
        serial, library = state
        _overrides.remove(self.target, serial)
        forget_plans(self.target)
        if library is not None:
            library._destroy()

    def _install_lowering(self):
        op = self.target
        builtin = _overrides.builtin(op)
        if builtin is not None:
            # The user's function sees the arguments as the built-in lowering does (promotion,
            # static arguments, half precision computed in float32), without its PRNG key,
            # index check, contiguity flags or `only_when` limit: every call takes `fn`.
            fn = in_opmath(self.fn) if builtin.opmath else self.fn
            lowering = dataclasses.replace(builtin, fn=fn, rng=False, index_error=None,
                                           contiguity=(), only_when=None)
        else:
            lowering = Lowering(self.fn)
        serial = _overrides.install(op, lowering)
        forget_plans(op)
        library = None
        if not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "PrivateUse1"):
            # The op reaches the runtime through a composite kernel (or the boxed fallback): a
            # kernel of its own, for the scope, makes sure the runtime sees it.
            ns, name = op._schema.name.split("::")
            library = torch.library.Library(ns, "IMPL")
            overload_name = name + ("" if op._overloadname == "default" else "." + op._overloadname)

            def kernel(*args, **kwargs):
                return dispatch.dispatch_op(op, *args, **kwargs)

            library.impl(overload_name, kernel, "PrivateUse1")
        return serial, library
