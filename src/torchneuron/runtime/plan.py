"""What is known about one ATen overload before any call, derived once from its schema and
its lowering record: the kinds of its arguments, what it writes, and the route its calls take.
"""

from __future__ import annotations

import collections
import enum
import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch._decomp

from ..lowerings import LOWERINGS, Lowering
from ..lowerings.registry import CPU_KERNEL_UNLESS, DECOMPOSITIONS
from . import _native

aten = torch.ops.aten
OpOverload = torch._ops.OpOverload

NEURON = "neuron"


class Route(enum.Enum):
    """The path a call takes on the neuron device (op counters and profiler records use it).
    Routes up to VIEW only touch metadata or run the runtime's own kernels."""

    HANDLER = 0  # a kernel of the runtime's own: allocation, copies, resize_, set_
    VIEW = 1  # metadata over the same storage, through the CPU kernel
    NATIVE = 2  # the op's lowering (its own or its functional twin's), one executable
    DECOMPOSED = 3  # computed from other ATen ops on the device
    FALLBACK = 4  # CPU's kernel on copies of the arguments

    @property
    def label(self) -> str:
        return self.name.lower()


# Route -> op name -> calls that took it (torchneuron.op_counts(), fallback_ops()).
COUNTS: dict[Route, collections.Counter[str]] = {route: collections.Counter() for route in Route}


class ArgKind(enum.IntEnum):
    """How an argument reaches an executable."""

    STATIC = 0  # a Python value in the cache key (ints, bools, lists, strings, dtypes)
    SCALAR = 1  # a traced number (Scalar and float arguments, unless the lowering wants them static)
    TENSOR = 2
    TENSOR_LIST = 3
    OPT_TENSOR_LIST = 4
    GENERATOR = 5  # its draw becomes an executable input


STATIC, SCALAR, TENSOR, TENSOR_LIST, OPT_TENSOR_LIST, GENERATOR = ArgKind

_KINDS = {
    "Tensor": TENSOR,
    "Optional[Tensor]": TENSOR,
    "List[Tensor]": TENSOR_LIST,
    "List[Optional[Tensor]]": OPT_TENSOR_LIST,
    "number": SCALAR,
    "Optional[number]": SCALAR,
    "float": SCALAR,
    "Optional[float]": SCALAR,
    "complex": SCALAR,
    "Generator": GENERATOR,
    "Optional[Generator]": GENERATOR,
}

# The runtime's own kernels (runtime/handlers.py registers them with `handles`).
HANDLERS: dict[OpOverload, Callable] = {}


def kernel_name(op: OpOverload) -> str:
    """The name torch.library registers a kernel of `op` under ("add.Tensor", "relu")."""
    name = op._schema.name.split("::")[1]
    return name if op._overloadname == "default" else f"{name}.{op._overloadname}"


