"""Early stopping on a validation plateau (the plateau schedule, what `epochs: auto` trains with): the best value of
the primary validation metric (and its weights), the validations since it last improved by more than its noise, and
the cooldown once it began. All of it is in the checkpoint, so that a resumed run stops where the uninterrupted one
would."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

# The cooldown (a linear LR decay) that follows a plateau lasts this fraction of the steps trained until then
# (warmup-stable-decay schedules cool down over 10-20% of a run: Hägele et al. 2024), and at least one validation.
COOLDOWN_FRACTION = 0.2


@dataclass
class Stopping:
    """Watches `metric` (a key of the validation row, without its val_ prefix): after `patience` validations without
    a value better than the best by more than its standard error on `val_count` samples, the cooldown begins, and not
    so early that the run would end before `lower_steps` optimizer steps."""

    metric: str
    patience: int
    lower_steps: int = 0
    higher_is_better: bool = True
    keep_best: bool = False  # fit returns the best validation's weights (else the last ones, after the cooldown)
    val_count: int = 0  # validation samples: a fraction's standard error on them is the least improvement that counts
    best: float | None = None
    best_epoch: int = 0
    best_step: int = 0
    since_best: int = 0
    cooldown: tuple[int, int] | None = None  # (first step, steps)
    margin: float = 0.0  # the noise an improvement had to beat when the cooldown began
    best_state: dict[str, torch.Tensor] = field(default_factory=dict)
    at_ceiling: bool = False  # the cooldown began because the epoch ceiling was near, not at a plateau

    def observe(self, row: dict[str, float], model: nn.Module) -> bool:
        """Take one validation row; a better value keeps a copy of `model`'s weights. True when it was better."""
        value = row.get(f"val_{self.metric}", float("nan"))
        margin = self.noise(self.best)
        better = not math.isnan(value) and (self.best is None or (value > self.best + margin if self.higher_is_better
                                                                  else value < self.best - margin))
        if better:
            self.best, self.best_epoch, self.best_step, self.since_best = value, int(row["epoch"]), int(row["step"]), 0
            if self.keep_best:
                self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            self.since_best += 1
        return better

    def noise(self, best: float | None) -> float:
        """The least improvement on `best` that counts: the standard error of a fraction (accuracy, Dice, IoU) measured
        on `val_count` samples, sqrt(p (1 - p) / n); 0 for a value that is no fraction or no count given. One photo in
        a 120-photo validation split moves accuracy 0.8 points, so an improvement within the noise is no improvement."""
        if best is None or not self.val_count or not 0.0 <= best <= 1.0:
            return 0.0
        return math.sqrt(best * (1.0 - best) / self.val_count)

    def plateaued(self, step: int, ceiling: int) -> bool:
        """Whether the cooldown should begin now: none yet, and either `patience` validations of nothing better with
        the cooldown then ending at `lower_steps` or later, or the cooldown would otherwise not end by `ceiling`."""
        if self.cooldown is not None:
            return False
        ends = step + math.ceil(COOLDOWN_FRACTION * step)
        self.at_ceiling = ends >= ceiling
        return self.at_ceiling or (ends >= self.lower_steps and self.since_best >= self.patience)

    def earliest_end(self, step: int, steps_per_validation: int, ceiling: int) -> int:
        """The first step training could end at, seen from `step` (the progress bar's total until the cooldown
        fixes the end): `patience` validations of no progress, then the cooldown, not before the lower bound."""
        if self.cooldown is not None:
            return sum(self.cooldown)
        plateau = step + max(1, self.patience - self.since_best) * steps_per_validation
        return min(ceiling, max(self.lower_steps, plateau + math.ceil(COOLDOWN_FRACTION * plateau)))

    def begin_cooldown(self, step: int, steps_per_validation: int) -> int:
        """Start the cooldown at `step`; its length in optimizer steps."""
        steps = max(math.ceil(COOLDOWN_FRACTION * step), steps_per_validation)
        self.cooldown, self.margin = (step, steps), self.noise(self.best)
        return steps

    def restore_best(self, model: nn.Module) -> None:
        """Put the best weights seen back into `model` (nothing when no validation was better than none)."""
        if self.best_state:
            model.load_state_dict(self.best_state)

    def record(self, epochs: int, steps: int) -> dict:
        """What info.json and MLflow keep: where the run stopped, where its best weights are from, and why."""
        if self.cooldown is None:
            why = "stopped before a plateau"
        elif self.at_ceiling:
            why = f"the step ceiling came before a plateau: {self.cooldown[1]:,} steps of cooldown from step " \
                  f"{self.cooldown[0]:,}"
        else:
            why = (f"val_{self.metric} had not improved by more than its noise ({self.margin:.4f} on "
                   f"{self.val_count:,} samples) for {self.patience} validations at step {self.cooldown[0]:,}; "
                   f"then {self.cooldown[1]:,} steps of cooldown")
        return {"stopped_epoch": epochs, "stopped_step": steps, "kept_epoch": self.best_epoch if self.keep_best
                else epochs, "best_epoch": self.best_epoch,
                "best_step": self.best_step, f"best_val_{self.metric}": self.best,
                "cooldown_step": self.cooldown[0] if self.cooldown else None, "why": why}

    def state_dict(self) -> dict:
        return {"best": self.best, "best_epoch": self.best_epoch, "best_step": self.best_step,
                "since_best": self.since_best, "cooldown": list(self.cooldown) if self.cooldown else None,
                "at_ceiling": self.at_ceiling, "margin": self.margin,
                "best_state": {k: v.cpu() for k, v in self.best_state.items()}}

    def load_state_dict(self, saved: dict, device: torch.device) -> None:
        self.best, self.best_epoch, self.best_step = saved["best"], saved["best_epoch"], saved["best_step"]
        self.since_best, self.at_ceiling = saved["since_best"], saved.get("at_ceiling", False)
        self.margin = saved.get("margin", 0.0)
        self.cooldown = tuple(saved["cooldown"]) if saved["cooldown"] else None
        self.best_state = {k: v.to(device) for k, v in saved["best_state"].items()}
