"""The training loop shared by every task: fit (train, validate, checkpoint, resume) and evaluate."""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Protocol

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainlab.core import distributed
from trainlab.core.config import TrainParams
from trainlab.engine.batches import Batch, make_batches
from trainlab.engine.metrics import bincount_allowed
from trainlab.engine.checkpoint import (load_checkpoint, load_model_state, rng_state, save_checkpoint,
                                       set_rng_state)
from trainlab.engine.precise_bn import PRECISE_BN_BATCHES, recompute_batchnorm, wanted
from trainlab.engine.progress import Progress
from trainlab.engine.step import TrainStep, graphs_plan, to_device_layout
from trainlab.engine.contract import Task
from trainlab.core.errors import CheckpointError, ParamsError, TrainingDiverged, UserError
from trainlab.core.runtime import Runtime


class MetricsSink(Protocol):
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...


class TrainingInterrupted(UserError):
    """Stopped by a signal (or on request) after writing a checkpoint to resume from."""

    exit_code = 130


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(total, trainable) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


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


def scalars(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    """The scalar entries of a metrics dict as floats (one sync for all of them)."""
    keys = [k for k, v in metrics.items() if not torch.is_tensor(v) or v.numel() == 1]
    values = torch.stack([torch.as_tensor(metrics[k], dtype=torch.float32).reshape(()).cpu() for k in keys]) \
        if keys else torch.empty(0)
    return {k: float(v) for k, v in zip(keys, values.tolist())}


@torch.inference_mode()
def evaluate(task: Task, model: nn.Module, data: Batch, runtime: Runtime, batch_size: int = 256,
             max_device_mb: int = 2048) -> dict[str, torch.Tensor]:
    """Loss and the task's metrics over `data` (no gradients, eval mode, same precision as training).
    Under torch.distributed each rank takes its own slice and the results are reduced over all ranks."""
    model.eval()
    ctx = distributed.context()
    if ctx.enabled:
        data = {k: v[ctx.rank :: ctx.world_size] for k, v in data.items()}
    batches = make_batches(data, batch_size, runtime.device, seed=0, shuffle=False, drop_last=False,
                           max_device_mb=max_device_mb)
    metrics = task.make_metrics().to(runtime.device)
    loss_sum = torch.zeros((), device=runtime.device)
    count = 0
    for batch in batches.epoch(0):
        x, y = task.prepare_batch(batch, False, None)
        x = to_device_layout(x, task, runtime)
        with runtime.autocast():
            out = model(x)
            loss = task.loss_fn(out, y)
        n = y.shape[0]
        loss_sum += loss.float() * n
        count += n
        with bincount_allowed(runtime.device):
            metrics.update(task.predict(out.float()), y)
    totals = distributed.all_reduce_sum(torch.stack([loss_sum, torch.tensor(float(count), device=loss_sum.device)]))
    return {"loss": totals[0] / totals[1].clamp(min=1), **metrics.compute()}


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


def fit(task: Task, train: Batch, val: Batch, cfg: TrainParams, runtime: Runtime, seed: int, *,
        tracker: MetricsSink | None = None, checkpoint_path: str | Path | None = None, fingerprint: str = "",
        max_device_mb: int = 2048, num_workers: int = 2, stop_at_step: int | None = None,
        eval_batch_size: int = 256, sync_batchnorm: bool = False, stop: threading.Event | None = None,
        cuda_graphs: bool | str = "auto") -> FitResult:
    """Train `task.model` on `train`, validating on `val` after each epoch.

    With `checkpoint_path`, the full state is saved at each epoch end (and every `cfg.checkpoint_every_steps`
    optimizer steps), and a checkpoint with the same `fingerprint` found there is resumed from.
    `stop_at_step` stops after that many optimizer steps as if interrupted (for tests of exact resume); `stop`, set
    by another thread, stops at the next optimizer step the same way (checkpoint, then TrainingInterrupted).
    `cuda_graphs` (auto, True, False): capture the step as a CUDA graph where the device and settings allow.
    Under torch.distributed (torchrun) the model is wrapped in DDP, each rank takes `batch_size / world_size`
    samples of every global batch, and only rank 0 reports progress and writes checkpoints.
    """
    device = runtime.device
    ctx = distributed.context()
    if cfg.batch_size % ctx.world_size:
        raise ParamsError(f"{task.name}.batch_size ({cfg.batch_size}) must be divisible by the number of "
                          f"processes ({ctx.world_size})")
    model = task.model.to(device)
    if task.conv and runtime.channels_last:
        model = model.to(memory_format=torch.channels_last)
    wrapped = model
    if ctx.enabled:
        if sync_batchnorm:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    forward = torch.compile(wrapped) if runtime.compile else wrapped

    train_batches = make_batches(train, cfg.batch_size // ctx.world_size, device, seed, shuffle=True,
                                 drop_last=True, max_device_mb=max_device_mb, num_workers=num_workers,
                                 rank=ctx.rank, world_size=ctx.world_size)
    accum = cfg.accumulation_steps
    updates_per_epoch = max(1, len(train_batches) // accum)
    steps_per_epoch = updates_per_epoch * accum
    total_updates = cfg.epochs * updates_per_epoch
    if cfg.max_steps:
        total_updates = min(total_updates, cfg.max_steps)
    graphs, why_not = graphs_plan(cuda_graphs, runtime, cfg, distributed=ctx.enabled)
    if why_not and ctx.is_main:
        print(f"{task.name}: CUDA graphs off ({why_not}); the training step runs eagerly", flush=True)
    step = TrainStep(task, model, cfg, runtime, total_updates=total_updates,
                     warmup_updates=round(cfg.warmup_epochs * updates_per_epoch), seed=seed, forward=forward,
                     graphs=graphs)
    total_params, trainable = count_parameters(model)
    precise_bn = wanted(cfg.precise_bn, model, updates_per_epoch, ctx.enabled)

    def settle_batchnorm(epoch: int) -> None:
        """Precise BatchNorm statistics of the model that is evaluated, from training batches as evaluation sees
        them (no augmentation), before each validation."""
        batches = islice(train_batches.epoch(epoch), PRECISE_BN_BATCHES)
        recompute_batchnorm(step.eval_model, (to_device_layout(task.prepare_batch(b, False, None)[0], task, runtime)
                                              for b in batches), runtime)

    epoch, step_in_epoch, history, train_time = 0, 0, [], 0.0
    ckpt = Path(checkpoint_path) if checkpoint_path else None
    resumed_from = 0
    state = resume_state(ckpt, device)
    if state is not None:
        if state.get("fingerprint") == fingerprint:
            # same params and data, but the model code may have changed since: a clear error, not a traceback
            load_model_state(model, state.get("model") or {}, str(ckpt))
            try:
                step.load_state_dict(state["step"])
                epoch, step_in_epoch = state["epoch"], state["step_in_epoch"]
                history, train_time = list(state["history"]), state["train_time"]
                set_rng_state(state["rng"])
            except (KeyError, ValueError, RuntimeError, TypeError, AttributeError) as exc:
                raise CheckpointError(f"{ckpt}: cannot resume from this checkpoint ({type(exc).__name__}: {exc}); "
                                      "delete it to train from the start") from None
            resumed_from = step.updates
            print(f"{task.name}: resuming from {ckpt} at epoch {epoch + 1}, optimizer step {step.updates}",
                  flush=True)
        else:
            print(f"{task.name}: ignoring checkpoint {ckpt} from other params or data", flush=True)

    def checkpoint(elapsed: float) -> None:
        if ckpt is None:
            return
        _raise_if_diverged(step.first_bad, task.name, ckpt)
        if not ctx.is_main:
            distributed.barrier()
            return
        save_checkpoint(ckpt, {
            "fingerprint": fingerprint, "model": model.state_dict(), "step": step.state_dict(), "epoch": epoch,
            "step_in_epoch": step_in_epoch, "update": step.updates, "history": history, "train_time": elapsed,
            "rng": rng_state(),
        })
        distributed.barrier()

    progress = Progress(total_updates, desc=f"train {task.name}", initial=step.updates, enabled=ctx.is_main)
    try:
        with _stop_on_signals(stop) as stop_flag:
            while epoch < cfg.epochs and step.updates < total_updates:
                model.train()
                t0 = time.perf_counter()
                samples_at_start = int(step.seen) if step_in_epoch else 0
                first_step = step_in_epoch
                if step_in_epoch == 0:
                    step.loss_sum.zero_()
                    step.seen.zero_()
                for index, batch in enumerate(train_batches.epoch(epoch, step_in_epoch), start=step_in_epoch):
                    if index >= steps_per_epoch:
                        break
                    updated = step(batch)
                    step_in_epoch = index + 1
                    if not updated:
                        continue
                    since = time.perf_counter() - t0
                    progress.step(step.updates, (step_in_epoch - first_step) * cfg.batch_size / max(since, 1e-9),
                                  lambda: float(step.loss_sum / step.seen.clamp(min=1)))
                    if step.updates >= total_updates:
                        break
                    if stop_flag.is_set() or step.updates == stop_at_step:
                        checkpoint(train_time + since)
                        raise TrainingInterrupted(
                            f"{task.name}: stopped at optimizer step {step.updates}; checkpoint saved to {ckpt}. "
                            "Run the same command (or `dvc repro`) again to resume.")
                    if cfg.checkpoint_every_steps and step.updates % cfg.checkpoint_every_steps == 0:
                        checkpoint(train_time + since)
                _raise_if_diverged(step.first_bad, task.name, ckpt)
                epoch_time = time.perf_counter() - t0
                train_time += epoch_time
                totals = distributed.all_reduce_sum(torch.stack([step.loss_sum, step.seen.float()]))
                train_loss = float(totals[0] / totals[1].clamp(min=1))
                epoch_samples = (int(step.seen) - samples_at_start) * ctx.world_size
                if precise_bn:
                    settle_batchnorm(epoch)
                val_metrics = scalars(evaluate(task, step.eval_model, val, runtime, eval_batch_size, max_device_mb))
                row = {"epoch": epoch + 1, "step": step.updates, "train_loss": train_loss,
                       "lr": step.schedule.lr_at(step.updates), "samples_per_s": epoch_samples / max(epoch_time, 1e-9),
                       **{f"val_{k}": v for k, v in val_metrics.items()}}
                history.append(row)
                progress.write(f"{task.name} epoch {epoch + 1}/{cfg.epochs}: train_loss {train_loss:.4f} "
                               f"val_loss {val_metrics['loss']:.4f} val_{task.primary_metric} "
                               f"{val_metrics.get(task.primary_metric, float('nan')):.4f} {row['samples_per_s']:,.0f} samples/s")
                if tracker is not None:
                    tracker.log_metrics({k: v for k, v in row.items() if k != "epoch"}, step=epoch + 1)
                epoch, step_in_epoch = epoch + 1, 0
                checkpoint(train_time)
    finally:
        progress.close()

    samples = step.updates * accum * cfg.batch_size
    return FitResult(model=step.eval_model, history=history, final=history[-1] if history else {},
                     params_total=total_params, params_trainable=trainable, train_time_s=train_time,
                     samples_per_s=samples / max(train_time, 1e-9), resumed_from_step=resumed_from,
                     cuda_graphs=graphs)


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
