"""Compare and promote against a real MLflow store (SQLite in tmp): the table, and `champion` moving only for better."""

from __future__ import annotations

import pytest

from pipelines.compare import (
    CHAMPION,
    champion_version,
    collect_runs,
    format_table,
    main,
    model_name,
    promote,
    promote_new_models,
)
from trainlab.core.cli import run_cli

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

EXPERIMENT = "trainlab"


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A folder that looks like the repo to the CLI (.dvc, params.yaml), with its own MLflow store."""
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "params.yaml").write_text(f"tracking:\n  experiment: {EXPERIMENT}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return tmp_path


@pytest.fixture
def client(repo):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{repo / 'mlflow.db'}")
    client.create_experiment(EXPERIMENT)
    return client


def train(client, accuracy: float, lr: float, task: str = "classifier", parent: str | None = None,
          register: bool = True) -> tuple[str, str | None]:
    """A finished training run as the stages log it, optionally registered as a new model version."""
    experiment_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
    tags = {"stage": f"train_{task}", **({"mlflow.parentRunId": parent} if parent else {})}
    run_id = client.create_run(experiment_id, tags=tags).info.run_id
    for key, value in {f"{task}.lr": lr, "base.seed": 42, f"{task}.epochs": 1}.items():
        client.log_param(run_id, key, value)
    metric = "test_mean_iou" if task == "segmenter" else "test_accuracy"
    client.log_metric(run_id, metric, accuracy)
    client.log_metric(run_id, "test_loss", 1 - accuracy)
    client.set_terminated(run_id)
    if not register:
        return run_id, None
    if not client.search_registered_models(f"name = '{model_name(task)}'"):
        client.create_registered_model(model_name(task))
    artifacts = client.get_run(run_id).info.artifact_uri
    version = client.create_model_version(model_name(task), source=f"{artifacts}/model", run_id=run_id)
    return run_id, str(version.version)


def champion(client, task: str = "classifier") -> str | None:
    found = champion_version(client, task)
    return str(found.version) if found else None


def test_promotion_moves_champion_only_for_a_better_version(client):
    train(client, 0.80, 0.001)
    first = promote(client, "classifier")
    assert first.promoted and champion(client) == "1" and "there was none" in first.reason

    train(client, 0.90, 0.003)
    better = promote(client, "classifier")
    assert better.promoted and champion(client) == "2"
    assert "replacing v1 (0.8000)" in better.reason

    train(client, 0.85, 0.01)
    worse = promote(client, "classifier", candidates=["3"])
    assert not worse.promoted and champion(client) == "2"
    assert worse.reason == ("trainlab-classifier: v3 (test_accuracy 0.8500) does not beat champion v2 (0.9000); "
                            "champion stays")

    train(client, 0.90, 0.02)  # a tie is not a win
    assert not promote(client, "classifier").promoted and champion(client) == "2"
    assert "already the best" in promote(client, "classifier").reason


def test_table_shows_differing_params_metrics_and_duration_sorted_by_primary_metric(client):
    train(client, 0.70, 0.001)
    train(client, 0.95, 0.003)
    train(client, 0.80, 0.01, register=False)
    promote(client, "classifier")

    rows = collect_runs(client, EXPERIMENT, "classifier")
    assert [r.metrics["test_accuracy"] for r in rows] == [0.95, 0.80, 0.70]
    text = format_table(rows, "classifier")
    header, first = text.splitlines()[:2]
    assert header.split()[:5] == ["#", "run", "version", "classifier.lr", "test_accuracy"]
    assert "base.seed" not in header and "duration" in header  # the same everywhere: not a column
    assert "v2 (champion)" in first and "0.003" in first and "0.9500" in first

    markdown = format_table(rows, "classifier", markdown=True)
    assert markdown.startswith("**trainlab-classifier**: 3 run(s), sorted by `test_accuracy`")
    assert "| # | run | version | classifier.lr | test_accuracy | test_loss | duration | started (UTC) |" in markdown
    assert markdown.count("\n|") == 5  # header, rule, 3 runs


def test_cli_prints_the_table_and_says_why_it_does_not_promote(client, capsys):
    train(client, 0.90, 0.003)
    promote(client, "classifier")
    train(client, 0.60, 0.1)

    run_cli(main, ["classifier", "--markdown", "--promote"])
    out = capsys.readouterr().out
    assert "| 1 | " in out and "v1 (champion)" in out
    assert "not promoted: trainlab-classifier: champion v1 (test_accuracy 0.9000) is already the best" in out
    assert champion(client) == "1"


def test_retraining_job_promotes_only_versions_of_its_own_run_that_beat_the_champion(client, repo):
    train(client, 0.50, 0.001, task="segmenter")
    train(client, 0.70, 0.001)
    experiment_id = client.get_experiment_by_name(EXPERIMENT).experiment_id
    first = {d.model: d for d in promote_new_models(repo, None)}  # no champions yet: the best there is
    assert first[model_name("classifier")].promoted and first[model_name("segmenter")].promoted
    assert not first[model_name("text")].promoted

    parent = client.create_run(experiment_id, tags={"stage": "pipeline"}).info.run_id
    train(client, 0.95, 0.002, task="classifier", parent=parent)   # better than the champion
    train(client, 0.40, 0.002, task="segmenter", parent=parent)    # worse
    train(client, 0.99, 0.005)                                       # better, but not from this run
    decisions = {d.model: d for d in promote_new_models(repo, parent)}

    assert decisions[model_name("classifier")].promoted and champion(client) == "2"
    assert not decisions[model_name("segmenter")].promoted and champion(client, "segmenter") == "1"
    assert "does not beat champion v1" in decisions[model_name("segmenter")].reason
    assert CHAMPION == "champion"
