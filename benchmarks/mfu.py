"""Engine MFU per model: FLOPs per training step over step time, against the matmul peak measured alongside."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO,
    TRANSFORMER_TEXT,
    PartResult,
    alternate,
    engine_runtime,
    fmt,
    log,
    table,
    task_data,
)

MODELS = ("classifier", "segmenter", "text")
TARGET_STEP_S = {"full": 1.5, "quick": 0.5}  # each timed run of steps lasts about this long
PEAK_SIZES = {"cpu": (1024, 2048, 4096), "gpu": (4096, 8192)}

# Self-time categories of the profiled training step (aten op name substrings, first match wins).
OP_CATEGORIES = (
    ("convolution (fwd+bwd)", ("conv", "mkldnn_convolution")),
    ("matmul / linear", ("addmm", "::mm", "bmm", "matmul", "linear", "scaled_dot_product", "_flash_attention")),
    ("batch / layer norm", ("batch_norm", "layer_norm", "native_norm")),
    ("optimizer (AdamW)", ("_foreach", "adamw", "lerp", "addcdiv", "addcmul")),
    ("layout / dtype copies", ("copy_", "to_copy", "contiguous", "clone", "_to_dense", "reorder")),
    ("activations / elementwise", ("relu", "threshold", "gelu", "add", "mul", "div", "sub", "where", "fill",
                                   "zero_", "sqrt", "softmax", "log_softmax", "nll_loss", "cross_entropy")),
    ("pooling / indexing", ("pool", "index", "gather", "scatter", "cat", "slice", "select", "embedding")),
)


def params():
    """params.yaml as the pipeline reads it: the engine is measured with the training recipe it really runs (the
    text model: the Transformer with its recipe, benchmarks.common.TRANSFORMER_TEXT)."""
    from trainlab.core.config import load_params

    return load_params(REPO / "params.yaml", {f"text.{k}": v for k, v in TRANSFORMER_TEXT.items()})


def model_batch(name: str, batch_size: int, device) -> tuple[Any, dict]:
    """The pipeline's Trainable for `name` (params.yaml) and one training batch of real data on the device."""
    from trainlab.core.repro import seed_everything
    from trainlab.jobs.train import build_trainable

    data = task_data(name)
    p = params()
    seed_everything(p.base.seed)
    task = build_trainable(name, p, data.meta)
    batch = {k: v[:batch_size].to(device) for k, v in data.train.items()}
    return task, batch


def best_peak_size(device, precision: str, quick: bool) -> tuple[int, dict[int, float]]:
    """The square matmul size with the highest FLOP/s (trainlab.profiling.matmul_peak_flops, one size at a time)."""
    from trainlab.profiling.peaks import matmul_peak_flops

    sizes = PEAK_SIZES["gpu" if device.type == "cuda" else "cpu"]
    if quick:
        sizes = sizes[:2]
    found: dict[int, float] = {}
    for n in sizes:
        t0 = time.perf_counter()
        found[n] = matmul_peak_flops(device, precision, repeats=2, sizes=(n,))
        if time.perf_counter() - t0 > 6.0:  # the next size costs ~8x: stop
            break
    return max(found, key=found.get), found


def steps_for(step, device, target_s: float) -> int:
    """How many calls of `step` take about `target_s` (from two warm calls)."""
    from trainlab.profiling.throughput import time_step

    timing = time_step(step, device, steps=1, warmup=2, repeats=1)
    return max(1, min(200, round(target_s / max(timing.per_step[0], 1e-6))))


def op_breakdown(step, device, top: int = 12) -> dict[str, Any]:
    """Self time of one training step per op category (profiled after a warm call), and the top ops."""
    import os

    from torch.profiler import ProfilerActivity, profile

    from trainlab.profiling.peaks import synchronize

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # Kineto's GPU-query noise on a CPU-only run (see traces.py)
    step()
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        synchronize(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, key) > 0]
    total = sum(getattr(e, key) for e in events) or 1
    shares: dict[str, float] = defaultdict(float)
    for e in events:
        name = e.key.lower()
        category = next((c for c, pats in OP_CATEGORIES if any(p in name for p in pats)), "other")
        shares[category] += getattr(e, key) / total
    ranked = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:top]
    return {"total_ms": total / 1e3, "shares": dict(sorted(shares.items(), key=lambda kv: -kv[1])),
            "top_ops": [{"op": e.key, "self_ms": getattr(e, key) / 1e3, "share": getattr(e, key) / total,
                         "calls": e.count} for e in ranked]}


