"""A search trial's pruning in the training stage: the epoch's validation metric reported to a real Optuna study in
SQLite, the pruner's verdict ending training with exit 9 and no checkpoint; nothing at all without $TRAINLAB_TRIAL."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainlab.core.errors import ParamsError, TrialPruned
from trainlab.jobs.pruning import PRUNED_TAG, TRIAL_ENV, trial_sink


class Recorder:
    def __init__(self):
        self.metrics, self.tags = [], {}

    def log_metrics(self, metrics, step=None):
        self.metrics.append((step, dict(metrics)))

    def set_tags(self, tags):
        self.tags.update(tags)


@pytest.fixture
def study(tmp_path):
    import optuna

    from trainlab.jobs.pruning import make_pruner, open_storage

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    pruner = {"kind": "median", "startup_trials": 1, "warmup_epochs": 0}
    created = optuna.create_study(study_name="s", storage=open_storage(url), direction="maximize",
                                  pruner=make_pruner(pruner))
    first = created.ask()
    for epoch, value in ((1, 0.90), (2, 0.93)):
        first.report(value, epoch)
    created.tell(first, 0.93)
    return created, url, pruner


def start_trial(study, monkeypatch):
    """A new trial of `study`, named to the training stage as pipelines.search names it ($TRAINLAB_TRIAL)."""
    created, url, pruner = study
    trial = created.ask()
    spec = {"storage": url, "study": "s", "trial_id": trial._trial_id, "number": trial.number, "task": "classifier",
            "metric": "val_accuracy", "pruner": pruner}
    monkeypatch.setenv(TRIAL_ENV, json.dumps(spec))
    return trial


def test_a_trial_behind_the_median_is_pruned_exit_9_checkpoint_removed(study, tmp_path, monkeypatch):
    created = study[0]
    trial = start_trial(study, monkeypatch)
    checkpoint = tmp_path / "last.pt"
    checkpoint.write_bytes(b"state")
    inner = Recorder()
    sink = trial_sink(inner, "classifier", checkpoint)

    # Optuna's median rule: the trial's best value so far against the median of finished trials at this epoch
    sink.log_metrics({"train_loss": 0.5, "val_accuracy": 0.92}, step=1)  # 0.92 >= 0.90: goes on
    with pytest.raises(TrialPruned, match=r"trial 1 of study s pruned at epoch 2 \(val_accuracy 0.91"):
        sink.log_metrics({"train_loss": 0.4, "val_accuracy": 0.91}, step=2)  # best 0.92 < 0.93

    assert TrialPruned.exit_code == 9
    assert not checkpoint.exists()
    assert [step for step, _ in inner.metrics] == [1, 2]  # the tracker still got every epoch
    assert inner.tags[PRUNED_TAG] == "PRUNED" and inner.tags["pruned_at_epoch"] == "2"
    assert created._storage.get_trial(trial._trial_id).intermediate_values == {1: 0.92, 2: 0.91}


def test_validations_within_an_epoch_report_the_epochs_first_to_the_trial(study, monkeypatch):
    trial = start_trial(study, monkeypatch)
    inner = Recorder()
    sink = trial_sink(inner, "classifier", None)
    sink.log_metrics({"epoch": 1, "val_accuracy": 0.92}, step=40)
    sink.log_metrics({"epoch": 1, "val_accuracy": 0.50}, step=80)  # the same epoch again: the tracker's alone
    sink.log_metrics({"epoch": 2, "val_accuracy": 0.94}, step=120)
    assert [step for step, _ in inner.metrics] == [40, 80, 120]
    assert study[0]._storage.get_trial(trial._trial_id).intermediate_values == {1: 0.92, 2: 0.94}


def test_another_task_or_no_trial_leaves_the_tracker_alone(study, monkeypatch):
    created, url, pruner = study
    inner = Recorder()
    assert trial_sink(inner, "classifier") is inner  # no $TRAINLAB_TRIAL
    spec = {"storage": url, "study": "s", "trial_id": 1, "task": "segmenter", "metric": "val_mean_iou"}
    monkeypatch.setenv(TRIAL_ENV, json.dumps(spec))
    assert trial_sink(inner, "classifier") is inner  # the trial optimises another stage
    monkeypatch.setenv(TRIAL_ENV, "{not json")
    with pytest.raises(ParamsError, match=r"\$TRAINLAB_TRIAL: expected the JSON that pipelines.search sets"):
        trial_sink(inner, "classifier")


def test_a_normal_stage_never_imports_optuna():
    code = ("import sys, trainlab.jobs.train\nfrom trainlab.jobs.pruning import trial_sink\n"
            "assert trial_sink(object(), 'classifier') is not None\nprint('optuna' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={k: v for k, v in __import__("os").environ.items() if k != TRIAL_ENV})
    assert out.stdout.strip() == "False"


def test_warmup_epochs_are_never_pruned(study, monkeypatch):
    created, url, _ = study
    trial = created.ask()
    pruner = {"kind": "threshold", "lower": 0.99, "warmup_epochs": 1}  # anything below 0.99 is stopped, after epoch 1
    monkeypatch.setenv(TRIAL_ENV, json.dumps({"storage": url, "study": "s", "trial_id": trial._trial_id,
                                              "task": "classifier", "metric": "val_accuracy", "pruner": pruner}))
    sink = trial_sink(Recorder(), "classifier")
    sink.log_metrics({"val_accuracy": 0.1}, step=1)
    with pytest.raises(TrialPruned, match="pruned at epoch 2"):
        sink.log_metrics({"val_accuracy": 0.1}, step=2)
