"""`custom_op`: a JAX function as a PyTorch operator, with its autograd and mutation glue."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from ..runtime import dispatch
from .kernels import (
    Signature,
    define_op,
    results_of,
    returns_of,
    split_schema,
    strip_mutation,
)


def _is_differentiable(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_floating_point() or value.is_complex()
    return value is not None and jnp.issubdtype(value.dtype, jnp.inexact)


def _slots(sig: Signature, values: list) -> list[tuple[int, int | None]]:
    """(argument index, list position or None) of each differentiable tensor input."""
    slots = []
    for i in sig.tensor_positions:
        value = values[i]
        if isinstance(value, list | tuple):
            slots.extend((i, j) for j, v in enumerate(value)
                         if v is not None and _is_differentiable(v))
        elif value is not None and _is_differentiable(value):
            slots.append((i, None))
    return slots


def _at(values: list, slot: tuple[int, int | None]) -> Any:
    i, j = slot
    return values[i] if j is None else values[i][j]


def _replaced(values: list, slots: list, new: Iterable) -> list:
    vals = [list(v) if isinstance(v, list | tuple) else v for v in values]
    for (i, j), value in zip(slots, new):
        if j is None:
            vals[i] = value
        else:
            vals[i][j] = value
    return vals


class CustomOp:
    """A PyTorch operator computed by a JAX function (see `custom_op`).

    Calling it calls `torch.ops.<ns>.<name>`; `opoverload` is that OpOverload (pass it to
    `torch.library.opcheck`), `jax_fn` the function itself (callable from other JAX code).
    """

    def __init__(self, qualname: str, fn: Callable, mutates_args: Iterable[str] | str,
                 schema: str | None) -> None:
        if isinstance(mutates_args, str):
            if mutates_args == "unknown":
                raise ValueError("torchneuron.library.custom_op: mutates_args must name the "
                                 "mutated arguments ('unknown' is not supported)")
            mutates_args = (mutates_args,)
        self.mutates_args = tuple(mutates_args)
        if schema is None:
            schema = torch.library.infer_schema(fn, mutates_args=self.mutates_args)
        self.qualname = qualname
        self.jax_fn = fn
        self.schema = schema
        self._def, self._sig = define_op(qualname, schema, fn, self.mutates_args)
        self.opoverload = self._def._opoverload
        self._backward: Callable | None = None
        self._differentiated = False
        self._libraries: list[torch.library.Library] = []
        if self.mutates_args:
            self._define_functional_twin()
        else:
            self._define_backward()
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", qualname.split("::")[1])

    def __call__(self, *args, **kwargs):
        return self.opoverload(*args, **kwargs)

    def __repr__(self) -> str:
        return f"torchneuron.library.CustomOp({self.qualname}{self.schema})"

    # -- mutation ------------------------------------------------------------------------
    def _define_functional_twin(self) -> None:
        """`<name>_functional`: the op without mutation, returning the new values after the
        outputs. A CompositeImplicitAutograd kernel of the mutating op calls it and copies the
        new values in: AOTAutograd's functionalization decomposes the mutating op through it,
        so a compiled graph holds the functional op plus input mutations it can lower. Eager
        calls keep their direct kernels (CPU, and neuron through the runtime, where the new
        values are written through views inside the op's one executable)."""
        sig = self._sig
        args_text, _ = split_schema(strip_mutation(self.schema))
        n_results = sig.num_outputs + len(sig.mutated)
        returns = "Tensor" if n_results == 1 else "(" + ", ".join(["Tensor"] * n_results) + ")"
        twin, _ = define_op(self.qualname + "_functional", f"({args_text}) -> {returns}",
                            self.jax_fn)
        self.functional = twin._opoverload
        n_outputs = sig.num_outputs
        functional = self.functional

        def decomposed(*args, **kwargs):
            values = sig.bind(args, kwargs)
            results = functional(*args, **kwargs)
            flat = list(results) if isinstance(results, tuple | list) else [results]
            for i, new in zip(sig.mutated, flat[n_outputs:]):
                values[i].copy_(new)
            return returns_of(flat[:n_outputs])

        ns, name = self.qualname.split("::")
        lib = torch.library.Library(ns, "FRAGMENT")
        lib.impl(name, decomposed, "CompositeImplicitAutograd")
        op = self.opoverload

        def neuron_kernel(*args, **kwargs):
            return dispatch.dispatch_op(op, *args, **kwargs)

        # A backend kernel of its own keeps the neuron device off the composite kernel.
        lib.impl(name, neuron_kernel, "PrivateUse1")
        self._libraries.append(lib)

    # -- autograd ------------------------------------------------------------------------
    def _define_backward(self) -> None:
        """`<name>_backward(saved_outputs, grad_outputs, *args)`: the gradient of every
        differentiable tensor input, from the backward given to `register_autograd` (called
        with the forward's outputs) or else from `jax.vjp` of the function (outputs not
        needed: it recomputes the forward)."""
        sig = self._sig
        args_text, _ = split_schema(strip_mutation(self.schema))
        for reserved in ("saved_outputs", "grad_outputs"):
            if reserved in sig.names:
                raise ValueError(f"torchneuron.library.custom_op({self.qualname!r}): the argument "
                                 f"name {reserved!r} is reserved")
        schema = "(Tensor[] saved_outputs, Tensor[] grad_outputs" + (
            f", {args_text}" if args_text else "") + ") -> Tensor[]"
        bwd_def, _ = define_op(self.qualname + "_backward", schema, self._jax_backward)
        self.backward_op = bwd_def._opoverload
        self._def.register_autograd(self._torch_backward, setup_context=self._setup_context)

    def register_autograd(self, backward: Callable) -> Callable:
        """Use `backward` (a JAX function) for this op's gradients instead of `jax.vjp`.

        It is called as `backward(*args, output=..., grad=...)`: the forward's arguments
        (arrays and Python values), its output(s) and the gradient(s) of the output(s)
        (single arrays for a one-output op, tuples otherwise), and returns one gradient per
        argument of the forward (None for non-tensor or non-differentiable arguments; a list
        for a Tensor[] argument). Usable as a decorator. Register it before the op is first
        differentiated."""
        if self.mutates_args:
            raise RuntimeError(f"{self.qualname} mutates {list(self.mutates_args)}: PyTorch "
                               "custom ops that mutate their inputs are not differentiable")
        if self._differentiated:
            raise RuntimeError(f"{self.qualname}: register_autograd must come before the op "
                               "is first differentiated (its backward is already traced)")
        for reserved in ("output", "grad"):
            if reserved in self._sig.names:
                raise ValueError(f"{self.qualname}: an argument named {reserved!r} clashes with "
                                 "the backward's keyword of that name")
        self._backward = backward
        return backward

    def _jax_backward(self, saved_outputs, grad_outputs, *args, **kwargs):
        sig = self._sig
        values = sig.bind(args, kwargs)
        slots = _slots(sig, values)
        if not slots:
            return []
        if self._backward is not None:
            grads = self._user_gradients(values, saved_outputs, grad_outputs)
        else:
            grads = self._vjp_gradients(values, slots, grad_outputs)
        result = []
        for slot, g in zip(slots, grads):
            x = _at(values, slot)
            if g is None:
                g = jnp.zeros_like(x)
            g = jnp.asarray(g)
            if g.shape != x.shape:
                raise RuntimeError(f"{self.qualname}: the backward returned a gradient of shape "
                                   f"{g.shape} for an argument of shape {x.shape}")
            result.append(g.astype(x.dtype))
        return result

    def _vjp_gradients(self, values: list, slots: list, grad_outputs: list) -> list:
        sig = self._sig

        def forward(*primals):
            return tuple(results_of(sig, sig.call(self.jax_fn, _replaced(values, slots, primals)),
                                  sig.num_outputs))

        try:
            outputs, pullback = jax.vjp(forward, *[_at(values, s) for s in slots])
            cotangents = []
            for out, g in zip(outputs, grad_outputs):
                if not jnp.issubdtype(out.dtype, jnp.inexact):
                    cotangents.append(np.zeros(out.shape, dtype=jax.dtypes.float0))
                elif g.shape != out.shape:  # a placeholder for an output without gradient
                    cotangents.append(jnp.zeros_like(out))
                else:
                    cotangents.append(jnp.conj(g.astype(out.dtype)))
            # PyTorch's complex gradients are the conjugates of JAX's cotangents (conj is
            # the identity on real arrays): torch grad = conj(vjp(conj(grad_output))).
            return [jnp.conj(g) for g in pullback(tuple(cotangents))]
        except Exception as err:
            raise RuntimeError(
                f"{self.qualname}: jax.vjp cannot differentiate its function "
                f"({type(err).__name__}: {err}); give the op a backward with "
                f"{self.__name__}.register_autograd"
            ) from err

    def _user_gradients(self, values: list, saved_outputs: list, grad_outputs: list) -> list:
        sig = self._sig
        pos, kw = sig.split(values)

        def structured(items):
            return items[0] if sig.num_outputs == 1 else tuple(items)

        raw = self._backward(*pos, **kw, output=structured(saved_outputs),
                             grad=structured(grad_outputs))
        if not isinstance(raw, tuple | list) or (len(sig.args) == 1 and not isinstance(raw, tuple)):
            raw = (raw,)
        if len(raw) != len(sig.args):
            raise RuntimeError(f"{self.qualname}: the backward returned {len(raw)} gradient(s); "
                               f"expected one per argument ({len(sig.args)}), None where there "
                               "is none")
        grads = []
        for slot in _slots(sig, values):
            i, j = slot
            g = raw[i]
            grads.append(g if j is None or g is None else g[j])
        return grads

    def _setup_context(self, ctx, inputs, output, keyword_only_inputs=None) -> None:
        sig = self._sig
        self._differentiated = True
        values = list(inputs) + [keyword_only_inputs[n] for n in sig.names[len(inputs):]] \
            if keyword_only_inputs else list(inputs)
        tensors, layout = [], []
        for i in sig.tensor_positions:
            value = values[i]
            if isinstance(value, list | tuple):
                layout.append((i, len(value)))
                tensors.extend(value)
            else:
                layout.append((i, None))
                tensors.append(value)
            values[i] = None
        outputs = list(output) if isinstance(output, tuple | list) else [output]
        keep_outputs = self._backward is not None
        ctx.save_for_backward(*tensors, *(outputs if keep_outputs else ()))
        ctx.tn_values, ctx.tn_layout, ctx.tn_count = values, layout, len(tensors)
        ctx.tn_num_inputs = len(inputs)

    def _torch_backward(self, ctx, *grads):
        sig = self._sig
        saved = ctx.saved_tensors
        tensors, outputs = saved[: ctx.tn_count], list(saved[ctx.tn_count:])
        values = list(ctx.tn_values)
        it = iter(tensors)
        for i, n in ctx.tn_layout:
            values[i] = next(it) if n is None else [next(it) for _ in range(n)]
        device = next(t for t in tensors if t is not None).device
        grad_list = [g if g is not None else torch.zeros((), device=device) for g in grads]
        pos, kw = sig.split(values)
        flat = iter(self.backward_op(outputs, grad_list, *pos, **kw))
        per_arg: list = [None] * len(sig.args)
        for i, j in _slots(sig, values):
            if j is None:
                per_arg[i] = next(flat)
            else:
                if per_arg[i] is None:
                    per_arg[i] = [None] * len(values[i])
                per_arg[i][j] = next(flat)
        return tuple(per_arg[: ctx.tn_num_inputs])


def custom_op(name: str, fn: Callable | None = None, *, mutates_args: Iterable[str] | str = (),
              schema: str | None = None) -> CustomOp | Callable[[Callable], CustomOp]:
    """Make a PyTorch operator `torch.ops.<ns>.<name>` from a function on `jax.Array`s.

    Used like `torch.library.custom_op`: `name` is `"ns::name"`; the schema comes from the
    function's torch type annotations (`torch.Tensor`, `float`, `int`, `bool`, lists,
    `Optional`) unless `schema` is given. Tensor arguments arrive as `jax.Array`s, the others
    as Python values (each distinct value compiles once). The function returns its declared
    outputs, then, JAX arrays being immutable, the new value of each argument in
    `mutates_args`, which the runtime writes back into the tensor (through views).
    """

    def make(function: Callable) -> CustomOp:
        return CustomOp(name, function, mutates_args, schema)

    return make if fn is None else make(fn)
