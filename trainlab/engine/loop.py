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
from trainlab.core.errors import ParamsError, UserError
from trainlab.core.runtime import Runtime
from trainlab.engine.batches import Batch, make_batches, num_samples
from trainlab.engine.contract import Trainable
from trainlab.engine.evaluation import evaluate, scalars  # noqa: F401 - evaluate re-exported
from trainlab.engine.precise_bn import PRECISE_BN_BATCHES, recompute_batchnorm, wanted
from trainlab.engine.progress import Progress
from trainlab.engine.resume import Checkpoints, FitState, raise_if_diverged, resume
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
    checkpoint_path: Path | None = None  # the full state is saved here at the end of each epoch that validated,
    fingerprint: str = ""  # at the end, every cfg.checkpoint_every_steps; resumed only when this fingerprint matches
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
    """Train `trainable.model` on `train`, validating on `val` every `cfg.validate_every` optimizer steps (within an
    epoch too) and when training ends (the plateau schedule stops once that stops improving); resume from a checkpoint
    of the same fingerprint. Under torchrun DDP: each rank takes `batch_size / world_size` of every batch; rank 0
    reports progress and writes checkpoints."""
    ctx = distributed.context()
    if cfg.batch_size % ctx.world_size:
        raise ParamsError(f"{trainable.name}.batch_size ({cfg.batch_size}) must be divisible by the number of "
                          f"processes ({ctx.world_size})")
    model, forward = place_model(trainable, runtime, options.sync_batchnorm)
    batches = make_batches(train, cfg.batch_size // ctx.world_size, runtime.device, seed, shuffle=True,
                           drop_last=True, max_device_mb=options.max_device_mb, num_workers=options.num_workers,
                           rank=ctx.rank, world_size=ctx.world_size, repeats=cfg.epoch_repeats)
    plan = EpochPlan.of(cfg, len(batches))
    every = auto.validation_steps(cfg.validate_every, plan.updates_per_epoch)
    graphs, why_not = graphs_plan(options.cuda_graphs, runtime, cfg, distributed=ctx.enabled)
    if why_not and ctx.is_main:
        print(f"{trainable.name}: CUDA graphs off ({why_not}); the training step runs eagerly", flush=True)
    step = TrainStep(trainable, model, cfg, runtime, total_updates=plan.total_updates, seed=seed, forward=forward,
                     warmup_updates=round(cfg.warmup_epochs * plan.updates_per_epoch), graphs=graphs)
    stopping = Stopping(trainable.primary_metric, cfg.patience, cfg.min_steps or 0, keep_best=cfg.keep == "best",
                        val_count=num_samples(val)) if cfg.schedule == "plateau" else None
    state = FitState(trail=Trail(step, {**(options.run_fingerprint or {}), "cuda_graphs": str(graphs)}),
                     total_updates=plan.total_updates, stopping=stopping)
    resumed_from = resume(options.checkpoint_path, options.fingerprint, trainable.name, model, step, state,
                          runtime.device)
    saver = Checkpoints(options.checkpoint_path, options.fingerprint, trainable.name, model, step, state)
    precise_bn = wanted(cfg.precise_bn, model, plan.updates_per_epoch, ctx.enabled)
    ends = stopping.earliest_end(step.updates, every, plan.total_updates) if stopping else 0
    progress = Progress(ends or state.total_updates, f"train {trainable.name}", step.updates, enabled=ctx.is_main)
    with _stop_on_signals(hooks.stop) as stop_flag, closing(progress):
        def should_stop() -> bool:
            return stop_flag.is_set() or (hooks.stop_after is not None and hooks.stop_after(step.updates))

        def validate_now() -> None:
            raise_if_diverged(step.first_bad, trainable.name, saver.path)
            validate(trainable, step, batches, val, runtime, options, state, precise_bn)
            report_validation(trainable, step, state, plan, every, progress, hooks, cfg.epochs)

        while state.epoch < cfg.epochs and step.updates < state.total_updates:
            started = state.epoch * plan.updates_per_epoch  # the optimizer steps before this epoch
            train_one_epoch(step, batches, state, plan, progress, should_stop, saver, every, validate_now)
            raise_if_diverged(step.first_bad, trainable.name, saver.path)
            if state.epoch + 1 >= cfg.epochs and last_validated(state) < step.updates:
                validate_now()  # the last epoch ends with a validation, wherever the cadence falls
            state.trail.epoch_end(state.epoch + 1)
            state.epoch, state.step_in_epoch = state.epoch + 1, 0
            # a checkpoint at the end of an epoch that validated (not every epoch of a small set) and at the end
            saved = last_validated(state) > started or step.updates >= state.total_updates or state.epoch >= cfg.epochs
            if saved:
                saver.save()
            if hooks.stop_after_epochs and state.epoch >= hooks.stop_after_epochs and state.epoch < cfg.epochs \
                    and step.updates < state.total_updates:
                if not saved:
                    saver.save()
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
    validation (then counted anew), the LR, the validation loss and metrics."""
    if precise_bn:
        settle_batchnorm(trainable, step.eval_model, batches, state.epoch, runtime)
    val_metrics = scalars(evaluate(trainable, step.eval_model, val, runtime, options.eval_batch_size,
                                   options.max_device_mb))
    loss, samples = window_train_loss(step)
    state.history.append({"epoch": state.epoch + 1, "step": step.updates, "train_loss": loss,
                          "lr": step.schedule.lr_at(step.updates),
                          "samples_per_s": samples / max(state.window_s, 1e-9),
                          **{f"val_{k}": v for k, v in val_metrics.items()}})
    state.window_s = 0.0
    step.loss_sum.zero_()
    step.seen.zero_()


def last_validated(state: FitState) -> int:
    """The optimizer step of the last validation (-1: none yet)."""
    return int(state.history[-1]["step"]) if state.history else -1


def report_validation(trainable: Trainable, step: TrainStep, state: FitState, plan: EpochPlan, every: int,
                      progress: Progress, hooks: FitHooks, epochs: int) -> None:
    """After a validation: the plateau schedule's watch (keep the best weights; at a plateau, begin the cooldown
    and move the end of training to its end), the log line, and the row to the tracker."""
    row, stopping = state.history[-1], state.stopping
    if stopping is not None:
        stopping.observe(row, step.eval_model)
        if stopping.plateaued(step.updates, plan.total_updates) and step.updates < state.total_updates:
            length = stopping.begin_cooldown(step.updates, every)
            state.total_updates = min(plan.total_updates, step.updates + length)
            step.schedule.cool_down(step.updates, state.total_updates - step.updates)
        progress.set_total(min(state.total_updates, stopping.earliest_end(step.updates, every, plan.total_updates)))
    progress.write(epoch_line(trainable, row, epochs, stopping, mid_epoch=step.updates % plan.updates_per_epoch != 0))
    if hooks.tracker is not None:  # MLflow's step axis is the history's: optimizer steps (the epoch a metric)
        hooks.tracker.log_metrics({k: v for k, v in row.items() if k != "step"}, step=step.updates)


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
                    should_stop: Callable[[], bool], saver: Checkpoints, every: int,
                    validate_now: Callable[[], None]) -> None:
    """The optimizer steps of one epoch, from where a resumed epoch stopped, with a validation after every `every`-th
    step and after the last step of training. Training time (validations not counted) goes to `state`."""
    step.model.train()
    t0 = lap = time.perf_counter()
    first_step = state.step_in_epoch

    def clock() -> None:  # the seconds trained since the last look, into train_time and the validation window
        nonlocal lap
        now = time.perf_counter()
        state.train_time, state.window_s, lap = state.train_time + now - lap, state.window_s + now - lap, now

    for index, batch in enumerate(batches.epoch(state.epoch, state.step_in_epoch), start=state.step_in_epoch):
        if index >= plan.steps_per_epoch:
            break
        updated = step(batch)
        state.step_in_epoch = index + 1
        if not updated:
            continue
        state.trail.after_update()
        progress.step(step.updates, (state.step_in_epoch - first_step) * step.cfg.batch_size /
                      max(time.perf_counter() - t0, 1e-9), lambda: float(step.loss_sum / step.seen.clamp(min=1)))
        if step.updates % every == 0 or step.updates >= state.total_updates:
            clock()
            validate_now()
            lap = time.perf_counter()
            step.model.train()
        if step.updates >= state.total_updates:
            break
        if should_stop():
            clock()
            saver.save()
            raise TrainingInterrupted(
                f"{step.trainable.name}: stopped at optimizer step {step.updates}; checkpoint saved to "
                f"{saver.path}. Run the same command (or `dvc repro`) again to resume.")
        if step.cfg.checkpoint_every_steps and step.updates % step.cfg.checkpoint_every_steps == 0:
            clock()
            saver.save()
    clock()


def window_train_loss(step: TrainStep) -> tuple[float, int]:
    """The mean training loss and the samples trained since the last validation, over every rank (one sync)."""
    totals = distributed.all_reduce_sum(torch.stack([step.loss_sum, step.seen.float()]))
    return float(totals[0] / totals[1].clamp(min=1)), int(totals[1])


def settle_batchnorm(trainable: Trainable, model: nn.Module, batches, epoch: int, runtime: Runtime) -> None:
    """Precise BatchNorm statistics of the model that is evaluated, from training batches as evaluation sees them
    (no augmentation), before a validation."""
    inputs = (to_device_layout(trainable.prepare_batch(b, False, None)[0], trainable, runtime)
              for b in islice(batches.epoch(epoch), PRECISE_BN_BATCHES))
    recompute_batchnorm(model, inputs, runtime)


def epoch_line(trainable: Trainable, row: dict[str, float], epochs: int, stopping: Stopping | None = None,
               mid_epoch: bool = False) -> str:
    """The log line of one validation (with its optimizer step when it falls within an epoch)."""
    metric = trainable.primary_metric
    at = f" step {row['step']:,}" if mid_epoch else ""
    of = f"{row['epoch']}/{epochs}{at}" if stopping is None else (
        f"{row['epoch']}{at} (best {stopping.best_epoch}" + (", cooling down)" if stopping.cooldown else ")"))
    return (f"{trainable.name} epoch {of}: train_loss {row['train_loss']:.4f} "
            f"val_loss {row['val_loss']:.4f} val_{metric} {row.get(f'val_{metric}', float('nan')):.4f} "
            f"{row['samples_per_s']:,.0f} samples/s")
