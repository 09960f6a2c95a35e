"""The import graph of this repo's code, read from the source (not by running it): every import statement with where
it is (module level or inside a function, under TYPE_CHECKING or not), and on request the modules a registry names by
their dotted path to import later. Read by trainlab.dvc_deps (dvc.yaml's code deps) and the import tests."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CODE_ROOTS = ("trainlab", "stages", "pipelines")


@dataclass(frozen=True)
class Import:
    module: str  # what is imported (for `from pkg import name`: pkg.name when that is a module, else pkg)
    line: int
    lazy: bool  # inside a function: runs when the function is called
    typing_only: bool  # under `if TYPE_CHECKING:`: never runs
    by_name: bool = False  # a string naming the module (a registry's entry): imported when asked for, lazily


def module_file(module: str, roots: tuple[str, ...] = CODE_ROOTS) -> Path | None:
    """The source file of a module of this repo (a package's __init__.py), or None for anything else."""
    if module.split(".")[0] not in roots:
        return None
    base = REPO.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_name(path: Path) -> str:
    parts = list(path.resolve().relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_in(path: Path, by_name: bool = False) -> list[Import]:
    """Every import statement of `path` (and `importlib.import_module("a.constant")`), in source order; `by_name`:
    also every string that is exactly the dotted name of a module of this repo's code (as "trainlab.tasks.text" in
    the task registry, imported by importlib when the task is loaded), as a lazy import."""
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool, typing_only: bool) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.body:
                visit(child, lazy, True)
            for child in node.orelse:
                visit(child, lazy, typing_only)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(alias.name, node.lineno, lazy, typing_only) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [f"{node.module}.{a.name}" for a in node.names if module_file(f"{node.module}.{a.name}")]
            if len(modules) < len(node.names):  # some names are attributes of the module itself
                found.append(Import(node.module, node.lineno, lazy, typing_only))
            found.extend(Import(m, node.lineno, lazy, typing_only) for m in modules)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            found.append(Import(node.args[0].value, node.lineno, lazy, typing_only))
        elif by_name and isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value \
                and module_file(node.value):
            found.append(Import(node.value, node.lineno, True, typing_only, by_name=True))
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner, typing_only)

    visit(ast.parse(path.read_text(), str(path)), False, False)
    return found


def repo_modules(root: str) -> dict[str, Path]:
    """Every module under the package `root` of this repo, by name."""
    return {module_name(p): p for p in sorted((REPO / root).rglob("*.py")) if "__pycache__" not in p.parts}
