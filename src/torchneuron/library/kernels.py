"""The kernels behind a JAX-function custom op, read from its schema.

Every op `torchneuron.library.custom_op` defines (and the `_functional`/`_backward` ops it adds)
gets three implementations of one function: its entry in the lowering table (eager neuron
calls and compiled graphs), a CPU kernel (the function under jax.jit on JAX's CPU client) and
a fake/meta kernel (`jax.eval_shape`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np
import torch

from ..lowerings.dtypes import to_jax_dtype, to_torch_dtype
from ..lowerings.registry import LOWERINGS, Lowering
from ..runtime.platform import platform_name

TENSOR, OPT_TENSOR, TENSOR_LIST, OTHER = range(4)
TENSOR_KINDS = {"Tensor": TENSOR, "Optional[Tensor]": OPT_TENSOR, "List[Tensor]": TENSOR_LIST}

# Platforms where Pallas compiles kernels; elsewhere (the CPU client, other PJRT plugins) it
# can only interpret them.
_PALLAS_COMPILED = {"cuda", "gpu", "rocm", "tpu"}
# The platform a kernel is being traced for (set while a custom op's function is traced).
_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("torchneuron_kernel_target",
                                                                   default=None)


def pallas_interpret() -> bool:
    """True when the kernel being traced runs on a client where Pallas must interpret it.

    Pass it as `pallas_call(..., interpret=pallas_interpret())`: a custom op's function is
    traced for the neuron device's platform (`torchneuron.platform_name()`) and, for CPU
    tensors, for JAX's CPU client; Pallas compiles kernels only for GPU and TPU clients."""
    target = _TARGET.get() or platform_name()
    return target not in _PALLAS_COMPILED


@contextlib.contextmanager
def _tracing_for(platform: str):
    token = _TARGET.set(platform)
    try:
        yield
    finally:
        _TARGET.reset(token)


# ----------------------------------------------------------------------------------------
# Schemas


@dataclasses.dataclass(frozen=True)
class _Arg:
    name: str
    kind: int
    kwarg_only: bool
    default: Any  # the schema default, or _REQUIRED
    mutated: bool


_REQUIRED = object()


class Signature:
    """One op's arguments and returns, read from its schema once."""

    def __init__(self, qualname: str, schema_text: str) -> None:
        self.qualname = qualname
        parsed = torch._C.parse_schema(qualname + schema_text)
        self.args = [
            _Arg(a.name, TENSOR_KINDS.get(str(a.type), OTHER), a.kwarg_only,
                 a.default_value if a.has_default_value() else _REQUIRED,
                 bool(a.alias_info and a.alias_info.is_write))
            for a in parsed.arguments
        ]
        self.names = [a.name for a in self.args]
        self.num_positional = sum(1 for a in self.args if not a.kwarg_only)
        self.mutated = [i for i, a in enumerate(self.args) if a.mutated]
        self.static_names = frozenset(a.name for a in self.args if a.kind == OTHER)
        self.tensor_positions = [i for i, a in enumerate(self.args) if a.kind != OTHER]
        returns = [str(r.type) for r in parsed.returns]
        # One Tensor[] return (the backward ops'): the function returns a list of arrays.
        self.returns_list = returns == ["List[Tensor]"] and not self.mutated
        if not self.returns_list and any(r != "Tensor" for r in returns):
            raise NotImplementedError(
                f"torchneuron.library.custom_op({qualname!r}): only Tensor outputs are "
                f"supported (schema returns {returns})"
            )
        self.num_outputs = len(returns)

    def bind(self, args: tuple | list, kwargs: dict) -> list:
        """The full argument list (schema order, defaults filled in)."""
        if len(args) > len(self.args):
            raise TypeError(f"{self.qualname}() takes {len(self.args)} arguments, got {len(args)}")
        values = list(args)
        for arg in self.args[len(values):]:
            if arg.name in kwargs:
                values.append(kwargs[arg.name])
            elif arg.default is not _REQUIRED:
                values.append(arg.default)
            else:
                raise TypeError(f"{self.qualname}() missing required argument {arg.name!r}")
        return values

    def split(self, values: list) -> tuple[list, dict]:
        n = self.num_positional
        return values[:n], dict(zip(self.names[n:], values[n:]))

    def call(self, fn: Callable, values: list) -> Any:
        pos, kw = self.split(values)
        return fn(*pos, **kw)


def strip_mutation(schema_text: str) -> str:
    """`(Tensor(a0!) x, float s)` -> `(Tensor x, float s)`."""
    return re.sub(r"Tensor\([a-z0-9]+!?\)", "Tensor", schema_text)