def handles(*ops: OpOverload) -> Callable[[Callable], Callable]:
    """Register `fn` as the runtime's own kernel for each op in `ops`."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            HANDLERS[op] = fn
        return fn

    return register


def functional_overload(op: OpOverload) -> OpOverload | None:
    """`add_.Tensor` -> `add.Tensor`; `add.out` -> `add.Tensor` (matched by argument names)."""
    schema = op._schema
    name = schema.name.split("::")[-1]
    packet_name = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    packet = getattr(aten, packet_name, None)
    if packet is None:
        return None
    wanted = [(a.name, str(a.type)) for a in schema.arguments
              if not (a.kwarg_only and a.alias_info and a.alias_info.is_write)]
    if packet_name != name:  # in-place: the same overload name, unless its arguments differ
        same = getattr(packet, op._overloadname, None)
        if same is None or [(a.name, str(a.type)) for a in same._schema.arguments] == wanted:
            return same
        # pow_.Scalar is pow(Tensor, Scalar): pow.Tensor_Scalar, not pow.Scalar(Scalar, Tensor)
        return _overload_with_arguments(packet, op, wanted, exact=True) or same
    return _overload_with_arguments(packet, op, wanted)


def _overload_with_arguments(packet, op: OpOverload, wanted: list, exact: bool = False):
    """The overload of `packet` (not `op`, not writing) whose arguments are `wanted`: names
    and types, else (unless `exact`) names alone."""
    by_name = None
    for overload_name in packet.overloads():
        candidate = getattr(packet, overload_name)
        if candidate is op:
            continue
        cand_schema = candidate._schema
        if any(a.alias_info and a.alias_info.is_write for a in cand_schema.arguments):
            continue
        args = [(a.name, str(a.type)) for a in cand_schema.arguments]
        if args == wanted:  # names and types: clamp.Tensor_out -> clamp.Tensor, not clamp
            return candidate
        if not exact and by_name is None and [n for n, _ in args] == [n for n, _ in wanted]:
            by_name = candidate
    return by_name


def inplace_overload(op: OpOverload) -> OpOverload | None:
    """`add.Tensor` -> `add_.Tensor`, when it exists."""
    name = op._schema.name.split("::")[1]
    packet = getattr(aten, name + "_", None)
    if packet is None:
        return None
    return getattr(packet, op._overloadname, None)


def eager_lowering(op: OpOverload | None) -> Lowering | None:
    """The lowering eager mode runs for `op` (graph-only lowerings excluded)."""
    lowering = LOWERINGS.get(op)
    return None if lowering is None or lowering.graph_only else lowering


@functools.cache
def size_arguments(op: OpOverload) -> frozenset[str]:
    """The arguments of `op` that take sizes (`SymInt`, `SymInt[]`, `SymInt?` in its schema;
    the parsed argument types say `int` for them). An `int` argument is not a size."""
    text = str(op._schema)
    inside = text[text.index("(") + 1:text.rindex(") ->")]
    names = set()
    for declaration in inside.split(","):
        parts = declaration.strip().split("=")[0].split()
        if len(parts) >= 2 and parts[0].startswith("SymInt"):
            names.add(parts[1])
    return frozenset(names)


def is_default(value: Any, default: Any) -> bool:
    """Whether a traced argument's value is its schema default: same type and value (the
    sign of a zero included), so that the constant computes exactly what the input would."""
    if default is None or type(value) is not type(default) or value != default:
        return False
    return not isinstance(value, float) or math.copysign(1.0, value) == math.copysign(1.0, default)


class OpPlan:
    """What is known about one overload before any call: derived from its schema, cached."""

    def __init__(self, op: OpOverload) -> None:
        self.op = op
        self.name = str(op)
        schema = op._schema
        self.arguments = schema.arguments
        self.arg_names = [a.name for a in self.arguments]
        self.kinds = [_KINDS.get(str(a.type), STATIC) for a in self.arguments]
        self.defaults = [a.default_value if a.has_default_value() else None for a in self.arguments]
        self.num_positional = sum(1 for a in self.arguments if not a.kwarg_only)
        self.num_arguments = len(self.arguments)
        annotated = [i for i, a in enumerate(self.arguments) if a.alias_info and a.alias_info.is_write]
        self.out_args = [i for i in annotated if self.arguments[i].kwarg_only]
        self.out_names = frozenset(self.arg_names[i] for i in self.out_args)

        self.lowering = eager_lowering(op)
        self.functional: OpOverload | None = None
        if self.lowering is None and annotated:
            functional = functional_overload(op)
            if eager_lowering(functional) is not None:
                self.functional = functional
        # The lowering calls of this op run: its own, else its functional twin's (in-place and
        # out= variants are derived from the functional op).
        self.runs: Lowering | None = self.lowering or eager_lowering(self.functional)
        # Arguments the kernel writes although the schema does not say so come after the
        # annotated ones, in the order the lowering returns their values.
        unannotated = [self.arg_names.index(n) for n in self.runs.writes] if self.runs else []
        self.mutated = annotated + unannotated
        # Written tensors in the order a functional twin returns their values: outputs first.
        self.write_order = self.out_args + [i for i in self.mutated if i not in self.out_args]

        returns = schema.returns
        # Views and in-place metadata changes (`transpose_`, `as_strided_`) only touch
        # sizes/strides/offset: both run through the CPU kernel on the shared storage.
        self.is_view = (self.lowering is not None and self.lowering.aliases_input) or (
            torch.Tag.inplace_view in op.tags
        ) or (bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns))
        self.fresh_returns = [i for i, r in enumerate(returns) if r.alias_info is None]
        self.return_types = [str(r.type) for r in returns]
        self.returns_scalar = len(returns) == 1 and self.return_types[0] in (
            "int", "float", "bool", "number", "complex",
        )
        self.single_tensor_return = self.return_types == ["Tensor"] and self.fresh_returns == [0]

        project = DECOMPOSITIONS.get(op)
        self.project_decomposition: Callable | None = project.fn if project is not None else None
        decomposition = torch._decomp.decomposition_table.get(op)
        if self.out_args and decomposition is not None and (
            decomposition is torch._decomp.decomposition_table.get(functional_overload(op))
        ):
            # Registered for the out overload too, but without taking `out` (e.g.
            # reflection_pad1d_backward.grad_input): run it as the functional op's out variant.
            decomposition = None
        self.decomposition: Callable | None = self.project_decomposition or decomposition
        # Which calls the lowering serves (its `only_when`), or which calls of an overload
        # without a lowering must run CPU's kernel (registry.cpu_kernel_unless).
        self.only_when: Callable[[dict], bool] | None = CPU_KERNEL_UNLESS.get(op) or (
            self.runs.only_when if self.runs is not None else None
        )
        # When only_when's verdict follows from the signature (the fast path may then reuse
        # executables; runtime/fastpath.py).
        self.signature_decides: Callable[[dict], bool] | None = (
            self.runs.signature_decides
            if self.runs is not None and op not in CPU_KERNEL_UNLESS else None
        )
        # In-place/out= variants run the functional lowering: its static arguments (e.g.
        # vector_norm's `ord`) must reach it as Python values here too.
        if self.runs is not None:
            self.kinds = [
                STATIC if (k == SCALAR and n in self.runs.static) else k
                for k, n in zip(self.kinds, self.arg_names)
            ]
        # A traced argument passed at its schema default (`alpha=1` of add, sub and addmm) in a
        # call run by itself reaches the lowering as that constant instead of as an executable
        # input: one input less per call (~0.4 us of an add run by itself), and the same key
        # as leaving it out. Recorded calls keep it an input (signature._gather).
        self.scalar_defaults = tuple(d if k == SCALAR else None
                                     for k, d in zip(self.kinds, self.defaults))
        self.route = self._static_route()
        # Whether every call takes `route` (no per-call decision in dispatch.route_of).
        self.route_is_fixed = self.route in (Route.HANDLER, Route.VIEW) or (
            self.only_when is None and self.route is not Route.DECOMPOSED)
        self.cache: dict[tuple, Any] = {}  # signature -> executable (runtime/eager.py)

    def _static_route(self) -> Route:
        if self.op in HANDLERS:
            return Route.HANDLER
        if self.is_view:
            return Route.VIEW
        if self.runs is not None and (self.lowering is not None or self.project_decomposition is None):
            return Route.NATIVE
        if self.decomposition is not None or self.out_functional is not None:
            return Route.DECOMPOSED
        return Route.FALLBACK

    @functools.cached_property
    def out_functional(self) -> OpOverload | None:
        """For an out= overload: the functional op that computes it on the device (its
        result is then copied into `out`)."""
        if not self.out_args:
            return None
        functional = functional_overload(self.op)
        if functional is not None and (
            functional in LOWERINGS or functional in torch._decomp.decomposition_table
            or functional in DECOMPOSITIONS
        ):
            return functional
        return None

    def bind(self, args: tuple, kwargs: dict) -> list:
        """The call's values in schema order, defaults filled in."""
        values = list(args)
        if len(values) < self.num_arguments:
            for i in range(len(values), self.num_arguments):
                name = self.arg_names[i]
                values.append(kwargs[name] if name in kwargs else self.defaults[i])
        return values

    def split(self, values: list) -> tuple[list, dict]:
        n = self.num_positional
        return values[:n], dict(zip(self.arg_names[n:], values[n:]))

    def reusable(self, values: list) -> bool:
        """Whether every call with the signature of this call (bound `values`) takes the route
        it took, so that its executable may serve them unasked."""
        return self.only_when is None or (
            self.signature_decides is not None
            and bool(self.signature_decides(dict(zip(self.arg_names, values)))))

    def accepts(self, args: tuple, kwargs: dict) -> bool:
        """Whether `only_when` lets this call take the op's static route."""
        return self.only_when is None or bool(
            self.only_when(dict(zip(self.arg_names, self.bind(args, kwargs))))
        )


_PLANS: dict[OpOverload, OpPlan] = {}


def plan_for(op: OpOverload) -> OpPlan:
    plan = _PLANS.get(op)
    if plan is None:
        plan = _PLANS[op] = OpPlan(op)
    return plan


def forget_plans(op: OpOverload) -> None:
    """Drop the plans (and cached executables) of `op` and of its in-place/out= variants,
    after its lowering changed (torchneuron.library.override)."""
    names = (op._schema.name, op._schema.name + "_")
    for cached in [o for o in _PLANS if o._schema.name in names]:
        del _PLANS[cached]
    native = _native.fastpath()
    if native is not None:  # the C++ kernel's op descriptions and learned executables too
        native.forget()
