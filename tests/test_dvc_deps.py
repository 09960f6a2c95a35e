"""dvc.yaml's code deps are exactly the code that can change a stage's outputs: its command's module and every module
of this repo that it imports, at module level or inside functions (read from the source, not by running it), plus the
code of the tasks the stage runs (trainlab.tasks loads it by name), less the code that cannot change an output's
bytes (NOT_DEPS): so an edit to MLflow plumbing or a progress bar reruns no stage, and one to a model, a loss, the data
or the code writing the outputs reruns the stages it feeds (shown with real DVC at the end)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from tests.import_graph import REPO, imports_in, module_file
from trainlab import tasks

CODE_ROOTS = ("trainlab", "stages")  # the packages whose files are DVC deps; pipelines/ runs DVC, it is not run by it

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
        path = module_file(module, CODE_ROOTS)
        if path is None or excluded(path.relative_to(REPO)):
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
    assert imports_of(source) >= {"trainlab.core.errors", "trainlab.tasks.text"}
    assert "trainlab.jobs.train" not in imports_of(source)


def test_not_deps_name_existing_code_and_leave_the_output_writers_in():
    for entry in NOT_DEPS:
        assert (REPO / entry).exists(), f"NOT_DEPS names {entry}, which does not exist"
    runs = closure(stage_modules("train_classifier", STAGES["train_classifier"]["cmd"]))
    assert {Path("trainlab/jobs/outputs.py"), Path("trainlab/engine/contract.py"), Path("trainlab/jobs/train.py"),
            Path("trainlab/models/classifier.py"), Path("trainlab/engine/step.py")} <= runs
    assert not any(excluded(f) for f in runs)
    assert excluded(Path("trainlab/tracking/queue.py")) and not excluded(Path("trainlab/engine/progress_bar.py"))


def test_a_change_to_one_task_does_not_rerun_another_tasks_training():
    for spec in tasks.REGISTRY.values():
        runs = closure(stage_modules(spec.stage, STAGES[spec.stage]["cmd"]))
        others = {Path(*other.code.split(".")).with_suffix(".py") for other in tasks.REGISTRY.values()
                  if other is not spec}
        others |= {Path("trainlab/models", f"{other.name}.py") for other in tasks.REGISTRY.values()
                   if other is not spec}
        assert not runs & others, f"{spec.stage} runs another task's code: {sorted(map(str, runs & others))}"


# --- the rule, seen by DVC itself -----------------------------------------------------------------------------------

MLFLOW_ONLY = ("trainlab/tracking/tracker.py", "trainlab/tracking/queue.py", "trainlab/tracking/runs.py",
               "trainlab/serving/flavor.py", "trainlab/engine/progress.py")
TRAINING = {"train_classifier", "train_segmenter", "train_text"}


def placeholder(root: Path, out: str) -> None:
    """A stand-in for an out: a folder with one file (no suffix), else a file."""
    path = root / out
    if path.suffix:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("placeholder\n")
    else:
        path.mkdir(parents=True, exist_ok=True)
        (path / "placeholder.txt").write_text("placeholder\n")


@pytest.fixture(scope="module")
def recorded_repo(tmp_path_factory) -> Path:
    """A copy of this working tree in a fresh git repo, every stage recorded up to date with `dvc commit` over
    placeholder outputs: DVC hashes the deps as they are now, and no stage runs."""
    from tests.reliability.factories import dvc, git, make_dvc_repo, tiny_params

    root = make_dvc_repo(tmp_path_factory.mktemp("deps") / "repo", tiny_params())
    for stage in STAGES.values():
        for entry in stage.get("outs", []) + stage.get("metrics", []) + stage.get("plots", []) + stage["deps"]:
            out = entry if isinstance(entry, str) else next(iter(entry))
            if not (root / out).exists():  # an out, or a dep that is an upstream out (data/prepared/text)
                placeholder(root, out)
    proc = dvc(["commit", "--force", "--quiet"], root, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    git(["add", "-A"], root)
    return root


def stages_to_rerun(root: Path) -> set[str]:
    """The stages `dvc status` says changed (their own deps, params or outs)."""
    import json

    from tests.reliability.factories import dvc

    proc = dvc(["status", "--json"], root, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return set(json.loads(proc.stdout or "{}"))


@pytest.mark.parametrize("edited,must_rerun", [
    *((path, set()) for path in MLFLOW_ONLY),
    ("trainlab/models/classifier.py", {"train_classifier"}),  # a model
    ("trainlab/tasks/segmenter.py", {"train_segmenter"}),  # a loss
    ("trainlab/engine/step.py", TRAINING),  # the training step
    ("trainlab/data/splits.py", {"prepare"}),  # the data
    ("trainlab/jobs/outputs.py", TRAINING),  # what writes outputs back from an outage spool
])
def test_an_edit_reruns_the_stages_whose_outputs_it_can_change_and_no_other(recorded_repo, edited, must_rerun):
    assert stages_to_rerun(recorded_repo) == set(), "the recorded copy should start up to date"
    path = recorded_repo / edited
    original = path.read_bytes()
    try:
        path.write_bytes(original + b"\n# an edit\n")
        rerun = stages_to_rerun(recorded_repo)
    finally:
        path.write_bytes(original)
    if must_rerun:
        assert must_rerun <= rerun, f"an edit of {edited} reruns {sorted(rerun)}, not all of {sorted(must_rerun)}"
    else:
        assert rerun == set(), f"an edit of {edited} (no output's bytes depend on it) reruns {sorted(rerun)}"