def make_bare_step(task, runtime, batch: dict, cfg, seed: int, graph: bool):
    """The hand-written reference step (benchmarks.bare) on a copy of the model, set up like the engine's."""
    import copy

    import torch

    from benchmarks.bare import bare_step

    model = copy.deepcopy(task.model).to(runtime.device)
    if task.conv and runtime.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    step = bare_step(dataclasses.replace(task, model=model), model, cfg, runtime, batch, graph, seed)
    return lambda: step()


@dataclass(frozen=True)
class MfuRun:
    """What the whole part shares: the engine's runtime, params.yaml, how long a timed run lasts, where traces go."""

    runtime: Any
    params: Any
    target_s: float  # each timed run of steps (or of matmuls) lasts about this long
    quick: bool
    out_dir: Path | None = None

    @property
    def device(self):
        return self.runtime.device


@dataclass(frozen=True)
class ModelSteps:
    """One model measured: its params.yaml recipe, the pipeline's Trainable, one training batch on the device, its
    FLOPs."""

    name: str
    cfg: Any
    task: Any
    batch: dict
    flops: dict[str, int]


@dataclass
class Contenders:
    """The alternated contenders (label -> timed call) and what each one's step is (label -> its JSON info)."""

    calls: dict[str, Callable] = field(default_factory=dict)
    info: dict[str, dict[str, Any]] = field(default_factory=dict)


def run(quick: bool, repeats: int, device: str, models: tuple[str, ...] = MODELS, compile: bool = False,
        out_dir: Path | None = None) -> PartResult:
    """Alternate the matmul peak and each model's engine training step; MFU per round, medians over rounds."""
    t0 = time.perf_counter()
    runtime = engine_runtime(device, compile)
    bench = MfuRun(runtime, params(), TARGET_STEP_S["quick" if quick else "full"], quick, out_dir)
    found = Contenders()
    for name in models:
        add_model_steps(bench, name, found)
    sweeps = peak_sweeps(bench, found.info)
    for precision, (size, sweep) in sweeps.items():
        found.calls[f"peak_{precision}"] = peak_contender(bench, precision, size, sweep[size])
    comparison = alternate(found.calls, repeats, what="mfu")
    results = summarise(comparison, found.info, sweeps, runtime.precision)
    return PartResult("mfu", results, markdown(results), headline(results, models), time.perf_counter() - t0)


def add_model_steps(bench: MfuRun, name: str, found: Contenders) -> None:
    """Add one model's steps to `found`: the engine's (and the classifier's fp32 reference) and the bare ones."""
    from trainlab.profiling.flops import flops_per_step

    cfg = getattr(bench.params, name)
    task, batch = model_batch(name, cfg.batch_size, bench.device)
    model = ModelSteps(name, cfg, task, batch, flops_per_step(task, batch))
    for label, setting in step_settings(bench.runtime, model).items():
        # The fp32 reference runs without augmentation: the on-device shift returns channels_last-strided
        # batches, and the reference is meant to be what the plain loop computes (fp32, NCHW throughout).
        recipe = cfg.model_copy(update={"augment": False}) if label.endswith("[fp32]") else cfg
        step, cuda_graph = build_step(bench, model, label, setting, recipe)
        steps = steps_for(step, bench.device, bench.target_s)
        found.calls[label] = timed_steps(step, bench.device, steps, cfg.batch_size, model.flops["train"])
        found.info[label] = step_info(model, setting, recipe, steps, cuda_graph)
        if name == "classifier" and label == name:
            found.info[label]["breakdown"] = profile_classifier_step(bench, model, step, setting)


def step_settings(runtime, model: ModelSteps) -> dict[str, Any]:
    """label -> the engine's settings for it: precision auto as the training stage settles it for this model (fp32
    for a small step on CUDA), the classifier's fp32 reference where auto is not fp32, the bare steps (graph: CUDA)."""
    from trainlab.jobs.train import settle_auto_precision

    auto = settle_auto_precision(runtime, "auto", model.task, {k: v.cpu() for k, v in model.batch.items()},
                                 model.cfg.batch_size)
    settings = {model.name: auto}
    if model.name == "classifier" and auto.precision != "fp32":
        settings[f"{model.name}[fp32]"] = dataclasses.replace(auto, precision="fp32", channels_last=False,
                                                              compile=False)
    for kind in ("bare eager", "bare graph"):
        if kind == "bare graph" and runtime.device.type != "cuda":
            continue
        settings[f"{model.name}[{kind}]"] = auto
    return settings


