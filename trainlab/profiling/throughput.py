"""Training-step and inference throughput of one model under one runtime setting (warm-up excluded, medians)."""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from trainlab.config import TrainParams
from trainlab.engine.batches import Batch
from trainlab.engine.loop import to_device_layout
from trainlab.engine.optim import build_optimizer, param_groups
from trainlab.engine.task import Task
from trainlab.profiling.memory import PeakMemory
from trainlab.profiling.peaks import synchronize
from trainlab.repro import generator
from trainlab.runtime import Runtime, cpu_supports_bf16


def setting_name(runtime: Runtime, conv: bool = True) -> str:
    """`fp32`, `bf16_channels_last`, `bf16_channels_last_compile`, ...: the precision and the switches that are on."""
    parts = [runtime.precision]
    if conv and runtime.channels_last:
        parts.append("channels_last")
    if runtime.compile:
        parts.append("compile")
    return "_".join(parts)


def autocast_precisions(device: torch.device) -> list[str]:
    """The autocast dtypes worth measuring on `device` (none on a CPU without native bf16)."""
    if device.type == "cuda":
        return ["bf16", "fp16"] if torch.cuda.is_bf16_supported() else ["fp16"]
    if device.type == "cpu":
        return ["bf16"] if cpu_supports_bf16() else []
    return ["fp16"]


def settings_matrix(base: Runtime, conv: bool, compile: bool) -> dict[str, Runtime]:
    """fp32 and each autocast dtype, channels_last off/on for conv nets, and (when `compile`) one compiled
    variant of the fastest-looking setting (lowest precision, channels_last for conv nets)."""
    plain = dataclasses.replace(base, compile=False)
    precisions = ["fp32", *autocast_precisions(base.device)]
    settings: dict[str, Runtime] = {}
    for precision in precisions:
        for channels_last in ((False, True) if conv else (False,)):
            runtime = dataclasses.replace(plain, precision=precision, channels_last=channels_last)
            settings[setting_name(runtime, conv)] = runtime
    if compile:
        runtime = dataclasses.replace(plain, precision=precisions[-1], channels_last=conv, compile=True)
        settings[setting_name(runtime, conv)] = runtime
    return settings


@dataclass
class Steps:
    """One model copy set up for `runtime`, with its training step and inference step as closures."""

    model: nn.Module
    train: Callable[[], None]
    infer: Callable[[], None]


def make_steps(task: Task, runtime: Runtime, batch: Batch, cfg: TrainParams, seed: int = 0) -> Steps:
    """The engine's real training step on a copy of the model: prepare_batch (with augmentation when the task
    trains with it), forward and loss under autocast, backward (scaled for fp16), gradient clipping and the
    optimizer step; and the evaluation step (prepare, forward under autocast, no grad). `task.model` is untouched."""
    device = runtime.device
    model, head = copy.deepcopy((task.model, task.head))  # one deepcopy keeps `head` a submodule of `model`
    model = model.to(device)
    if task.conv and runtime.channels_last:
        model = model.to(memory_format=torch.channels_last)
    forward = torch.compile(model) if runtime.compile else model
    optimizer = build_optimizer(param_groups(model, cfg.weight_decay, cfg.lr, head, task.head_lr), cfg, device)
    scaler = torch.amp.GradScaler(device.type, enabled=runtime.needs_grad_scaler)
    augment = generator(seed, "augment", device=device) if cfg.augment else None
    no_grad = torch.no_grad if runtime.compile else torch.inference_mode

    def train() -> None:
        if not model.training:
            model.train()
        x, y = task.prepare_batch(batch, True, augment)
        x = to_device_layout(x, task, runtime)
        with runtime.autocast():
            loss = task.loss_fn(forward(x), y)
        scaler.scale(loss).backward()
        if cfg.grad_clip:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    def infer() -> None:
        if model.training:
            model.eval()
        with no_grad():
            x, _ = task.prepare_batch(batch, False, None)
            x = to_device_layout(x, task, runtime)
            with runtime.autocast():
                forward(x)

    return Steps(model, train, infer)


def time_step(step: Callable[[], None], device: torch.device, steps: int, warmup: int,
              repeats: int) -> tuple[list[float], float]:
    """Seconds per step for each of `repeats` timed runs of `steps` steps (synchronised), after `warmup` untimed
    steps; and the warm-up's seconds (compilation shows up there)."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    synchronize(device)
    warmup_s = time.perf_counter() - t0
    per_step = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        per_step.append((time.perf_counter() - start) / steps)
    return per_step, warmup_s


def _summary(prefix: str, per_step: list[float], batch_size: int, warmup_s: float, peak_mb: float) -> dict:
    rates = [batch_size / t for t in per_step]
    median = statistics.median(rates)
    return {
        f"{prefix}_samples_per_s": median,
        f"{prefix}_step_ms": statistics.median(per_step) * 1e3,
        f"{prefix}_spread": (max(rates) - min(rates)) / median,  # relative spread of the repeats: the noise
        f"{prefix}_warmup_s": warmup_s,
        f"{prefix}_peak_memory_mb": peak_mb,
    }


def measure_throughput(task: Task, runtime: Runtime, batch: Batch, steps: int, warmup: int, repeats: int,
                       cfg: TrainParams | None = None, seed: int = 0) -> dict[str, float]:
    """Train and inference samples/s (medians over `repeats` runs of `steps` steps, warm-up excluded), step
    times, spread and peak memory of `task` under `runtime`, on `batch` (already on the device).

    `cfg` supplies the optimizer, grad clipping and augmentation (default: TrainParams()). Keys:
    train_/infer_ + samples_per_s, step_ms, spread, warmup_s, peak_memory_mb.
    """
    cfg = cfg or TrainParams()
    batch_size = len(next(iter(batch.values())))
    result: dict[str, float] = {}
    with PeakMemory(runtime.device) as memory:
        built = make_steps(task, runtime, batch, cfg, seed)
        per_step, warmup_s = time_step(built.train, runtime.device, steps, warmup, repeats)
    result.update(_summary("train", per_step, batch_size, warmup_s, memory.peak_mb))
    with PeakMemory(runtime.device) as memory:
        per_step, warmup_s = time_step(built.infer, runtime.device, steps, warmup, repeats)
    result.update(_summary("infer", per_step, batch_size, warmup_s, memory.peak_mb))
    del built
    return result
