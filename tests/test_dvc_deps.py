"""dvc.yaml's code deps are exactly the code each stage runs: its command's module and every trainlab module that
module imports, at module level or inside functions (found by reading the source, not by running it), plus the
code of the tasks the stage runs (trainlab.tasks loads it by name)."""

from __future__ import annotations

import ast
import shlex
from pathlib import Path

import pytest
import yaml

from trainlab import tasks

REPO = Path(__file__).resolve().parent.parent
CODE_ROOTS = ("trainlab", "stages")  # the packages whose files are DVC deps; pipelines/ runs DVC, it is not run by it


def module_file(module: str) -> Path | None:
    """The source file of a module of this repo (a package's __init__.py), or None for anything else."""
    if module.split(".")[0] not in CODE_ROOTS:
        return None
    base = REPO.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path) -> set[str]:
    """Every module that `path` imports anywhere (module level and function bodies), except under TYPE_CHECKING;
    `from pkg import name` counts pkg.name when that is a module."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names
                         if module_file(f"{node.module}.{alias.name}") is not None)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def closure(modules: set[str]) -> set[Path]:
    """The files of `modules` and of everything they import, transitively, with the packages that contain them
    (importing a.b.c runs a/__init__.py and a/b/__init__.py)."""
    todo, seen, files = list(modules), set(), set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        path = module_file(module)
        if path is None:
            continue
        files.add(path.relative_to(REPO))
        todo.extend(imports_of(path))
    return files


def stage_modules(name: str, cmd: str) -> set[str]:
    """The module a stage's command runs (`python -m X`), and the code of the tasks that stage runs."""
    argv = shlex.split(cmd)
    assert argv[:2] == ["python", "-m"], f"dvc.yaml stage {name}: expected `python -m ...`, got {cmd!r}"
    modules = {argv[2]}
    trained = [spec for spec in tasks.REGISTRY.values() if spec.stage == name]
    if trained:
        modules.update(spec.code for spec in trained)
    elif name in ("evaluate", "profile"):  # every registered task
        modules.update(spec.code for spec in tasks.REGISTRY.values())
    return modules


def code_files(dep: str) -> set[Path]:
    """The Python files of this repo that a dvc.yaml dep names (a file, or every file under a folder)."""
    path = REPO / dep
    if path.is_file():
        return {Path(dep)} if path.suffix == ".py" else set()
    return {p.relative_to(REPO) for p in path.rglob("*.py") if "__pycache__" not in p.parts}


STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


@pytest.mark.parametrize("name", sorted(STAGES))
def test_deps_cover_the_code_the_stage_runs_and_no_more(name):
    stage = STAGES[name]
    runs = closure(stage_modules(name, stage["cmd"]))
    deps = [d for d in stage.get("deps", []) if d.split("/")[0] in CODE_ROOTS]
    declared = {f: d for d in deps for f in code_files(d)}
    missing = sorted(str(f) for f in runs - set(declared))
    extra = sorted(f"{f} (from {declared[f]})" for f in set(declared) - runs)
    assert not missing, f"dvc.yaml stage {name}: runs code that is not among its deps: {missing}"
    assert not extra, f"dvc.yaml stage {name}: deps on code it does not run: {extra}"


def test_the_analysis_sees_function_level_imports_and_skips_type_checking_ones(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import trainlab.jobs.train\n"
                      "def f():\n    from trainlab.core import errors\n    import trainlab.tasks.text\n")
    assert imports_of(source) >= {"trainlab.core", "trainlab.core.errors", "trainlab.tasks.text"}
    assert "trainlab.jobs.train" not in imports_of(source)


def test_a_change_to_one_task_does_not_rerun_another_tasks_training():
    for spec in tasks.REGISTRY.values():
        runs = closure(stage_modules(spec.stage, STAGES[spec.stage]["cmd"]))
        others = {Path(*other.code.split(".")).with_suffix(".py") for other in tasks.REGISTRY.values()
                  if other is not spec}
        others |= {Path("trainlab/models", f"{other.name}.py") for other in tasks.REGISTRY.values() if other is not spec}
        assert not runs & others, f"{spec.stage} runs another task's code: {sorted(map(str, runs & others))}"
