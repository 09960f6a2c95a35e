"""Precise BatchNorm statistics (Wu and Johnson 2021, "Rethinking Batch in BatchNorm"): the running means and
variances recomputed as exact averages over training batches, for runs whose epochs are too short for BatchNorm's
running averages (momentum 0.1: about the last 10 steps) to settle on weights that still move."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from trainlab.core import auto
from trainlab.core.auto import PRECISE_BN_BELOW_STEPS  # noqa: F401 - re-exported
from trainlab.core.runtime import Runtime

PRECISE_BN_BATCHES = 50  # training batches averaged at most


def batchnorms(model: nn.Module) -> list[_BatchNorm]:
    return [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]


def wanted(setting: bool | str, model: nn.Module, updates_per_epoch: int, distributed: bool) -> bool:
    """Whether to recompute: `setting` true or false, or "auto": for a model with BatchNorm whose epochs have fewer
    than PRECISE_BN_BELOW_STEPS optimizer steps. Not under DDP, where each rank would average its own batches."""
    if distributed or not batchnorms(model):
        return False
    return auto.precise_bn(setting, updates_per_epoch)


@torch.no_grad()
def recompute_batchnorm(model: nn.Module, inputs: Iterable[torch.Tensor], runtime: Runtime) -> None:
    """Set every BatchNorm's running statistics to the exact average over `inputs` (model inputs, as evaluation
    prepares them). Only the BatchNorm layers run in training mode (dropout stays off, no RNG is drawn); buffers
    change in place (a captured CUDA graph keeps pointing at them)."""
    layers = batchnorms(model)
    if not layers:
        return
    training = model.training
    momenta = [layer.momentum for layer in layers]
    model.eval()
    for layer in layers:
        layer.reset_running_stats()
        layer.momentum = None  # a cumulative average over the batches that follow
        layer.train()
    for x in inputs:
        with runtime.autocast():
            model(x)
    for layer, momentum in zip(layers, momenta):
        layer.momentum = momentum
    model.train(training)
