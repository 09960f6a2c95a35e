"""The engine's contract with a task: the model, the loss, the metrics and the batch transform (not the loop)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from trainlab.engine.batches import Batch

if TYPE_CHECKING:
    from torchmetrics import MetricCollection

# (batch on the device, training?, augmentation generator or None) -> (inputs, targets)
PrepareBatch = Callable[[Batch, bool, "torch.Generator | None"], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Task:
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
