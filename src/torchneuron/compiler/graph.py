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
import time
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.fx
from jax.experimental import serialize_executable
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from .. import __version__, config
from ..lowerings import LOWERINGS
from ..lowerings.dtypes import to_jax_dtype
from ..lowerings.registry import LIMITS, index_exception, lowering_applies
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


def _arg_val(node: torch.fx.Node, target, name: str) -> Any:
    """The traced value (meta) of argument `name` of a call node."""
    index = [a.name for a in target._schema.arguments].index(name)
    arg = node.args[index] if index < len(node.args) else node.kwargs[name]
    return _val(arg)


def _example(value):
    """An argument as a lowering's predicate sees it: a node stands for its example value
    (a fake tensor with dtype, shape and strides)."""
    if isinstance(value, torch.fx.Node):
        return value.meta.get("val", value)
    if isinstance(value, list | tuple):
        return type(value)(_example(v) for v in value)
    return value


def _call_arguments(node: torch.fx.Node) -> dict:
    """{schema argument name: example value} of a call node (defaults filled in)."""
    values = {}
    for i, a in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            values[a.name] = _example(node.args[i])
        elif a.name in node.kwargs:
            values[a.name] = _example(node.kwargs[a.name])
        else:
            values[a.name] = a.default_value if a.has_default_value() else None
    return values


