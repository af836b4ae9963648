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
from contextlib import nullcontext
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .. import __version__, config
from ..lowerings import LOWERINGS, Lowering, overrides
from ..lowerings.dtypes import to_jax_dtype, to_torch_dtype
from ..runtime import (
    disk_cache,
    fusion,
    opcall,
    platform,
    rng,
    signature,
    storage,
    strided,
    transfer,
    value_checks,
)
from ..runtime.meta import promotion_dtype, promotion_operands
from ..runtime.plan import NEURON, plan_for
from . import host_updates, support
from .stats import bump, target_stats

aten = torch.ops.aten
_NOT_RANDOM = Lowering(fn=None)
_HOST_ARRAY = "host array"  # signature key tag of a CPU tensor input (not 0-dim)
# Part of every on-disk key: version 2 drops the entries stored from JAX's own cache, which
# cannot run (runtime/disk_cache.py `compile_lowered`).
_DISK_FORMAT = "graph executables 2"


class LoweringError(RuntimeError):
    """A node of the graph cannot be lowered: `reason` says why, `location` where in the
    user's source the op comes from."""

    def __init__(self, node: torch.fx.Node, reason: str) -> None:
        self.op_name = str(node.target)
        self.reason = reason
        self.location = source_location(node)
        where = f" (from {self.location})" if self.location else ""
        super().__init__(f"{self.op_name}{where}: {reason}")


def source_location(node: torch.fx.Node) -> str:
    """The innermost user frame a node was traced from: 'file.py:12 in forward: code'."""
    trace = node.meta.get("stack_trace") or ""
    lines = [line.strip() for line in trace.strip().splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("File "):
            # 'File "/path/model.py", line 12, in forward' followed by the code line
            parts = lines[i].split('"')
            path = parts[1] if len(parts) > 2 else lines[i]
            rest = parts[2] if len(parts) > 2 else ""
            lineno = rest.split("line", 1)[-1].split(",")[0].strip()
            func = rest.split(" in ", 1)[-1].strip() if " in " in rest else ""
            code = lines[i + 1] if i + 1 < len(lines) and not lines[i + 1].startswith("File ") else ""
            return f"{path}:{lineno} in {func}: {code}".rstrip(": ")
    return ""


_SYM_FUNCTIONS = {
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
    operator.mod, operator.neg, operator.pow, operator.eq, operator.ne, operator.lt,
    operator.le, operator.gt, operator.ge, operator.and_, operator.or_,
}


def _val(node_or_value: Any) -> Any:
    if isinstance(node_or_value, torch.fx.Node):
        return node_or_value.meta.get("val")
    return node_or_value


def _example(value):
    """An argument as a lowering's predicate sees it: a node stands for its example value
    (a fake tensor with dtype, shape and strides)."""
    if isinstance(value, torch.fx.Node):
        return value.meta.get("val", value)
    if isinstance(value, list | tuple):
        return type(value)(_example(v) for v in value)
    return value


def _examples(plan, args, kwargs) -> list:
    """A call's example values (fake tensors for nodes) in schema order, defaults filled in."""
    return plan.bind(_example(tuple(args)), {k: _example(v) for k, v in kwargs.items()})


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
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
            and (support.graph_lowering(n.target) or _NOT_RANDOM).rng
        ]
        # node -> rewrite(args, kwargs, call) used instead of the plain call while a bucketed
        # executable is traced (compiler/buckets.py installs them).
        self.rules: dict = {}
        self._check_lowerable()

    def _check_lowerable(self) -> None:
        for node in self.nodes:
            if node.op == "call_function":
                target = node.target
                if target is operator.getitem or target in _SYM_FUNCTIONS:
                    continue
                if target in (aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default):
                    continue
                if target in support.CHECKS:
                    continue
                if target is aten.copy_.default:
                    if node.args[0] not in self.placeholders:
                        raise LoweringError(node, "it copies into an intermediate value")
                    continue
                if support.is_foreach(target):
                    if support.foreach_base(target) is None:
                        raise LoweringError(node, "it has no lowering")
                    continue
                if not isinstance(target, torch._ops.OpOverload):
                    raise LoweringError(node, "it is not an ATen op")
                refusal = support.op_refusal(target)
                if refusal is not None:
                    raise LoweringError(node, refusal)
                lowering = support.graph_lowering(target)
                if lowering is None:  # decomposable, yet left in the graph by a later pass
                    raise LoweringError(node, "it has no graph lowering")
                if lowering.only_when is not None:
                    plan = plan_for(target)
                    arguments = dict(zip(plan.arg_names, _examples(plan, node.args, node.kwargs)))
                    if not lowering.only_when(arguments):
                        raise LoweringError(node, "this mode of the op is not lowered "
                                            "(eager mode runs it on CPU or decomposes it)")
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
            if target in support.CHECKS:
                # Metadata and range assertions the tracer has already proven for the
                # shapes this executable serves; a dependency token where one is returned.
                env[node] = jnp.zeros((), bool) if isinstance(_val(node), torch.Tensor) else None
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
            if support.is_foreach(target):
                env[node] = self._foreach(node, target, args, kwargs)
                continue
            rule = self.rules.get(node)
            if rule is not None:
                env[node] = rule(args, kwargs, lambda a, k, node=node, target=target: self._call(
                    node, target, a, k, draw_iter, checks))
                continue
            env[node] = self._call(node, target, args, kwargs, draw_iter, checks)
        raise AssertionError("graph without output")

    def _foreach(self, node, target, args, kwargs):
        """A `_foreach_*` op (compiled optimizers): the per-tensor lowering, once per element."""
        base = support.foreach_base(target)
        lowering = LOWERINGS[base]
        plan = plan_for(base)
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
            meta = metas[i] if isinstance(metas, list | tuple) else None
            results.append(self._invoke(node, plan, lowering, elem_args, elem_kwargs,
                                        (elem_nodes, elem_kwargs), None, None, meta))
        return results

    def _call(self, node, target, args, kwargs, draw_iter, checks):
        return self._invoke(node, plan_for(target), support.graph_lowering(target), args, kwargs,
                            (node.args, node.kwargs), draw_iter, checks, _val(node))

    def _invoke(self, node, plan, lowering, args, kwargs, arg_nodes, draw_iter, checks, meta):
        """One lowering through the op-call core, as eager executables call it: `args` and
        `kwargs` hold traced values, `arg_nodes` the call's (args, kwargs) as FX nodes,
        whose example values decide type promotion and layout flags."""
        values = plan.bind(tuple(args), kwargs)
        examples = _examples(plan, *arg_nodes)
        compute = None
        if lowering.promote is not None:
            compute = promotion_dtype(lowering.promote, promotion_operands(plan, examples))
        draw = next(draw_iter) if lowering.rng else None
        try:
            result, bad = opcall.call_lowering(
                plan, lowering, values, compute_dtype=compute, draw=draw,
                contiguous=opcall.contiguity_flags(plan, lowering, examples))
        except LoweringError:
            raise
        except Exception as err:  # a lowering that cannot trace this call
            raise LoweringError(node, f"{type(err).__name__}: {err}") from err
        if bad is not None:  # with what a failed check raises (runtime/value_checks.py)
            where = source_location(node) or "a compiled graph"
            checks.append((bad, (lowering.index_error, str(node.target), where)))
        return opcall.cast_results(result, meta)