def build_step(bench: MfuRun, model: ModelSteps, label: str, setting, recipe) -> tuple[Callable[[], None], bool]:
    """(the step of `label`, whether it is a CUDA graph): the hand-written reference for `[bare ...]`, else the
    engine's (trainlab.profiling.throughput.make_steps)."""
    from trainlab.profiling.throughput import make_steps

    seed = bench.params.base.seed
    if "[bare" in label:
        graph = label.endswith("graph]")
        return make_bare_step(model.task, setting, model.batch, recipe, seed, graph=graph), graph
    built = make_steps(model.task, setting, model.batch, recipe, seed)
    return built.train, built.cuda_graph


def timed_steps(step, device, steps: int, batch_size: int, flops: int):
    """The contender: `steps` calls of `step` timed as one run (one call when warming up)."""
    from trainlab.profiling.throughput import time_step

    def run_steps(r, warm):
        timing = time_step(step, device, steps=1 if warm else steps, warmup=0, repeats=1)
        t = timing.per_step[0]
        return {"step_s": t, "samples_per_s": batch_size / t, "flop_per_s": flops / t}

    return run_steps


def step_info(model: ModelSteps, setting, recipe, steps: int, cuda_graph: bool) -> dict[str, Any]:
    """What the JSON records of one step: its model, settings, batch, steps per timing, FLOPs and recipe."""
    return {"model": model.name, "setting": setting.describe(), "precision": setting.precision,
            "batch_size": model.cfg.batch_size, "steps_per_timing": steps, "cuda_graph": cuda_graph,
            "train_flop_per_step": model.flops["train"], "infer_flop_per_step": model.flops["infer"],
            "recipe": {"grad_clip": recipe.grad_clip, "augment": recipe.augment,
                       "label_smoothing": recipe.label_smoothing, "optimizer": recipe.optimizer}}


def profile_classifier_step(bench: MfuRun, model: ModelSteps, step, setting) -> dict[str, Any]:
    """The classifier step's op breakdown, and (with an output folder) its trace and top ops written there."""
    from trainlab.profiling.traces import trace_step

    breakdown = op_breakdown(step, bench.device)
    if bench.out_dir is not None:
        bench.out_dir.mkdir(parents=True, exist_ok=True)
        trace_step(step, bench.device, bench.out_dir / "trace_classifier_step.json",
                   bench.out_dir / "top_ops_classifier_step.txt", warmup=1,
                   title=f"classifier: one engine training step ({setting.precision}), batch {model.cfg.batch_size}")
    return breakdown


def peak_sweeps(bench: MfuRun, info: dict[str, dict[str, Any]]) -> dict[str, tuple[int, dict[int, float]]]:
    """precision -> (the best matmul size, FLOP/s per size tried), for each precision a step runs in."""
    sweeps: dict[str, tuple[int, dict[int, float]]] = {}
    for precision in dict.fromkeys(m["precision"] for m in info.values()):
        sweeps[precision] = best_peak_size(bench.device, precision, bench.quick)
        log(f"mfu: {precision} matmul sweep " + ", ".join(f"{n}: {v / 1e9:,.0f} GFLOP/s"
                                                        for n, v in sweeps[precision][1].items()))
    return sweeps


def peak_contender(bench: MfuRun, precision: str, n: int, flops: float):
    """The peak contender: as many n x n matmuls as fill about a step timing. The median of their single timings is
    robust to a preemption, so on a busy machine the peak errs high and the MFU low (conservative)."""
    from trainlab.profiling.peaks import matmul_peak_flops

    count = max(3, min(100, round(bench.target_s / (2 * n**3 / flops))))
    return lambda r, warm: {"flop_per_s": matmul_peak_flops(bench.device, precision, repeats=2 if warm else count,
                                                              sizes=(n,))}


def summarise(comparison, info: dict[str, dict[str, Any]], sweeps: dict[str, tuple[int, dict[int, float]]],
              precision: str) -> dict[str, Any]:
    """The part's JSON: the peak of the runtime's precision, then per step its timings and MFU, then the run order."""
    size, sweep = sweeps.get(precision, next(iter(sweeps.values())))
    results: dict[str, Any] = {"precision": precision, "peak_size": size, "peak_sweep": sweep,
                               "fp32_peak_size": sweeps.get("fp32", (None, {}))[0], "models": {}}
    for label, meta in info.items():
        results["models"][label] = model_summary(comparison, label, meta, sweeps[meta["precision"]][1])
    results["order"] = comparison.order
    return results


