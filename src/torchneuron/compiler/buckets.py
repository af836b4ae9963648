"""Bucketed compilation: one XLA executable per bucket of sizes, not per shape.

XLA compiles for static shapes. A graph with symbolic sizes would otherwise compile once per
distinct input shape; here each dynamic size is rounded up to a bucket (`BucketRule`), the
inputs are padded to it, the bucket's executable runs (the true sizes are its runtime
inputs), and the outputs are cut back to their true size. compiler/padding.py proves, per
graph, that the true region of every output is exact, and says what the padding must hold
where it matters; a graph it cannot prove keeps one executable per shape.

Forward and backward graphs of one Dynamo graph are bucketed together (`BucketLink`): the
values the forward saves for the backward stay padded, and the backward reads their layout
from the forward's analysis.

The rule comes from `torch.compile(..., options={"buckets": ...})`, else from
`TORCHNEURON_BUCKETS` (docs/CONFIGURATION.md):

- `pow2` (default) or `pow2:MIN`: the next power of two, at least MIN;
- `multiple:N`: the next multiple of N;
- `sizes:A,B,C`: the smallest listed size that fits (a larger size is its own bucket);
- `off`: no bucketing (one executable per shape).
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import sympy
import torch
import torch.fx

from .. import config
from ..runtime import platform, storage, transfer
from . import padding
from .stats import bump, note_unbucketed

aten = torch.ops.aten


# ---------------------------------------------------------------------------------------
# The rule


@dataclass(frozen=True)
class BucketRule:
    """How a true size is rounded up to its bucket."""

    kind: str  # "pow2", "multiple", "sizes" or "off"
    minimum: int = 1
    multiple: int = 1
    sizes: tuple[int, ...] = ()

    @property
    def enabled(self) -> bool:
        return self.kind != "off"

    def bucket(self, n: int) -> int:
        if n <= 0:
            # An empty size stays empty: code branches on zero (`x[:, -k:]` keeps everything
            # at k == 0 and k items above), so a graph traced at 0 says nothing about 1.
            return n
        if self.kind == "pow2":
            return max(self.minimum, 1 << max(n - 1, 0).bit_length())
        if self.kind == "multiple":
            return -(-n // self.multiple) * self.multiple
        if self.kind == "sizes":
            for size in self.sizes:
                if size >= n:
                    return size
            return n
        return n

    def describe(self) -> str:
        if self.kind == "pow2":
            return "pow2" if self.minimum == 1 else f"pow2:{self.minimum}"
        if self.kind == "multiple":
            return f"multiple:{self.multiple}"
        if self.kind == "sizes":
            return "sizes:" + ",".join(map(str, self.sizes))
        return "off"


def parse_rule(spec: Any, source: str = "buckets") -> BucketRule:
    """A rule from its text (see the module docstring); `source` names the setting in errors."""
    if isinstance(spec, BucketRule):
        return spec
    if spec is False or spec is None:
        return BucketRule("off")
    if spec is True:
        return BucketRule("pow2")
    text = str(spec).strip().lower()
    try:
        if text in config.BUCKETS_OFF:
            return BucketRule("off")
        if text in ("pow2", "on", "1", "true", "yes"):
            return BucketRule("pow2")
        kind, _, arg = text.partition(":")
        if kind == "pow2":
            minimum = int(arg)
            if minimum < 1:
                raise ValueError
            return BucketRule("pow2", minimum=minimum)
        if kind == "multiple":
            multiple = int(arg)
            if multiple < 1:
                raise ValueError
            return BucketRule("multiple", multiple=multiple)
        if kind == "sizes":
            sizes = tuple(sorted({int(v) for v in arg.split(",") if v.strip()}))
            if not sizes or sizes[0] < 1:
                raise ValueError
            return BucketRule("sizes", sizes=sizes)
    except ValueError:
        pass
    raise ValueError(
        f"{source}={spec!r}: expected 'pow2', 'pow2:MIN', 'multiple:N', 'sizes:A,B,...' or 'off'"
    )


def rule_for(options: dict) -> BucketRule:
    """The rule a torch.compile call asked for (`options["buckets"]`), else the setting's."""
    if "buckets" in options:
        return parse_rule(options["buckets"], "torch.compile option 'buckets'")
    return parse_rule(config.raw("TORCHNEURON_BUCKETS"), "TORCHNEURON_BUCKETS")


