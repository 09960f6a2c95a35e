"""No import circle in the code, counting imports inside functions, under TYPE_CHECKING and by a registry's module
path (a circle is a layering mistake whichever way it is hidden); no code, benchmarks included, imports the tests; and
the MLflow adapter imports lazily only what is heavy to load."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.import_graph import REPO, imports_in, module_file, module_name, repo_modules

# Imported inside functions so that a command starts (and probes its MLflow server) before these load: each takes
# from a tenth of a second (requests, numpy) to seconds (mlflow, torch). A trainlab module that loads one of them at
# import may be imported lazily for the same reason.
HEAVY = ("mlflow", "torch", "torchvision", "numpy", "pandas", "matplotlib", "requests", "safetensors", "PIL", "scipy")
LAZY_CHECKED = ("trainlab/tracking",)  # where every lazy import must be of something heavy


def import_graph(roots: tuple[str, ...]) -> dict[str, dict[str, tuple[Path, int]]]:
    """module -> {imported module of these roots: (file, line)}, over every import (lazy and typing-only too, and a
    module a registry names by its path: the task registry imports the tasks' code when asked for it)."""
    modules = {name: path for root in roots for name, path in repo_modules(root).items()}
    return {name: {i.module: (path, i.line) for i in imports_in(path, by_name=True)
                   if i.module in modules and i.module != name}
            for name, path in modules.items()}


def circles(graph: dict[str, dict[str, tuple[Path, int]]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each a set of modules importing each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def describe(group: list[str], graph: dict[str, dict[str, tuple[Path, int]]]) -> str:
    edges = [f"{a} -> {b} ({path.relative_to(REPO)}:{line})" for a in group
             for b, (path, line) in sorted(graph[a].items()) if b in group]
    return "; ".join(edges)


@pytest.mark.parametrize("roots", [("trainlab",), ("trainlab", "stages", "pipelines")], ids=["trainlab", "all"])
def test_no_import_circle(roots):
    graph = import_graph(roots)
    found = circles(graph)
    assert not found, "import circles: " + " | ".join(describe(group, graph) for group in found)


def test_the_circle_finder_sees_lazy_and_typing_only_imports(tmp_path):
    source = tmp_path / "a.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainlab.tasks import base\n"
                      "def f():\n    import trainlab.tracking.spool\n")
    found = {(i.module, i.lazy, i.typing_only) for i in imports_in(source)}
    assert found >= {("trainlab.tasks.base", False, True), ("trainlab.tracking.spool", True, False)}
    here = (Path("a.py"), 1)
    graph = {"a": {"b": here}, "b": {"c": here}, "c": {"a": here}, "d": {"a": here}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b": here}, "b": {}}) == []


# The code the tests exercise (and the benchmarks, which import the code): none of it may import the tests. What both
# need lives beside the benchmarks (benchmarks/tiny.py, benchmarks/processes.py), which the tests may import.
NOT_TESTS = ("trainlab", "stages", "pipelines", "benchmarks")


def imports_of_the_tests(path: Path) -> list[str]:
    """`path`'s imports of the tests (module level or inside functions), each as "line N: module"."""
    return [f"line {i.line}: {i.module}" for i in imports_in(path)
            if i.module == "tests" or i.module.startswith("tests.")]


@pytest.mark.parametrize("root", NOT_TESTS)
def test_no_code_imports_the_tests(root):
    found = [f"{path.relative_to(REPO)} {line}" for path in repo_modules(root).values()
             for line in imports_of_the_tests(path)]
    assert not found, "move what these need out of tests/ (into benchmarks/ or the package): " + "; ".join(found)


def test_the_tests_import_check_sees_lazy_imports(tmp_path):
    source = tmp_path / "bench.py"
    source.write_text("import testsuite\nimport tests.reliability.factories\n"
                      "def f():\n    from tests.tiny import TINY_PARAMS\n")
    assert imports_of_the_tests(source) == ["line 2: tests.reliability.factories", "line 4: tests.tiny"]


def test_the_circle_finder_sees_the_modules_a_registry_names(tmp_path):
    source = tmp_path / "registry.py"
    source.write_text('register(Spec("toy", "trainlab.tasks.text", "trainlab.no_such_module", "data/prepared"))\n')
    assert [(i.module, i.lazy) for i in imports_in(source, by_name=True)] == [("trainlab.tasks.text", True)]
    assert imports_in(source) == []  # the DVC-deps analysis adds the code of a stage's own tasks by itself
    assert {"trainlab.tasks.classifier", "trainlab.tasks.segmenter", "trainlab.tasks.text"} <= \
        set(import_graph(("trainlab",))["trainlab.tasks"])


def heavy_at_import(module: str, seen: set[str] | None = None) -> bool:
    """Whether importing `module` loads a HEAVY module (through module-level imports, its packages' included)."""
    seen = set() if seen is None else seen
    if module in seen:
        return False
    seen.add(module)
    if module.split(".")[0] in HEAVY:
        return True
    parts = module.split(".")
    parents = [".".join(parts[:i]) for i in range(1, len(parts))]
    path = module_file(module)
    direct = [i.module for i in imports_in(path) if not i.lazy and not i.typing_only] if path else []
    return any(heavy_at_import(m, seen) for m in parents + direct if m.split(".")[0] in HEAVY or module_file(m))


@pytest.mark.parametrize("folder", LAZY_CHECKED)
def test_lazy_imports_are_of_heavy_modules_only(folder):
    """A lazy import of anything light hides what a module depends on (and, in the past here, import circles)."""
    light = [f"{path.relative_to(REPO)}:{i.line} imports {i.module} inside a function"
             for path in sorted((REPO / folder).rglob("*.py")) if "__pycache__" not in path.parts
             for i in imports_in(path) if i.lazy and not i.typing_only and not heavy_at_import(i.module)]
    assert not light, "move these imports to the top of their modules: " + "; ".join(light)


def test_heavy_at_import_follows_module_level_imports_only():
    assert heavy_at_import("mlflow.entities") and heavy_at_import("trainlab.core.repro")  # imports torch
    assert not heavy_at_import("trainlab.tracking.secrets") and not heavy_at_import("json")
    assert not heavy_at_import("trainlab.core.provenance")  # the flows' and every run's record, torch-free
    assert module_name(REPO / "trainlab/tracking/__init__.py") == "trainlab.tracking"