def split_schema(schema_text: str) -> tuple[str, str]:
    """`(args) -> returns` -> (`args`, `returns`)."""
    head, _, returns = schema_text.rpartition("->")
    head = head.strip()
    if not (head.startswith("(") and head.endswith(")")):
        raise ValueError(f"torchneuron.library: cannot read the schema {schema_text!r}")
    return head[1:-1].strip(), returns.strip()


def results_of(sig: Signature, raw: Any, expected: int) -> list:
    """A function's results as a list of `expected` values (outputs, then the new values of
    mutated arguments); for a Tensor[] return, the list's items."""
    if sig.returns_list:
        return list(raw)
    if expected == 1 and not isinstance(raw, tuple | list):
        return [raw]
    if isinstance(raw, tuple | list) and len(raw) == expected:
        return list(raw)
    got = len(raw) if isinstance(raw, tuple | list) else 1
    mutated = [sig.names[i] for i in sig.mutated]
    detail = f"{sig.num_outputs} declared output(s)"
    if mutated:
        detail += f", then the new value of each argument in mutates_args {mutated}"
    raise RuntimeError(f"{sig.qualname}: the function returned {got} value(s), expected "
                       f"{expected}: {detail}")


# ----------------------------------------------------------------------------------------
# The kernels every op gets: the lowering (neuron, compiled graphs), CPU, fake/meta


def _lowering_fn(sig: Signature, fn: Callable, expected: int) -> Callable:
    """The op's entry in the lowering table: called by the eager runtime (arguments as the
    schema names them, defaults filled) and by the graph interpreter (an FX node's arguments,
    where defaults may be left out)."""

    def lowering(*args, **kwargs):
        values = sig.bind(args, kwargs)
        with _tracing_for(platform_name()):
            flat = results_of(sig, sig.call(fn, values), expected)
        if sig.returns_list:
            return flat
        return flat[0] if len(flat) == 1 else tuple(flat)

    lowering.__name__ = lowering.__qualname__ = f"lowering_of_{sig.qualname.replace('::', '_')}"
    return lowering


def _hashable(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_hashable(v) for v in value)
    return value


def _host_array(t: torch.Tensor) -> jax.Array:
    """A CPU tensor as a jax.Array on JAX's CPU client (zero-copy when dlpack allows it)."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return jax.dlpack.from_dlpack(t.contiguous())


def _map_tensors(value: Any, fn: Callable) -> Any:
    if isinstance(value, torch.Tensor | jax.Array):
        return fn(value)
    if isinstance(value, list | tuple):
        return [_map_tensors(v, fn) for v in value]
    return value


def _cpu_kernel(sig: Signature, fn: Callable, expected: int) -> Callable:
    """The CPU implementation: the same function under jax.jit on JAX's CPU client."""
    executables: dict[tuple, Callable] = {}

    def kernel(*args, **kwargs):
        values = sig.bind(args, kwargs)
        key = tuple(_hashable(values[i]) for i, a in enumerate(sig.args) if a.kind == OTHER)
        jitted = executables.get(key)
        if jitted is None:
            # The non-tensor values (the cache key); tensors are not kept alive by the cache.
            frozen = [None if a.kind != OTHER else v for a, v in zip(sig.args, values)]

            def run(arrays):
                vals = list(frozen)
                for i, a in zip(sig.tensor_positions, arrays):
                    vals[i] = a
                return tuple(results_of(sig, sig.call(fn, vals), expected))

            jitted = executables[key] = jax.jit(run)
        inputs = [_map_tensors(values[i], _host_array) for i in sig.tensor_positions]
        with _tracing_for("cpu"):
            flat = jax.block_until_ready(jitted(inputs))
        taken = {t.data_ptr() for i in sig.tensor_positions
                 for t in flat_tensors(values[i]) if t.numel()}
        outputs = []
        for value in (flat if sig.returns_list else flat[: sig.num_outputs]):
            out = torch.from_dlpack(value)
            if out.numel() and out.data_ptr() in taken:  # a custom op's outputs never alias
                out = out.clone()
            taken.add(out.data_ptr())
            outputs.append(out)
        for i, new in zip(sig.mutated, flat[sig.num_outputs:]):
            values[i].copy_(torch.from_dlpack(new))  # through the view, as in-place ops write
        return outputs if sig.returns_list else returns_of(outputs)

    return kernel


def flat_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [v for v in value if isinstance(v, torch.Tensor)]
    return []


