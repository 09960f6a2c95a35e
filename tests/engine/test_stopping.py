"""The plateau schedule (what `epochs: auto` trains with): it stops when the validation metric stops improving by more
than its noise, after a cooldown, within its bounds; keeps the last or the best weights; resumes to the same bits;
validates every few epochs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.engine.test_loop import make_trainable, runtime, tiny_data
from trainlab.core.auto import resolve_training
from trainlab.core.config import ClassifierParams, TrainParams
from trainlab.engine.loop import FitHooks, FitOptions, TrainingInterrupted, evaluate, fit, scalars
from trainlab.engine.optim import plateau_factor
from trainlab.engine.stopping import COOLDOWN_FRACTION, Stopping

PHOTOS = {"num_classes": 2, "channels": 3, "height": 96, "width": 96, "augment": "photo"}

PLATEAU = TrainParams(epochs=60, schedule="plateau", patience=2, batch_size=16, lr=2e-2, warmup_epochs=0.5,
                      weight_decay=0.01, min_steps=8, keep="best")


def weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [v.detach().clone() for v in model.state_dict().values()]


def test_the_plateau_schedule_stops_early_after_a_cooldown_and_keeps_the_best_weights():
    train, val = tiny_data(96), tiny_data(48, seed=1)
    result = fit(make_trainable(), train, val, PLATEAU, runtime(), seed=0)
    stop = result.stopping
    epochs = [int(r["epoch"]) for r in result.history]
    assert stop["stopped_epoch"] == epochs[-1] < PLATEAU.epochs  # stopped long before the ceiling of 60 epochs
    assert "had not improved by more than its noise" in stop["why"] and "for 2 validations" in stop["why"]
    assert "on 48 samples" in stop["why"] and "cooldown" in stop["why"]
    best_row = next(r for r in result.history if int(r["epoch"]) == stop["best_epoch"])
    assert stop["best_val_accuracy"] == best_row["val_accuracy"] == max(r["val_accuracy"] for r in result.history)
    # the model returned holds the best epoch's weights: validating it again gives that epoch's figure
    again = scalars(evaluate(dataclasses.replace(make_trainable(), model=result.model), result.model, val,
                             runtime()))
    assert again["accuracy"] == pytest.approx(best_row["val_accuracy"], abs=1e-6)
    # the LR is constant (after warmup) until the cooldown, then falls linearly to 1% of it at the last step
    lrs = [r["lr"] for r in result.history]
    assert lrs[-1] == pytest.approx(PLATEAU.lr * 0.01, rel=1e-6) and max(lrs) == pytest.approx(PLATEAU.lr)


def test_the_cooldown_lasts_a_fifth_of_the_steps_so_far_and_the_factor_falls_linearly():
    stopping = Stopping("accuracy", patience=1)
    assert stopping.begin_cooldown(100, steps_per_validation=6) == round(COOLDOWN_FRACTION * 100)
    assert Stopping("accuracy", patience=1).begin_cooldown(10, steps_per_validation=6) == 6  # at least a validation
    assert plateau_factor(3, 0, None) == 1.0 and plateau_factor(3, 10, None) == pytest.approx(0.4)
    factors = [plateau_factor(s, 0, (100, 20)) for s in range(98, 121)]
    assert factors[:2] == [1.0, 1.0] and factors[-2] == pytest.approx(0.01) and factors[2] < 1.0
    assert all(a >= b for a, b in zip(factors, factors[1:]))


def test_a_plateau_is_not_called_before_the_lower_bound_and_the_ceiling_forces_the_cooldown():
    stopping = Stopping("accuracy", patience=2, lower_steps=50)
    model = torch.nn.Linear(2, 2)
    for epoch, value in enumerate([0.5, 0.4, 0.4, 0.4], start=1):
        stopping.observe({"epoch": epoch, "step": 10 * epoch, "val_accuracy": value}, model)
    # the cooldown (a fifth of the steps so far) may begin where the run would then end at the lower bound or later
    assert stopping.since_best == 3 and not stopping.plateaued(40, ceiling=1000)  # 40 + 8 steps < 50
    assert stopping.plateaued(41, ceiling=1000) and not stopping.at_ceiling  # 41 + 9 steps
    fresh = Stopping("accuracy", patience=100)
    assert fresh.plateaued(900, ceiling=1000) and fresh.at_ceiling  # 900 + 20% passes the ceiling


def test_a_run_killed_mid_way_resumes_to_the_same_bits_and_stops_at_the_same_step(tmp_path):
    train, val = tiny_data(96), tiny_data(48, seed=1)
    whole = fit(make_trainable(), train, val, PLATEAU, runtime(), seed=0)
    options = FitOptions(checkpoint_path=tmp_path / "last.pt", fingerprint="x")
    with pytest.raises(TrainingInterrupted):
        fit(make_trainable(), train, val, PLATEAU, runtime(), 0, options,
            FitHooks(stop_after_epochs=whole.stopping["stopped_epoch"] - 2))
    resumed = fit(make_trainable(), train, val, PLATEAU, runtime(), 0, options)
    assert resumed.resumed_from_step > 0 and resumed.stopping == whole.stopping
    def timeless(history):
        return [{k: v for k, v in row.items() if k != "samples_per_s"} for row in history]

    assert timeless(resumed.history) == timeless(whole.history)
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed.model), weights(whole.model)))


def test_validations_every_few_epochs_average_the_training_loss_over_the_window():
    train, val = tiny_data(64), tiny_data(32, seed=1)
    cfg = TrainParams(epochs=6, batch_size=16, lr=2e-2, validate_every=8)  # 4 steps an epoch: every 2 epochs
    result = fit(make_trainable(), train, val, cfg, runtime(), seed=0)
    assert [int(r["epoch"]) for r in result.history] == [2, 4, 6]
    assert [int(r["step"]) for r in result.history] == [8, 16, 24]


class Sink:
    def __init__(self):
        self.calls = []

    def log_metrics(self, metrics, step=None):
        self.calls.append((step, dict(metrics)))


def test_a_cadence_shorter_than_an_epoch_validates_within_it_by_optimizer_steps_and_at_the_end():
    train, val = tiny_data(64), tiny_data(32, seed=1)
    cfg = TrainParams(epochs=3, batch_size=16, lr=2e-2, validate_every=5, schedule="constant")  # 4 steps an epoch
    sink = Sink()
    result = fit(make_trainable(), train, val, cfg, runtime(), seed=0, hooks=FitHooks(tracker=sink))
    assert [(int(r["epoch"]), int(r["step"])) for r in result.history] == [(2, 5), (3, 10), (3, 12)]
    # MLflow's step axis is the history's optimizer step; the epoch goes along as a metric
    assert [step for step, _ in sink.calls] == [5, 10, 12]
    assert [m["epoch"] for _, m in sink.calls] == [2, 3, 3] and all("step" not in m for _, m in sink.calls)
    # each row's training loss is the mean over its own window: a fresh run over the first 5 steps agrees
    first = fit(make_trainable(), train, val, cfg.model_copy(update={"max_steps": 5}), runtime(), seed=0)
    assert first.history[0]["train_loss"] == pytest.approx(result.history[0]["train_loss"], rel=1e-6)


def test_a_run_stopped_between_validations_within_an_epoch_resumes_to_the_same_history_and_bits(tmp_path):
    train, val = tiny_data(96), tiny_data(48, seed=1)
    cfg = PLATEAU.model_copy(update={"validate_every": 4, "epochs": 12})  # 6 steps an epoch: 2 of 3 mid-epoch
    whole = fit(make_trainable(), train, val, cfg, runtime(), seed=0)
    assert any(int(r["step"]) % 6 for r in whole.history) and whole.stopping["stopped_step"] < 72
    ckpt = tmp_path / "last.pt"
    with pytest.raises(TrainingInterrupted):
        fit(make_trainable(), train, val, cfg, runtime(), seed=0, options=FitOptions(checkpoint_path=ckpt,
            fingerprint="a"), hooks=FitHooks(stop_after=lambda done: done == 11))
    resumed = fit(make_trainable(), train, val, cfg, runtime(), seed=0,
                  options=FitOptions(checkpoint_path=ckpt, fingerprint="a"))

    def timeless(history):
        return [{k: v for k, v in row.items() if k != "samples_per_s"} for row in history]

    assert resumed.resumed_from_step == 11 and timeless(resumed.history) == timeless(whole.history)
    assert resumed.stopping == whole.stopping
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed.model), weights(whole.model)))


def test_epochs_auto_resolves_to_a_ceiling_with_the_plateau_schedule_and_a_cadence_of_tens_of_validations():
    cfg, choices = resolve_training("classifier", ClassifierParams(epochs="auto", batch_size=64), PHOTOS, 80)
    # 80 photos: one step an epoch; CutMix's 3,840 steps would be 3,840 passes: the lower bound is 300 epochs, the
    # ceiling 10x that; about 20 validations in the lower bound
    assert cfg.schedule == "plateau" and cfg.min_steps == 300 and cfg.epochs == 3000
    assert "more than 300 epochs" in choices["min_steps"]["why"]
    assert cfg.validate_every == 15 and "about 20 validations" in choices["validate_every"]["why"]
    digits = {"num_classes": 10, "channels": 1, "height": 28, "width": 28}
    cfg, choices = resolve_training("classifier", ClassifierParams(), digits, 3500)  # the default: epochs auto
    assert cfg.schedule == "plateau" and cfg.min_steps == 480 and cfg.epochs == 100 and cfg.keep == "last"
    assert cfg.validate_every == 54 and "validate_every" not in choices  # every epoch
    cfg, choices = resolve_training("classifier", ClassifierParams(epochs=1, schedule="cosine"), PHOTOS, 80)
    assert (cfg.epochs, cfg.schedule, cfg.validate_every) == (1, "cosine", 1) and "epochs" not in choices
    # a cadence shorter than an epoch, set by the user, is kept, and the stop line says what patience then means
    cfg, choices = resolve_training("classifier", ClassifierParams(validate_every=211, batch_size=64), digits, 54000)
    assert cfg.validate_every == 211 and "3 validations are 0.75 epochs; raise patience" in choices["epochs"]["why"]
    # so sparse a cadence that the ceiling (100 epochs of 843 steps) comes before patience could be used up
    cfg, choices = resolve_training("classifier", ClassifierParams(validate_every=30000, batch_size=64), digits, 54000)
    assert "2 validations before the ceiling's 84,300 steps" in choices["epochs"]["why"]
    assert "trains to the ceiling" in choices["epochs"]["why"]


def test_an_improvement_within_the_validation_metrics_noise_does_not_count():
    stopping = Stopping("accuracy", patience=2, val_count=100)
    model = torch.nn.Linear(2, 2)
    # noise at 0.80 on 100 samples: sqrt(0.8 * 0.2 / 100) = 0.04
    assert stopping.noise(0.8) == pytest.approx(0.04) and stopping.noise(1.0) == 0.0 and stopping.noise(2.5) == 0.0
    for epoch, value in enumerate([0.8, 0.83, 0.839, 0.85], start=1):
        stopping.observe({"epoch": epoch, "step": 10 * epoch, "val_accuracy": value}, model)
    assert stopping.best == 0.85 and stopping.best_epoch == 4 and stopping.since_best == 0  # 0.85 - 0.80 > 0.04
    stopping.observe({"epoch": 5, "step": 50, "val_accuracy": 0.88}, model)  # within sqrt(.85 * .15 / 100) = 0.036
    assert stopping.best == 0.85 and stopping.since_best == 1
    stopping.begin_cooldown(50, steps_per_validation=10)
    stopping.observe({"epoch": 6, "step": 60, "val_accuracy": 0.99}, model)  # the cooldown's gain
    assert stopping.best == 0.99 and "its noise (0.0357 on 100 samples)" in stopping.record(6, 60)["why"]
    assert Stopping("accuracy", patience=1).noise(0.8) == 0.0  # no count given: any improvement counts


def test_keep_last_returns_the_cooled_down_weights_of_the_same_run():
    train, val = tiny_data(96), tiny_data(48, seed=1)
    best = fit(make_trainable(), train, val, PLATEAU, runtime(), seed=0)
    last = fit(make_trainable(), train, val, PLATEAU.model_copy(update={"keep": "last"}), runtime(), seed=0)
    assert last.stopping["kept_epoch"] == last.stopping["stopped_epoch"] == best.stopping["stopped_epoch"]
    assert best.stopping["kept_epoch"] == best.stopping["best_epoch"]
    trainable = dataclasses.replace(make_trainable(), model=last.model)
    again = scalars(evaluate(trainable, last.model, val, runtime()))
    assert again["accuracy"] == pytest.approx(last.history[-1]["val_accuracy"], abs=1e-6)  # the last row's weights


def test_the_progress_bar_ends_at_the_earliest_step_training_could_stop_until_the_cooldown_fixes_it():
    stopping = Stopping("accuracy", patience=3, lower_steps=100)
    assert stopping.earliest_end(0, steps_per_validation=10, ceiling=1000) == 100  # the lower bound
    stopping.observe({"epoch": 20, "step": 200, "val_accuracy": 0.5}, torch.nn.Linear(2, 2))
    assert stopping.earliest_end(200, 10, 1000) == 230 + 46  # 3 validations of no progress, then a fifth more
    assert stopping.earliest_end(200, 10, ceiling=250) == 250
    stopping.begin_cooldown(300, steps_per_validation=10)
    assert stopping.earliest_end(300, 10, 1000) == 360
