"""Where fit is (FitState) and its full state on disk: written at epoch ends and on request, resumed when its
fingerprint matches, never written once the loss has diverged."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from trainlab.core import distributed
from trainlab.core.errors import CheckpointError, TrainingDiverged
from trainlab.engine.checkpoint import load_checkpoint, load_model_state, rng_state, save_checkpoint, set_rng_state
from trainlab.engine.step import TrainStep
from trainlab.engine.stopping import Stopping
from trainlab.engine.trail import Trail


@dataclass
class FitState:
    """Where training is: what a checkpoint keeps besides the weights and the optimizer."""

    epoch: int = 0
    step_in_epoch: int = 0
    history: list[dict[str, float]] = field(default_factory=list)
    train_time: float = 0.0
    trail: Trail | None = None
    total_updates: int = 0  # where training ends: the plan's, or the end of the plateau schedule's cooldown
    stopping: Stopping | None = None  # the plateau schedule's watch of the validation metric
    window_s: float = 0.0  # seconds trained since the last validation


class Checkpoints:
    """Saves the full training state to `path` with its `fingerprint` (rank 0 writes, the others wait); nothing
    without a path. A diverged step is refused before anything is written, so the last checkpoint stays a good one."""

    def __init__(self, path: Path | None, fingerprint: str, name: str, model: nn.Module, step: TrainStep,
                 state: FitState):
        self.path = Path(path) if path else None
        self.fingerprint, self.name, self.model, self.step, self.state = fingerprint, name, model, step, state

    def save(self) -> None:
        if self.path is None:
            return
        raise_if_diverged(self.step.first_bad, self.name, self.path)
        if distributed.context().is_main:
            save_checkpoint(self.path, {
                "fingerprint": self.fingerprint, "model": self.model.state_dict(), "step": self.step.state_dict(),
                "epoch": self.state.epoch, "step_in_epoch": self.state.step_in_epoch, "update": self.step.updates,
                "history": self.state.history, "train_time": self.state.train_time, "rng": rng_state(),
                "total_updates": self.state.total_updates, "window_s": self.state.window_s,
                "stopping": self.state.stopping.state_dict() if self.state.stopping is not None else None,
                "trail": self.state.trail.state_dict() if self.state.trail is not None else None})
        distributed.barrier()


def resume(path: Path | None, fingerprint: str, name: str, model: nn.Module, step: TrainStep, state: FitState,
           device: torch.device) -> int:
    """Load the checkpoint at `path` into model, step and state when its fingerprint matches; the optimizer step it
    resumed from (0: none)."""
    ckpt = Path(path) if path else None
    saved = resume_state(ckpt, device)
    if saved is None:
        return 0
    if saved.get("fingerprint") != fingerprint:
        print(f"{name}: ignoring checkpoint {ckpt} from other params or data", flush=True)
        return 0
    # same params and data, but the model code may have changed since: a clear error, not a traceback
    load_model_state(model, saved.get("model") or {}, str(ckpt))
    try:
        step.load_state_dict(saved["step"])
        state.epoch, state.step_in_epoch = saved["epoch"], saved["step_in_epoch"]
        state.history, state.train_time = list(saved["history"]), saved["train_time"]
        if state.trail is not None:
            state.trail.load_state_dict(saved.get("trail"))
        state.total_updates = saved.get("total_updates", state.total_updates)
        state.window_s = float(saved.get("window_s", 0.0))
        if state.stopping is not None and saved.get("stopping"):
            state.stopping.load_state_dict(saved["stopping"], device)
            if state.stopping.cooldown is not None:
                step.schedule.cool_down(*state.stopping.cooldown)
        set_rng_state(saved["rng"])
    except (KeyError, ValueError, RuntimeError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{ckpt}: cannot resume from this checkpoint ({type(exc).__name__}: {exc}); "
                              "delete it to train from the start") from None
    print(f"{name}: resuming from {ckpt} at epoch {state.epoch + 1}, optimizer step {step.updates}", flush=True)
    return step.updates


def resume_state(ckpt: Path | None, device: torch.device) -> dict | None:
    """The checkpoint's state for training on `device`: the weights there, everything else (RNG states, which torch
    and NumPy read only on the CPU; optimizer state, which the optimizer moves itself) on the CPU. None when there
    is no checkpoint (or it vanished: another run of this task in the same folder finished and removed it between
    our look and our read)."""
    if ckpt is None or not ckpt.exists():
        return None
    try:
        state = load_checkpoint(ckpt, map_location="cpu")
    except CheckpointError:
        if ckpt.exists():
            raise
        return None
    if isinstance(state.get("model"), dict):
        state["model"] = {k: v.to(device) for k, v in state["model"].items()}
    return state


def raise_if_diverged(first_bad: torch.Tensor, name: str, ckpt: Path | None) -> None:
    bad = int(distributed.all_reduce_max(first_bad.clone()))
    if bad >= 0:
        where = f"the last good checkpoint is {ckpt}" if ckpt is not None and ckpt.exists() else \
            "no good checkpoint was written"
        raise TrainingDiverged(f"{name}: loss became NaN/inf at optimizer step {bad + 1}; {where}. "
                               "Lower the learning rate, enable grad_clip, or check the data.")