# ---------------------------------------------------------------------------------------
# Forward and backward of one Dynamo graph


@dataclass
class BucketLink:
    """What the backward of a Dynamo graph needs to know of its forward: the bucketed size
    symbols, and the layout of each value the forward hands over (by node name), for each
    assignment of the graph's other symbols."""

    symbols: tuple | None = None
    outputs: dict = field(default_factory=dict)  # static items -> {name: (layout, zero)}
    user_layouts: list = field(default_factory=list)
    forward: Any = None  # the forward's GraphBucketing


# ---------------------------------------------------------------------------------------
# One graph


def _symbol_of(value) -> sympy.Symbol | None:
    if isinstance(value, torch.SymInt):
        e = sympy.sympify(value.node.expr)
        if e.is_Symbol:
            return e
    return None


def _hint(value) -> int | None:
    try:
        hint = value.node.hint
        return None if hint is None else int(hint)
    except (AttributeError, TypeError):
        return None


class GraphBucketing:
    """Bucketing for one forward, backward or inference graph: per call, the padded inputs,
    the true sizes and the cut outputs; at trace time, the rewrites the analysis asked for."""

    def __init__(self, gm: torch.fx.GraphModule, kind: str, rule: BucketRule,
                 link: BucketLink | None, user_outputs: int | None) -> None:
        self.gm = gm
        self.kind = kind
        self.rule = rule
        self.link = link
        if kind == "forward" and link is not None:
            link.forward = self
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
        self.output_nodes = list(output.args[0])
        self.user_outputs = len(self.output_nodes) if user_outputs is None else user_outputs
        # Symbolic sizes among the inputs and outputs, read now: any later int() of a fake
        # size (a lowering's predicate, a stride check) specializes the shape environment,
        # and the metadata would then show that one concrete value.
        self.input_sizes = {i: padding.expr_of(n.meta["val"]) for i, n in enumerate(self.placeholders)
                            if isinstance(n.meta.get("val"), torch.SymInt)}
        self.output_sizes = {i: padding.expr_of(n.meta["val"])
                             for i, n in enumerate(self.output_nodes)
                             if isinstance(n, torch.fx.Node)
                             and isinstance(n.meta.get("val"), torch.SymInt)}
        self.reason: str | None = None
        self._analyses: dict = {}
        self._symbols()
        self._bindings()

    # -- which symbols are bucketed, and where each call gives their true values ---------
    def _symbols(self) -> None:
        if self.kind == "backward":
            self.symbols = tuple(self.link.symbols) if self.link and self.link.symbols else ()
            return
        found: list = []
        for node in self.placeholders:
            meta = node.meta.get("val")
            for size in (meta.shape if isinstance(meta, torch.Tensor) else (meta,)):
                s = _symbol_of(size)
                if s is not None and s not in found:
                    found.append(s)
        self.symbols = tuple(sorted(found, key=lambda s: s.name))

    def _bindings(self) -> None:
        symbols = set(self.symbols)
        self.size_bindings: dict = {}  # symbol -> (placeholder index, dim or None)
        self.static_bindings: dict = {}  # other symbol -> placeholder index
        saved = self._saved_names()
        # Inputs that always arrive at their true size: the forward's, and the backward's
        # tangents (the forward's saved values may arrive padded).
        self.arrive_true = {i for i, node in enumerate(self.placeholders) if node.name not in saved}
        for i, node in enumerate(self.placeholders):
            meta = node.meta.get("val")
            s = _symbol_of(meta)
            if s is not None:
                if s in symbols:
                    self.size_bindings.setdefault(s, (i, None))
                else:
                    self.static_bindings.setdefault(s, (i, None))
        for i, node in enumerate(self.placeholders):
            meta = node.meta.get("val")
            if isinstance(meta, torch.Tensor):
                for d, size in enumerate(meta.shape):
                    s = _symbol_of(size)
                    if s in symbols:
                        if node.name not in saved:
                            self.size_bindings.setdefault(s, (i, d))
                    elif s is not None:  # never padded: any input has its true value
                        self.static_bindings.setdefault(s, (i, d))
        missing = [s for s in self.symbols if s not in self.size_bindings]
        if missing:
            self.reason = f"the true value of size {missing[0]} is not among the graph's inputs"

    def _saved_names(self) -> set:
        if self.kind != "backward" or self.link is None:
            return set()
        names: set = set()
        for outputs in self.link.outputs.values():
            names.update(outputs)
        return names

    @property
    def active(self) -> bool:
        return bool(self.symbols)

    def give_up(self, op: str, error: Exception | str) -> None:
        """Tracing a bucket's executable failed (a rewrite the lowering does not accept), or
        the backward cannot take padded values: this graph compiles per shape from now on,
        visibly."""
        if isinstance(error, Exception):
            error = f"tracing on padded inputs failed ({type(error).__name__}: {error})"
        self.reason = error
        self._analyses.clear()
        bump("bucketed_graphs", -1)
        note_unbucketed(f"{op}: {self.reason}")
        warnings.warn(
            f"torchneuron.compile: a graph with dynamic sizes compiles once per shape because "
            f"of {op}: {self.reason}",
            stacklevel=3,
        )

    # -- analysis ---------------------------------------------------------------------------
    def analysis(self, static: dict):
        """The analysis for this assignment of the non-bucketed symbols (cached), or the
        NotPadSafe that stops it."""
        key = tuple(sorted((s.name, v) for s, v in static.items()))
        if key not in self._analyses:
            self._analyses[key] = self._analyze(static, key)
        return self._analyses[key]

    def _analyze(self, static: dict, key: tuple):
        if self.reason is not None:
            return padding.NotPadSafe("graph", self.reason)
        try:
            inputs = self._input_layouts(key)
            result = padding.Analyzer(self.gm, self.symbols, static, inputs).run()
        except padding.NotPadSafe as err:
            return err
        except Exception as err:  # a bug of the analysis must not break the compile
            return padding.NotPadSafe("analysis", f"internal error ({type(err).__name__}: {err})")
        if self.kind == "forward" and self.link is not None:
            self.link.symbols = self.symbols
            self.link.outputs[key] = {
                node.name: (result.info[node].layout, result.info[node].zero)
                for node in self.output_nodes
                if isinstance(node, torch.fx.Node) and node in result.info
                and result.info[node].layout is not None
            }
            self.link.user_layouts = [
                result.info[node].layout for node in self.output_nodes[:self.user_outputs]
                if isinstance(node, torch.fx.Node) and node in result.info
                and result.info[node].layout is not None
            ]
        return result

    def _input_layouts(self, key: tuple) -> dict:
        """Placeholder -> (layout or None, zero dims or None) where the forward decides."""
        if self.kind != "backward":
            return {}
        link = self.link
        outputs = self._link_outputs(key)
        inputs = {}
        for node in self.placeholders:
            meta = node.meta.get("val")
            if not isinstance(meta, torch.Tensor):
                continue
            if node.name in outputs:
                inputs[node] = outputs[node.name]
            elif any(isinstance(s, torch.SymInt) and _symbol_of(s) is None for s in meta.shape):
                # A tangent with a flattened padded dim: its layout is its output's.
                shape = [padding.expr_of(s) for s in meta.shape]
                matches = {layout for layout in link.user_layouts
                           if len(layout) == len(shape)
                           and all(padding._same(padding.dim_size(d), e)
                                   for d, e in zip(layout, shape))}
                if len(matches) == 1:
                    inputs[node] = (next(iter(matches)), None)
        return inputs

    def _link_outputs(self, key: tuple) -> dict:
        return {} if self.link is None else self.link.outputs.get(key, {})

    # -- one call ---------------------------------------------------------------------------
    def true_and_static(self, args) -> tuple[dict, dict]:
        """This call's true value of each bucketed symbol, and of each other symbol."""
        true = {}
        for s, (i, d) in self.size_bindings.items():
            value = args[i] if d is None else args[i].shape[d]
            true[s] = int(value)
        static = {s: int(args[i] if d is None else args[i].shape[d])
                  for s, (i, d) in self.static_bindings.items()}
        return true, static

    def static_hints(self) -> dict:
        """The example value of each non-bucketed symbol, from the graph's fake inputs."""
        static = {}
        for s, (i, d) in self.static_bindings.items():
            meta = self.placeholders[i].meta.get("val")
            hint = _hint(meta if d is None else meta.shape[d])
            if hint is not None:
                static[s] = hint
        return static

    def keep_exact(self):
        """After a failed analysis: the first bucketed symbol whose padding the proof refused
        (a vocabulary or hidden size marked dynamic along with the length) becomes a
        per-shape size and the others stay bucketed. The new analysis, or None (unchanged)
        when no single symbol helps."""
        if self.kind == "backward" or len(self.symbols) < 2 or self.reason is not None:
            return None
        symbols = self.symbols
        for dropped in symbols:
            self.symbols = tuple(s for s in symbols if s != dropped)
            self._analyses.clear()
            self._bindings()
            analysis = self.analysis(self.static_hints())
            if not isinstance(analysis, padding.NotPadSafe) and self.reason is None:
                return analysis
        self.symbols = symbols
        self.reason = None
        self._analyses.clear()
        self._bindings()
        return None

    def prepare(self, args) -> Call | None:
        """The call's padded arguments and sizes, or None to run it as it is."""
        true, static = self.true_and_static(args)
        analysis = self.analysis(static)
        if isinstance(analysis, padding.NotPadSafe):
            return self._unpadded_call(args, true, static)
        padded = {s: self.rule.bucket(v) for s, v in true.items()}
        padded_env = {**padded, **{s: v for s, v in static.items()}}
        true_env = {**true, **static}
        new_args = list(args)
        jobs = []
        for i, node in enumerate(self.placeholders):
            meta = node.meta.get("val")
            if isinstance(meta, torch.Tensor):
                info = analysis.info.get(node)
                if info is None or not padding.padded_dims(info.layout):
                    continue
                arg = args[i]
                true_shape = _shape(info.layout, true_env)
                padded_shape = _shape(info.layout, padded_env)
                if tuple(arg.shape) == padded_shape:
                    if padded_shape != true_shape and i in self.arrive_true:
                        raise RuntimeError(
                            f"torchneuron.compile: input {node.name} arrived padded, but the "
                            "bucketed graph expected to pad it")
                    continue
                if tuple(arg.shape) != true_shape:
                    raise RuntimeError(
                        f"torchneuron.compile: input {node.name} has shape {tuple(arg.shape)}, "
                        f"expected {true_shape} (or {padded_shape} padded)")
                jobs.append((i, info.layout))
            elif i in self.input_sizes:
                new_args[i] = int(padding.evaluate(_subs(self.input_sizes[i], static), padded_env))
        if jobs:
            _pad_into(new_args, args, jobs, true_env, padded_env)
        return Call(self, analysis, new_args, true_env, padded_env, args)

    def _unpadded_call(self, args, true: dict, static: dict) -> Call | None:
        """A call this graph runs unbucketed: inputs the bucketed forward left padded are cut
        to their true size first (the layouts come from the forward's analysis)."""
        if self.kind != "backward" or self.link is None:
            return None
        key = tuple(sorted((s.name, v) for s, v in static.items()))
        outputs = self._link_outputs(key)
        if not outputs:
            return None
        if len(true) != len(self.symbols):
            raise RuntimeError(
                "torchneuron.compile: the backward of a bucketed graph cannot tell the true "
                f"sizes of its saved values ({self.reason})")
        true_env = {**true, **static}
        padded_env = {**{s: self.rule.bucket(v) for s, v in true.items()}, **static}
        new_args = list(args)
        jobs = []
        for i, node in enumerate(self.placeholders):
            if node.name not in outputs:
                continue
            layout = outputs[node.name][0]
            if not padding.padded_dims(layout):
                continue
            padded_shape = _shape(layout, padded_env)
            if tuple(args[i].shape) == padded_shape != _shape(layout, true_env):
                jobs.append((i, layout))
        if not jobs:
            return None
        _crop_into(new_args, args, jobs, true_env, padded_env)
        return Call(self, None, new_args, true_env, padded_env, args)