class CompiledGraph:
    """The callable handed back to AOTAutograd for one forward or backward graph."""

    def __init__(self, gm: torch.fx.GraphModule, options: dict[str, Any]) -> None:
        self.gm = gm
        # compiler/buckets.GraphBucketing, set by the backend for a graph with dynamic sizes:
        # pads each call's inputs to a bucket
        self.bucketing = None
        self.options = options
        self.max_shapes = int(options.get("max_shapes", 16))
        self.strict = bool(options.get("strict", False))
        self.donate = bool(options.get("donate", True))
        self.interpreter = GraphInterpreter(gm)  # raises LoweringError if not lowerable
        # Writes into CPU inputs computed from CPU inputs alone (optimizer step counters): the
        # host computes them, so no call waits for its executable to read them back.
        self.host_updates = host_updates.find(self.interpreter.nodes,
                                              self.interpreter.placeholders,
                                              self.interpreter.mutations)
        on_host = set(self.host_updates.targets) if self.host_updates else set()
        # The mutated inputs whose new values the executable returns, in that order.
        self.mutation_order = [i for i in sorted(self.interpreter.mutations) if i not in on_host]
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

    def __call__(self, *args, check_sites: list | None = None) -> list:
        """Run the graph on `args`; a failed value check raises at the next sync point, naming
        its op and source line (or those of `check_sites`, one per check of the graph)."""
        call = self.bucketing.prepare(args) if self.bucketing is not None else None
        if call is not None:
            args = call.args
        key, inputs = self._signature(args)
        if fusion.any_pending(inputs):  # recorded eager ops produce some inputs: run them
            fusion.flush()
            key, inputs = self._signature(args)
        # An executable traced under lowering overrides (torchneuron.library.override) serves
        # only calls under the same overrides.
        cache_key = (key, overrides.token(), None if call is None else call.tag)
        entry = self.executables.get(cache_key)
        if entry is None:
            try:
                entry = self._build(key, inputs, args, cache_key, call)
            except Exception as err:
                if call is None or call.analysis is None:
                    raise
                # A bucket that cannot be traced: per shape from now on (where a genuine
                # error raises again, unpadded).
                self.bucketing.give_up(getattr(err, "op_name", "a padding rewrite"), err)
                return self(*call.original, check_sites=check_sites)
        else:
            self.executables.move_to_end(cache_key)
            target_stats().memory_cache_hits += 1  # the hot path: no lock for a statistic
        executable, out_layouts, sites = entry
        draws = [rng.split_draw(rng.next_draw(None)) for _ in self.interpreter.rng_nodes] \
            if self.interpreter.rng_nodes else []
        sizes = [] if call is None else call.sizes
        donated = key[-1][1]
        if donated:
            # Eager ops recorded for fusion may still read a buffer this call overwrites.
            fusion.flush()
            outputs, checks, writes = executable(*_split(inputs, donated), draws, sizes)
        else:
            outputs, checks, writes = executable([], inputs, draws, sizes)
        if sites:
            if check_sites is not None and len(check_sites) == len(sites):
                sites = check_sites
            for bad, site in zip(checks, sites):
                value_checks.check(bad, site)
        if self.host_updates is not None:
            self.host_updates.apply(args)
        if writes:
            self._apply_mutations(key, args, writes)
        results = self._wrap(outputs, out_layouts, args)
        return results if call is None else call.finish(results)

    def _apply_mutations(self, key: tuple, args, writes: list) -> None:
        aliased = key[-1][0]
        if not aliased and all(isinstance(key[i][0], torch.dtype) for i in self.mutation_order):
            # Plain neuron tensors only (parameters, optimizer state): the executable returned
            # their new storage buffers, swapped in by the C++ library where it is built.
            if signature.set_buffers([args[i] for i in self.mutation_order], list(writes)):
                return
        host = []
        for index, new in zip(self.mutation_order, writes):
            dst = args[index]
            if not isinstance(dst, torch.Tensor):
                raise RuntimeError("torchneuron.compile: the graph mutates a non-tensor input")
            if _is_device_tensor(dst):
                if not aliased and isinstance(key[index][0], torch.dtype):
                    # a plain neuron tensor: the executable returned its new storage buffer
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
                    if dst.dim() == 0:
                        dst.fill_(value.item())  # a step counter: no tensor to build
                    else:
                        dst.copy_(torch.from_numpy(np.asarray(value).copy()).reshape(dst.shape))

    # -- inputs ----------------------------------------------------------------------------
    def _signature(self, args: list):
        """(key, inputs): the executable's cache key and its input list. The key's last entry
        is (aliased, donated): whether two mutated inputs share a storage, and the positions
        in `inputs` of the storage buffers the executable may overwrite (donate)."""
        key = []
        inputs: list = []
        mutations = self.interpreter.mutations
        buffer_at = {}  # mutated placeholder -> position of its storage buffer in `inputs`
        plain_key = signature.plain_tensor_key
        for index, value in enumerate(args):
            start = len(inputs)
            k = plain_key(value, inputs)  # the common cases: a device tensor with its buffer
            if k is not None:
                key.append(k)
                if index in mutations and isinstance(k[0], torch.dtype):
                    buffer_at[index] = start
            elif isinstance(value, torch.Tensor):
                if value.is_cpu and value.dim() > 0:
                    # A host tensor the graph moves to the device itself (`batch.to("neuron")`
                    # inside the compiled function): its values are the executable's input.
                    inputs.append(transfer.cpu_to_numpy(value))
                    key.append((_HOST_ARRAY, value.dtype, tuple(value.shape)))
                    continue
                k = signature.tensor_key(value, inputs)
                key.append(k)
                if index in mutations and isinstance(k[0], torch.dtype):
                    buffer_at[index] = start
            else:
                # SymInt inputs arrive as Python ints: one executable per concrete value.
                key.append(("static", value if not isinstance(value, torch.SymInt) else int(value)))
        aliased = False
        donated: tuple[int, ...] = ()
        if mutations:
            # Mutated inputs sharing a storage cannot each swap in a whole buffer: then the
            # executable returns the values and they are copied in one by one.
            if all(i in buffer_at or not _is_device_tensor(args[i]) for i in mutations):
                # The tensors of one storage pass its one buffer object (two storages that
                # share an array count as aliased too, which only costs the copies).
                storages = [id(inputs[p]) for p in buffer_at.values()]
            else:
                storages = [args[i].untyped_storage()._cdata for i in mutations
                            if _is_device_tensor(args[i])]
            aliased = len(set(storages)) != len(storages)
            if self.donate and not aliased and buffer_at:
                # A buffer the executable overwrites must reach it once, and only through
                # the tensor it writes (a parameter read through another input keeps its
                # buffer, and the write is a copy).
                uses = collections.Counter(id(x) for x in inputs)
                donated = tuple(sorted(p for p in buffer_at.values() if uses[id(inputs[p])] == 1))
        key.append((aliased, donated))
        return tuple(key), inputs

    def _placeholder_values(self, key: tuple, inputs) -> tuple[list, dict]:
        """Inside the trace: each placeholder's value, and placeholder index -> (flat buffer,
        offset, view spec) for the device tensors the graph may write in place."""
        values = []
        raw = {}
        it = iter(inputs)
        for index, k in enumerate(key[:-1]):
            if k[0] == "static":
                values.append(k[1])
            elif k[0] == _HOST_ARRAY:
                values.append(jnp.asarray(next(it)))
            elif isinstance(k[0], torch.dtype):  # a plain neuron tensor: keep its buffer
                buf = next(it)
                spec = k[1]
                offset = 0 if spec.mode == strided.FULL else next(it)
                raw[index] = (buf, offset, spec)
                values.append(strided.gather(buf, offset, spec))
            else:
                values.append(signature.read_tensor(k, it))
        return values, raw

    # -- building --------------------------------------------------------------------------
    def _build(self, key: tuple, inputs: list, args: list, cache_key: tuple, call=None):
        start = time.perf_counter()
        aliased, donated = key[-1]
        out_nodes = self._output_metas()
        layouts: list = []
        sites: list = []

        def fn(donated_buffers, kept, draws, sizes):
            values, raw = self._placeholder_values(key, _merge(donated_buffers, kept, donated))
            mutated: dict = {}
            with call.tracing(self.interpreter, sizes) if call is not None else nullcontext():
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
                        view[0] in raw and raw[view[0]][2].mode == strided.FULL:
                    layouts.append(("view", *view))
                    flat.append(None)
                elif isinstance(out, jax.Array | jax.core.Tracer) and hasattr(out, "shape"):
                    stride = _concrete_stride(meta, out.shape)
                    dtype = _torch_dtype(meta, out)
                    shape = tuple(out.shape)
                    # A graph may compute values for the host (`.cpu()`, `.tolist()`'s source)
                    kind = "host" if _on_host(meta) else "tensor"
                    nbytes = storage.storage_size_for(shape, stride) * dtype.itemsize
                    layouts.append((kind, dtype, shape, stride, nbytes))
                    flat.append(strided.to_memory_order(out, stride))
                else:
                    layouts.append(("value", out))
                    flat.append(None)
            # The new contents of each mutated input: its whole storage buffer for a device
            # tensor (the call swaps it in, no copy), the value itself for anything else.
            writes = []
            for index in self.mutation_order:
                value = mutated[index]
                if index in raw and not aliased:
                    buf, offset, spec = raw[index]
                    writes.append(strided.scatter(buf, offset, value, spec))
                else:
                    writes.append(value)
            sites[:] = [site for _, site in checks]
            return flat, [bad for bad, _ in checks], writes

        # Donated buffers (parameters, optimizer state) are overwritten in place by XLA.
        jitted = jax.jit(fn, donate_argnums=(0,))
        draws = [rng.split_draw((0, 0)) for _ in self.interpreter.rng_nodes]
        traced = jitted.trace(*_split(inputs, donated), draws, [] if call is None else call.sizes)
        lowered = traced.lower()
        disk_key = self._disk_key(key, lowered)
        executable = self._load_from_disk(disk_key)
        if executable is None:
            executable, from_jax_cache = disk_cache.compile_lowered(lowered)
            if from_jax_cache:
                bump("disk_cache_hits")
            else:
                bump("xla_compilations")
                self._store_on_disk(disk_key, executable)
        entry = (executable, list(layouts), list(sites))
        self.executables[cache_key] = entry
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
        # The input tree too: an entry must be called with the arguments it was built for.
        for part in (_DISK_FORMAT, __version__, torch.__version__, jax.__version__,
                     platform.platform_name(), self.graph_digest, repr(key),
                     str(lowered.in_tree), text):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def _load_from_disk(self, disk_key: str):
        executable = disk_cache.load_executable(disk_key, disk_cache.GRAPHS,
                                                platform.jax_device(0).client,
                                                on_error=lambda: bump("disk_cache_errors"))
        if executable is not None:
            bump("disk_cache_hits")
        return executable

    def _store_on_disk(self, disk_key: str, executable) -> None:
        disk_cache.store_executable(disk_key, disk_cache.GRAPHS, executable)

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
            kind, dtype, shape, stride, nbytes = layout
            if kind == "host":
                flat = transfer.numpy_to_cpu(np.array(buf), dtype)
                results.append(flat.as_strided(shape, stride))
                continue
            # storage.new_tensor, with the storage size worked out when the executable was built
            results.append(storage.output_tensor(shape, stride, nbytes, dtype, buf))
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
    if not (_static_layout(meta) and _static_layout(base_meta)):
        return None  # int() of a symbolic size would specialize the graph to this shape
    try:
        if not base_meta.is_contiguous() or int(base_meta.storage_offset()) != 0:
            return None
        size = tuple(int(s) for s in meta.shape)
        stride = tuple(int(s) for s in meta.stride())
        offset = int(meta.storage_offset())
    except (TypeError, ValueError, RuntimeError):  # symbolic sizes
        return None
    return slot[base], size, stride, offset


