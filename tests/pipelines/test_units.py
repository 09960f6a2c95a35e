"""Fast checks of the pipeline pieces: the DAG from DVC, overrides, failure classification, tables, schedules, CLIs."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from pipelines import overrides as ov
from pipelines.dag import DagError, read_stages, select
from pipelines.dvc_cli import CommandResult, stage_env
from pipelines.execute import (
    PermanentStageError,
    TransientStageError,
    describe_changes,
    is_transient,
    parse_repro_log,
    read_key_metrics,
    stage_failure,
)
from pipelines.flow import summary_table
from pipelines.runs import stage_run_env, tracking_uri
from tests.pipelines.conftest import REPO
from trainlab.core.cli import run_cli
from trainlab.core.config import load_params
from trainlab.core.errors import DataError, ParamsError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_dag_comes_from_dvc_in_dependency_order():
    stages = read_stages(REPO)
    names = [s.name for s in stages]
    assert set(names) == set(yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"])
    for i, stage in enumerate(stages):
        assert stage.upstream <= set(names[:i]), f"{stage.name} comes before one of its dependencies"
    by_name = {s.name: s for s in stages}
    assert names[0] == "prepare" and "prepare" in by_name["train_classifier"].upstream
    assert "reports/classifier/metrics.json" in by_name["train_classifier"].metrics
    assert [s.name for s in select(stages, ["train_text"])] == ["prepare", "text_baseline", "train_text"]
    with pytest.raises(DagError, match="unknown stage"):
        select(stages, ["train_nothing"])


def test_overrides_and_grids_parse_to_yaml_values():
    assert ov.parse_overrides(["classifier.lr=0.01", "base.seed=3", "classifier.pretrained=null"]) == {
        "classifier.lr": 0.01, "base.seed": 3, "classifier.pretrained": None}
    grid = ov.parse_grid(["classifier.lr=0.001,0.003", "base.seed=1,2"])
    assert ov.expand_grid(grid) == [{"classifier.lr": 0.001, "base.seed": 1}, {"classifier.lr": 0.001, "base.seed": 2},
                                    {"classifier.lr": 0.003, "base.seed": 1}, {"classifier.lr": 0.003, "base.seed": 2}]
    with pytest.raises(ParamsError, match="KEY=VALUE"):
        ov.parse_overrides(["classifier.lr"])
    with pytest.raises(ParamsError, match="classifier.lrr"):
        ov.validated_params(REPO, {"classifier.lrr": 0.1})


def result(*lines: str, rc: int = 255) -> CommandResult:
    return CommandResult(rc, list(lines), 1.0)


@pytest.mark.parametrize("code", [2, 3, 4, 5])
def test_user_error_exit_codes_are_permanent(code):
    error = stage_failure("train_classifier", result(
        "error: data/raw/x.csv row 3: not a number", "  (expected a float)",
        f"ERROR: failed to reproduce 'train_classifier': failed to run: python -m stages.x, exited with {code}"))
    assert isinstance(error, PermanentStageError) and error.exit_code == code
    assert "row 3: not a number (expected a float)" in str(error) and "not retried" in str(error)
    assert not is_transient(None, None, SimpleNamespace(data=error))


@pytest.mark.parametrize("lines", [
    ("Traceback ...", "ERROR: failed to reproduce 'x': failed to run: python -m stages.x, exited with 1"),
    ("ERROR: failed to reproduce 'x': failed to run: python -m stages.x, exited with -9",),
    ("ERROR: Unable to acquire lock. Most likely another DVC process is running",),
])
def test_crashes_kills_and_lock_contention_are_retried(lines):
    error = stage_failure("x", result(*lines))
    assert isinstance(error, TransientStageError)
    assert is_transient(None, None, SimpleNamespace(data=error))
    assert is_transient(None, None, SimpleNamespace(data=OSError("disk hiccup")))
    assert not is_transient(None, None, SimpleNamespace(data=DataError("bad row")))


def test_repro_log_tells_ran_skipped_restored():
    log = ["Stage 'prepare' didn't change, skipping", "Running stage 'train_classifier':", "> python -m ...",
           "Stage 'train_text' is cached - skipping run, checking out outputs"]
    assert parse_repro_log(log) == [("prepare", "skipped"), ("train_classifier", "ran"), ("train_text", "restored")]
    assert describe_changes([{"changed deps": {"params.yaml": {"classifier.lr": 1}}}, "always changed"]) == (
        "changed deps (params.yaml); always changed")


def test_key_metrics_prefer_test_metrics(tmp_path):
    (tmp_path / "m.json").write_text('{"test_accuracy": 0.5, "epochs": 3, "nested": {"a": 1}}')
    stage = SimpleNamespace(metrics=("m.json", "missing.json"))
    assert read_key_metrics(stage, tmp_path) == {"test_accuracy": 0.5}


def test_tracking_uri_is_anchored_at_the_repo(tmp_path, monkeypatch):
    params = load_params(REPO / "params.yaml")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri(tmp_path, params) == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///stores/m.db")
    assert tracking_uri(tmp_path, params) == f"sqlite:///{tmp_path / 'stores/m.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking_uri(tmp_path, params) == "http://127.0.0.1:5000"
    off = load_params(REPO / "params.yaml", {"tracking.enabled": False})
    assert tracking_uri(tmp_path, off) is None


def test_stage_env_puts_this_interpreter_first_and_analytics_off():
    import sys
    from pathlib import Path

    env = stage_env({"TRAINLAB_PARENT_RUN_ID": "abc"})
    assert env["PATH"].split(":")[0] == str(Path(sys.executable).parent)
    assert env["DVC_NO_ANALYTICS"] == "1" and env["TRAINLAB_PARENT_RUN_ID"] == "abc"


def test_summary_table_lists_every_stage():
    summary = {"stages": [
        {"stage": "prepare", "status": "skipped", "seconds": 1.0, "metrics": {}, "reason": "up to date"},
        {"stage": "train_classifier", "status": "ran", "seconds": 12.5, "metrics": {"test_accuracy": 0.91}}]}
    table = summary_table(summary)
    assert "| prepare | skipped | 1.0 | up to date |" in table
    assert "| train_classifier | ran | 12.5 | test_accuracy=0.91 |" in table


def test_schedule_comes_from_params_or_the_command_line(tmp_path):
    from pipelines.schedule import describe, schedule_for

    assert describe(schedule_for(REPO, None, None, None)) == "cron '0 3 * * *' (UTC)"
    assert describe(schedule_for(REPO, "*/5 * * * *", None, "Europe/Berlin")) == "cron '*/5 * * * *' (Europe/Berlin)"
    assert describe(schedule_for(REPO, None, 30, None)) == "every 30 s"
    with pytest.raises(ParamsError, match="not a valid cron"):
        schedule_for(REPO, "61 * * * *", None, None)
    with pytest.raises(ParamsError, match="interval"):
        schedule_for(REPO, None, 0, None)


@pytest.mark.parametrize("module, argv, message", [
    ("pipelines.flow", ["--override", "classifier.lr=-1"], "classifier.lr"),
    ("pipelines.sweep", ["--grid", "classifier.lrr=0.1,0.2"], "did you mean 'classifier.lr'"),
    ("pipelines.schedule", ["--cron", "61 * * * *"], "not a valid cron"),
])
def test_bad_input_is_one_clear_line_and_exit_2(module, argv, message, monkeypatch, capsys):
    import importlib

    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(importlib.import_module(module).main, argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_deep_merge_merges_nested_sections_and_copies_values():
    extra = {"classifier": {"lr": 0.1, "milestones": [1, 2]}, "new": {"x": 1}}
    base = {"classifier": {"lr": 0.01, "epochs": 3}, "text": {"epochs": 4}}
    merged = ov.deep_merge(base, extra)
    assert merged is base
    assert base == {"classifier": {"lr": 0.1, "epochs": 3, "milestones": [1, 2]}, "text": {"epochs": 4},
                    "new": {"x": 1}}
    base["classifier"]["milestones"].append(3)
    assert extra["classifier"]["milestones"] == [1, 2]  # copied, not shared


def test_copy_worktree_takes_tracked_and_untracked_files_but_not_ignored_or_skipped(tmp_path):
    from pipelines.workspace import copy_worktree
    from tests.pipelines.conftest import commit_all, git

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    git(["init", "--quiet"], src)
    (src / ".gitignore").write_text("ignored.txt\n")
    (src / "tracked.txt").write_text("t")
    (src / "sub").mkdir()
    (src / "sub" / "skipped.txt").write_text("s")
    commit_all(src)
    (src / "tracked.txt").write_text("edited")
    (src / "untracked.txt").write_text("u")
    (src / "ignored.txt").write_text("i")
    copy_worktree(src, dst, skip=lambda rel: rel.startswith("sub/"))
    assert sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*") if p.is_file()) == [
        ".gitignore", "tracked.txt", "untracked.txt"]
    assert (dst / "tracked.txt").read_text() == "edited"  # as the files are now, not as committed


def test_stage_runs_of_an_experiment_get_its_name_as_dvc_exp_run_gives_it():
    """A stage in a flow's experiment or a sweep point names its MLflow run after it (DVC_EXP_NAME)."""
    assert stage_run_env("sqlite:///x.db", "abc", "lr-seed-03") == {
        "DVC_EXP_NAME": "lr-seed-03", "MLFLOW_TRACKING_URI": "sqlite:///x.db", "TRAINLAB_PARENT_RUN_ID": "abc"}
    assert "DVC_EXP_NAME" not in stage_run_env("sqlite:///x.db", "abc")


def test_a_search_trial_trained_with_epochs_auto_reads_its_plateau_record(tmp_path):
    """A trial stopped by its plateau schedule is scored by the weights it kept (its best validation), and says so;
    a run of a set number of epochs has no record."""
    from pipelines.search import plateau_record

    info = tmp_path / "info.json"
    record = {"stopped_epoch": 12, "best_epoch": 9, "best_val_accuracy": 0.91, "why": "val_accuracy had not improved"}
    info.write_text(json.dumps({"task": "classifier", "stopping": record}))
    assert plateau_record(info) == record
    info.write_text(json.dumps({"task": "classifier"}))
    assert plateau_record(info) == {} and plateau_record(tmp_path / "missing.json") == {}
