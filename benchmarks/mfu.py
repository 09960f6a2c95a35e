"""Engine MFU per model: FLOPs per training step over step time, against the matmul peak measured alongside."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import defaultdict
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
    """The pipeline's Task for `name` (params.yaml) and one training batch of real data on the device."""
    from trainlab.core.repro import seed_everything
    from trainlab.jobs.train import build_task

    data = task_data(name)
    p = params()
    seed_everything(p.base.seed)
    task = build_task(name, p, data.meta)
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


def run(quick: bool, repeats: int, device: str, models: tuple[str, ...] = MODELS, compile: bool = False,
        out_dir: Path | None = None) -> PartResult:
    """Alternate the matmul peak and each model's engine training step; MFU per round, medians over rounds."""
    from trainlab.profiling.flops import flops_per_step
    from trainlab.profiling.peaks import matmul_peak_flops
    from trainlab.profiling.throughput import make_steps, time_step
    from trainlab.profiling.traces import trace_step
    from trainlab.jobs.train import settle_auto_precision

    t0 = time.perf_counter()
    runtime = engine_runtime(device, compile)
    dev = runtime.device
    p = params()
    target = TARGET_STEP_S["quick" if quick else "full"]
    contenders, info = {}, {}

    def step_fn(step, steps: int, batch_size: int, flops: int):
        def run_steps(r, warm):
            timing = time_step(step, dev, steps=1 if warm else steps, warmup=0, repeats=1)
            t = timing.per_step[0]
            return {"step_s": t, "samples_per_s": batch_size / t, "flop_per_s": flops / t}
        return run_steps

    for name in models:
        cfg = getattr(p, name)
        task, batch = model_batch(name, cfg.batch_size, dev)
        flops = flops_per_step(task, batch)
        # precision auto as the training stage settles it for this model (fp32 for a small step on CUDA)
        setting_of_model = settle_auto_precision(runtime, "auto", task, {k: v.cpu() for k, v in batch.items()},
                                                 cfg.batch_size)
        fp32 = dataclasses.replace(setting_of_model, precision="fp32", channels_last=False, compile=False)
        settings = {name: setting_of_model}
        if name == "classifier" and setting_of_model.precision != "fp32":
            settings[f"{name}[fp32]"] = fp32
        for kind in ("bare eager", "bare graph"):
            if kind == "bare graph" and dev.type != "cuda":
                continue
            settings[f"{name}[{kind}]"] = setting_of_model
        for label, setting in settings.items():
            # The fp32 reference runs without augmentation: the on-device shift returns channels_last-strided
            # batches, and the reference is meant to be what the plain loop computes (fp32, NCHW throughout).
            recipe = cfg.model_copy(update={"augment": False}) if label.endswith("[fp32]") else cfg
            if "[bare" in label:
                step = make_bare_step(task, setting, batch, recipe, p.base.seed, graph=label.endswith("graph]"))
                cuda_graph = label.endswith("graph]")
            else:
                built = make_steps(task, setting, batch, recipe, p.base.seed)
                step, cuda_graph = built.train, built.cuda_graph
            steps = steps_for(step, dev, target)
            contenders[label] = step_fn(step, steps, cfg.batch_size, flops["train"])
            info[label] = {"model": name, "setting": setting.describe(), "precision": setting.precision,
                           "batch_size": cfg.batch_size, "steps_per_timing": steps, "cuda_graph": cuda_graph,
                           "train_flop_per_step": flops["train"], "infer_flop_per_step": flops["infer"],
                           "recipe": {"grad_clip": recipe.grad_clip, "augment": recipe.augment,
                                      "label_smoothing": recipe.label_smoothing, "optimizer": recipe.optimizer}}
            if name == "classifier" and label == name:
                info[label]["breakdown"] = op_breakdown(step, dev)
                if out_dir is not None:
                    out_dir.mkdir(parents=True, exist_ok=True)
                    trace_step(step, dev, out_dir / "trace_classifier_step.json",
                               out_dir / "top_ops_classifier_step.txt", warmup=1,
                               title=f"classifier: one engine training step ({setting.precision}), batch "
                                     f"{cfg.batch_size}")

    sweeps: dict[str, tuple[int, dict[int, float]]] = {}
    for precision in dict.fromkeys(m["precision"] for m in info.values()):
        sweeps[precision] = best_peak_size(dev, precision, quick)
        log(f"mfu: {precision} matmul sweep " + ", ".join(f"{n}: {v / 1e9:,.0f} GFLOP/s"
                                                        for n, v in sweeps[precision][1].items()))

    def peak_fn(prec: str, n: int, flops: float):
        # As many matmuls as fill about `target` seconds, like a step timing; the median of their single timings
        # is robust to a preemption, so on a busy machine the peak errs high and the MFU low (conservative).
        count = max(3, min(100, round(target / (2 * n**3 / flops))))
        return lambda r, warm: {"flop_per_s": matmul_peak_flops(dev, prec, repeats=2 if warm else count,
                                                                  sizes=(n,))}

    for precision, (size, sweep) in sweeps.items():
        contenders[f"peak_{precision}"] = peak_fn(precision, size, sweep[size])
    precision = runtime.precision
    size, sweep = sweeps.get(precision, next(iter(sweeps.values())))
    fp32_size = sweeps.get("fp32", (None, {}))[0]

    comparison = alternate(contenders, repeats, what="mfu")
    results: dict[str, Any] = {"precision": precision, "peak_size": size, "peak_sweep": sweep,
                               "fp32_peak_size": fp32_size, "models": {}}
    for label, meta in info.items():
        peak_key = f"peak_{meta['precision']}"
        achieved = comparison.values(label, "flop_per_s")
        peaks = comparison.values(peak_key, "flop_per_s")
        paired = [a / b for a, b in zip(achieved, peaks) if b]
        med_a, med_p = comparison.median(label, "flop_per_s"), comparison.median(peak_key, "flop_per_s")
        best_p = max([*peaks, *sweeps[meta["precision"]][1].values()], default=None)
        results["models"][label] = {
            **meta, "step_s": comparison.values(label, "step_s"), "achieved_flop_per_s": achieved,
            "peak_flop_per_s": peaks, "median_step_s": comparison.median(label, "step_s"),
            "median_samples_per_s": comparison.median(label, "samples_per_s"),
            "median_achieved_flop_per_s": med_a, "median_peak_flop_per_s": med_p,
            "mfu": med_a / med_p if med_a and med_p else None,
            "mfu_paired_median": statistics.median(paired) if paired else None,
            "best_peak_flop_per_s": best_p, "mfu_vs_best_peak": med_a / best_p if med_a and best_p else None,
            "spread": comparison.spread(label, "flop_per_s"),
        }
    results["order"] = comparison.order
    headline = {}
    if "classifier" in results["models"]:
        headline["classifier_engine_mfu"] = results["models"]["classifier"]["mfu"]
    for name in models:
        engine = results["models"].get(name, {}).get("median_samples_per_s")
        headline[f"{name}_engine_step_samples_per_s"] = engine
        for kind in ("bare eager", "bare graph"):
            other = results["models"].get(f"{name}[{kind}]", {}).get("median_samples_per_s")
            if engine and other:
                headline[f"{name}_engine_over_{kind.replace(' ', '_')}_step"] = engine / other
    return PartResult("mfu", results, markdown(results), headline, time.perf_counter() - t0)


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
              "peak seen' is the highest of all peak measurements, sweep included. FLOPs: trainlab.profiling.flops_per_step (matmuls, "
              "convolutions, attention; forward + backward, the optimizer's elementwise update not counted). The "
              "step is the engine's (trainlab.profiling.throughput.make_steps: trainlab.engine.step.TrainStep, a CUDA graph where "
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