class GraphInterpreter:
    """Evaluates an FX graph on JAX values using the lowering table."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.nodes = list(gm.graph.nodes)
        self.placeholders = [n for n in self.nodes if n.op == "placeholder"]
        slot = {node: i for i, node in enumerate(self.placeholders)}
        # Input mutations AOTAutograd keeps in the graph (keep_inference_input_mutations):
        # `copy_(placeholder, value)`. Placeholder index -> node, in graph order.
        self.mutations = {
            slot[n.args[0]]: n for n in self.nodes
            if n.op == "call_function" and n.target is aten.copy_.default and n.args[0] in slot
        }
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
                if target in _GRAPH_ONLY:
                    continue
                if target is aten.copy_.default:
                    if node.args[0] not in self.placeholders:
                        raise LoweringError(node, "copy_ into an intermediate value")
                    continue
                if _is_foreach(target):
                    if _foreach_base(target) is None:
                        raise LoweringError(node, "no lowering")
                    continue
                if target not in LOWERINGS:
                    raise LoweringError(node, "no lowering")
                if not LOWERINGS[target].jit:
                    raise LoweringError(node, "data-dependent output shape")
                if target in LIMITS and not lowering_applies(target, _call_arguments(node)):
                    raise LoweringError(node, "this mode of the op is not lowered")
            elif node.op in ("call_module", "call_method"):
                raise LoweringError(node, f"unsupported FX node kind {node.op}")

    def run(self, placeholder_values: list, draws: list, mutated: dict | None = None):
        """Outputs and index checks; `mutated` (when given) receives placeholder index -> the
        value the graph copies into that input."""
        env: dict[torch.fx.Node, Any] = {}
        checks = []
        slot = {node: i for i, node in enumerate(self.placeholders)}
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
            if target in _GRAPH_ONLY:
                env[node] = _GRAPH_ONLY[target](node, *args, **kwargs)
                continue
            if target is aten.copy_.default:
                dst_node, value = node.args[0], args[1]
                meta = _val(dst_node)
                value = jnp.broadcast_to(jnp.asarray(value).astype(to_jax_dtype(meta.dtype)),
                                         jnp.shape(args[0]))
                env[node] = env[dst_node] = value
                if mutated is not None:
                    mutated[slot[dst_node]] = value
                continue
            if _is_foreach(target):
                env[node] = self._foreach(node, target, args, kwargs)
                continue
            env[node] = self._call(node, target, args, kwargs, draw_iter, checks)
        raise AssertionError("graph without output")

    def _foreach(self, node, target, args, kwargs):
        """A `_foreach_*` op (compiled optimizers): the per-tensor lowering, once per element."""
        base = _foreach_base(target)
        lowering = LOWERINGS[base]
        lists = [i for i, a in enumerate(node.args) if isinstance(a, list | tuple)]
        count = len(args[lists[0]])
        metas = _val(node)
        results = []
        for i in range(count):
            elem_args = [args[j][i] if j in lists else args[j] for j in range(len(args))]
            elem_nodes = [node.args[j][i] if j in lists else node.args[j] for j in range(len(args))]
            elem_kwargs = dict(kwargs)
            if base._overloadpacket in (aten.addcmul, aten.addcdiv) and len(elem_args) == 4:
                elem_kwargs["value"] = elem_args.pop()
                elem_nodes.pop()
            if lowering.promote is not None:
                operands = _promotion_operands(elem_nodes)
                elem_args, elem_kwargs = _promote_operands(operands, lowering.promote, elem_args,
                                                           elem_kwargs)
            try:
                result = lowering.fn(*elem_args, **elem_kwargs)
            except Exception as err:
                raise LoweringError(node, f"{type(err).__name__}: {err}") from err
            meta = metas[i] if isinstance(metas, list | tuple) else None
            results.append(_cast_like(result, meta))
        return results

    def _call(self, node, target, args, kwargs, draw_iter, checks):
        lowering = LOWERINGS[target]
        if lowering.promote is not None:
            args, kwargs = _promote(node, lowering.promote, args, kwargs)
        if lowering.rng:
            kwargs["key"] = rng.fold_key(next(draw_iter))
        for name in lowering.contiguity:
            kwargs[f"{name}_contiguous"] = _arg_val(node, target, name).is_contiguous()
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


def _full_like(node, x, fill_value, **_):
    # Shape from the traced input, dtype from the node's meta (its dtype= and layout kwargs
    # are already resolved there).
    return jnp.full(jnp.shape(x), fill_value, to_jax_dtype(_val(node).dtype))


# Ops lowered only inside compiled graphs (eager mode reaches them through other paths).
_GRAPH_ONLY = {aten.full_like.default: _full_like}


def _is_foreach(target) -> bool:
    packet = getattr(target, "_overloadpacket", None)
    return packet is not None and packet.__name__.startswith("_foreach_")


# Per-element overloads to try for each `_foreach_*` overload, in order.
_FOREACH_OVERLOADS = {
    "default": ("default",),
    "Scalar": ("Tensor", "Tensor_Scalar", "default"),
    "ScalarList": ("Tensor", "Tensor_Scalar", "default"),
    "List": ("Tensor", "Tensor_Tensor", "default"),
    "Tensor": ("Tensor", "Tensor_Tensor"),
    "ScalarAndTensor": ("Scalar",),
}


def _foreach_base(target):
    """The per-tensor op a `_foreach_*` overload applies, when it has a usable lowering."""
    name = target._overloadpacket.__name__[len("_foreach_"):]
    packet = getattr(aten, name, None)
    if packet is None or name in ("copy", "zero", "norm"):
        return None
    if packet in (aten.addcmul, aten.addcdiv) and target._overloadname != "Scalar" and \
            target._overloadname != "ScalarList":
        return None
    for overload in _FOREACH_OVERLOADS.get(target._overloadname, ()):
        op = getattr(packet, overload, None)
        if op is not None and op in LOWERINGS:
            lowering = LOWERINGS[op]
            if lowering.jit and not lowering.rng and lowering.index_error is None:
                return op
    return None


def _promotion_operands(arg_nodes) -> list:
    operands = []
    for arg in arg_nodes:
        val = _val(arg)
        if isinstance(val, torch.Tensor):
            operands.append(val)
        elif isinstance(val, bool | int | float | complex) and not isinstance(arg, torch.fx.Node):
            operands.append(val)
    return operands


def _promote(node, kind: str, args, kwargs):
    operands = _promotion_operands(list(node.args) + list(node.kwargs.values()))
    return _promote_operands(operands, kind, args, kwargs)


def _promote_operands(operands, kind: str, args, kwargs):
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
        # Outputs that are graph inputs as they came in (AOTAutograd saves parameters for the
        # backward this way) are handed back as the same tensors: no copy in the executable.
        output = next(n for n in reversed(self.interpreter.nodes) if n.op == "output")
        slot = {node: i for i, node in enumerate(self.interpreter.placeholders)}
        self.passthrough = {
            i: slot[a] for i, a in enumerate(output.args[0])
            if isinstance(a, torch.fx.Node) and a in slot and isinstance(_val(a), torch.Tensor)
        }
        # Outputs that are views of an input (`t(weight)` saved for the backward) become
        # views of the input tensor: (placeholder index, size, stride, storage offset).
        self.view_outputs = {}
        for i, a in enumerate(output.args[0]):
            if i not in self.passthrough and isinstance(a, torch.fx.Node):
                view = _view_of_input(a, slot)
                if view is not None:
                    self.view_outputs[i] = view
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
        outputs, checks, writes = executable(inputs, draws)
        for bad, message in zip(checks, messages):
            if bool(bad):
                raise index_exception(message)
        if writes:
            self._apply_mutations(key, args, writes)
        return self._wrap(outputs, out_layouts, args)

    def _apply_mutations(self, key: tuple, args, writes: list) -> None:
        aliased = key[-1]
        host = []
        for index, new in zip(sorted(self.interpreter.mutations), writes):
            dst = args[index]
            if not isinstance(dst, torch.Tensor):
                raise RuntimeError("torchneuron.compile: the graph mutates a non-tensor input")
            if _is_device_tensor(dst):
                if not aliased:
                    storage.set_storage_buffer(dst.untyped_storage(), new, dst.dtype)
                else:
                    value = storage.new_tensor(tuple(new.shape), dst.dtype, None, new.reshape(-1))
                    with torch.no_grad():
                        dst.copy_(value)
            else:
                host.append((dst, new))
        if host:
            # CPU inputs (an optimizer's step counters): one transfer for all of them.
            values = jax.device_get([new for _, new in host])
            with torch.no_grad():
                for (dst, _), value in zip(host, values):
                    dst.copy_(torch.from_numpy(np.asarray(value).copy()).reshape(dst.shape))

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
        # Mutated inputs sharing a storage cannot each swap in a whole buffer: then the
        # executable returns the values and they are copied in one by one.
        aliased = False
        if self.interpreter.mutations:
            seen = set()
            for index in self.interpreter.mutations:
                value = args[index]
                if _is_device_tensor(value):
                    ptr = value.untyped_storage()._cdata
                    aliased = aliased or ptr in seen
                    seen.add(ptr)
        key.append(aliased)
        return tuple(key), inputs, slots

    def _placeholder_values(self, key: tuple, inputs) -> tuple[list, dict]:
        values = []
        raw = {}  # placeholder index -> (flat buffer, offset, view spec) for device tensors
        it = iter(inputs)
        for index, k in enumerate(key[:-1]):
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
                raw[index] = (buf, offset, spec)
                values.append(_read_view(buf, offset, spec))
        return values, raw

    # -- building --------------------------------------------------------------------------
    def _build(self, key: tuple, inputs: list, args: list):
        start = time.perf_counter()
        aliased = key[-1]
        out_nodes = self._output_metas()
        layouts: list = []
        messages: list = []

        def fn(inputs, draws):
            values, raw = self._placeholder_values(key, inputs)
            mutated: dict = {}
            outputs, checks = self.interpreter.run(values, draws, mutated)
            flat = []
            layouts.clear()
            for i, (out, meta) in enumerate(zip(outputs, out_nodes)):
                source = self.passthrough.get(i)
                view = self.view_outputs.get(i)
                if source is not None and _is_device_tensor(args[source]):
                    layouts.append(("input", source))
                    flat.append(None)
                elif view is not None and _is_device_tensor(args[view[0]]) and \
                        key[view[0]][1].mode == views.FULL:
                    layouts.append(("view", *view))
                    flat.append(None)
                elif isinstance(out, jax.Array | jax.core.Tracer) and hasattr(out, "shape"):
                    stride = _concrete_stride(meta, out.shape)
                    layouts.append(("tensor", _torch_dtype(meta, out), tuple(out.shape), stride))
                    flat.append(views.to_memory_order(out, stride))
                else:
                    layouts.append(("value", out))
                    flat.append(None)
            # The new contents of each mutated input: its whole storage buffer for a device
            # tensor (the call swaps it in, no copy), the value itself for anything else.
            writes = []
            for index in sorted(mutated):
                value = mutated[index]
                if index in raw and not aliased:
                    buf, offset, spec = raw[index]
                    writes.append(views.scatter(buf, offset, value, spec))
                else:
                    writes.append(value)
            messages[:] = [message for _, message in checks]
            return flat, [bad for bad, _ in checks], writes

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
    def _wrap(self, outputs: list, layouts: list, args) -> list:
        results = []
        for buf, layout in zip(outputs, layouts):
            if layout[0] == "value":
                results.append(layout[1])
                continue
            if layout[0] == "input":
                results.append(args[layout[1]])
                continue
            if layout[0] == "view":
                _, index, size, stride, offset = layout
                results.append(args[index].as_strided(size, stride, offset))
                continue
            _, dtype, shape, stride = layout
            results.append(storage.new_tensor(shape, dtype, stride, buf))
        return results


_VIEW_OPS = {
    aten.t.default, aten.transpose.int, aten.permute.default, aten.view.default,
    aten._unsafe_view.default, aten.alias.default, aten.unsqueeze.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.expand.default,
}


def _view_of_input(node, slot: dict):
    """(placeholder index, size, stride, offset) when `node` is a chain of view ops over a
    contiguous graph input and its layout is static; else None."""
    meta = _val(node)
    if not isinstance(meta, torch.Tensor):
        return None
    base = node
    while isinstance(base, torch.fx.Node) and base.op == "call_function" and \
            base.target in _VIEW_OPS:
        base = base.args[0]
    if base is node or not isinstance(base, torch.fx.Node) or base not in slot:
        return None
    base_meta = _val(base)
    if not isinstance(base_meta, torch.Tensor) or base_meta.dtype != meta.dtype:
        return None
    try:
        if not base_meta.is_contiguous() or int(base_meta.storage_offset()) != 0:
            return None
        size = tuple(int(s) for s in meta.shape)
        stride = tuple(int(s) for s in meta.stride())
        offset = int(meta.storage_offset())
    except (TypeError, ValueError, RuntimeError):  # symbolic sizes
        return None
    return slot[base], size, stride, offset


def _is_device_tensor(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == dispatch.NEURON


def _read_view(buf, offset, spec: views.ViewSpec):
    """A view's value. Dense permuted views (transposes saved between the forward and the
    backward) become a slice and a transpose, which XLA folds into the consumer's layout,
    instead of the generic gather by computed indices."""
    if spec.mode == views.STRIDED:
        perm = views.dense_permutation(spec.shape, spec.stride)
        if perm is not None and 0 not in spec.shape:
            numel = 1
            for size in spec.shape:
                numel *= size
            flat = buf if numel == buf.shape[0] else jax.lax.dynamic_slice(buf, (offset,), (numel,))
            stored = flat.reshape(tuple(spec.shape[d] for d in perm))
            inverse = [0] * len(perm)
            for position, d in enumerate(perm):
                inverse[d] = position
            return jnp.transpose(stored, inverse)
    return views.gather(buf, offset, spec)


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
    if options.get("strict") or config.strict():
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
