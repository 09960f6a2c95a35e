"""The real pipeline on tiny params and data as a Prefect flow: every stage runs under one MLflow run, then all skip."""

from __future__ import annotations

import json

import pytest

from pipelines.dag import read_stages
from tests.pipelines.conftest import dvc

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


def mlflow_client(repo):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")


def test_first_run_executes_every_stage_under_one_parent_mlflow_run(first_pipeline_run, tiny_repo):
    summary, seconds = first_pipeline_run
    stages = [s.name for s in read_stages(tiny_repo)]
    print(f"first pipeline run: {seconds:.1f} s")

    assert summary["ok"] and [s["stage"] for s in summary["stages"]] == stages
    assert all(s["status"] == "ran" and s["seconds"] > 0 for s in summary["stages"]), summary["stages"]
    by_stage = {s["stage"]: s for s in summary["stages"]}
    assert 0 <= by_stage["train_classifier"]["metrics"]["test_accuracy"] <= 1
    assert "test_mean_iou" in by_stage["train_segmenter"]["metrics"]

    client = mlflow_client(tiny_repo)
    parent = client.get_run(summary["mlflow_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["stage"] == "pipeline"
    assert parent.data.tags["stage_status.train_text"] == "ran"
    assert parent.data.metrics["train_classifier.seconds"] == pytest.approx(by_stage["train_classifier"]["seconds"])
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert {r.data.tags["stage"] for r in children} >= {"prepare", "train_classifier", "train_segmenter", "train_text"}
    assert by_stage["train_classifier"]["mlflow_run_id"] in {r.info.run_id for r in children}
    flow_run = parent.data.tags["prefect_flow_run"]
    assert flow_run and parent.info.run_name == f"pipeline {flow_run}"  # named after its Prefect flow run


def test_runs_have_distinct_names_dataset_inputs_and_the_model_training_view(first_pipeline_run, tiny_repo):
    """What the MLflow UI shows: a name per run that says its stage; the Dataset column; the experiment's kind."""
    from trainlab.tracking.lineage import file_md5

    summary, _ = first_pipeline_run
    client = mlflow_client(tiny_repo)
    parent = client.get_run(summary["mlflow_run_id"])
    experiment = client.get_experiment(parent.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    names = {r.data.tags["stage"]: r.info.run_name for r in children}
    assert len(set(names.values())) == len(children) == len(summary["stages"])
    assert all(name.startswith(f"{stage} ") for stage, name in names.items()), names
    prepared = tiny_repo / "data" / "prepared"
    for run in children:
        stage = run.data.tags["stage"]
        inputs = {(d.dataset.name, d.dataset.digest) for d in run.inputs.dataset_inputs}
        if stage.startswith("train_"):
            folder = {"train_classifier": "classification", "train_segmenter": "segmentation"}.get(stage, "text")
            assert inputs == {(f"{folder}/{s}", file_md5(prepared / folder / f"{s}.safetensors"))
                              for s in ("train", "val", "test")}
        elif stage == "evaluate":
            assert inputs == {(f"{f}/test", file_md5(prepared / f / "test.safetensors"))
                              for f in ("classification", "segmentation", "text")}


def test_pipeline_summary_artifact(first_pipeline_run, tiny_repo):
    summary, _ = first_pipeline_run
    stages = [s.name for s in read_stages(tiny_repo)]
    client = mlflow_client(tiny_repo)
    parent = client.get_run(summary["mlflow_run_id"])
    logged = json.loads((tiny_repo / client.download_artifacts(parent.info.run_id, "pipeline_summary.json",
                                                               str(tiny_repo / ".."))).read_text())
    assert [s["status"] for s in logged["stages"]] == ["ran"] * len(stages)


def test_second_run_skips_every_stage_and_leaves_dvc_status_clean(first_pipeline_run, tiny_env):
    from pipelines.flow import pipeline

    summary = pipeline(root=str(tiny_env), retries=0)

    assert summary["ok"]
    assert {s["status"] for s in summary["stages"]} == {"skipped"}, summary["stages"]
    assert "up to date" in dvc(["status"], tiny_env).stdout
    assert "test_accuracy" in {k for s in summary["stages"] for k in s["metrics"]}  # read from the workspace


def test_bytecode_caches_and_the_raw_data_readme_do_not_make_stages_stale(first_pipeline_run, tiny_env):
    """.dvcignore: another interpreter's __pycache__ or a doc edit beside the raw data reruns nothing."""
    cache = tiny_env / "trainlab" / "data" / "__pycache__"
    cache.mkdir(exist_ok=True)
    (cache / "splits.cpython-399.pyc").write_bytes(b"\x00bytecode of another interpreter")
    readme = tiny_env / "data" / "raw" / "README.md"
    original = readme.read_text()
    readme.write_text(original + "\nA note added by a user.\n")
    try:
        assert "up to date" in dvc(["status"], tiny_env).stdout
    finally:
        (cache / "splits.cpython-399.pyc").unlink()
        readme.write_text(original)
