"""The search space file: what it proposes, and each mistake one error naming the file, line and key (in-process)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pipelines.search_space import SearchSpaceError, load_space
from trainlab.core.config import load_params

REPO = Path(__file__).resolve().parents[2]
HEAD = """\
objective:
  stage: train_classifier
  metric: val_accuracy
"""


@pytest.fixture(scope="module")
def stages():
    from pipelines.dag import read_stages

    return read_stages(REPO)


def write(tmp_path: Path, body: str, head: str = HEAD) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(head + textwrap.dedent(body))
    return path


def test_the_example_space_loads_and_suggests_conditional_params(stages):
    import optuna

    space = load_space(REPO / "pipelines" / "spaces" / "classifier.yaml", REPO, stages)
    assert space.objective.task == "classifier" and space.objective.direction == "maximize"
    assert space.objective.history == "reports/classifier/history.csv"
    assert space.targets == ("train_classifier",) and space.pruner["kind"] == "median"
    kinds = {p.key: p.kind for p in space.params}
    assert kinds["classifier.lr"] == "float" and kinds["classifier.width"] == "int"
    assert kinds["classifier.batch_size"] == "categorical"
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0), direction="maximize")
    seen = {"resnet_small": 0, "mobilenet_v3_small": 0}
    for _ in range(12):
        trial = study.ask()
        overrides = space.suggest(trial)
        seen[overrides["classifier.arch"]] += 1
        # width only for the arch that has one; nothing fixed: params.yaml's epochs
        assert ("classifier.width" in overrides) == (overrides["classifier.arch"] == "resnet_small")
        assert "classifier.epochs" not in overrides and 3e-4 <= overrides["classifier.lr"] <= 1e-2
        study.tell(trial, 0.5)
    assert all(seen.values()), seen
    # the enqueued trial is what its comment says: params.yaml's own values
    (first,) = space.enqueue
    repo = load_params(REPO / "params.yaml").model_dump()
    assert space.fixed == {} and {k: repo[k.split(".")[0]][k.split(".")[1]] for k in first} == first


@pytest.mark.parametrize("body, line, expected", [
    ("params:\n  classifier.lrr: {low: 0.001, high: 0.01}\n", 5,
     "params.classifier.lrr: not a key of params.yaml; did you mean 'classifier.lr'?"),
    ("params:\n  classifier.lr: {low: 0.01, high: 0.001}\n", 5, "low (0.01) must be below high (0.001)"),
    ("params:\n  classifier.lr: {low: 0, high: 0.01, log: true}\n", 5, "got 0 for classifier.lr; Input should be "
     "greater than 0"),
    ("params:\n  classifier.weight_decay: {low: 0, high: 0.01, log: true}\n", 5, "a log range needs low > 0"),
    ("params:\n  classifier.lr: {low: 0.001, high: 20}\n", 5, "high: got 20 for classifier.lr; Input should be "
     "less than or equal to 10"),
    ("params:\n  classifier.epochs: {low: 1.5, high: 4}\n", 5, "got 1.5; classifier.epochs takes whole numbers"),
    ("params:\n  classifier.arch: {choices: [resnet_small, resnet99]}\n", 5, "got 'resnet99' for classifier.arch"),
    ("params:\n  classifier.optimizer: {low: 1, high: 2}\n", 5, "classifier.optimizer is not a number; give its "
     "values as choices"),
    ("params:\n  classifier.lr: {low: 0.001, high: 0.01, logg: true}\n", 5, "unknown key; did you mean 'log'?"),
    ("params:\n  classifier.width: {low: 8, high: 16, when: {classifier.arch: resnet_small}}\n", 5,
     "when.classifier.arch: not a choices param given above this one"),
    ("params:\n  classifier.arch: {choices: [resnet_small]}\n  classifier.width: {low: 8, high: 16, when: "
     "{classifier.arch: resnet18}}\n", 6, "'resnet18' is not one of its choices ['resnet_small']"),
    ("params:\n  classifier: {low: 1, high: 2}\n", 5, "classifier is a section; name one of its keys"),
    ("params:\n  classifier.lr: {low: 0.001, high: 0.01}\nfixed:\n  classifier.epochs: 0\n", 7,
     "got 0 for classifier.epochs; Input should be greater than or equal to 1"),
    ("params:\n  classifier.lr: {low: 0.001, high: 0.01}\n  classifier.lr: {low: 0.01, high: 0.1}\n", 6,
     "params.classifier.lr is given twice"),
    ("params:\n  classifier.lr: {low: 0.001, high: 0.01}\npruner: {kind: median, startup: 2}\n", 6,
     "pruner.startup: unknown key; did you mean 'startup_trials'?"),
    ("params:\n  classifier.lr: {low: 0.001, high: 0.01}\nenqueue:\n  - {classifier.lr: 0.5}\n", 6,
     "trial 1: classifier.lr=0.5: outside its range"),
    ("params:\n  classifier.lr: {low: 0.001, high: 0.01}\nsearch: {}\n", 6, "search: unknown key"),
], ids=["unknown-key", "low-above-high", "log-zero-outside-schema", "log-zero", "above-schema-maximum",
        "int-param-float-bound", "bad-choice", "range-for-a-choice-param", "unknown-param-key", "condition-on-nothing",
        "condition-value-not-a-choice", "a-section", "bad-fixed-value", "key-twice", "unknown-pruner-key",
        "enqueued-outside", "unknown-section"])
def test_a_bad_space_is_one_error_naming_file_line_and_key(tmp_path, stages, body, line, expected):
    path = write(tmp_path, body)
    with pytest.raises(SearchSpaceError) as err:
        load_space(path, REPO, stages)
    message = str(err.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert expected in message, message
    assert SearchSpaceError.exit_code == 2


@pytest.mark.parametrize("head, expected", [
    ("objective:\n  stage: evaluate\n  metric: val_accuracy\n", "got 'evaluate'; the training stages of dvc.yaml "
     "are train_classifier, train_segmenter, train_text"),
    ("objective:\n  stage: train_classifier\n  metric: test_accuracy\n", "a validation metric reported every epoch"),
    ("objective:\n  stage: train_classifier\n  metric: val_iou\n", "reports/classifier/history.csv has no column "
     "'val_iou'; its validation metrics: val_loss, val_accuracy, val_macro_f1"),
    ("objective:\n  stage: train_classifier\n  metric: val_loss\n  direction: down\n", "got 'down'; maximize or "
     "minimize"),
], ids=["not-a-training-stage", "not-a-validation-metric", "unknown-metric", "bad-direction"])
def test_the_objective_names_a_training_stage_and_its_validation_metric(tmp_path, stages, head, expected):
    path = write(tmp_path, "params:\n  classifier.lr: {low: 0.001, high: 0.01}\n", head=head)
    with pytest.raises(SearchSpaceError, match=expected.replace("(", r"\(").replace("[", r"\[")):
        load_space(path, REPO, stages)


def test_loss_is_minimized_unless_told_and_a_missing_file_is_named(tmp_path, stages):
    path = write(tmp_path, "params:\n  classifier.lr: {low: 0.001, high: 0.01}\n",
                 head="objective:\n  stage: train_classifier\n  metric: val_loss\n")
    assert load_space(path, REPO, stages).objective.direction == "minimize"
    with pytest.raises(SearchSpaceError, match="nowhere.yaml: search space file not found"):
        load_space(tmp_path / "nowhere.yaml", REPO, stages)