def _split(inputs: list, donated: tuple[int, ...]) -> tuple[list, list]:
    """(the donated inputs, the others), both in order."""
    chosen = set(donated)
    return [inputs[i] for i in donated], [x for i, x in enumerate(inputs) if i not in chosen]


def _merge(donated_buffers: list, kept: list, donated: tuple[int, ...]) -> list:
    """The inverse of `_split`."""
    merged = list(kept)
    for position, buf in zip(donated, donated_buffers):  # ascending positions
        merged.insert(position, buf)
    return merged


def _static_layout(meta: torch.Tensor) -> bool:
    """Whether a fake value's sizes, strides and offset are plain ints (reading a SymInt
    with int() would add a guard that specializes the graph to one shape)."""
    return all(isinstance(s, int) for s in (*meta.shape, *meta.stride(), meta.storage_offset()))


def _is_device_tensor(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == NEURON


def _on_host(meta) -> bool:
    return isinstance(meta, torch.Tensor) and meta.device.type == "cpu"


def _torch_dtype(meta, out) -> torch.dtype:
    if isinstance(meta, torch.Tensor):
        return meta.dtype
    return to_torch_dtype(out.dtype)


def _concrete_stride(meta, shape) -> tuple[int, ...]:
    if isinstance(meta, torch.Tensor):
        try:
            stride = tuple(int(s) for s in meta.stride()) if _static_layout(meta) else None
        except (TypeError, ValueError, RuntimeError):  # symbolic strides
            stride = None
        if stride is not None and tuple(int(s) for s in meta.shape) == tuple(shape):
            if strided.dense_permutation(tuple(shape), stride) is not None:
                return stride
    return storage.contiguous_strides(shape)


def _graph_digest(gm: torch.fx.GraphModule) -> str:
    # AOTAutograd calls the backend with its fake mode active; constants are real tensors.
    with unset_fake_temporarily():
        return _digest(gm)


def _digest(gm: torch.fx.GraphModule) -> str:
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


_WARNED: set[tuple[str, str]] = set()


def eager_graph(gm: torch.fx.GraphModule, error: LoweringError, options: dict[str, Any]):
    """Run the graph op by op on the device (the fallback when it cannot be compiled); warned
    once per op and source line, counted in `compile_stats()["eager_fallbacks"]`."""
    if options.get("strict") or config.strict():
        raise RuntimeError(f"torchneuron.compile: cannot lower the graph: {error}")
    if (error.op_name, error.location) not in _WARNED:
        _WARNED.add((error.op_name, error.location))
        where = f" (from {error.location})" if error.location else ""
        warnings.warn(
            f"torchneuron.compile: a graph runs op by op in eager mode on the device because "
            f"{error.op_name}{where} cannot be lowered: {error.reason}",
            stacklevel=2,
        )
    bump("eager_fallbacks")

    def run(*args):
        out = gm(*args)
        return list(out) if isinstance(out, list | tuple) else [out]

    return run