def _subs(e: sympy.Expr, static: dict) -> sympy.Expr:
    return e.xreplace({s: sympy.Integer(v) for s, v in static.items()}) if static else e


def _shape(layout, env: dict) -> tuple[int, ...]:
    return tuple(math.prod(int(padding.evaluate(f, env)) for f in dim) for dim in layout)


def _factor_sizes(layout, env: dict) -> tuple[int, ...]:
    return tuple(int(padding.evaluate(f, env)) for dim in layout for f in dim)


# ---------------------------------------------------------------------------------------
# Padding inputs and cutting outputs (host copies on the CPU platform, else small programs)


def _padded(xp, x, true_f: tuple, padded_f: tuple):
    """`x` (numpy or jax) padded from its true factor sizes to the padded ones, flat."""
    return xp.pad(x.reshape(true_f), [(0, p - t) for t, p in zip(true_f, padded_f)]).reshape(-1)


def _cropped(xp, x, padded_f: tuple, true_f: tuple):
    """`x` cut from its padded factor sizes to the true ones, flat (a copy)."""
    return x.reshape(padded_f)[tuple(slice(0, t) for t in true_f)].reshape(-1)


@functools.lru_cache(maxsize=256)
def _program(resize, specs: tuple):
    """One jitted program resizing each array by (from factor sizes, to factor sizes, shape)."""
    bump("bucket_adapter_compilations")
    return jax.jit(lambda arrays: [resize(jnp, x, a, b) for x, (a, b, _) in zip(arrays, specs)])


