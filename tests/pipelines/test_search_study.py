"""The study in SQLite (in-process, a made-up objective): asked one trial at a time it proposes the same trials again,
also when a trial is killed and the study resumed; a stale trial is failed and run again with its params."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from pipelines import search_study as st
from pipelines.search_space import Objective, Param, SearchSpace
from trainlab.core.errors import ParamsError

SPACE = SearchSpace(
    path=Path("space.yaml"),
    objective=Objective("train_classifier", "classifier", "val_accuracy", "maximize", "reports/classifier/history.csv"),
    params=(Param("classifier.lr", "float", low=1e-4, high=1e-1, log=True),
            Param("classifier.optimizer", "categorical", choices=("adamw", "sgd")),
            Param("classifier.label_smoothing", "float", low=0.0, high=0.2,
                  when=(("classifier.optimizer", ("adamw",)),)),
            Param("classifier.width", "int", low=8, high=48, step=8)),
    fixed={"classifier.epochs": 3}, startup_trials=3, seed=11)


def score(overrides: dict) -> float:
    """A made-up validation accuracy, best near lr 3e-3 and width 32."""
    return 1 - abs(math.log10(overrides["classifier.lr"] / 3e-3)) / 3 - abs(overrides["classifier.width"] - 32) / 200


def run(study, count: int, asked: list) -> None:
    for _ in range(count):
        trial, overrides = st.ask(study, SPACE)
        asked.append(overrides)
        study.tell(trial, score(overrides))


def test_one_at_a_time_the_same_study_proposes_the_same_trials_even_across_a_kill(tmp_path):
    for folder in "abc":
        (tmp_path / folder).mkdir()
    straight: list = []
    run(st.open_study(tmp_path / "a", SPACE, "s", heartbeat_s=1), 8, straight)
    assert len({repr(o) for o in straight}) == 8 and all(o["classifier.epochs"] == 3 for o in straight)

    again: list = []
    run(st.open_study(tmp_path / "b", SPACE, "s", heartbeat_s=1), 8, again)
    assert again == straight

    # the same study, its search killed while trial 3 ran, then resumed by a new search
    resumed: list = []
    study = st.open_study(tmp_path / "c", SPACE, "s", heartbeat_s=1)
    run(study, 3, resumed)
    killed, overrides = st.ask(study, SPACE)
    study._storage.record_heartbeat(killed._trial_id)
    time.sleep(3.5)  # no heartbeat for more than 2 intervals (SQLite keeps whole seconds)
    study = st.open_study(tmp_path / "c", SPACE, "s", heartbeat_s=1)
    from optuna.storages import fail_stale_trials

    fail_stale_trials(study)
    assert study.get_trials()[killed.number].state.name == "FAIL" and st.finished(study) == 3
    run(study, 5, resumed)
    assert resumed == straight  # trial 3 again with its params, then what the uninterrupted study proposed
    assert [t.state.name for t in study.get_trials()].count("COMPLETE") == 8


def test_finished_counts_complete_pruned_and_real_failures_not_killed_ones(tmp_path):
    study = st.open_study(tmp_path, SPACE, "s", heartbeat_s=30)
    trials = [st.ask(study, SPACE)[0] for _ in range(4)]
    st.tell(study, trials[0], {"state": "COMPLETE", "history": [0.5, 0.6], "value": 0.6})
    st.tell(study, trials[1], {"state": "PRUNED"})
    st.tell(study, trials[2], RuntimeError("stage train_classifier failed (training diverged, exit 5)"))
    assert st.finished(study) == 3  # trial 3 still running
    rows = st.rows(study)
    assert [r["state"] for r in rows] == ["COMPLETE", "PRUNED", "FAIL", "RUNNING"]
    assert rows[0]["value"] == 0.6 and rows[0]["last_epoch"] == 2  # restored from the run cache: history reported
    assert "diverged" in rows[2]["error"]
    assert st.best(study)["number"] == 0


def test_a_study_resumed_with_another_space_or_a_bad_name_is_refused(tmp_path):
    st.open_study(tmp_path, SPACE, "s", heartbeat_s=30)
    other = SearchSpace(SPACE.path, SPACE.objective, SPACE.params[:1], seed=SPACE.seed)
    with pytest.raises(ParamsError, match="was made from another search space"):
        st.open_study(tmp_path, other, "s", heartbeat_s=30)
    with pytest.raises(ParamsError, match="study name 'a b'"):
        st.open_study(tmp_path, SPACE, "a b", heartbeat_s=30)