def returns_of(outputs: list) -> Any:
    if not outputs:
        return None
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _fake_kernel(sig: Signature, fn: Callable, expected: int) -> Callable:
    """The fake/meta implementation: output shapes and dtypes from `jax.eval_shape`."""

    def fake(*args, **kwargs):
        values = sig.bind(args, kwargs)
        reference = next((t for i in sig.tensor_positions for t in flat_tensors(values[i])), None)
        if reference is None:
            raise RuntimeError(f"{sig.qualname}: called without any tensor argument (its "
                               "outputs take the device of the first tensor argument)")
        with _tracing_for(platform_name()):
            shapes = _eval_shape(sig, fn, values, expected)
        if sig.returns_list:
            return [reference.new_empty(shape, dtype=dtype) for shape, dtype in shapes]
        outputs = [reference.new_empty(shape, dtype=dtype)
                   for shape, dtype in shapes[: sig.num_outputs]]
        return returns_of(outputs)

    return fake


def _eval_shape(sig: Signature, fn: Callable, values: list, expected: int) -> list:
    """[(shape, torch dtype)] of the function's results. Symbolic sizes (dynamic shapes) are
    followed with JAX's symbolic dimensions; when the function cannot be traced with them
    (Pallas block shapes must be static), they are specialized to their current values."""
    symbols: dict[str, torch.SymInt] = {}
    for i in sig.tensor_positions:
        for t in flat_tensors(values[i]):
            for d in t.shape:
                if isinstance(d, torch.SymInt) and d.node.maybe_as_int() is None:
                    symbols.setdefault(str(d.node.expr), d)

    def run(arrays):
        vals = list(values)
        for i, a in zip(sig.tensor_positions, arrays):
            vals[i] = a
        return tuple(results_of(sig, sig.call(fn, vals), expected))

    def structs(dims: dict[str, Any]):
        def struct(t):
            shape = tuple(dims.get(str(d.node.expr), d) if isinstance(d, torch.SymInt) else d
                          for d in t.shape)
            return jax.ShapeDtypeStruct(shape, to_jax_dtype(t.dtype))

        return [_map_tensors(values[i], struct) for i in sig.tensor_positions]

    if symbols:
        names = [f"d{n}" for n in range(len(symbols))]
        jax_dims = jax.export.symbolic_shape(", ".join(names))
        by_expr = dict(zip(symbols, jax_dims))
        env = dict(zip(names, symbols.values()))
        try:
            out = jax.eval_shape(run, structs(by_expr))
            return [(tuple(_concrete_dim(d, env) for d in o.shape), to_torch_dtype(o.dtype))
                    for o in out]
        except Exception:  # noqa: BLE001  (not traceable symbolically: specialize below)
            pass
    concrete = {expr: int(d) for expr, d in symbols.items()}  # int() guards on the value
    out = jax.eval_shape(run, structs(concrete))
    return [(tuple(int(d) for d in o.shape), to_torch_dtype(o.dtype)) for o in out]


# The functions JAX's dimension expressions print with (`floordiv(d0, 2)`, `max(d0, d1)`).
_DIM_FUNCTIONS = {"floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
                  "max": torch.sym_max, "min": torch.sym_min}


def _concrete_dim(d: Any, env: dict[str, torch.SymInt]) -> Any:
    """A JAX output dimension as an int or a SymInt expression of the input SymInts.

    Evaluated from its printed form: JAX's own evaluator calls `operator.index` on the
    values, which would specialize every SymInt to its current value."""
    if isinstance(d, int | np.integer):
        return int(d)
    return eval(str(d), {"__builtins__": {}, **_DIM_FUNCTIONS}, dict(env))  # noqa: S307


# ----------------------------------------------------------------------------------------
# Defining ops


def define_op(qualname: str, schema_text: str, fn: Callable, mutates_args: Iterable[str] = ()
            ) -> tuple[torch._library.custom_ops.CustomOpDef, Signature]:
    """A torch custom op computing `fn`: CPU kernel, fake kernel and lowering-table entry."""
    sig = Signature(qualname, schema_text)
    if not sig.tensor_positions:
        raise ValueError(
            f"torchneuron.library.custom_op({qualname!r}): the op needs a Tensor argument")
    for i in sig.mutated:
        if sig.args[i].kind != TENSOR:
            raise NotImplementedError(
                f"torchneuron.library.custom_op({qualname!r}): mutated argument "
                f"{sig.args[i].name!r} must be a (non-optional) Tensor"
            )
    expected = sig.num_outputs + len(sig.mutated)
    if expected == 0:
        raise ValueError(f"torchneuron.library.custom_op({qualname!r}): the op neither returns "
                         "nor mutates anything")
    op_def = torch.library.custom_op(qualname, _cpu_kernel(sig, fn, expected),
                                     mutates_args=tuple(mutates_args), device_types="cpu",
                                     schema=schema_text)
    op_def.register_fake(_fake_kernel(sig, fn, expected))
    overload = op_def._opoverload
    if overload in LOWERINGS:
        raise RuntimeError(f"torchneuron: two lowerings registered for {overload}")
    LOWERINGS[overload] = Lowering(_lowering_fn(sig, fn, expected), static=sig.static_names)
    return op_def, sig
