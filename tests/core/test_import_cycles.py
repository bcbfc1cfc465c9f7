"""No import cycles inside atom_core, atom_kernels or atom_frontends (dependencies point kernels <- core <- frontends).

A static check with `ast`: every import statement at a module's top level (inside module-level `if`/`try` blocks
too, `if TYPE_CHECKING:` included: a type-only cycle is still two modules that need each other) is an edge to the
module it names (`from pkg import name` to `pkg.name` when that is a module, else to `pkg`). Imports inside
functions are not edges: they run after both modules loaded. The check is run on a tiny synthetic package with a
cycle first, so a checker that finds nothing cannot pass.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# import name → folder (pyproject's package-dir)
PACKAGES = {"atom_core": ROOT / "atom_core", "atom_kernels": ROOT / "atom_kernels",
            "atom_frontends": ROOT / "frontends"}


def modules_of(name: str, folder: Path) -> dict[str, Path]:
    """Every module of the package `name` living in `folder`: dotted name → file."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        parts = path.relative_to(folder).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((name, *parts))] = path
    return found


def _top_level_imports(tree: ast.Module):
    """Import nodes at module level, descending into if/try/with blocks but not into functions or classes."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(getattr(node, field, []))
        elif isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module → the modules (of `modules`) it imports at its top level."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in _top_level_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:  # relative: resolve against the importing module's package
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            graph[module].update(t for t in targets if t in modules and t != module)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, white/grey/black)."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_checker_finds_a_cycle_in_a_synthetic_package(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..c import C\n")
    (pkg / "c.py").write_text("import os\n\nimport pkg.a\n\n\ndef late():\n    import pkg.sub.b\n")
    (pkg / "d.py").write_text("def f():\n    from pkg import a\n")  # inside a function: no edge
    graph = import_graph(modules_of("pkg", pkg))
    assert graph["pkg.a"] == {"pkg.sub.b"} and graph["pkg.sub.b"] == {"pkg.c"} and graph["pkg.d"] == set()
    assert find_cycle(graph) == ["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]
    (pkg / "c.py").write_text("def late():\n    import pkg.a\n")  # the cycle broken: none found
    assert find_cycle(import_graph(modules_of("pkg", pkg))) is None


def test_no_import_cycles_in_the_library():
    modules = {}
    for name, folder in PACKAGES.items():
        modules.update(modules_of(name, folder))
    assert len(modules) > 50  # the tree was found
    cycle = find_cycle(import_graph(modules))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)
