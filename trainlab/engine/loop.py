"""The training loop shared by every task: fit (train, validate, checkpoint, resume) and evaluate."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Protocol

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainlab.core import auto, distributed
from trainlab.core.config import BaseParams, TrainParams
from trainlab.core.errors import CheckpointError, ParamsError, TrainingDiverged, UserError
from trainlab.core.runtime import Runtime
from trainlab.engine.batches import Batch, make_batches, num_samples
from trainlab.engine.checkpoint import load_checkpoint, load_model_state, rng_state, save_checkpoint, set_rng_state
from trainlab.engine.contract import Trainable
from trainlab.engine.evaluation import evaluate, scalars  # noqa: F401 - evaluate re-exported
from trainlab.engine.precise_bn import PRECISE_BN_BATCHES, recompute_batchnorm, wanted
from trainlab.engine.progress import Progress
from trainlab.engine.step import TrainStep, graphs_plan, to_device_layout
from trainlab.engine.stopping import Stopping
from trainlab.engine.trail import Trail
from trainlab.models.init import count_parameters


class MetricsSink(Protocol):
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...


class TrainingInterrupted(UserError):
    """Stopped by a signal (or on request) after writing a checkpoint to resume from."""

    exit_code = 130


@dataclass
class FitResult:
    model: nn.Module  # the weights to keep (the EMA copy when EMA is on)
    history: list[dict[str, float]] = field(default_factory=list)
    final: dict[str, float] = field(default_factory=dict)
    params_total: int = 0
    params_trainable: int = 0
    train_time_s: float = 0.0
    samples_per_s: float = 0.0
    resumed_from_step: int = 0
    cuda_graphs: bool = False  # the step was captured as a CUDA graph
    trail: dict = field(default_factory=dict)  # trainlab.engine.trail: what `python -m trainlab.verify` compares
    stopping: dict = field(default_factory=dict)  # the plateau schedule's record (trainlab.engine.stopping)


@contextmanager
def _stop_on_signals(flag: threading.Event | None = None):
    """SIGINT/SIGTERM set a flag that the loop checks after each optimizer step (main thread only); `flag` may also
    be set by another thread."""
    flag = flag if flag is not None else threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, lambda signum, frame: flag.set())
    try:
        yield flag
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@dataclass(frozen=True)
class FitOptions:
    """How fit runs, beside what it trains (TrainParams) and where (Runtime): where the data lives, the validation
    batch, the checkpoint to write and resume, and the DDP and CUDA-graph settings."""

    max_device_mb: int = 2048  # a split up to this size lives on the device, a larger one is streamed
    num_workers: int = 2  # DataLoader workers for a streamed split
    eval_batch_size: int = 256
    checkpoint_path: Path | None = None  # the full state is saved here at each epoch end (and every
    fingerprint: str = ""  # cfg.checkpoint_every_steps); a checkpoint there is resumed only when this matches
    sync_batchnorm: bool = False
    cuda_graphs: bool | str = "auto"  # capture the step as a CUDA graph where the device and settings allow
    run_fingerprint: Mapping[str, str] | None = None  # kept with the trail (trainlab.core.fingerprint)

    @classmethod
    def from_base(cls, base: BaseParams, **overrides) -> FitOptions:
        """The options that params.yaml's `base` section sets, plus `overrides`."""
        return cls(max_device_mb=base.data_on_device_max_mb, num_workers=base.num_workers,
                   sync_batchnorm=base.distributed.sync_batchnorm, cuda_graphs=base.cuda_graphs, **overrides)


@dataclass(frozen=True)
class FitHooks:
    """What fit tells the caller and asks it. `tracker` gets each epoch's metrics. `stop` (an event set by another
    thread) and `stop_after` (called with the optimizer-step count after each step) stop training at that step as if
    interrupted: checkpoint, then TrainingInterrupted; `stop_after_epochs` the same at the end of that epoch."""

    tracker: MetricsSink | None = None
    stop: threading.Event | None = None
    stop_after: Callable[[int], bool] | None = None
    stop_after_epochs: int | None = None


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
    window: list[float] = field(default_factory=lambda: [0.0, 0.0])  # seconds and samples since the last validation


