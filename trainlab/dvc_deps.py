"""Write dvc.yaml's code deps from what each stage imports; `--check` reports where they drift and changes nothing."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import yaml

from trainlab import tasks
from trainlab.core.atomic import write_text
from trainlab.core.cli import command_parser, run_cli
from trainlab.core.errors import UserError
from trainlab.import_graph import REPO, imports_in, module_file

DVC_YAML = REPO / "dvc.yaml"
DEP_ROOTS = ("trainlab", "stages")  # the packages whose files are DVC deps; pipelines/ runs DVC, it is not run by it
EVERY_TASK_STAGES = ("evaluate", "profile")  # stages that run the code of every registered task
# A dvc.yaml dep line naming this repo's code (a .py file or a folder); it may carry a comment, which is not kept.
CODE_DEP = re.compile(r"^(?P<indent>\s*)- (?P<dep>(?:trainlab|stages|pipelines)/(?:\S*\.py|\S*/))\s*(?:#.*)?$")

# Code no stage's outputs depend on: not a dep, and what it alone imports is not one either. Each entry says why.
NOT_DEPS = {
    # The MLflow adapter only talks to MLflow. It reaches training only through engine/contract.py's Tracker.failed
    # (the engine's stop event, set when the store refuses the run: a dep, as part of the engine), and the outputs
    # an outage spool keeps are copied and put back by trainlab/jobs/outputs.py (a dep).
    "trainlab/tracking/": "MLflow talk only",
    # What a training stage logs to MLflow as its raw-input model (the pyfunc flavour); no stage writes an out with it
    # (the predict command and the served model use it).
    "trainlab/serving/": "the MLflow model's code",
    "trainlab/engine/progress.py": "training progress on the terminal",
}


def excluded(path: Path) -> bool:
    rel = path.as_posix()
    return any(rel == entry or (entry.endswith("/") and rel.startswith(entry)) for entry in NOT_DEPS)


def imports_of(path: Path) -> set[str]:
    """Every module that `path` imports and runs (module level and function bodies, not TYPE_CHECKING)."""
    return {i.module for i in imports_in(path) if not i.typing_only}


def closure(modules: set[str]) -> set[Path]:
    """The files of `modules` and of everything they import, transitively, with the packages that contain them
    (importing a.b.c runs a/__init__.py and a/b/__init__.py), except NOT_DEPS and what only they import."""
    todo, seen, files = list(modules), set(), set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        path = module_file(module, DEP_ROOTS)
        if path is None or excluded(path.relative_to(REPO)):
            continue
        files.add(path.relative_to(REPO))
        todo.extend(imports_of(path))
    return files


def stage_modules(name: str, cmd: str) -> set[str]:
    """The module a stage's command runs (`python -m X`), and the code of the tasks that stage runs (the task
    registry names it by module path: trainlab.tasks imports it when a task is loaded)."""
    argv = shlex.split(cmd)
    if argv[:2] != ["python", "-m"] or len(argv) < 3:
        raise UserError(f"dvc.yaml stage {name}: expected `python -m ...`, got {cmd!r}")
    modules = {argv[2]}
    trained = [spec for spec in tasks.REGISTRY.values() if spec.stage == name]
    if trained:
        modules.update(spec.code for spec in trained)
    elif name in EVERY_TASK_STAGES:
        modules.update(spec.code for spec in tasks.REGISTRY.values())
    return modules


def code_files(dep: str) -> set[Path]:
    """The Python files a code dep names: the file, or every .py file under the folder."""
    if not dep.endswith("/"):
        return {Path(dep)}
    return {p.relative_to(REPO) for p in (REPO / dep).rglob("*.py") if "__pycache__" not in p.parts}


def dep_entries(files: set[Path]) -> list[str]:
    """The dep lines naming `files`, sorted: a folder whose .py files are all among them, else each file."""
    folders = {parent for f in files for parent in f.parents if parent != Path(".")}
    whole = {d for d in folders if code_files(f"{d.as_posix()}/") <= files}
    top = {d for d in whole if not whole & set(d.parents)}
    loose = {f for f in files if not top & set(f.parents)}
    return sorted([f"{d.as_posix()}/" for d in top] + [f.as_posix() for f in loose])


def wanted_deps(text: str) -> dict[str, list[str]]:
    """Each stage's code deps as they should read, computed from the import closure of what its command runs."""
    stages = (yaml.safe_load(text) or {}).get("stages", {})
    return {name: dep_entries(closure(stage_modules(name, stage["cmd"]))) for name, stage in stages.items()}


