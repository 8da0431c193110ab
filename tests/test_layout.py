"""The package's structure, as issue 12 set it: no import cycles, a shallow import chain, no
import inside a function to dodge a cycle, modules of a readable size, and ``__all__`` in every
public module. Read statically from the sources."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "torchfeed"
MAX_LINES = 450
MAX_CHAIN = 9  # modules in the longest chain of top-level imports (it was 12)
# Imports inside functions that are there for start-up time, not for a cycle: the command line
# imports its heavy subcommands only when they run.
LAZY_OK = {"torchfeed.cli"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _targets(node: ast.AST, module: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = module.rsplit(".", node.level)[0]
            base = f"{package}.{base}" if base else package
        found = [base]
        found += [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
        return found
    return []


@cache
def imports(module: str) -> tuple[set[str], set[str]]:
    """(torchfeed modules imported at module level, those imported inside functions)."""
    tree = ast.parse(MODULES[module].read_text())
    top, inner = set(), set()
    for node in ast.walk(tree):
        for target in _targets(node, module):
            if target in MODULES and target != module:
                (top if node in tree.body or _in_type_checking(tree, node) else inner).add(target)
    # a module-level `if` (e.g. a build-dependent registration) is still module level
    for stmt in tree.body:
        if isinstance(stmt, ast.If | ast.Try):
            for node in ast.walk(stmt):
                top.update(t for t in _targets(node, module) if t in MODULES and t != module)
    inner -= top
    # importing a submodule imports its package first
    for name in list(top):
        parts = name.split(".")
        top.update(
            ".".join(parts[:i]) for i in range(2, len(parts)) if ".".join(parts[:i]) != module
        )
    return top, inner


def _in_type_checking(tree: ast.Module, node: ast.AST) -> bool:
    return False


def test_no_import_cycles():
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for dep in sorted(imports(m)[0]):
            if dep not in MODULES or dep.startswith(m + "."):
                continue
            if state.get(dep) == 1:
                cycles.append([*path, m, dep])
            elif dep not in state:
                visit(dep, [*path, m])
        state[m] = 2

    for m in MODULES:
        if m not in state:
            visit(m, [])
    assert not cycles, cycles


def test_import_chain_is_shallow():
    @cache
    def depth(m: str) -> int:
        deps = [d for d in imports(m)[0] if not d.startswith(m + ".") and d in MODULES]
        return 1 + max((depth(d) for d in deps), default=0)

    deepest = max(MODULES, key=depth)
    assert depth(deepest) <= MAX_CHAIN, (deepest, depth(deepest))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_function_level_import_of_the_package(module):
    if module in LAZY_OK:
        return
    assert not imports(module)[1], f"{module} imports {imports(module)[1]} inside a function"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_size(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines < MAX_LINES, f"{module}: {lines} lines"


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if not any(p.startswith("_") for p in m.split(".")))
)
def test_public_modules_list_their_names(module):
    tree = ast.parse(MODULES[module].read_text())
    names = {
        t.id
        for stmt in tree.body
        if isinstance(stmt, ast.Assign | ast.AnnAssign)
        for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
        if isinstance(t, ast.Name)
    }
    assert "__all__" in names or module.endswith("__main__"), f"{module} has no __all__"
