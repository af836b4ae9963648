"""Writes into host (CPU) inputs of a graph, computed on the host instead of read back.

A compiled optimizer step keeps each parameter's step counter in a 0-dim CPU tensor (AdamW's
default, `capturable=False`) and increments it inside the graph. Had the executable returned
the new counters, every call would wait for it to finish to read them back, and the host could
not queue the next graph while the device works. When the new value of a CPU input depends
only on CPU inputs (`step + 1`), that slice of the graph runs on the host with PyTorch's CPU
kernels, as eager mode runs it, and the executable (which still computes with the old value it
was given) returns nothing for it.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

aten = torch.ops.aten


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def _host_value(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.device.type == "cpu"
    if isinstance(value, list | tuple):
        return all(_host_value(v) for v in value)
    return True  # a Python number or a symbolic size


class HostUpdates:
    """The graph's writes into CPU inputs that the host computes itself: `targets` are the
    written placeholders' indices, `module` computes their new values (in that order) from
    the placeholders at `sources`."""

    def __init__(self, module: torch.fx.GraphModule, sources: list[int], targets: list[int]):
        self.module = module
        self.sources = sources
        self.targets = targets
        self.increment = _common_increment(module, sources, targets)

    def apply(self, args) -> None:
        """Compute every new value first (they read the old ones), then write them."""
        with torch.no_grad():
            if self.increment is not None:  # `step += 1` of every counter: one CPU kernel
                torch._foreach_add_([args[i] for i in self.targets], self.increment)
                return
            values = self.module.forward(*[args[i] for i in self.sources])
            torch._foreach_copy_([args[i] for i in self.targets], list(values))


def _common_increment(module: torch.fx.GraphModule, sources: list[int],
                      targets: list[int]) -> int | float | None:
    """The number n where every new value is its own target plus n (an optimizer's step
    counters), which `_foreach_add_` writes in place with the same result as the module's adds
    and copies (~5 against ~50 us for six counters); else None."""
    placeholders = [node for node in module.graph.nodes if node.op == "placeholder"]
    (output,) = [node for node in module.graph.nodes if node.op == "output"]
    amounts = set()
    for target, value in zip(targets, output.args[0]):
        base, amount = _added(value)
        if not (base in placeholders and sources[placeholders.index(base)] == target):
            return None
        counter = _val(base)
        if isinstance(amount, bool) or not isinstance(amount, int | float):
            return None
        # An integer counter plus a float would be promoted, then truncated by the copy.
        if not isinstance(counter, torch.Tensor) or not (
                counter.dtype.is_floating_point or isinstance(amount, int)):
            return None
        amounts.add(amount)
    return amounts.pop() if len(amounts) == 1 else None


def _added(value) -> tuple:
    """(x, n) for a node computing x + n (`add`, or an item of `_foreach_add`), else (None,
    None)."""
    if not isinstance(value, torch.fx.Node) or value.op != "call_function" or value.kwargs:
        return None, None
    if value.target in (aten.add.Tensor, aten.add.Scalar) and len(value.args) == 2:
        return value.args
    if value.target is operator.getitem:
        source, item = value.args
        if (isinstance(source, torch.fx.Node) and source.target is aten._foreach_add.Scalar
                and len(source.args) == 2 and not source.kwargs):
            return source.args[0][item], source.args[1]
    return None, None


def find(nodes: list[torch.fx.Node], placeholders: list[torch.fx.Node],
         mutations: dict[int, torch.fx.Node]) -> HostUpdates | None:
    """The host-computable writes of a graph (`mutations`: placeholder index -> its copy_
    node), or None when it has none."""
    memo: dict[torch.fx.Node, bool] = {}
    inputs = set(placeholders)

    def computable(node: torch.fx.Node) -> bool:
        # Iterative: a long chain of host ops must not hit Python's recursion limit.
        stack = [node]
        while stack:
            current = stack[-1]
            if current in memo:
                stack.pop()
                continue
            pending = [a for a in current.all_input_nodes if a not in memo]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            memo[current] = _computable_here(current, inputs) and all(
                memo[a] for a in current.all_input_nodes)
        return memo[node]

    targets = [index for index, copy in sorted(mutations.items())
               if _on_host(placeholders[index]) and computable(copy.args[1])]
    if not targets:
        return None
    values = [mutations[index].args[1] for index in targets]
    needed: set[torch.fx.Node] = set()
    stack = list(values)
    while stack:
        current = stack.pop()
        if current not in needed:
            needed.add(current)
            stack.extend(current.all_input_nodes)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    slot = {node: i for i, node in enumerate(placeholders)}
    sources = []
    for node in nodes:  # graph order: placeholders first, every input before its users
        if node not in needed:
            continue
        if node.op == "placeholder":
            env[node] = graph.placeholder(node.name)
            env[node].meta["val"] = node.meta.get("val")  # its dtype decides `increment`
            sources.append(slot[node])
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[v] for v in values))
    return HostUpdates(torch.fx.GraphModule(torch.nn.Module(), graph), sources, targets)


def _on_host(node: torch.fx.Node) -> bool:
    value = _val(node)
    return isinstance(value, torch.Tensor) and value.device.type == "cpu"


def _computable_here(node: torch.fx.Node, inputs: set) -> bool:
    """Whether the host can compute this node by itself, given its inputs can be."""
    if node.op == "placeholder":
        return node in inputs and _host_value(_val(node))
    if node.op != "call_function" or not _host_value(_val(node)):
        return False
    target = node.target
    if target is operator.getitem:
        return True
    if not isinstance(target, torch._ops.OpOverload) or target is aten.copy_.default:
        return False
    # A random op draws from the device generator inside the executable: not repeatable here.
    return torch.Tag.nondeterministic_seeded not in target.tags