@dataclass(frozen=True)
class EpochPlan:
    """Micro-batches and optimizer steps an epoch and in all."""

    steps_per_epoch: int
    updates_per_epoch: int
    total_updates: int

    @classmethod
    def of(cls, cfg: TrainParams, batches_per_epoch: int) -> EpochPlan:
        updates_per_epoch = max(1, batches_per_epoch // cfg.accumulation_steps)
        total = cfg.epochs * updates_per_epoch
        return cls(updates_per_epoch * cfg.accumulation_steps, updates_per_epoch,
                   min(total, cfg.max_steps) if cfg.max_steps else total)


def fit(trainable: Trainable, train: Batch, val: Batch, cfg: TrainParams, runtime: Runtime, seed: int,
        options: FitOptions = FitOptions(), hooks: FitHooks = FitHooks()) -> FitResult:
    """Train `trainable.model` on `train`, validating on `val` every `cfg.validate_every` steps (whole epochs; the
    plateau schedule stops once that stops improving); resume from a checkpoint of the same fingerprint. Under torchrun
    DDP: each rank takes `batch_size / world_size` of every batch; rank 0 reports progress and writes checkpoints."""
    ctx = distributed.context()
    if cfg.batch_size % ctx.world_size:
        raise ParamsError(f"{trainable.name}.batch_size ({cfg.batch_size}) must be divisible by the number of "
                          f"processes ({ctx.world_size})")
    model, forward = place_model(trainable, runtime, options.sync_batchnorm)
    batches = make_batches(train, cfg.batch_size // ctx.world_size, runtime.device, seed, shuffle=True,
                           drop_last=True, max_device_mb=options.max_device_mb, num_workers=options.num_workers,
                           rank=ctx.rank, world_size=ctx.world_size, repeats=cfg.epoch_repeats)
    plan = EpochPlan.of(cfg, len(batches))
    every = auto.validation_epochs(cfg.validate_every, plan.updates_per_epoch)
    graphs, why_not = graphs_plan(options.cuda_graphs, runtime, cfg, distributed=ctx.enabled)
    if why_not and ctx.is_main:
        print(f"{trainable.name}: CUDA graphs off ({why_not}); the training step runs eagerly", flush=True)
    step = TrainStep(trainable, model, cfg, runtime, total_updates=plan.total_updates, seed=seed, forward=forward,
                     warmup_updates=round(cfg.warmup_epochs * plan.updates_per_epoch), graphs=graphs)
    stopping = Stopping(trainable.primary_metric, cfg.patience, cfg.min_steps or 0, keep_best=cfg.keep == "best",
                        val_count=num_samples(val)) if cfg.schedule == "plateau" else None
    state = FitState(trail=Trail(step, {**(options.run_fingerprint or {}), "cuda_graphs": str(graphs)}),
                     total_updates=plan.total_updates, stopping=stopping)
    resumed_from = resume(options, trainable.name, model, step, state, runtime.device)
    saver = Checkpoints(options, trainable.name, model, step, state)
    precise_bn = wanted(cfg.precise_bn, model, plan.updates_per_epoch, ctx.enabled)
    ends = stopping.earliest_end(step.updates, every * plan.updates_per_epoch, plan.total_updates) if stopping else 0
    progress = Progress(ends or state.total_updates, f"train {trainable.name}", step.updates, enabled=ctx.is_main)
    with _stop_on_signals(hooks.stop) as stop_flag, closing(progress):
        def should_stop() -> bool:
            return stop_flag.is_set() or (hooks.stop_after is not None and hooks.stop_after(step.updates))

        while state.epoch < cfg.epochs and step.updates < state.total_updates:
            seconds, samples = train_one_epoch(step, batches, state, plan, progress, should_stop, saver, every)
            _raise_if_diverged(step.first_bad, trainable.name, saver.path)
            state.train_time += seconds
            state.window = [state.window[0] + seconds, state.window[1] + samples]
            last = state.epoch + 1 >= cfg.epochs or step.updates >= state.total_updates
            if (state.epoch + 1) % every == 0 or last:
                validate(trainable, step, batches, val, runtime, options, state, precise_bn)
                report_validation(trainable, step, state, plan, every, progress, hooks, cfg.epochs)
            state.trail.epoch_end(state.epoch + 1)
            state.epoch, state.step_in_epoch = state.epoch + 1, 0
            saved = state.epoch % every == 0 or step.updates >= state.total_updates or state.epoch >= cfg.epochs
            if saved:
                saver.save(state.train_time)
            if hooks.stop_after_epochs and state.epoch >= hooks.stop_after_epochs and state.epoch < cfg.epochs \
                    and step.updates < state.total_updates:
                if not saved:
                    saver.save(state.train_time)
                raise TrainingInterrupted(f"{trainable.name}: stopped after epoch {state.epoch} as asked; checkpoint "
                                          f"saved to {saver.path}")

    return fit_result(model, step, state, cfg, resumed_from, graphs)


def fit_result(model: nn.Module, step: TrainStep, state: FitState, cfg: TrainParams, resumed_from: int,
               graphs: bool) -> FitResult:
    """What fit hands back: the weights to keep (the plateau schedule's best), the history, counts and timings."""
    if state.stopping is not None:
        state.stopping.restore_best(step.eval_model)
    total_params, trainable = count_parameters(model)
    samples = step.updates * cfg.accumulation_steps * cfg.batch_size
    return FitResult(model=step.eval_model, history=state.history, final=state.history[-1] if state.history else {},
                     params_total=total_params, params_trainable=trainable, train_time_s=state.train_time,
                     samples_per_s=samples / max(state.train_time, 1e-9), resumed_from_step=resumed_from,
                     cuda_graphs=graphs, trail=state.trail.state_dict(),
                     stopping=state.stopping.record(state.epoch, step.updates) if state.stopping else {})


def validate(trainable: Trainable, step: TrainStep, batches, val: Batch, runtime: Runtime, options: FitOptions,
             state: FitState, precise_bn: bool) -> None:
    """Validate the weights to keep and append the history row: the training loss and throughput since the last
    validation, the LR, the validation loss and metrics."""
    if precise_bn:
        settle_batchnorm(trainable, step.eval_model, batches, state.epoch, runtime)
    val_metrics = scalars(evaluate(trainable, step.eval_model, val, runtime, options.eval_batch_size,
                                   options.max_device_mb))
    seconds, samples = state.window
    state.history.append({"epoch": state.epoch + 1, "step": step.updates, "train_loss": mean_train_loss(step),
                          "lr": step.schedule.lr_at(step.updates),
                          "samples_per_s": samples * distributed.context().world_size / max(seconds, 1e-9),
                          **{f"val_{k}": v for k, v in val_metrics.items()}})
    state.window = [0.0, 0.0]


def report_validation(trainable: Trainable, step: TrainStep, state: FitState, plan: EpochPlan, every: int,
                      progress: Progress, hooks: FitHooks, epochs: int) -> None:
    """After a validation: the plateau schedule's watch (keep the best weights; at a plateau, begin the cooldown
    and move the end of training to its end), the log line, and the row to the tracker."""
    row, stopping = state.history[-1], state.stopping
    if stopping is not None:
        stopping.observe(row, step.eval_model)
        if stopping.plateaued(step.updates, plan.total_updates) and step.updates < state.total_updates:
            length = stopping.begin_cooldown(step.updates, every * plan.updates_per_epoch)
            state.total_updates = min(plan.total_updates, step.updates + length)
            step.schedule.cool_down(step.updates, state.total_updates - step.updates)
        progress.set_total(min(state.total_updates, stopping.earliest_end(step.updates, every * plan.updates_per_epoch,
                                                                          plan.total_updates)))
    progress.write(epoch_line(trainable, row, epochs, stopping))
    if hooks.tracker is not None:
        hooks.tracker.log_metrics({k: v for k, v in row.items() if k != "epoch"}, step=state.epoch + 1)


def place_model(trainable: Trainable, runtime: Runtime, sync_batchnorm: bool) -> tuple[nn.Module, nn.Module]:
    """The model on its device and memory format, and what the step calls: the model, wrapped in DDP under
    torch.distributed, compiled when the runtime says so."""
    device = runtime.device
    model = trainable.model.to(device)
    if trainable.conv and runtime.channels_last:
        model = model.to(memory_format=torch.channels_last)
    forward = model
    if distributed.context().enabled:
        if sync_batchnorm:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        forward = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model, torch.compile(forward) if runtime.compile else forward


def train_one_epoch(step: TrainStep, batches, state: FitState, plan: EpochPlan, progress: Progress,
                    should_stop: Callable[[], bool], saver: Checkpoints, every: int = 1) -> tuple[float, int]:
    """The optimizer steps of one epoch, from where a resumed epoch stopped; its seconds and this rank's samples.
    The running training loss starts anew with each validation window (`every` epochs)."""
    step.model.train()
    t0 = time.perf_counter()
    window_start = state.step_in_epoch == 0 and state.epoch % every == 0
    samples_at_start = 0 if window_start else int(step.seen)
    first_step = state.step_in_epoch
    if window_start:
        step.loss_sum.zero_()
        step.seen.zero_()
    every = step.cfg.checkpoint_every_steps
    for index, batch in enumerate(batches.epoch(state.epoch, state.step_in_epoch), start=state.step_in_epoch):
        if index >= plan.steps_per_epoch:
            break
        updated = step(batch)
        state.step_in_epoch = index + 1
        if not updated:
            continue
        state.trail.after_update()
        since = time.perf_counter() - t0
        progress.step(step.updates, (state.step_in_epoch - first_step) * step.cfg.batch_size / max(since, 1e-9),
                      lambda: float(step.loss_sum / step.seen.clamp(min=1)))
        if step.updates >= state.total_updates:
            break
        if should_stop():
            saver.save(state.train_time + since)
            raise TrainingInterrupted(
                f"{step.trainable.name}: stopped at optimizer step {step.updates}; checkpoint saved to "
                f"{saver.path}. Run the same command (or `dvc repro`) again to resume.")
        if every and step.updates % every == 0:
            saver.save(state.train_time + since)
    return time.perf_counter() - t0, int(step.seen) - samples_at_start


def mean_train_loss(step: TrainStep) -> float:
    """The epoch's mean training loss over every rank (one sync)."""
    totals = distributed.all_reduce_sum(torch.stack([step.loss_sum, step.seen.float()]))
    return float(totals[0] / totals[1].clamp(min=1))


def settle_batchnorm(trainable: Trainable, model: nn.Module, batches, epoch: int, runtime: Runtime) -> None:
    """Precise BatchNorm statistics of the model that is evaluated, from training batches as evaluation sees them
    (no augmentation), before a validation."""
    inputs = (to_device_layout(trainable.prepare_batch(b, False, None)[0], trainable, runtime)
              for b in islice(batches.epoch(epoch), PRECISE_BN_BATCHES))
    recompute_batchnorm(model, inputs, runtime)


def epoch_line(trainable: Trainable, row: dict[str, float], epochs: int, stopping: Stopping | None = None) -> str:
    metric = trainable.primary_metric
    of = f"{row['epoch']}/{epochs}" if stopping is None else (
        f"{row['epoch']} (best {stopping.best_epoch}" + (", cooling down)" if stopping.cooldown else ")"))
    return (f"{trainable.name} epoch {of}: train_loss {row['train_loss']:.4f} "
            f"val_loss {row['val_loss']:.4f} val_{metric} {row.get(f'val_{metric}', float('nan')):.4f} "
            f"{row['samples_per_s']:,.0f} samples/s")


class Checkpoints:
    """Saves the full training state to `options.checkpoint_path` (rank 0 writes, the others wait); nothing without
    a path. A diverged step is refused before anything is written, so the last checkpoint stays a good one."""

    def __init__(self, options: FitOptions, name: str, model: nn.Module, step: TrainStep, state: FitState):
        self.path = Path(options.checkpoint_path) if options.checkpoint_path else None
        self.fingerprint, self.name, self.model, self.step, self.state = options.fingerprint, name, model, step, state

    def save(self, elapsed: float) -> None:
        if self.path is None:
            return
        _raise_if_diverged(self.step.first_bad, self.name, self.path)
        if distributed.context().is_main:
            save_checkpoint(self.path, {
                "fingerprint": self.fingerprint, "model": self.model.state_dict(), "step": self.step.state_dict(),
                "epoch": self.state.epoch, "step_in_epoch": self.state.step_in_epoch, "update": self.step.updates,
                "history": self.state.history, "train_time": elapsed, "rng": rng_state(),
                "total_updates": self.state.total_updates, "window": list(self.state.window),
                "stopping": self.state.stopping.state_dict() if self.state.stopping is not None else None,
                "trail": self.state.trail.state_dict() if self.state.trail is not None else None})
        distributed.barrier()


def resume(options: FitOptions, name: str, model: nn.Module, step: TrainStep, state: FitState,
           device: torch.device) -> int:
    """Load the checkpoint at `options.checkpoint_path` into model, step and state when its fingerprint matches;
    the optimizer step it resumed from (0: none)."""
    ckpt = Path(options.checkpoint_path) if options.checkpoint_path else None
    saved = resume_state(ckpt, device)
    if saved is None:
        return 0
    if saved.get("fingerprint") != options.fingerprint:
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
        state.window = list(saved.get("window", state.window))
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


def _raise_if_diverged(first_bad: torch.Tensor, name: str, ckpt: Path | None) -> None:
    bad = int(distributed.all_reduce_max(first_bad.clone()))
    if bad >= 0:
        where = f"the last good checkpoint is {ckpt}" if ckpt is not None and ckpt.exists() else \
            "no good checkpoint was written"
        raise TrainingDiverged(f"{name}: loss became NaN/inf at optimizer step {bad + 1}; {where}. "
                               "Lower the learning rate, enable grad_clip, or check the data.")
