"""Exponential moving average of the weights, updated with foreach ops (no host sync, safe in a CUDA graph)."""

from __future__ import annotations

import copy

import torch
from torch import nn


class EMA:
    """A copy of `model` that follows it: after optimizer step t (0, 1, ...) float params and buffers lerp towards
    the model's by 1 - min(decay, (1 + t) / (10 + t)); integer buffers (BatchNorm's counters) are copied.

    The warm-up of the decay is TensorFlow's (ExponentialMovingAverage's num_updates): without it the copy keeps
    decay ** steps of the random init, half of it after 700 steps at 0.999, and evaluates near chance."""

    def __init__(self, model: nn.Module, decay: float):
        self.module = copy.deepcopy(model).requires_grad_(False)
        self.decay = decay
        pairs, seen = [], set()
        for a, b in zip(self.module.state_dict(keep_vars=True).values(), model.state_dict(keep_vars=True).values()):
            if id(b) not in seen:  # a tied weight appears under two keys: update it once
                seen.add(id(b))
                pairs.append((a, b))
        self._float = [(a.data, b.data) for a, b in pairs if a.is_floating_point()]
        self._other = [(a.data, b.data) for a, b in pairs if not a.is_floating_point()]

    @torch.no_grad()
    def update(self, step: torch.Tensor) -> None:
        """Follow the model after optimizer step `step`, a 0-dim tensor on the model's device (read there, so the
        update needs no host sync and replays in a CUDA graph)."""
        if self._float:
            weight = 1.0 - torch.clamp((1.0 + step) / (10.0 + step), max=self.decay)
            # a + weight * (b - a): foreach lerp takes its weight as a host number only, a sync on CUDA
            averages, currents = [a for a, _ in self._float], [b for _, b in self._float]
            steps = torch._foreach_sub(currents, averages)
            torch._foreach_mul_(steps, weight)
            torch._foreach_add_(averages, steps)
        for a, b in self._other:
            a.copy_(b)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict(state)
