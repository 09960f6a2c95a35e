"""The profile's numbers and outputs: achieved FLOP/s and MFU, headline metrics for DVC and the full measurements,
a markdown report, a bar chart."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The per-setting keys of metrics.json, in order (the _datasheet ones only on a known GPU).
METRIC_KEYS = (
    "train_samples_per_s", "infer_samples_per_s", "train_step_ms", "infer_step_ms",
    "train_gflop_per_step", "infer_gflop_per_step", "train_achieved_gflop_per_s", "infer_achieved_gflop_per_s",
    "train_mfu", "infer_mfu", "train_mfu_datasheet", "infer_mfu_datasheet",
    "train_peak_memory_mb", "infer_peak_memory_mb", "train_spread", "infer_spread",
)


@dataclass
class ModelProfile:
    """What was measured for one model: per-setting numbers, FLOPs, skipped settings, trace files."""

    task: str
    arch: str
    parameters: int
    flops: dict[str, int]  # train / infer, per step (trainlab.profiling.flops.StepFlops: and its basis)
    settings: dict[str, dict[str, float]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # setting -> why
    trace_setting: str | None = None
    files: list[str] = field(default_factory=list)


@dataclass
class DeviceProfile:
    """The machine: device, name, threads, and peak FLOP/s per precision (measured and datasheet)."""

    device: str
    name: str
    threads: int
    memory_kind: str
    matmul_peak: dict[str, float]  # precision -> FLOP/s
    datasheet_peak: dict[str, float]  # precision -> FLOP/s (known GPUs only)
    torch_version: str
    notes: list[str] = field(default_factory=list)


def _round(value: float, digits: int = 4) -> float:
    return float(f"{value:.{digits}g}")


def metrics_dict(device: DeviceProfile, models: list[ModelProfile], seconds: float) -> dict[str, Any]:
    """{"device": {...peaks}, "<task>": {"<setting>": {metric: value}}, "stage_seconds": s}; numbers only."""
    out: dict[str, Any] = {"device": {}}
    for precision, flops in device.matmul_peak.items():
        out["device"][f"matmul_peak_{precision}_gflop_per_s"] = _round(flops / 1e9)
    for precision, flops in device.datasheet_peak.items():
        out["device"][f"datasheet_peak_{precision}_gflop_per_s"] = _round(flops / 1e9)
    for model in models:
        out[model.task] = {name: {k: _round(m[k]) for k in METRIC_KEYS if k in m}
                           for name, m in model.settings.items()}
    out["stage_seconds"] = round(seconds, 1)
    return out


def headline_metrics(models: list[ModelProfile]) -> dict[str, Any]:
    """The profile's DVC metrics: each model's fastest training throughput (samples/s, over the settings measured).
    The full matrix (and the stage's timing) goes to measurements.json, a plain report, so `dvc exp show` stays
    readable."""
    best = {m.task: _round(max(s["train_samples_per_s"] for s in m.settings.values())) for m in models if m.settings}
    return {"best_train_samples_per_s": best}


def derived(m: dict[str, float], flops: dict[str, int], batch_size: int, peak: float,
            sheet: float | None) -> dict[str, float]:
    """FLOPs per step, achieved FLOP/s and MFU (measured and datasheet peak) from a throughput measurement; none of
    them for a phase whose FLOPs were not counted (0: n/a, not a measured zero)."""
    out = dict(m)
    for phase in ("train", "infer"):
        if not flops[phase]:
            continue
        achieved = flops[phase] * m[f"{phase}_samples_per_s"] / batch_size
        out[f"{phase}_gflop_per_step"] = flops[phase] / 1e9
        out[f"{phase}_achieved_gflop_per_s"] = achieved / 1e9
        out[f"{phase}_mfu"] = achieved / peak
        if sheet:
            out[f"{phase}_mfu_datasheet"] = achieved / sheet
    return out


def percent(value: float | None) -> str:
    """A fraction as a percentage: one decimal, or two significant digits below 0.05% (a memory-bound model's MFU
    is not 0.0%); n/a when it was not measured."""
    if value is None:
        return "n/a"
    if 0 < abs(value) < 0.0005:
        return f"{100 * value:.2g}%"
    return f"{100 * value:.1f}%"


def gflop(flops: int) -> str:
    """FLOPs as GFLOP (three significant digits), n/a when nothing was counted."""
    return f"{flops / 1e9:.3g} GFLOP" if flops else "n/a"


def _fmt(value: float | None, kind: str = "") -> str:
    if value is None:
        return "–"
    if kind == "pct":
        return percent(value)
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def markdown_report(device: DeviceProfile, models: list[ModelProfile], batch_size: int, steps: int,
                    warmup: int, repeats: int, seconds: float) -> str:
    """A readable report: the device and its peaks, then one table per model, then how to read it."""
    lines = [
        "# Profile", "",
        (f"Device **{device.device}** ({device.name}, {device.threads} threads), torch {device.torch_version}. "
         f"Batch {batch_size} from the test split, on the device; up to {warmup} warm-up steps (excluded), then "
         f"the median of {repeats} timed runs of up to {steps} steps. Profiling took {seconds:.0f} s."), "",
        "## Peak matmul FLOP/s", "",
        "| precision | measured (square matmul) GFLOP/s | datasheet GFLOP/s |",
        "|---|---:|---:|",
    ]
    for precision, flops in device.matmul_peak.items():
        sheet = device.datasheet_peak.get(precision)
        lines.append(f"| {precision} | {_fmt(flops / 1e9)} | {_fmt(sheet / 1e9) if sheet else '–'} |")
    lines.append("")
    for model in models:
        lines += model_section(model, repeats, has_sheet=bool(device.datasheet_peak))
    lines += how_to_read(device)
    return "\n".join(lines) + "\n"


def model_section(model: ModelProfile, repeats: int, has_sheet: bool) -> list[str]:
    """One model's lines: its FLOPs, a row per setting, the fastest setting, what was skipped, the trace files."""
    flops_line = (f"{gflop(model.flops['train'])} per training step (forward + backward), "
                  f"{gflop(model.flops['infer'])} per inference step.")
    if getattr(model.flops, "basis", "matmul") == "elementwise":  # trainlab.profiling.flops.ELEMENTWISE
        flops_line += (" No matmul, convolution, attention or embedding bag: the model gathers table rows and sums "
                       "them, so these are its floating-point multiplies and adds; its speed is memory-bound and "
                       "its MFU against the matmul peak is small by nature: read its samples/s.")
    if not model.flops["train"]:
        flops_line = ("FLOPs: n/a (no matmul, convolution, attention, embedding bag or floating-point multiply-add "
                      "was counted in its step): MFU does not apply (n/a); read its samples/s.")
    lines = [f"## {model.task} ({model.arch}, {model.parameters:,} parameters)", "", flops_line, ""]
    header = ["setting", "train samples/s", "infer samples/s", "train step ms", "train GFLOP/s", "train MFU",
              "infer MFU"]
    if has_sheet:
        header += ["train MFU (datasheet)", "infer MFU (datasheet)"]
    header += ["train peak MB", "infer peak MB", "spread (train/infer)", "steps × repeats (train/infer)",
               "warm-up s (train)"]
    lines += ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    lines += [setting_row(name, m, repeats, has_sheet) for name, m in model.settings.items()]
    if model.settings:
        best = max(model.settings, key=lambda s: model.settings[s]["train_samples_per_s"])
        base = model.settings.get("fp32")
        if base and best != "fp32":
            speedup = model.settings[best]["train_samples_per_s"] / base["train_samples_per_s"]
            lines += ["", f"Fastest training setting: `{best}`, {speedup:.2f}x the fp32 throughput."]
    for name, why in model.skipped.items():
        lines += ["", f"Skipped `{name}`: {why}"]
    if model.files:
        traced = f" (one training step, setting `{model.trace_setting}`)" if model.trace_setting else ""
        lines += ["", "Files" + traced + ": " + ", ".join(f"`{f}`" for f in model.files)]
    return lines + [""]


def setting_row(name: str, m: dict[str, float], repeats: int, has_sheet: bool) -> str:
    counted = "train_mfu" in m  # not when the model's FLOPs were not counted: n/a
    row = [f"`{name}`", _fmt(m["train_samples_per_s"]), _fmt(m["infer_samples_per_s"]),
           _fmt(m["train_step_ms"]), _fmt(m["train_achieved_gflop_per_s"]) if counted else "n/a",
           percent(m.get("train_mfu")), percent(m.get("infer_mfu"))]
    if has_sheet:
        row += [_fmt(m.get("train_mfu_datasheet"), "pct") if counted else "n/a",
                _fmt(m.get("infer_mfu_datasheet"), "pct") if counted else "n/a"]
    row += [_fmt(m["train_peak_memory_mb"]), _fmt(m["infer_peak_memory_mb"]),
            f"{_fmt(m['train_spread'], 'pct')} / {_fmt(m['infer_spread'], 'pct')}",
            f"{int(m['train_steps'])}×{repeats} / {int(m['infer_steps'])}×{repeats}",
            f"{m['train_warmup_s']:.1f}"]
    return "| " + " | ".join(row) + " |"


def how_to_read(device: DeviceProfile) -> list[str]:
    has_sheet = bool(device.datasheet_peak)
    lines = [
        "## How to read this", "",
        "- MFU = achieved FLOP/s ÷ peak FLOP/s of the setting's precision. Achieved FLOP/s = FLOPs per step "
        "(torch.utils.flop_counter: matmuls, convolutions, attention, embedding bags; for a model with none of "
        "them, its floating-point multiplies and adds; the optimizer update is not counted) × "
        "steps per second. The peak is a square matmul measured in the same run and dtype"
        + (", and the datasheet dense peak of this GPU." if has_sheet else "."),
        "- Peak memory is the " + ("CUDA caching allocator's peak (allocated bytes)." if device.memory_kind ==
                                   "cuda_allocator" else "process resident set size (RSS), sampled every 5 ms: it "
                                   "includes the Python interpreter and the libraries."),
        "- Spread = (max − min) ÷ median of the repeats' throughput: large values mean a noisy (shared) machine.",
    ]
    return lines + [f"- {note}" for note in device.notes]


def throughput_chart(models: list[ModelProfile], path: Path) -> None:
    """A PNG bar chart: one panel per model, train and inference samples/s per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [m for m in models if m.settings]
    fig, axes = plt.subplots(1, max(1, len(shown)), figsize=(4.8 * max(1, len(shown)), 4.2), squeeze=False)
    for ax, model in zip(axes[0], shown, strict=False):
        names = list(model.settings)
        xs = range(len(names))
        train = [model.settings[n]["train_samples_per_s"] for n in names]
        infer = [model.settings[n]["infer_samples_per_s"] for n in names]
        width = 0.4
        ax.bar([x - width / 2 for x in xs], train, width, label="train step")
        ax.bar([x + width / 2 for x in xs], infer, width, label="inference")
        ax.set_xticks(list(xs), [n.replace("_", "\n") for n in names], fontsize=8)
        ax.set_title(f"{model.task} ({model.arch})")
        ax.set_ylabel("samples/s")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Throughput per setting (median of repeats)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