def _pad_into(new_args, args, jobs, true_env, padded_env) -> None:
    _resize_into(new_args, args, jobs, true_env, padded_env, _padded)


def _crop_into(new_args, args, jobs, true_env, padded_env) -> None:
    _resize_into(new_args, args, jobs, padded_env, true_env, _cropped)


def _resize_into(new_args, args, jobs, from_env, to_env, resize) -> None:
    """new_args[i] = args[i] laid out by `layout` at the sizes of `from_env`, padded or cut to
    those of `to_env`, for each (i, layout) of `jobs`: on the CPU platform as copies in host
    memory (a program per distinct set of shapes would compile for every new length, ~40 ms
    each, where the copies take microseconds), elsewhere in one program."""
    specs = tuple((_factor_sizes(layout, from_env), _factor_sizes(layout, to_env),
                   _shape(layout, to_env)) for _, layout in jobs)
    if platform.platform_name() == "cpu":
        device = platform.jax_device(0)
        # fresh numpy arrays, which nothing else holds: the device may alias them
        results = [jax.device_put(resize(np, transfer.logical_host_array(args[i]), a, b), device)
                   for (i, _), (a, b, _) in zip(jobs, specs)]
    else:
        results = _program(resize, specs)([transfer.logical_array(args[i]) for i, _ in jobs])
    for (i, _), flat, spec in zip(jobs, results, specs):
        new_args[i] = storage.new_tensor(spec[2], args[i].dtype, None, flat)


