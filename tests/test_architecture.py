"""The package's modules import one way: no cycles, not even through imports inside functions."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO.parent / "shared" / "tools" / "import_cycles.py"


def _imports(path: Path, package: str) -> set[str]:
    """The torchneuron modules a file imports (module level and inside functions)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("torchneuron"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if not module.startswith("torchneuron"):
                continue
            found.add(module)
            for alias in node.names:  # `from . import storage` imports a module
                found.add(f"{module}.{alias.name}")
    return found


def test_no_import_cycles():
    src = REPO / "src"
    modules = {}
    for path in (src / "torchneuron").rglob("*.py"):
        name = ".".join(path.relative_to(src).with_suffix("").parts)
        if name.endswith(".__init__"):
            name = name[: -len(".__init__")]
            package = name
        else:
            package = name.rsplit(".", 1)[0]
        modules[name] = (path, package)
    graph = {}
    for name, (path, package) in modules.items():
        # importing a package's __init__ is not a dependency on its submodules
        graph[name] = {m for m in _imports(path, package) if m in modules and m != name}
    # cycles among the non-package modules (packages' __init__ re-export their children)
    packages = {n for n, (p, _) in modules.items() if p.name == "__init__.py"}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(node: str, stack: list[str]) -> bool:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if nxt in packages:
                continue
            if state.get(nxt) == 1:
                cycle.extend(stack[stack.index(nxt):] + [nxt])
                return True
            if nxt not in state and visit(nxt, stack):
                return True
        stack.pop()
        state[node] = 2
        return False

    for name in sorted(graph):
        if name not in state and name not in packages and visit(name, []):
            break
    assert not cycle, " -> ".join(cycle)


def test_shared_import_cycle_tool_agrees():
    if not TOOL.exists():
        pytest.skip("the team's import-cycle tool (../shared/tools) is not next to this checkout")
    out = subprocess.run([sys.executable, str(TOOL), str(REPO / "src" / "torchneuron")],
                         capture_output=True, text=True, timeout=60).stdout
    assert "cycle:" not in out, out
