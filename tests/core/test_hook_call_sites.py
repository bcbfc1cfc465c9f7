"""Every hook declared in atom_core/hookspecs.py is called by the core (atom_core), and none by a frontend.

Hooks are the core's questions to the frontends (DESIGN.md, "Hooks"): a hook the core never asks is dead glue,
and a frontend calling a hook asks the core to call its own code back. A static check with `ast`: a call site is
a call of an attribute named like the hook (`hook().atom_platform(...)`). The checker runs on synthetic sources
first, so that it is shown to fail.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOOKSPECS = ROOT / "atom_core" / "hookspecs.py"


def declared_hooks(source: str) -> set[str]:
    """Names of the methods of the hookspec class(es) decorated with @hookspec / @hookspec(...)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if isinstance(target, ast.Name) and target.id == "hookspec":
                    names.add(node.name)
    return names


def called_hooks(sources: dict[str, str], hooks: set[str]) -> dict[str, list[str]]:
    """hook → the files (of `sources`: name → text) that call it as an attribute: `x.hook(...)`."""
    found: dict[str, list[str]] = {h: [] for h in hooks}
    for name, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in hooks:
                found[node.func.attr].append(name)
    return found


def read_tree(folder: Path, skip: Path | None = None) -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for p in sorted(folder.rglob("*.py")) if p != skip}


def test_checker_on_synthetic_sources():
    specs = ("class S:\n    @hookspec\n    def a(self): ...\n    @hookspec(firstresult=True)\n    def b(self): ...\n"
             "    def helper(self): ...\n")
    hooks = declared_hooks(specs)
    assert hooks == {"a", "b"}
    core = {"core.py": "def f(pm):\n    return pm.hook.a()\n", "other.py": "b = 1\nprint(b)\n"}
    calls = called_hooks(core, hooks)
    assert calls == {"a": ["core.py"], "b": []}  # b is declared and never asked: the test below would fail


def test_every_hook_is_called_by_the_core_and_by_no_frontend():
    hooks = declared_hooks(HOOKSPECS.read_text())
    assert len(hooks) >= 4, hooks
    core = called_hooks(read_tree(ROOT / "atom_core", skip=HOOKSPECS), hooks)
    assert not [h for h, where in core.items() if not where], \
        f"hooks the core never calls: {sorted(h for h, where in core.items() if not where)}"
    frontends = called_hooks(read_tree(ROOT / "frontends"), hooks)
    assert not any(frontends.values()), f"frontends calling hooks: { {h: w for h, w in frontends.items() if w} }"
