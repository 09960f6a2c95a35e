"""Metric updates that stay fast and bounded under deterministic algorithms (torchmetrics' counting paths)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from trainlab.core.repro import set_deterministic_algorithms

if TYPE_CHECKING:
    from torchmetrics import Metric, MetricCollection

# torchmetrics counts classes with a (samples x classes**2) comparison when deterministic algorithms are on:
# updates are fed in chunks of at most this many elements so that memory stays bounded.
CHUNK_ELEMENTS = 2**22


@contextmanager
def bincount_allowed(device: torch.device) -> Iterator[None]:
    """Let torchmetrics use torch.bincount on the CPU, where it is deterministic anyway.

    With deterministic algorithms on, torchmetrics counts with an (elements x classes**2) comparison instead,
    which made the segmentation test split ~10x slower on a CPU. On other devices nothing changes.
    """
    if device.type != "cpu" or not torch.are_deterministic_algorithms_enabled():
        yield
        return
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    set_deterministic_algorithms(False)
    try:
        yield
    finally:
        set_deterministic_algorithms(True, warn_only=warn_only)


def update_in_chunks(metrics: Metric | MetricCollection, preds: torch.Tensor, target: torch.Tensor,
                     num_classes: int) -> None:
    """Update with flattened predictions and targets, in chunks that bound torchmetrics' counting memory."""
    preds, target = preds.reshape(-1), target.reshape(-1)
    step = max(1, CHUNK_ELEMENTS // num_classes**2)
    with bincount_allowed(preds.device):
        for start in range(0, preds.numel(), step):
            metrics.update(preds[start:start + step], target[start:start + step])
