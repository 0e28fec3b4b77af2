"""The package's shape as a specification: rooms import only downwards, no import circle anywhere
(late imports inside functions included), no bare top-level ``tasks``/``variants`` import, and every
room opens with a docstring that says what it holds."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import fwbench

PACKAGE_DIR = Path(fwbench.__file__).parent

#: The rooms along the one-way flow; a module may import its own room and the rooms before it.
ROOM_ORDER = ["variants", "tasks", "errors", "run", "analysis", "bench", "report", "cli", "__main__"]
ROOMS = ["variants", "tasks", "run", "analysis", "bench", "report"]


def all_modules() -> dict[str, Path]:
    """Every module of the fwbench package, by dotted name, with its source file."""
    modules = {"fwbench": PACKAGE_DIR / "__init__.py"}
    for info in pkgutil.walk_packages([str(PACKAGE_DIR)], prefix="fwbench."):
        spec = importlib.util.find_spec(info.name)
        modules[info.name] = Path(spec.origin)
    return modules


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The fwbench modules ``name`` imports anywhere in its file (top level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    known = set(modules)
    return {name: imported_modules(name, path, known) for name, path in modules.items()}


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_no_import_circle_anywhere():
    graph = import_graph()
    # Depth-first search for a back edge; report the circle it closes.
    state: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_rooms_import_only_downwards():
    upward = []
    for module, targets in import_graph().items():
        room = room_of(module)
        if room is None:
            continue
        for target in targets:
            other = room_of(target)
            if other is not None and ROOM_ORDER.index(other) > ROOM_ORDER.index(room):
                upward.append(f"{module} imports {target}")
    assert not upward, "\n".join(upward)


def test_no_bare_tasks_or_variants_import():
    """Inside the project everything goes through fwbench.tasks / fwbench.variants: a bare
    ``import variants`` would load a second copy of the registry from the source tree."""
    root = PACKAGE_DIR.parent
    offenders = []
    for folder in ("fwbench", "tasks", "variants", "tests", "benchmarks"):
        for path in (root / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                if any(n.split(".")[0] in ("tasks", "variants") for n in names):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, offenders


@pytest.mark.parametrize("room", ROOMS)
def test_every_room_opens_with_a_docstring(room):
    module = importlib.import_module(f"fwbench.{room}")
    assert module.__doc__ and len(module.__doc__.split()) >= 15, f"fwbench.{room} needs an opening docstring"
