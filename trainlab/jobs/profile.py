"""The profile stage's core: every trained model under a matrix of settings, its outputs, and its MLflow run."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainlab.core.atomic import atomic_dir, write_json, write_text
from trainlab.core.config import Params
from trainlab.core.flatten import numbers
from trainlab.core.runtime import Runtime, resolve_runtime
from trainlab.engine.batches import Batch
from trainlab.engine.contract import Trainable
from trainlab.profiling.flops import MATMUL, flops_per_step
from trainlab.profiling.memory import memory_kind, write_cuda_memory_snapshot
from trainlab.profiling.peaks import datasheet_key, datasheet_peak_flops, matmul_peak_flops
from trainlab.profiling.report import (
    DeviceProfile,
    ModelProfile,
    derived,
    gflop,
    headline_metrics,
    markdown_report,
    metrics_dict,
    percent,
    throughput_chart,
)
from trainlab.profiling.throughput import Steps, make_steps, measure_steps, setting_name, settings_matrix
from trainlab.profiling.traces import trace_step
from trainlab.tasks import get, names

# On a CPU the whole stage aims to finish within this many seconds: each measurement gets a share of what is
# left (see throughput.time_step), so a 2-core machine still measures every setting of the default models.
CPU_TIME_BUDGET_S = 30.0
RESERVE_S = 6.0  # kept back for the report, the chart and the MLflow artifacts
MEASUREMENTS_FILE = "measurements.json"  # every setting's figures; metrics.json keeps the headline ones

Log = Callable[[str], None]


def log_line(message: str) -> None:
    print(f"profile: {message}", flush=True)


@dataclass
class Loaded:
    """One trained model with its Trainable and a batch of its test split on the device."""

    name: str
    task: Trainable
    arch: str
    batch: Batch


@dataclass
class ProfileOutcome:
    metrics: dict[str, Any]
    run_id: str
    seconds: float
    files: list[str]


def test_batch(split: Batch, batch_size: int, device: torch.device) -> Batch:
    """The first `batch_size` samples of a split (cycled when it is smaller), moved to `device` once."""
    n = len(next(iter(split.values())))
    idx = torch.arange(batch_size) % n
    return {k: v[idx].to(device) for k, v in split.items()}


def load_model(name: str, params: Params, data_root: Path, models_root: Path, device: torch.device) -> Loaded:
    """models/<name> (weights and architecture) as the engine Trainable that trained it, plus its profiling batch."""
    from trainlab.data.prepared import load_meta
    from trainlab.data.shards import ShardSplit
    from trainlab.tasks.saved import load_saved_model

    spec = get(name)
    data_dir = data_root / spec.data_folder
    meta = load_meta(data_dir)
    saved = load_saved_model(models_root / name, name, device=device)
    cfg = getattr(params, spec.params_section)
    # the loss, batch transform and head of the task, around the trained model (not a fresh or pretrained one)
    task = spec.load().make_trainable(saved.model, meta, cfg)
    saved.model.train()
    batch = test_batch(ShardSplit(data_dir, "test"), params.profile.batch_size, device)  # reads just that batch
    return Loaded(name, task, str(saved.config.get("arch", name)), batch)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def measure_peaks(runtime: Runtime, precisions: Sequence[str], log: Log) -> DeviceProfile:
    """Measured matmul peaks in each precision (and datasheet peaks on a known GPU)."""
    t0 = time.perf_counter()
    measured = {p: matmul_peak_flops(runtime.device, p) for p in precisions}
    sheet = {p: v for p in precisions if (v := datasheet_peak_flops(runtime.device, p, runtime.tf32)) is not None}
    profile = DeviceProfile(device=str(runtime.device), name=device_name(runtime.device),
                            threads=torch.get_num_threads(), memory_kind=memory_kind(runtime.device),
                            matmul_peak=measured, datasheet_peak=sheet, torch_version=torch.__version__)
    if runtime.tf32 and "fp32" in precisions:
        profile.notes.append("TF32 is on: fp32 matmuls (the model's and the peak's) run in TF32; the datasheet "
                             f"column for fp32 is the {datasheet_key('fp32', True)} peak.")
    shown = ", ".join(f"{p} {v / 1e9:,.1f} GFLOP/s" for p, v in measured.items())
    log(f"device {runtime.device} ({profile.name}, {profile.threads} threads); matmul peak {shown} "
        f"({time.perf_counter() - t0:.1f} s)")
    return profile


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:200]}"


def caveats(models: list[ModelProfile], seconds: float, budget_s: float | None, steps: int) -> list[str]:
    """What the report's reader must know about these measurements: an overrun budget, an MFU above 100%,
    settings timed with fewer steps."""
    notes = []
    if budget_s is not None and seconds > budget_s:
        notes.append(f"Profiling overran its {budget_s:.0f} s budget ({seconds:.0f} s) although slow measurements "
                     "were shortened (down to 1 warm-up step and 1 step per repeat): the machine was slower, or "
                     "busier, than the budget assumes.")
    settings = [m for model in models for m in model.settings.values()]
    if any(m.get(f"{phase}_mfu", 0) > 1 for m in settings for phase in ("train", "infer")):
        notes.append("An MFU above 100% means the matmul peak was measured low, most likely because other "
                     "processes were busy on the device during that measurement: rerun on a quiet machine.")
    if any(m["train_steps"] < steps or m["infer_steps"] < steps for m in settings):
        notes.append(f"Slow settings were timed with fewer than {steps} steps per repeat to fit the stage's time "
                     "budget on this CPU (see the steps column); each timed run still lasts long enough to time "
                     "reliably.")
    return notes


def profile_models(params: Params, data_root: str | Path, models_root: str | Path, out_dir: str | Path,
                   tasks: Sequence[str] | None = None, time_budget_s: float | None = None,
                   log: Log = log_line) -> ProfileOutcome:
    """Profile each trained model: throughput per setting, FLOPs, MFU, peak memory, a trace; write
    `out_dir/{metrics.json,measurements.json,report.md,throughput.png,trace_<task>.json,top_ops_<task>.txt}`
    (and on CUDA `memory_snapshot_<task>.json`) atomically, and log them all to one MLflow run (stage "profile").

    `time_budget_s`: at most this many seconds of timing; None: CPU_TIME_BUDGET_S on a CPU, no limit on a GPU.
    """
    from trainlab.core.repro import seed_everything
    from trainlab.tracking.runs import start_run

    start = time.perf_counter()
    cfg = params.profile
    data_root, models_root, out_dir = Path(data_root), Path(models_root), Path(out_dir)
    runtime = resolve_runtime(params.base)
    if time_budget_s is None and runtime.device.type == "cpu":
        time_budget_s = CPU_TIME_BUDGET_S
    deadline = start + time_budget_s if time_budget_s else None
    seed_everything(params.base.seed)
    tasks = list(tasks or names())
    loaded = [load_model(name, params, data_root, models_root, runtime.device) for name in tasks]
    matrices = {m.name: settings_matrix(runtime, m.task.conv, cfg.compile, cfg.settings) for m in loaded}
    precisions = list(dict.fromkeys(r.precision for mat in matrices.values() for r in mat.values()))

    with start_run(params, stage="profile", device=str(runtime.device)) as tracker:
        tracker.log_params({"profile": cfg.model_dump(), "base": params.base.model_dump(), "tasks": ",".join(tasks)})
        tracker.set_tags(runtime.describe())
        with atomic_dir(out_dir) as staging:
            device = measure_peaks(runtime, precisions, log)
            models: list[ModelProfile] = []
            phases_left = 2 * sum(len(mat) for mat in matrices.values())
            for item in loaded:
                model = profile_one(item, params, runtime, matrices[item.name], device, staging, deadline,
                                    phases_left, log)
                phases_left -= 2 * len(matrices[item.name])
                models.append(model)
            seconds = time.perf_counter() - start
            device.notes += caveats(models, seconds, time_budget_s if deadline is not None else None, cfg.steps)
            metrics = metrics_dict(device, models, seconds)
            write_json(staging / MEASUREMENTS_FILE, metrics)
            write_json(staging / "metrics.json", headline_metrics(models))
            write_text(staging / "report.md", markdown_report(device, models, cfg.batch_size, cfg.steps,
                                                              cfg.warmup_steps, cfg.repeats, seconds))
            throughput_chart(models, staging / "throughput.png")
            files = sorted(p.name for p in staging.iterdir() if not p.name.startswith("."))
            tracker.log_metrics(numbers(metrics, sep="/"))
            for name in files:
                tracker.log_artifact(staging / name, "profile")
    log(f"wrote {', '.join(str(out_dir / f) for f in files)} ({time.perf_counter() - start:.1f} s)")
    return ProfileOutcome(metrics, tracker.run_id, time.perf_counter() - start, files)


def profile_one(item: Loaded, params: Params, runtime: Runtime, matrix: dict[str, Runtime],
                device: DeviceProfile, out: Path, deadline: float | None, phases_left: int,
                log: Log) -> ModelProfile:
    """FLOPs, then every setting's throughput; the training setting's step (already warm) is then traced (and
    on CUDA its memory recorded)."""
    cfg, train_cfg = params.profile, getattr(params, get(item.name).params_section)
    model = item.task.model
    flops = flops_per_step(item.task, item.batch)
    result = ModelProfile(task=item.name, arch=item.arch, parameters=sum(p.numel() for p in model.parameters()),
                          flops=flops)
    basis = getattr(flops, "basis", MATMUL)
    log(f"{item.name} ({item.arch}, {result.parameters:,} parameters): {gflop(flops['train'])} per training step, "
        f"{gflop(flops['infer'])} per inference step" + (f" ({basis} FLOPs)" if basis != MATMUL else ""))
    traced = dataclasses.replace(runtime, compile=runtime.compile and cfg.compile)
    trace_name = setting_name(traced, item.task.conv) if cfg.trace else None
    for name, setting in matrix.items():
        budget = None
        if deadline is not None:
            budget = max(0.0, (deadline - RESERVE_S - time.perf_counter()) / max(phases_left, 1))
        phases_left -= 2
        t0 = time.perf_counter()
        try:
            built = make_steps(item.task, setting, item.batch, train_cfg, params.base.seed)
            m = measure_steps(built, setting.device, cfg.batch_size, cfg.steps, cfg.warmup_steps, cfg.repeats,
                              budget)
            if name == trace_name:
                write_trace(item, built, name, runtime.device, out, result, 0, log)
        except Exception as exc:
            if not setting.compile:
                raise
            result.skipped[name] = f"torch.compile failed ({_first_line(exc)})"
            log(f"{item.name} {name}: skipped, {result.skipped[name]}")
            continue
        finally:
            built = None
            if setting.compile:
                torch._dynamo.reset()
        m = derived(m, flops, cfg.batch_size, device.matmul_peak[setting.precision],
                    device.datasheet_peak.get(setting.precision))
        result.settings[name] = m
        log(f"{item.name} {name}: train {m['train_samples_per_s']:,.0f} samples/s (MFU {percent(m.get('train_mfu'))}), "
            f"inference {m['infer_samples_per_s']:,.0f} samples/s (MFU {percent(m.get('infer_mfu'))}), peak "
            f"{m['train_peak_memory_mb']:,.0f} MB [{time.perf_counter() - t0:.1f} s]")
    if trace_name is not None and trace_name not in result.settings:  # not in the matrix (or failed there)
        built = make_steps(item.task, traced, item.batch, train_cfg, params.base.seed)
        write_trace(item, built, trace_name, runtime.device, out, result, 1, log)
    if trace_name is None:  # dvc.yaml declares the trace files: write them, saying tracing was off
        (out / f"trace_{item.name}.json").write_text('{"traceEvents": [], "note": "profile.trace is false"}\n')
        (out / f"top_ops_{item.name}.txt").write_text("no trace: profile.trace is false\n")
    return result


def write_trace(item: Loaded, built: Steps, name: str, device: torch.device, out: Path, result: ModelProfile,
                warmup: int, log: Log) -> None:
    """trace_<task>.json and top_ops_<task>.txt for one training step (and memory_snapshot_<task>.json on CUDA)."""
    t0 = time.perf_counter()
    batch_size = len(next(iter(item.batch.values())))
    trace_step(built.train, device, out / f"trace_{item.name}.json", out / f"top_ops_{item.name}.txt",
               warmup=warmup, title=f"{item.name}: one training step, setting {name}, batch {batch_size}")
    result.trace_setting = name
    result.files += [f"trace_{item.name}.json", f"top_ops_{item.name}.txt"]
    if device.type == "cuda" and write_cuda_memory_snapshot(built.train, out / f"memory_snapshot_{item.name}.json"):
        result.files.append(f"memory_snapshot_{item.name}.json")
    log(f"{item.name}: traced one training step ({name}, {time.perf_counter() - t0:.1f} s)")
