"""Scoring a trained model on its test split: predictions with TTA, metrics on the device, and the report pieces
(metrics section, confusion data) that every task's evaluation is made of."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainlab.core.runtime import Runtime
from trainlab.engine.metrics import update_in_chunks
from trainlab.tasks.metrics import Metric, class_metric_keys
from trainlab.tasks.spec import get

if TYPE_CHECKING:
    from trainlab.core.config import Params

FEW_EXAMPLES = 4  # segmentation overlays, attention maps and feature maps show at most this many test samples


@dataclass
class TaskInputs:
    """One task's trained model and test split, checked against each other."""

    name: str
    model: nn.Module
    config: dict
    info: dict
    meta: dict
    test: dict[str, torch.Tensor]  # on the CPU
    model_dir: Path
    data_dir: Path
    extra: dict[str, Any] = field(default_factory=dict)  # TaskCode.load_extras: a tokenizer vocab, a baseline

    @property
    def code(self):  # -> trainlab.tasks.base.TaskCode: unnamed here, base builds on this module (no import circle)
        return get(self.name).load()


SHIFTS = ((1, 0), (-1, 0), (0, 1), (0, -1))  # (dy, dx) one-pixel moves of the "shift" TTA


def predict_logits(model: nn.Module, x: torch.Tensor, tta: str = "none", dense: bool = False) -> torch.Tensor:
    """Float logits. `tta` "flip" averages in the horizontal mirror; "shift" the four one-pixel shifts (for data a
    mirror would relabel, like digits). Dense logits are moved back (un-flipped, un-shifted) before averaging."""
    logits = model(x).float()
    if tta == "flip":
        flipped = model(x.flip(-1)).float()
        return (logits + (flipped.flip(-1) if dense else flipped)) / 2
    if tta == "shift":
        for dy, dx in SHIFTS:
            moved = model(torch.roll(x, (dy, dx), (-2, -1))).float()
            logits = logits + (torch.roll(moved, (-dy, -dx), (-2, -1)) if dense else moved)
        return logits / (1 + len(SHIFTS))
    return logits


@dataclass
class Predictions:
    """What one pass over a test split gives: metric values (on the device) and the predictions kept."""

    metrics: dict[str, torch.Tensor]
    predicted: torch.Tensor  # (N,) labels for classifier/text; the first few (K, H, W) masks for the segmenter


@torch.inference_mode()
def run_test_split(inputs: TaskInputs, runtime: Runtime, batch_size: int, tta: bool,
                   max_device_mb: int = 2048, keep: int = FEW_EXAMPLES) -> Predictions:
    """Predict the whole test split batch by batch; metrics accumulate on the device (no per-batch sync)."""
    from trainlab.engine.batches import eval_batch_size, make_batches

    code, n_classes = inputs.code, inputs.config["num_classes"]
    dense, task = code.dense, code.make_trainable(inputs.model, inputs.meta)
    metrics = code.eval_metrics(n_classes).to(runtime.device)
    batches = make_batches(inputs.test, eval_batch_size(inputs.test, batch_size), runtime.device, seed=0,
                           shuffle=False, drop_last=False, max_device_mb=max_device_mb)
    inputs.model.eval()
    kept: list[torch.Tensor] = []
    for batch in batches.epoch(0):
        x, y = task.prepare_batch(batch, False, None)
        if task.conv and runtime.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with runtime.autocast():
            logits = predict_logits(inputs.model, x, code.tta(inputs.meta) if tta else "none", dense)
        predicted = task.predict(logits)
        update_in_chunks(metrics, predicted, y, n_classes)
        if not dense or sum(len(p) for p in kept) < keep:
            kept.append(predicted if not dense else predicted[:keep])
    predicted = torch.cat(kept)
    return Predictions(metrics.compute(), predicted[:keep] if dense else predicted)


def class_names(meta: dict, num_classes: int) -> list[str]:
    names = [str(n) for n in meta.get("class_names") or []]
    return names if len(names) == num_classes else [str(i) for i in range(num_classes)]


def per_class(values: torch.Tensor, keys: list[str]) -> dict[str, float]:
    return {k: round(float(v), 6) for k, v in zip(keys, values.tolist())}


def summarize(metrics: dict[str, torch.Tensor], declared: tuple[Metric, ...], names: list[str],
              samples: int) -> dict[str, Any]:
    """The metrics.json section of one task: its declared scalars, then per-class dicts (keyed by class name), then
    the test size."""
    values = {k: v.detach().cpu() for k, v in metrics.items()}
    keys = class_metric_keys(names, len(names))
    out: dict[str, Any] = {m.name: round(float(values[m.name]), 6) for m in declared if not m.per_class}
    out.update({m.name: per_class(values[m.name], keys) for m in declared if m.per_class})
    out["test_samples"] = samples
    return out


def confusion_rows(actual: torch.Tensor, predicted: torch.Tensor, names: list[str]) -> list[dict[str, str]]:
    """One {actual, predicted} row per test sample, with class names (DVC's confusion template)."""
    return [{"actual": names[a], "predicted": names[p]} for a, p in zip(actual.tolist(), predicted.tolist())]


@dataclass
class TaskReport:
    """One task's metrics section, confusion data and picture inputs."""

    metrics: dict[str, Any]
    confusion: dict[str, Any] | None = None  # {"labels", "matrix"[, "baseline_matrix"]}
    rows: list[dict[str, str]] | None = None
    pictures: dict[str, Any] = field(default_factory=dict)


def evaluate_labels(inputs: TaskInputs, runtime: Runtime, params: Params) -> tuple[TaskReport, torch.Tensor]:
    """A labelled task (classifier, text): metrics, confusion matrix and rows; also returns the predictions (CPU)."""
    cfg, n = params.evaluate, inputs.config["num_classes"]
    result = run_test_split(inputs, runtime, cfg.batch_size, cfg.tta, params.base.data_on_device_max_mb)
    names = class_names(inputs.meta, n)
    labels, predicted = inputs.test[inputs.code.spec.targets], result.predicted.cpu()
    metrics = summarize(result.metrics, inputs.code.spec.metrics, names, len(labels))
    confusion = {"labels": names, "matrix": result.metrics["confusion"].cpu().tolist()}
    report = TaskReport(metrics, confusion, confusion_rows(labels, predicted, names))
    return report, predicted


