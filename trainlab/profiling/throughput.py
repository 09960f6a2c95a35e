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

from trainlab.core.config import TrainParams
from trainlab.core.runtime import Runtime, cpu_supports_bf16
from trainlab.engine.batches import Batch
from trainlab.engine.contract import Trainable
from trainlab.engine.step import TrainStep, graphs_plan, to_device_layout
from trainlab.profiling.memory import PeakMemory
from trainlab.profiling.peaks import synchronize


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


def settings_matrix(base: Runtime, conv: bool, compile: bool, which: str = "all") -> dict[str, Runtime]:
    """The settings to measure. `which="all"`: fp32 and each autocast dtype, channels_last off/on for conv nets.
    `which="used"`: the setting the training stages use (`base`'s precision and layout) and plain fp32 (NCHW), the
    baseline it is compared with. Either way, when `compile`, one compiled variant: of the fastest-looking setting
    (lowest precision, channels_last for conv nets) for "all", of the used one for "used"."""
    if which not in ("all", "used"):
        raise ValueError(f"settings: expected 'all' or 'used', got {which!r}")
    plain = dataclasses.replace(base, compile=False)
    if which == "used":
        fastest = dataclasses.replace(plain, channels_last=conv and base.channels_last)
        runtimes = [dataclasses.replace(plain, precision="fp32", channels_last=False), fastest]
    else:
        precisions = ["fp32", *autocast_precisions(base.device)]
        runtimes = [dataclasses.replace(plain, precision=precision, channels_last=channels_last)
                    for precision in precisions for channels_last in ((False, True) if conv else (False,))]
        fastest = dataclasses.replace(plain, precision=precisions[-1], channels_last=conv)
    if compile:
        runtimes.append(dataclasses.replace(fastest, compile=True))
    return {setting_name(runtime, conv): runtime for runtime in runtimes}


@dataclass
class Steps:
    """One model copy set up for `runtime`, with its training step and inference step as closures."""

    model: nn.Module
    train: Callable[[], None]
    infer: Callable[[], None]
    cuda_graph: bool = False  # the training step is a CUDA graph


def make_steps(trainable: Trainable, runtime: Runtime, batch: Batch, cfg: TrainParams, seed: int = 0,
               cuda_graphs: bool | str = "auto") -> Steps:
    """The engine's own training step (trainlab.engine.step.TrainStep: augmentation when the trainable trains with it,
    forward and loss under autocast, backward, clipping, the optimizer, a CUDA graph where `cuda_graphs` allows)
    on a copy of the model, and the evaluation step (prepare, forward under autocast, no grad).
    `trainable.model` is untouched."""
    device = runtime.device
    model, head = copy.deepcopy((trainable.model, trainable.head))  # one deepcopy keeps `head` a submodule of `model`
    model = model.to(device)
    if trainable.conv and runtime.channels_last:
        model = model.to(memory_format=torch.channels_last)
    forward = torch.compile(model) if runtime.compile else model
    copied = dataclasses.replace(trainable, model=model, head=head)
    graphs, _ = graphs_plan(cuda_graphs, runtime, cfg)
    step = TrainStep(copied, model, cfg, runtime, total_updates=10**9, seed=seed, forward=forward, graphs=graphs)
    no_grad = torch.no_grad if runtime.compile else torch.inference_mode

    def train() -> None:
        if not model.training:
            model.train()
        step(batch)

    def infer() -> None:
        if model.training:
            model.eval()
        with no_grad():
            x, _ = trainable.prepare_batch(batch, False, None)
            x = to_device_layout(x, trainable, runtime)
            with runtime.autocast():
                forward(x)

    return Steps(model, train, infer, graphs)


@dataclass
class Timing:
    """Seconds per step of each timed repeat, the steps per repeat, and the warm-up that preceded them."""

    per_step: list[float]
    steps: int
    warmup_steps: int
    warmup_s: float


def time_step(step: Callable[[], None], device: torch.device, steps: int, warmup: int, repeats: int,
              budget_s: float | None = None) -> Timing:
    """Time `repeats` runs of `steps` calls of `step` (synchronised at the end of each run) after `warmup`
    untimed calls.

    With `budget_s`, the warm-up stops (after at least one call) once it has used a quarter of the budget, and
    each run is shortened to the steps that fit in the rest (at least one), judged by the last warm-up call: a
    slow model on a small CPU then still gets every repeat, with fewer but long (so well-timed) steps.
    """
    t0 = time.perf_counter()
    done, last = 0, None
    while done < warmup:
        start = time.perf_counter()
        step()
        synchronize(device)
        last, done = time.perf_counter() - start, done + 1
        if budget_s is not None and time.perf_counter() - t0 > 0.25 * budget_s:
            break
    warmup_s = time.perf_counter() - t0
    if budget_s is not None and last is not None:
        steps = max(1, min(steps, int(0.75 * budget_s / repeats / max(last, 1e-9))))
    per_step = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize(device)
        per_step.append((time.perf_counter() - start) / steps)
    return Timing(per_step, steps, done, warmup_s)


def _summary(prefix: str, timing: Timing, batch_size: int, peak_mb: float) -> dict[str, float]:
    rates = [batch_size / t for t in timing.per_step]
    median = statistics.median(rates)
    return {
        f"{prefix}_samples_per_s": median,
        f"{prefix}_step_ms": statistics.median(timing.per_step) * 1e3,
        f"{prefix}_spread": (max(rates) - min(rates)) / median,  # relative spread of the repeats: the noise
        f"{prefix}_steps": timing.steps,
        f"{prefix}_warmup_steps": timing.warmup_steps,
        f"{prefix}_warmup_s": timing.warmup_s,
        f"{prefix}_peak_memory_mb": peak_mb,
    }


def measure_steps(built: Steps, device: torch.device, batch_size: int, steps: int, warmup: int, repeats: int,
                  budget_s: float | None = None) -> dict[str, float]:
    """Train and inference samples/s (medians over `repeats` runs of `steps` steps, warm-up excluded), step
    times, spread and peak memory of the steps `built` (make_steps: a copy of the trainable's model). `budget_s` caps
    the seconds of each of the two measurements (see time_step). Keys: train_/infer_ + samples_per_s, step_ms, spread,
    steps (timed per repeat), warmup_steps, warmup_s, peak_memory_mb."""
    result: dict[str, float] = {}
    for phase, step in (("train", built.train), ("infer", built.infer)):
        with PeakMemory(device) as memory:
            timing = time_step(step, device, steps, warmup, repeats, budget_s)
        result.update(_summary(phase, timing, batch_size, memory.peak_mb))
    return result
