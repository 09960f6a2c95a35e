"""The engine's contracts: with a task (the model, the loss, the metrics and the batch transform, not the loop), and
with the tracker a stage logs through."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch import nn

from trainlab.engine.batches import Batch

if TYPE_CHECKING:
    from torchmetrics import MetricCollection

# (batch on the device, training?, augmentation generator or None) -> (inputs, targets)
PrepareBatch = Callable[[Batch, bool, "torch.Generator | None"], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Trainable:
    name: str
    model: nn.Module
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    make_metrics: Callable[[], MetricCollection]
    prepare_batch: PrepareBatch
    primary_metric: str  # key of make_metrics()'s result, higher is better
    conv: bool = False  # a conv net: channels_last applies
    head: nn.Module | None = None  # gets `head_lr` when that is set
    head_lr: float | None = None

    def predict(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs.argmax(dim=1)


@runtime_checkable
class Tracker(Protocol):
    """What a stage logs through. trainlab.tracking has three: NullTracker (tracking off), MlflowTracker (one MLflow
    run, written directly) and QueuedTracker (a training stage's: a background thread, which rides out a server that
    does not answer); tests/tracking/test_contract.py holds each to this. The same call fails the same way whichever
    tracks it: an artifact that does not exist (FileNotFoundError), a model without an input example (ValueError), a
    metric that is not a number (TypeError naming it); NaN and infinite metrics are left out with a warning.

    The engine logs metrics only, and reads one thing more: `failed`, the one way tracking can reach training. It is
    set when the store answered with a refusal (a deleted experiment, a failed migration, a rejected call), never for a
    server that does not answer; given to `fit` as its stop event, training stops at its next step with a checkpoint.
    Tracking code is therefore no DVC dep of a stage: it cannot change an output's bytes."""

    run_id: str  # '' with tracking off, and while a queued run's server has been away since the stage began
    experiment_id: str
    tracking_uri: str
    failed: threading.Event

    def log_params(self, params: Any) -> None: ...  # a pydantic model or nested mapping, logged as dotted keys

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None: ...

    def set_tags(self, tags: Mapping[str, Any]) -> None: ...

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None: ...

    def log_dict(self, data: Any, artifact_file: str) -> None: ...

    def log_text(self, text: str, artifact_file: str) -> None: ...

    def log_figure(self, fig: Any, artifact_file: str) -> None: ...

    def log_model(self, model: nn.Module, name: str, input_example: Any, registered_model_name: str | None = None,
                  model_dir: str | os.PathLike | None = None,
                  raw_example: dict[str, list[Any]] | None = None, tensor_model: bool = False) -> str | None: ...
