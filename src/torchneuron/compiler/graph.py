"""An AOTAutograd FX graph (core ATen) as one XLA executable, built from the eager lowerings.

The graph is interpreted once per input signature under `jax.jit` tracing: every node calls
the same lowering function eager mode uses (with the same type promotion and output casts), so
the two paths cannot drift apart. Executables are cached in memory per signature (a bounded
LRU) and on disk across processes.
"""

from __future__ import annotations

import collections
import hashlib
import operator
import os
import time
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import torch
import torch.fx
from jax.experimental import serialize_executable
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from .. import __version__
from ..lowerings import LOWERINGS
from ..lowerings.dtypes import to_jax_dtype
from ..lowerings.registry import index_exception
from ..runtime import dispatch, platform, rng, storage, views
from . import disk_cache
from .stats import bump

aten = torch.ops.aten


class LoweringError(RuntimeError):
    """A node of the graph has no lowering (or its lowering failed to trace)."""

    def __init__(self, node: torch.fx.Node, reason: str) -> None:
        super().__init__(f"{node.target}: {reason}")
        self.op_name = str(node.target)


_SYM_FUNCTIONS = {
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
    operator.mod, operator.neg, operator.pow, operator.eq, operator.ne, operator.lt,
    operator.le, operator.gt, operator.ge, operator.and_, operator.or_,
}


def _val(node_or_value: Any) -> Any:
    if isinstance(node_or_value, torch.fx.Node):
        return node_or_value.meta.get("val")
    return node_or_value