def deps_items(lines: list[str]) -> dict[str, list[int]]:
    """The indices of the list items under each stage's `deps:`, read from the text (indentation, not YAML)."""
    items: dict[str, list[int]] = {}
    in_stages, stage_indent, stage, deps_indent = False, None, None, None
    for index, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        if stage_indent is None and in_stages and indent:
            stage_indent = indent  # the first key under `stages:`
        if indent == 0:
            in_stages, stage_indent, stage, deps_indent = stripped.startswith("stages:"), None, None, None
        elif in_stages and indent == stage_indent:
            stage, deps_indent = stripped.split(":", 1)[0], None
            items[stage] = []
        elif deps_indent is not None and (indent > deps_indent or indent == deps_indent and stripped[:2] == "- "):
            items[stage].append(index)
        elif stage is not None:
            deps_indent = indent if re.fullmatch(r"deps:\s*(#.*)?", stripped) else None
    return items


def current_deps(text: str) -> dict[str, list[str]]:
    """Each stage's code dep lines as dvc.yaml has them."""
    lines = text.splitlines(keepends=True)
    return {stage: [m["dep"] for i in indices if (m := CODE_DEP.match(lines[i]))]
            for stage, indices in deps_items(lines).items()}


def rewritten(text: str, wanted: dict[str, list[str]]) -> str:
    """`text` with each stage's run of code dep lines replaced by `wanted`'s (where its first one was, or after the
    stage's last dep), every other line as it was."""
    lines = text.splitlines(keepends=True)
    items = deps_items(lines)
    inserts: dict[int, list[str]] = {}
    dropped: set[int] = set()
    for stage, deps in wanted.items():
        if not items.get(stage):
            if deps:
                raise UserError(f"dvc.yaml stage {stage}: no `deps:` list to write its code deps into; add one")
            continue
        code = [i for i in items[stage] if CODE_DEP.match(lines[i])]
        anchor = code[0] if code else items[stage][-1] + 1
        indent = CODE_DEP.match(lines[code[0]])["indent"] if code else re.match(r"\s*", lines[anchor - 1])[0]
        inserts[anchor] = [f"{indent}- {dep}\n" for dep in deps]
        dropped.update(code)
    if len(lines) in inserts and lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    out: list[str] = []
    for index, line in enumerate([*lines, ""]):
        out += inserts.get(index, [])
        if index not in dropped:
            out.append(line)
    return "".join(out)


def drift(path: Path = DVC_YAML) -> list[str]:
    """What differs between `path`'s code deps and the computed ones, per stage ([] when they match)."""
    text = path.read_text()
    have, wanted = current_deps(text), wanted_deps(text)
    report = []
    for stage, deps in wanted.items():
        if have.get(stage) == deps:
            continue
        declared = {f for dep in have.get(stage, []) for f in code_files(dep)}
        runs = {f for dep in deps for f in code_files(dep)}
        missing, extra = sorted(map(str, runs - declared)), sorted(map(str, declared - runs))
        lines = [f"  missing (the stage runs it): {f}" for f in missing]
        lines += [f"  extra (the stage does not run it): {f}" for f in extra]
        lines = lines or ["  same files, listed otherwise (sorted; a folder when all its .py files are deps)"]
        report += [f"{path.name} stage {stage}:", *lines]
    if not report and rewritten(text, wanted) != text:
        report.append(f"{path.name}: a stage's code deps are split by other deps (writing puts them together)")
    return report


def fix_command(path: Path) -> str:
    return "python -m trainlab.dvc_deps" + ("" if path.resolve() == DVC_YAML else f" {shlex.quote(str(path))}")


def main(argv: list[str]) -> None:
    parser = command_parser("python -m trainlab.dvc_deps", __doc__)
    parser.add_argument("dvc_yaml", nargs="?", type=Path, default=DVC_YAML, help="the file (default: dvc.yaml)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if the code deps drift")
    args = parser.parse_args(argv)
    if args.check:
        report = drift(args.dvc_yaml)
        if report:
            print("\n".join(report + [f"fix: {fix_command(args.dvc_yaml)}"]), file=sys.stderr)
            sys.exit(1)
        print(f"{args.dvc_yaml}: code deps match what each stage imports")
        return
    text = args.dvc_yaml.read_text()
    new = rewritten(text, wanted_deps(text))
    if new != text:
        write_text(args.dvc_yaml, new)
    print(f"{args.dvc_yaml}: code deps {'rewritten' if new != text else 'already up to date'}")


if __name__ == "__main__":
    run_cli(main)
