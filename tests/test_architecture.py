"""The layout as docs/architecture.md draws it: no import cycles, imports only downwards.

Module-level imports are read with ``ast`` (imports under ``if TYPE_CHECKING:`` and inside
functions are left out: they do not run at import time, and function-level imports are how
commands keep torch out of `pp3 --help`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from pp3cli.run.scratch import repo_root

ROOT = repo_root()
# What each pp3cli concern may import at module level, besides itself and pp3kernels.
ALLOWED = {
    "run": set(),
    "evidence": {"run"},
    "verifiers": {"run"},
    "wire": {"run"},
    "timing": {"run", "evidence", "verifiers"},
    "receipts": {"run", "evidence", "timing"},
    "cli": {"run", "evidence", "verifiers", "wire", "timing", "receipts"},
}


def _module_name(path: Path) -> str:
    base = ROOT / "kernels" if path.is_relative_to(ROOT / "kernels") else ROOT
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_imports(path: Path, packages: tuple[str, ...] = ("pp3cli", "pp3kernels")) -> set[str]:
    """Modules of ``packages`` imported when ``path`` is imported (module level, outside
    TYPE_CHECKING): own modules by default."""
    found: set[str] = set()
    pending: list[ast.stmt] = list(ast.parse(path.read_text()).body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and not _is_type_checking(node):
            pending.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend(node.body + node.orelse + node.finalbody)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in packages}


def _graph() -> dict[str, set[str]]:
    files = sorted((ROOT / "pp3cli").rglob("*.py")) + sorted(
        (ROOT / "kernels" / "pp3kernels").rglob("*.py")
    )
    modules = {_module_name(path): path for path in files}
    return {
        name: {target for target in _module_imports(path) if target in modules and target != name}
        for name, path in modules.items()
    }


def test_no_import_cycles() -> None:
    graph = _graph()
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph[node]):
            # a package's __init__ importing its own submodule is not a cycle of the layout
            if node.startswith(target + ".") or state.get(target) == "done":
                continue
            assert state.get(target) != "open", " -> ".join([*trail, node, target])
            visit(target, [*trail, node])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


@pytest.mark.parametrize("concern", sorted(ALLOWED))
def test_each_concern_imports_only_downwards(concern: str) -> None:
    graph = _graph()
    wrong = []
    for module, targets in graph.items():
        if module.split(".")[:2] != ["pp3cli", concern]:
            continue
        for target in targets:
            parts = target.split(".")
            if parts[0] == "pp3cli" and len(parts) > 2:
                other = parts[1]
                if other != concern and other not in ALLOWED[concern]:
                    wrong.append(f"{module} -> {target}")
    assert not wrong, wrong


def test_kernels_never_import_the_cli() -> None:
    graph = _graph()
    wrong = [
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module.startswith("pp3kernels")
        for target in targets
        if target.startswith("pp3cli")
    ]
    assert not wrong, wrong


def test_own_modules_are_imported_statically() -> None:
    """importlib appears only where pp3 loads a foreign module by a name it cannot know
    statically: the pinned vLLM overlay and a user's ``--verifier MODULE:FUNCTION``."""
    users = set()
    for path in [*(ROOT / "pp3cli").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("import_module", "util"):
                users.add(path.relative_to(ROOT).as_posix())
            elif isinstance(node, ast.ImportFrom) and node.module == "importlib":
                users.add(path.relative_to(ROOT).as_posix())
    assert users == {"pp3cli/verifiers/overlay.py", "pp3cli/verifiers/external.py"}, users


@pytest.mark.parametrize(
    "module",
    [
        "pp3cli/evidence/shares.py",  # verify-receipts checks per-rank counts with it
        "pp3cli/evidence/family.py",
        "pp3cli/run/ranks.py",  # read by `pp3 qualify` before the guard, and by --plan
        "pp3cli/cli/ranked.py",
        "pp3cli/receipts/rates.py",
    ],
)
def test_distributed_modules_load_without_torch(module: str) -> None:
    """torch and triton load inside functions only: verify-receipts runs where they are absent."""
    assert _module_imports(ROOT / module, ("torch", "triton")) == set()
