"""The package has no import cycles: not at import time, and not hidden in function-level imports.

Two checks: every module imports on its own in a fresh interpreter state (nothing of the package
loaded before it), and the graph of every ``import`` statement in the package (module level and
inside functions, except ``if TYPE_CHECKING:`` blocks, which never run) has no cycle.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import rlhf_tutorial

PACKAGE = Path(rlhf_tutorial.__file__).parent


def all_modules() -> list[str]:
    names = ["rlhf_tutorial"]
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="rlhf_tutorial."):
        if not info.name.endswith(".__main__"):  # runs the command line when imported
            names.append(info.name)
    return sorted(names)


def module_path(name: str) -> Path:
    parts = name.split(".")[1:]
    folder = PACKAGE.joinpath(*parts)
    return folder / "__init__.py" if folder.is_dir() else folder.with_suffix(".py")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_modules(name: str, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports anywhere (skipping TYPE_CHECKING blocks)."""
    tree = ast.parse(module_path(name).read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module in known:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = dfs(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = dfs(node)
            if cycle:
                return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_any_import_statement():
    known = set(all_modules())
    graph = {name: imported_modules(name, known) for name in known}
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def test_every_module_imports_alone():
    code = (
        "import importlib, sys\n"
        "failed = []\n"
        f"for name in {all_modules()!r}:\n"
        "    for loaded in [m for m in sys.modules if m == 'rlhf_tutorial' or m.startswith('rlhf_tutorial.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {type(exc).__name__}: {exc}')\n"
        "print('\\n'.join(failed))\n"
        "print('imported', len(set(m for m in sys.modules if m.startswith('rlhf_tutorial'))))\n"
        "sys.exit(1 if failed else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "imported" in proc.stdout  # the loop ran to the end
