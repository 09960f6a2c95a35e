"""The engine: the loss falls, seeds reproduce bitwise, stop-and-resume is exact, every switch runs on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from trainlab.core.config import BaseParams, TrainParams
from trainlab.core.errors import CheckpointError, TrainingDiverged
from trainlab.core.repro import seed_everything
from trainlab.core.runtime import resolve_runtime
from trainlab.engine.contract import Trainable
from trainlab.engine.loop import FitHooks, FitOptions, TrainingInterrupted, evaluate, fit, scalars
from trainlab.tasks.augment import random_shift


def tiny_data(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Learnable images: the class sets which quadrant is bright."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    images = torch.randint(0, 60, (n, 1, 12, 12), generator=g, dtype=torch.uint8)
    for i, y in enumerate(labels.tolist()):
        r, c = divmod(y, 2)
        images[i, 0, r * 6:(r + 1) * 6, c * 6:(c + 1) * 6] += 150
    return {"images": images, "labels": labels}



def stop_after_updates(updates: int):
    """A FitHooks.stop_after seam: stop as if interrupted after that many optimizer steps."""
    return lambda done: done == updates

def make_trainable(seed: int = 0, dropout: float = 0.1) -> Trainable:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Dropout(dropout), nn.Linear(16, 4))

    def prepare(batch, train, gen):
        images = batch["images"]
        if train and gen is not None:  # batched on-device augmentation, no host sync: each image shifted by <= 1 px
            (images,) = random_shift([images], 1, gen)
        return images.float().div_(255), batch["labels"]

    return Trainable(name="tiny", model=model, loss_fn=lambda out, y: F.cross_entropy(out.float(), y),
                make_metrics=lambda: MetricCollection({"accuracy": MulticlassAccuracy(num_classes=4, average="micro")}),
                prepare_batch=prepare, primary_metric="accuracy", conv=True)


def runtime(**kw):
    return resolve_runtime(BaseParams(device="cpu", **kw))


CFG = TrainParams(epochs=3, batch_size=16, lr=2e-2, warmup_epochs=0.5, weight_decay=0.01)


def test_loss_falls_and_metrics_are_reported():
    task = make_trainable()
    result = fit(task, tiny_data(256), tiny_data(64, seed=1), CFG, runtime(precision="fp32"), seed=0)
    losses = [r["train_loss"] for r in result.history]
    assert len(result.history) == 3
    assert losses[-1] < losses[0] * 0.7
    assert result.history[-1]["val_accuracy"] > 0.5
    assert result.params_total == result.params_trainable > 0
    assert result.samples_per_s > 0


def test_a_short_run_with_a_slow_ema_evaluates_its_averaged_weights_well():
    """48 updates at ema_decay 0.999: a plain EMA would keep 95% of the random init and score near chance (0.25)."""
    cfg = CFG.model_copy(update={"ema_decay": 0.999})
    result = fit(make_trainable(), tiny_data(256), tiny_data(64, seed=1), cfg, runtime(precision="fp32"), seed=0)
    assert result.history[-1]["val_accuracy"] > 0.5


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_bitwise_equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_same_seed_gives_bitwise_equal_weights(precision):
    rt = runtime(precision=precision)
    runs = []
    for _ in range(2):
        seed_everything(7)
        runs.append(weights(fit(make_trainable(), tiny_data(128), tiny_data(32, 1), CFG, rt, seed=7).model))
    assert_bitwise_equal(*runs)
    seed_everything(8)
    other = weights(fit(make_trainable(), tiny_data(128), tiny_data(32, 1), CFG, rt, seed=8).model)
    assert any(not torch.equal(runs[0][k], other[k]) for k in other)


@pytest.mark.parametrize("stop_at", [3, 8, 9])  # mid-epoch, at an epoch boundary, right after one
def test_stop_and_resume_is_bitwise_equal_to_uninterrupted(tmp_path, stop_at):
    rt = runtime(precision="bf16")
    cfg = CFG.model_copy(update={"ema_decay": 0.9, "accumulation_steps": 2})
    train, val = tiny_data(160), tiny_data(32, 1)
    seed_everything(3)
    reference = fit(make_trainable(), train, val, cfg, rt, seed=3)
    ckpt = tmp_path / "last.pt"
    seed_everything(3)
    with pytest.raises(TrainingInterrupted, match="checkpoint saved"):
        fit(make_trainable(), train, val, cfg, rt, seed=3,
            options=FitOptions(checkpoint_path=ckpt, fingerprint="a"),
            hooks=FitHooks(stop_after=stop_after_updates(stop_at)))
    assert ckpt.exists()
    seed_everything(999)  # the resumed run must not depend on the global RNG at start
    resumed = fit(make_trainable(seed=5), train, val, cfg, rt, seed=3,
                  options=FitOptions(checkpoint_path=ckpt, fingerprint="a"))
    assert resumed.resumed_from_step == stop_at
    assert_bitwise_equal(weights(reference.model), weights(resumed.model))
    assert [r["train_loss"] for r in reference.history] == [r["train_loss"] for r in resumed.history]


def test_checkpoint_with_other_fingerprint_is_ignored(tmp_path, capsys):
    rt = runtime(precision="fp32")
    ckpt = tmp_path / "last.pt"
    with pytest.raises(TrainingInterrupted):
        fit(make_trainable(), tiny_data(64), tiny_data(16), CFG, rt, seed=0,
            options=FitOptions(checkpoint_path=ckpt, fingerprint="a"),
            hooks=FitHooks(stop_after=stop_after_updates(2)))
    result = fit(make_trainable(), tiny_data(64), tiny_data(16), CFG, rt, seed=0,
                 options=FitOptions(checkpoint_path=ckpt, fingerprint="b"))
    assert result.resumed_from_step == 0
    assert "ignoring checkpoint" in capsys.readouterr().out


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_every_precision_and_layout_runs_on_cpu(precision, channels_last):
    rt = runtime(precision=precision, channels_last=channels_last)
    cfg = CFG.model_copy(update={"epochs": 1, "grad_clip": None, "label_smoothing": 0.1})
    result = fit(make_trainable(), tiny_data(64), tiny_data(16), cfg, rt, seed=0)
    assert torch.isfinite(torch.tensor(result.history[-1]["train_loss"]))


def test_compile_switch_runs_on_cpu():
    rt = runtime(precision="fp32", compile=True)
    cfg = CFG.model_copy(update={"epochs": 1})
    result = fit(make_trainable(dropout=0.0), tiny_data(32), tiny_data(16), cfg, rt, seed=0)
    assert result.history[-1]["train_loss"] > 0


def test_nan_loss_stops_with_step_named(tmp_path):
    task = make_trainable()
    task.loss_fn = lambda out, y: F.cross_entropy(out.float(), y) * float("nan")
    with pytest.raises(TrainingDiverged, match=r"NaN/inf at optimizer step 1\b"):
        fit(task, tiny_data(64), tiny_data(16), CFG, runtime(precision="fp32"), seed=0,
            options=FitOptions(checkpoint_path=tmp_path / "c.pt"))
    assert not (tmp_path / "c.pt").exists()


def test_max_steps_and_sgd_and_constant_schedule():
    cfg = CFG.model_copy(update={"max_steps": 5, "optimizer": "sgd", "schedule": "constant", "lr": 0.05})
    result = fit(make_trainable(), tiny_data(160), tiny_data(16), cfg, runtime(precision="fp32"), seed=0)
    assert result.history[-1]["step"] == 5
    assert result.history[-1]["lr"] == pytest.approx(0.05)


def test_corrupt_checkpoint_is_a_clear_error(tmp_path):
    ckpt = tmp_path / "last.pt"
    ckpt.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a valid checkpoint"):
        fit(make_trainable(), tiny_data(32), tiny_data(16), CFG, runtime(precision="fp32"), seed=0,
            options=FitOptions(checkpoint_path=ckpt))


def test_evaluate_runs_without_grad_and_counts_all_samples():
    task = make_trainable()
    metrics = scalars(evaluate(task, task.model, tiny_data(50), runtime(precision="fp32"), batch_size=16))
    assert set(metrics) == {"loss", "accuracy"}
    assert 0 <= metrics["accuracy"] <= 1


def test_dataloader_path_matches_device_path():
    """Data over the device budget goes through a DataLoader with the same order: same weights."""
    rt = runtime(precision="fp32")
    cfg = CFG.model_copy(update={"epochs": 1})
    seed_everything(1)
    a = weights(fit(make_trainable(dropout=0.0), tiny_data(64), tiny_data(16), cfg, rt, seed=1).model)
    seed_everything(1)
    b = weights(fit(make_trainable(dropout=0.0), tiny_data(64), tiny_data(16), cfg, rt, seed=1,
                    options=FitOptions(max_device_mb=0, num_workers=0)).model)
    assert_bitwise_equal(a, b)


def test_stop_event_set_by_another_thread_stops_with_a_checkpoint(tmp_path):
    import threading

    stop = threading.Event()
    task = make_trainable()
    original = task.loss_fn

    def loss_setting_stop(out, y):  # another thread sets the event while the first step runs
        threading.Thread(target=stop.set).start()
        return original(out, y)

    task.loss_fn = loss_setting_stop
    ckpt = tmp_path / "last.pt"
    with pytest.raises(TrainingInterrupted, match="stopped at optimizer step 1; checkpoint saved"):
        fit(task, tiny_data(128), tiny_data(16), CFG, runtime(precision="fp32"), seed=0,
            options=FitOptions(checkpoint_path=ckpt, fingerprint="a"),
            hooks=FitHooks(stop=stop))
    assert ckpt.exists()


def test_a_checkpoint_resumed_on_another_device_restores_the_rng_from_the_cpu(tmp_path):
    """On a GPU the weights are loaded onto the device but the RNG states must stay on the CPU (torch and NumPy
    restore them only from there). 'meta' stands in for a non-CPU device here: loading the whole checkpoint onto
    it, as the engine once did with map_location=device, leaves set_rng_state nothing it can read."""
    from trainlab.engine.checkpoint import set_rng_state
    from trainlab.engine.resume import resume_state

    ckpt = tmp_path / "last.pt"
    with pytest.raises(TrainingInterrupted):
        fit(make_trainable(), tiny_data(64), tiny_data(16), CFG, runtime(precision="fp32"), seed=0,
            options=FitOptions(checkpoint_path=ckpt, fingerprint="a"),
            hooks=FitHooks(stop_after=stop_after_updates(2)))
    state = resume_state(ckpt, torch.device("meta"))
    assert {v.device.type for v in state["model"].values()} == {"meta"}
    assert state["rng"]["torch"].device.type == "cpu" and state["rng"]["numpy"]["keys"].device.type == "cpu"
    set_rng_state(state["rng"])
    first = torch.rand(3)
    torch.rand(100)
    set_rng_state(state["rng"])
    assert torch.equal(first, torch.rand(3))


def write_shards(folder, data: dict[str, torch.Tensor], per_shard: int):
    from trainlab.data.prepared import ShardWriter
    from trainlab.data.shards import ShardSplit

    row_bytes = sum(v[0].numel() * v.element_size() for v in data.values())
    writer = ShardWriter(folder, "train", row_bytes, shard_bytes=per_shard * row_bytes)
    writer.add(data)
    writer.close()
    return ShardSplit(folder, "train")


@pytest.mark.parametrize("workers", [0, 2])
def test_streamed_shards_train_bitwise_like_memory_whatever_the_workers(tmp_path, workers):
    """Splits read from disk shard by shard (any number of DataLoader workers) give the weights of the in-memory,
    device-resident path: same batches, same order; augmentation draws on the device, not in the workers."""
    rt = runtime(precision="fp32")
    cfg = CFG.model_copy(update={"epochs": 2})
    train, val = tiny_data(80), tiny_data(24, seed=1)
    seed_everything(1)
    in_memory = fit(make_trainable(dropout=0.0), train, val, cfg, rt, seed=1)
    streamed_train = write_shards(tmp_path / "train", train, per_shard=30)
    streamed_val = write_shards(tmp_path / "val", val, per_shard=10)
    seed_everything(1)
    streamed = fit(make_trainable(dropout=0.0), streamed_train, streamed_val, cfg, rt, seed=1,
                   options=FitOptions(num_workers=workers))
    assert_bitwise_equal(weights(in_memory.model), weights(streamed.model))
    assert [r["val_accuracy"] for r in in_memory.history] == [r["val_accuracy"] for r in streamed.history]