def model_summary(comparison, label: str, meta: dict[str, Any], sweep: dict[int, float]) -> dict[str, Any]:
    """One step's figures: its timings, achieved and peak FLOP/s per round, medians, MFU (of the medians, paired
    per round, and against the best peak seen, sweep included) and spread."""
    peak_key = f"peak_{meta['precision']}"
    achieved = comparison.values(label, "flop_per_s")
    peaks = comparison.values(peak_key, "flop_per_s")
    paired = [a / b for a, b in zip(achieved, peaks) if b]
    med_a, med_p = comparison.median(label, "flop_per_s"), comparison.median(peak_key, "flop_per_s")
    best_p = max([*peaks, *sweep.values()], default=None)
    return {
        **meta, "step_s": comparison.values(label, "step_s"), "achieved_flop_per_s": achieved,
        "peak_flop_per_s": peaks, "median_step_s": comparison.median(label, "step_s"),
        "median_samples_per_s": comparison.median(label, "samples_per_s"),
        "median_achieved_flop_per_s": med_a, "median_peak_flop_per_s": med_p,
        "mfu": med_a / med_p if med_a and med_p else None,
        "mfu_paired_median": statistics.median(paired) if paired else None,
        "best_peak_flop_per_s": best_p, "mfu_vs_best_peak": med_a / best_p if med_a and best_p else None,
        "spread": comparison.spread(label, "flop_per_s"),
    }


def headline(results: dict[str, Any], models: tuple[str, ...]) -> dict[str, Any]:
    """The classifier's MFU, each model's engine step samples/s and its ratio to the bare steps."""
    found = {}
    if "classifier" in results["models"]:
        found["classifier_engine_mfu"] = results["models"]["classifier"]["mfu"]
    for name in models:
        engine = results["models"].get(name, {}).get("median_samples_per_s")
        found[f"{name}_engine_step_samples_per_s"] = engine
        for kind in ("bare eager", "bare graph"):
            other = results["models"].get(f"{name}[{kind}]", {}).get("median_samples_per_s")
            if engine and other:
                found[f"{name}_engine_over_{kind.replace(' ', '_')}_step"] = engine / other
    return found


def markdown(results: dict[str, Any]) -> str:
    rows = []
    for label, m in results["models"].items():
        rows.append([label, m["precision"], m["batch_size"], fmt(m["train_flop_per_step"] / 1e9),
                     fmt(m["median_step_s"] and 1e3 * m["median_step_s"]), fmt(m["median_samples_per_s"]),
                     fmt(m["median_achieved_flop_per_s"] and m["median_achieved_flop_per_s"] / 1e9),
                     fmt(m["median_peak_flop_per_s"] and m["median_peak_flop_per_s"] / 1e9),
                     fmt(m["mfu"], "pct"), fmt(m["mfu_vs_best_peak"], "pct"), fmt(m["spread"], "pct")])
    header = ["model", "dtype", "batch", "GFLOP / train step", "step ms", "samples/s", "achieved GFLOP/s",
              "matmul peak GFLOP/s", "MFU", "MFU vs best peak seen", "spread"]
    lines = ["## MFU of the engine's training step (and the hand-written reference steps)", "", table(header, rows), "",
             (f"Peak: square {results['peak_size']}² matmul in the same dtype (trainlab.profiling.matmul_peak_flops), "
              "timed alternately with the steps: the median of as many single matmuls as fill a step timing; 'best "
              "peak seen' is the highest of all peak measurements, sweep included. FLOPs: "
              "trainlab.profiling.flops_per_step (matmuls, convolutions, attention; forward + backward, the "
              "optimizer's elementwise update not counted). The step is the engine's "
              "(trainlab.profiling.throughput.make_steps: trainlab.engine.step.TrainStep, a CUDA graph where "
              "base.cuda_graphs allows) with params.yaml's recipe (augmentation, grad clipping, label smoothing) and "
              "precision auto as the training stage settles it. `[bare eager]` and `[bare graph]`: the same recipe "
              "written by hand (benchmarks/bare.py), eager or captured as one CUDA graph (CUDA only). "
              "`classifier[fp32]` (where auto is not fp32) is the engine's step in fp32, NCHW throughout and without "
              "augmentation (what the plain loop computes), against the fp32 peak, for reference.")]
    breakdown = results["models"].get("classifier", {}).get("breakdown")
    if breakdown:
        lines += ["", f"Classifier step, self time by op category ({breakdown['total_ms']:.0f} ms profiled): " +
                  ", ".join(f"{k} {100 * v:.0f}%" for k, v in breakdown["shares"].items()) + "."]
    return "\n".join(lines) + "\n"