class GraphInterpreter:
    """Evaluates an FX graph on JAX values using the lowering table."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.nodes = list(gm.graph.nodes)
        self.placeholders = [n for n in self.nodes if n.op == "placeholder"]
        self.rng_nodes = [
            n for n in self.nodes
            if n.op == "call_function" and n.target in LOWERINGS and LOWERINGS[n.target].rng
        ]
        self._check_lowerable()

    def _check_lowerable(self) -> None:
        for node in self.nodes:
            if node.op == "call_function":
                target = node.target
                if target is operator.getitem or target in _SYM_FUNCTIONS:
                    continue
                if target in (aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default):
                    continue
                if target not in LOWERINGS:
                    raise LoweringError(node, "no lowering")
                if not LOWERINGS[target].jit:
                    raise LoweringError(node, "data-dependent output shape")
            elif node.op in ("call_module", "call_method"):
                raise LoweringError(node, f"unsupported FX node kind {node.op}")

    def run(self, placeholder_values: list, draws: list) -> tuple[list, Any]:
        env: dict[torch.fx.Node, Any] = {}
        checks = []
        for node, value in zip(self.placeholders, placeholder_values):
            env[node] = value
        draw_iter = iter(draws)

        def load(arg):
            return env[arg] if isinstance(arg, torch.fx.Node) else arg

        for node in self.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "get_attr":
                value = getattr(self.gm, node.target)
                env[node] = jnp.asarray(value.detach().cpu().numpy()) if isinstance(value, torch.Tensor) else value
                continue
            if node.op == "output":
                outputs = torch.fx.node.map_arg(node.args[0], load)
                return list(outputs), checks
            target = node.target
            args = list(torch.fx.node.map_arg(node.args, load))
            kwargs = dict(torch.fx.node.map_arg(node.kwargs, load))
            if target is operator.getitem or target in _SYM_FUNCTIONS:
                env[node] = target(*args)
                continue
            if target is aten.sym_size.int:
                env[node] = args[0].shape[args[1]]
                continue
            if target is aten.sym_numel.default:
                env[node] = int(args[0].size)
                continue
            if target is aten.sym_stride.int:
                env[node] = _val(node)
                continue
            env[node] = self._call(node, target, args, kwargs, draw_iter, checks)
        raise AssertionError("graph without output")

    def _call(self, node, target, args, kwargs, draw_iter, checks):
        lowering = LOWERINGS[target]
        if lowering.promote is not None:
            args, kwargs = _promote(node, lowering.promote, args, kwargs)
        if lowering.rng:
            kwargs["key"] = rng.fold_key(next(draw_iter))
        try:
            result = lowering.fn(*args, **kwargs)
        except LoweringError:
            raise
        except Exception as err:  # a lowering that cannot trace this call
            raise LoweringError(node, f"{type(err).__name__}: {err}") from err
        if lowering.index_error is not None:
            result, bad = result
            checks.append((bad, lowering.index_error))
        return _cast_like(result, _val(node))


def _promote(node, kind: str, args, kwargs):
    operands = []
    for arg in list(node.args) + list(node.kwargs.values()):
        val = _val(arg)
        if isinstance(val, torch.Tensor):
            operands.append(val)
        elif isinstance(val, bool | int | float | complex) and not isinstance(arg, torch.fx.Node):
            operands.append(val)
    tensor_operands = [o for o in operands if isinstance(o, torch.Tensor)]
    if not tensor_operands:
        return args, kwargs
    compute, _ = elementwise_dtypes(*operands, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND[kind])
    target = to_jax_dtype(compute)

    def cast(v):
        if isinstance(v, jax.Array | jax.core.Tracer) and getattr(v, "ndim", None) is not None:
            return v if v.dtype == target else v.astype(target)
        return v

    return [cast(a) for a in args], {k: cast(v) for k, v in kwargs.items()}


def _cast_like(result, meta):
    if isinstance(meta, torch.Tensor):
        if result is None:
            return None
        result = jnp.asarray(result)
        jdtype = to_jax_dtype(meta.dtype)
        return result if result.dtype == jdtype else result.astype(jdtype)
    if isinstance(meta, list | tuple) and isinstance(result, list | tuple):
        return type(result)(_cast_like(r, m) for r, m in zip(result, meta))
    return result


class CompiledGraph:
    """The callable handed back to AOTAutograd for one forward or backward graph."""

    def __init__(self, gm: torch.fx.GraphModule, options: dict[str, Any]) -> None:
        self.gm = gm
        self.options = options
        self.max_shapes = int(options.get("max_shapes", 16))
        self.strict = bool(options.get("strict", False))
        self.interpreter = GraphInterpreter(gm)  # raises LoweringError if not lowerable
        self.executables: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
        self.graph_digest = _graph_digest(gm)
        bump("graphs_compiled")

    def __call__(self, *args) -> list:
        key, inputs, tensor_slots = self._signature(args)
        entry = self.executables.get(key)
        if entry is None:
            entry = self._build(key, inputs, args)
        else:
            self.executables.move_to_end(key)
            bump("memory_cache_hits")
        executable, out_layouts, messages = entry
        draws = [rng.split_draw(rng.next_draw(None)) for _ in self.interpreter.rng_nodes]
        outputs, checks = executable(inputs, draws)
        for bad, message in zip(checks, messages):
            if bool(bad):
                raise index_exception(message)
        return self._wrap(outputs, out_layouts)

    # -- inputs ----------------------------------------------------------------------------
    def _signature(self, args: list):
        key = []
        inputs = []
        slots = []
        for value in args:
            if isinstance(value, torch.Tensor):
                key.append(dispatch._tensor_key_and_inputs(value, inputs))
                slots.append(True)
            else:
                # SymInt inputs arrive as Python ints: one executable per concrete value.
                key.append(("static", value if not isinstance(value, torch.SymInt) else int(value)))
                slots.append(False)
        return tuple(key), inputs, slots

    def _placeholder_values(self, key: tuple, inputs) -> list:
        values = []
        it = iter(inputs)
        for k in key:
            if k[0] == "static":
                values.append(k[1])
            elif k[0] == "host":
                values.append(jnp.asarray(next(it), to_jax_dtype(k[1])))
            elif k[0] == "number":
                values.append(next(it))
            else:
                buf = next(it)
                spec = k[1]
                offset = 0 if spec.mode == views.FULL else next(it)
                values.append(views.gather(buf, offset, spec))
        return values

    # -- building --------------------------------------------------------------------------
    def _build(self, key: tuple, inputs: list, args: list):
        start = time.perf_counter()
        out_nodes = self._output_metas()
        layouts: list = []
        messages: list = []

        def fn(inputs, draws):
            values = self._placeholder_values(key, inputs)
            outputs, checks = self.interpreter.run(values, draws)
            flat = []
            layouts.clear()
            for out, meta in zip(outputs, out_nodes):
                if isinstance(out, jax.Array | jax.core.Tracer) and hasattr(out, "shape"):
                    stride = _concrete_stride(meta, out.shape)
                    layouts.append(("tensor", _torch_dtype(meta, out), tuple(out.shape), stride))
                    flat.append(views.to_memory_order(out, stride))
                else:
                    layouts.append(("value", out))
                    flat.append(None)
            messages[:] = [message for _, message in checks]
            return flat, [bad for bad, _ in checks]

        jitted = jax.jit(fn)
        draws = [rng.split_draw((0, 0)) for _ in self.interpreter.rng_nodes]
        traced = jitted.trace(inputs, draws)
        lowered = traced.lower()
        disk_key = self._disk_key(key, lowered)
        executable = self._load_from_disk(disk_key)
        if executable is None:
            executable = lowered.compile()
            bump("xla_compilations")
            self._store_on_disk(disk_key, executable)
        entry = (executable, list(layouts), list(messages))
        self.executables[key] = entry
        while len(self.executables) > self.max_shapes:
            self.executables.popitem(last=False)
        bump("compile_seconds", time.perf_counter() - start)
        return entry

    def _output_metas(self) -> list:
        output = next(n for n in reversed(self.interpreter.nodes) if n.op == "output")
        return [_val(a) for a in output.args[0]]

    def _disk_key(self, key: tuple, lowered) -> str:
        text = lowered.as_text()
        h = hashlib.sha256()
        for part in (__version__, torch.__version__, jax.__version__, platform.platform_name(),
                     self.graph_digest, repr(key), text):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def _load_from_disk(self, disk_key: str):
        try:
            stored = disk_cache.load(disk_key)
        except Exception as err:  # corrupted or unreadable: ignore and rebuild
            bump("disk_cache_errors")
            warnings.warn(f"torchneuron: ignoring unreadable compile cache entry ({err})", stacklevel=2)
            disk_cache.discard(disk_key)
            return None
        if stored is None:
            return None
        try:
            payload, in_tree, out_tree = stored
            executable = serialize_executable.deserialize_and_load(
                payload, in_tree, out_tree, backend=platform.jax_device(0).client
            )
        except Exception as err:
            bump("disk_cache_errors")
            warnings.warn(f"torchneuron: ignoring unloadable compile cache entry ({err})", stacklevel=2)
            disk_cache.discard(disk_key)
            return None
        bump("disk_cache_hits")
        return executable

    def _store_on_disk(self, disk_key: str, executable) -> None:
        try:
            disk_cache.store(disk_key, serialize_executable.serialize(executable))
        except Exception as err:  # a full disk must not break training
            warnings.warn(f"torchneuron: could not write the compile cache ({err})", stacklevel=2)

    # -- outputs ---------------------------------------------------------------------------
    def _wrap(self, outputs: list, layouts: list) -> list:
        results = []
        for buf, layout in zip(outputs, layouts):
            if layout[0] == "value":
                results.append(layout[1])
                continue
            _, dtype, shape, stride = layout
            results.append(storage.new_tensor(shape, dtype, stride, buf))
        return results


def _torch_dtype(meta, out) -> torch.dtype:
    if isinstance(meta, torch.Tensor):
        return meta.dtype
    from ..lowerings.dtypes import to_torch_dtype

    return to_torch_dtype(out.dtype)


def _concrete_stride(meta, shape) -> tuple[int, ...]:
    if isinstance(meta, torch.Tensor):
        try:
            stride = tuple(int(s) for s in meta.stride())
        except (TypeError, ValueError, RuntimeError):  # symbolic strides
            stride = None
        if stride is not None and tuple(int(s) for s in meta.shape) == tuple(shape):
            if views.dense_permutation(tuple(shape), stride) is not None:
                return stride
    return storage.contiguous_strides(shape)


def _graph_digest(gm: torch.fx.GraphModule) -> str:
    h = hashlib.sha256(gm.code.encode())
    for name, buf in list(gm.named_buffers()) + list(gm.named_parameters()):
        h.update(name.encode())
        h.update(buf.detach().cpu().numpy().tobytes())
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, node.target)
            if isinstance(value, torch.Tensor):
                h.update(value.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def eager_graph(gm: torch.fx.GraphModule, reason: str, options: dict[str, Any]):
    """Run the graph op by op on the device (the fallback when it cannot be compiled)."""
    if options.get("strict") or os.environ.get("TORCHNEURON_STRICT", "0") not in ("", "0"):
        raise RuntimeError(f"torchneuron.compile: cannot lower the graph: {reason}")
    warnings.warn(
        f"torchneuron.compile: graph runs in eager mode on the device because {reason}",
        stacklevel=2,
    )
    bump("eager_fallbacks")

    def run(*args):
        out = gm(*args)
        return list(out) if isinstance(out, list | tuple) else [out]

    return run
