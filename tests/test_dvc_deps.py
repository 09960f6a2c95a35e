"""dvc.yaml's code deps are exactly the code that can change a stage's outputs: its command's module and every module
of this repo that it imports, at module level or inside functions (read from the source, not by running it), plus the
code of the tasks the stage runs (trainlab.tasks loads it by name), less the code that cannot change an output's
bytes (NOT_DEPS): so an edit to MLflow plumbing or a progress bar reruns no stage, and one to a model, a loss, the data
or the code writing the outputs reruns the stages it feeds (shown with real DVC at the end). `python -m
trainlab.dvc_deps` writes them; its `--check` is the test, and fails naming the stage and file on any drift."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainlab import tasks
from trainlab.dvc_deps import (
    CODE_DEP,
    NOT_DEPS,
    closure,
    code_files,
    dep_entries,
    excluded,
    imports_of,
    rewritten,
    stage_modules,
    wanted_deps,
)
from trainlab.import_graph import REPO

STAGES = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]


def dvc_deps(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainlab.dvc_deps", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_dvc_yaml_code_deps_are_what_each_stage_imports():
    proc = dvc_deps("--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def generated(tmp_path) -> Path:
    """A copy of dvc.yaml with the code deps written as the command writes them (so that the lead's edits of the
    code while the tests run do not matter here)."""
    text = (REPO / "dvc.yaml").read_text()
    path = tmp_path / "dvc.yaml"
    path.write_text(rewritten(text, wanted_deps(text)))
    return path


def drifted(text: str) -> str:
    """`text` with trainlab/engine/step.py gone from train_classifier's deps and an MLflow module added to prepare's."""
    lines = text.splitlines(keepends=True)
    stage_start = lines.index("  train_classifier:\n")
    step = lines.index("      - trainlab/engine/step.py\n", stage_start)
    del lines[step]
    lines.insert(lines.index("      - stages/prepare.py\n") + 1, "      - trainlab/tracking/queue.py\n")
    return "".join(lines)


def non_dep_lines(text: str) -> list[str]:
    return [line for line in text.splitlines(keepends=True) if not CODE_DEP.match(line)]


def test_the_check_names_each_stage_and_file_that_drift(generated):
    assert dvc_deps("--check", str(generated)).returncode == 0
    generated.write_text(drifted(generated.read_text()))
    proc = dvc_deps("--check", str(generated))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "dvc.yaml stage train_classifier:\n  missing (the stage runs it): trainlab/engine/step.py\n" in proc.stderr
    assert "dvc.yaml stage prepare:\n  extra (the stage does not run it): trainlab/tracking/queue.py\n" in proc.stderr
    assert "stage train_segmenter" not in proc.stderr
    assert f"fix: python -m trainlab.dvc_deps {generated}" in proc.stderr


def test_writing_fixes_the_drift_and_keeps_every_other_line(generated):
    expected = generated.read_bytes()
    generated.write_text(drifted(generated.read_text()))
    proc = dvc_deps(str(generated))
    assert proc.returncode == 0 and "rewritten" in proc.stdout, proc.stdout + proc.stderr
    assert generated.read_bytes() == expected
    assert dvc_deps("--check", str(generated)).returncode == 0
    assert non_dep_lines(expected.decode()) == non_dep_lines((REPO / "dvc.yaml").read_text())
    data_deps = yaml.safe_load(expected)["stages"]["train_text"]["deps"][:2]
    assert data_deps == ["data/prepared/text", "models/text_baseline"]


BEFORE = """\
# top
stages:
  a:
    cmd: python -m stages.a
    deps:   # why
    - data/x   # data
    # a comment
    - trainlab/old.py
    - models/y
    - stages/a.py
    outs:
    - trainlab/out.py
  b:
    cmd: python -m stages.b
    deps:
      - data/z
    params:
      - b
"""

AFTER = """\
# top
stages:
  a:
    cmd: python -m stages.a
    deps:   # why
    - data/x   # data
    # a comment
    - stages/a.py
    - trainlab/new.py
    - models/y
    outs:
    - trainlab/out.py
  b:
    cmd: python -m stages.b
    deps:
      - data/z
      - trainlab/b.py
    params:
      - b
"""


def test_the_rewrite_reads_the_deps_list_by_indentation_and_keeps_comments():
    """A stage's code deps go where its first one was (else after its last dep), at that line's indentation; what is
    not under `deps:` (an out under trainlab/) is left alone."""
    assert rewritten(BEFORE, {"a": ["stages/a.py", "trainlab/new.py"], "b": ["trainlab/b.py"]}) == AFTER


def test_a_folder_is_written_when_every_file_in_it_is_a_dep():
    every_task = code_files("trainlab/tasks/")
    assert dep_entries(every_task | {Path("trainlab/__init__.py")}) == ["trainlab/__init__.py", "trainlab/tasks/"]
    some = every_task - {Path("trainlab/tasks/text.py")}
    assert dep_entries(some) == sorted(p.as_posix() for p in some)


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