class Call:
    """One call of a bucketed graph: its padded arguments, its sizes (runtime inputs of the
    executable), the rewrites to install while tracing, and the outputs' cut."""

    def __init__(self, owner: GraphBucketing, analysis, args: list, true_env: dict,
                 padded_env: dict, original) -> None:
        self.owner = owner
        self.analysis = analysis
        self.args = args
        self.true_env = true_env
        self.padded_env = padded_env
        self.original = original
        symbols = owner.symbols
        if analysis is None:
            self.tag = None
            self.sizes = []
        else:
            self.tag = ("buckets",) + tuple(padded_env[s] for s in symbols)
            # weak-typed like Python ints, so that `x / count` keeps x's dtype
            self.sizes = [jnp.asarray(true_env[s]) for s in symbols]

    @contextlib.contextmanager
    def tracing(self, interpreter, sizes):
        """Install the analysis's rewrites on `interpreter` while it traces with `sizes`."""
        if self.analysis is None:
            yield
            return
        symbols = self.owner.symbols
        true = dict(zip(symbols, sizes))
        true.update({s: v for s, v in self.true_env.items() if s not in true})
        trace = padding.Trace(self.padded_env, true)

        def bind(action):
            return lambda args, kwargs, call: action(args, kwargs, call, trace)

        previous = interpreter.rules
        interpreter.rules = {node: bind(a) for node, a in self.analysis.actions.items()}
        try:
            yield
        finally:
            interpreter.rules = previous

    def finish(self, results: list) -> list:
        """The graph's outputs at their true sizes (the forward's values saved for the
        backward stay padded)."""
        if self.analysis is None:
            return results
        owner = self.owner
        static = {s: v for s, v in self.true_env.items() if s not in owner.symbols}
        results = list(results)
        jobs = []
        for i, node in enumerate(owner.output_nodes):
            if not isinstance(node, torch.fx.Node):
                continue
            if i in owner.output_sizes:
                results[i] = int(padding.evaluate(_subs(owner.output_sizes[i], static),
                                                  self.true_env))
                continue
            info = self.analysis.info.get(node)
            if info is None or info.layout is None or not padding.padded_dims(info.layout):
                continue
            if i >= owner.user_outputs or not isinstance(results[i], torch.Tensor):
                continue
            if tuple(results[i].shape) != _shape(info.layout, self.true_env):
                jobs.append((i, info.layout))
        if jobs:
            _crop_into(results, list(results), jobs, self.true_env, self.padded_env)
        bump("bucketed_calls")
        return results


