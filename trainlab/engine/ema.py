"""Exponential moving average of the weights, updated with foreach ops (no host sync, safe in a CUDA graph)."""

from __future__ import annotations

import copy

import torch
from torch import nn


class EMA:
    """A copy of `model` that follows it: float params and buffers lerp towards the model's by 1 - decay after each
    optimizer step; integer buffers (BatchNorm's counters) are copied."""

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
    def update(self) -> None:
        if self._float:
            torch._foreach_lerp_([a for a, _ in self._float], [b for _, b in self._float], 1.0 - self.decay)
        for a, b in self._other:
            a.copy_(b)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.module.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict(state)
