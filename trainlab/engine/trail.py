"""A training run's trail: the exact running loss and gradient norm every few optimizer steps, and hashes of the
weights and optimizer state at every epoch end, which `python -m trainlab.verify` compares between two runs."""

from __future__ import annotations

import hashlib
import math
import os
import random
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from trainlab.engine.step import TrainStep

# Optimizer steps between two trail records. A record costs one gradient norm (a pass over the gradients, less than
# the optimizer's own) and, on a GPU, one host sync: under 1% of the steps it follows (benchmarks/trail.py).
TRAIL_EVERY_STEPS = 10
EVERY_ENV = "TRAINLAB_TRAIL_EVERY"  # another spacing (1: every step; what `verify --bisect` replays with)
# Test only: perturb the gradients of this optimizer step by a random amount (os.urandom, not torch's RNG): an
# injected nondeterminism that verify must find. Eager steps only (a captured step's hooks do not run).
PERTURB_ENV = "TRAINLAB_TEST_PERTURB_STEP"


def tensors_digest(named: Iterable[tuple[str, Any]]) -> str:
    """A short sha256 of named tensors (name, dtype, shape and bytes in logical order, whatever their device or
    memory format) and plain values."""
    h = hashlib.sha256()
    for name, value in named:
        h.update(str(name).encode() + b"\0")
        if torch.is_tensor(value):
            t = value.detach()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()[:16]


def optimizer_items(optimizer: torch.optim.Optimizer) -> list[tuple[str, Any]]:
    state = optimizer.state_dict()["state"]
    return [(f"{index}.{key}", value) for index in sorted(state) for key, value in sorted(state[index].items())]


class Trail:
    """Records a run's trail as it trains; its state travels in the checkpoint, so a resumed run continues it."""

    def __init__(self, step: TrainStep, fingerprint: dict[str, str] | None = None, every: int | None = None):
        self.every = every or int(os.environ.get(EVERY_ENV) or TRAIL_EVERY_STEPS)
        self.fingerprint = dict(fingerprint or {})  # of the process that records (a resumed run: the last one)
        self.steps: list[dict[str, float | int]] = []
        self.epochs: list[dict[str, str | int]] = []
        self._step = step
        self._norm = torch.full((), math.nan, device=step.runtime.device)
        self._perturb = int(os.environ.get(PERTURB_ENV) or 0)
        if not step.graphs:  # a graphed step's gradients stay in place after each replay: read there
            step.optimizer.register_step_pre_hook(self._before_update)

    def _grad_norm(self) -> torch.Tensor:
        grads = [p.grad for p in self._step.params if p.grad is not None]
        return nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=self._norm.device)

    def _before_update(self, optimizer, args, kwargs) -> None:
        update = self._step.updates + 1  # the optimizer step about to be taken
        if update == self._perturb:
            self._perturb_gradients()
        if update % self.every == 0:
            self._norm.copy_(self._grad_norm())

    def _perturb_gradients(self) -> None:
        # Every gradient scaled by 1 + 1-2% drawn afresh each run: the step's gradient norm then differs between two
        # runs to the first order (a change to one element could vanish in the norm's rounding).
        scale = 1.0 + 0.01 * (1.0 + random.SystemRandom().random())
        with torch.no_grad():
            for p in self._step.params:
                if p.grad is not None:
                    p.grad.mul_(scale)

    def after_update(self) -> None:
        """Called after each optimizer step: every `every` steps, the step's running loss sum and gradient norm (one
        read from the device)."""
        update = self._step.updates
        if update % self.every:
            return
        if self._step.graphs:
            self._norm.copy_(self._grad_norm())
        loss_sum, norm = torch.stack([self._step.loss_sum.float(), self._norm.float()]).tolist()
        self.steps.append({"step": update, "loss_sum": loss_sum, "grad_norm": norm})
        self._norm.fill_(math.nan)

    def epoch_end(self, epoch: int) -> None:
        """The hashes of the weights (and EMA weights) and the optimizer state at the end of `epoch` (1-based)."""
        step = self._step
        record: dict[str, str | int] = {"epoch": epoch, "step": step.updates,
                                        "weights": tensors_digest(step.model.state_dict().items()),
                                        "optimizer": tensors_digest(optimizer_items(step.optimizer))}
        if step.ema is not None:
            record["ema"] = tensors_digest(step.ema.module.state_dict().items())
        self.epochs.append(record)

    def state_dict(self) -> dict[str, Any]:
        return {"every": self.every, "steps": list(self.steps), "epochs": list(self.epochs),
                "fingerprint": dict(self.fingerprint)}

    def load_state_dict(self, saved: dict[str, Any] | None) -> None:
        """Continue the trail a checkpoint kept (records at their own steps: a replay may record more often)."""
        if saved:
            self.steps, self.epochs = list(saved.get("steps", [])), list(saved.get("epochs", []))