def for_graph(gm: torch.fx.GraphModule, kind: str, options: dict, link: BucketLink | None,
              user_outputs: int | None = None) -> GraphBucketing | None:
    """The bucketing of a graph about to be compiled, or None when it has no dynamic sizes or
    bucketing is off. A graph the analysis cannot prove safe gets a GraphBucketing that runs
    every call unpadded (and cuts what a bucketed forward left padded)."""
    rule = rule_for(options)
    if not rule.enabled:
        return None
    bucketing = GraphBucketing(gm, kind, rule, link, user_outputs)
    if not bucketing.active:
        return None
    analysis = bucketing.analysis(bucketing.static_hints())
    if isinstance(analysis, padding.NotPadSafe):
        analysis = bucketing.keep_exact() or analysis
    forward = link.forward if link is not None else None
    if kind == "backward" and bucketing.reason is not None and forward is not None:
        # The backward cannot tell the true sizes of the values its forward would leave
        # padded: the forward runs per shape too (both are compiled before the first call).
        forward.give_up("its backward", bucketing.reason)
        link.outputs.clear()
        return None
    if isinstance(analysis, padding.NotPadSafe):
        note_unbucketed(f"{analysis.op}: {analysis.reason}")
        warnings.warn(
            f"torchneuron.compile: a graph with dynamic sizes compiles once per shape because "
            f"{analysis.op} is not proven exact on padded inputs ({analysis.reason})",
            stacklevel=3,
        )
    else:
        bump("bucketed_graphs")
    return bucketing


def unpadded(run, bucketing: GraphBucketing | None):
    """`run` (a graph run op by op) behind the cut of inputs a bucketed forward left padded."""
    if bucketing is None:
        return run

    def call(*args):
        prepared = bucketing._unpadded_call(args, *bucketing.true_and_static(args))
        return run(*(args if prepared is None else prepared.args))

    return call
