"""Train one task end to end: load prepared data, build model and task, fit, test, save, and track it."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from trainlab import distributed
from trainlab.atomic import atomic_dir, atomic_path, write_json
from trainlab.config import Params, TrainParams
from trainlab.engine import FitResult, Task, evaluate, fit, scalars
from trainlab.repro import environment, seed_everything
from trainlab.runtime import Runtime, resolve_runtime

TASK_SECTIONS = {"classifier": "classifier", "segmenter": "segmenter", "text": "text"}
CHECKPOINT_ROOT = Path("checkpoints")


@dataclass
class TrainOutcome:
    test: dict[str, float]
    fit: FitResult
    run_id: str
    seconds: float


def build_task(name: str, params: Params, meta: dict) -> Task:
    """The model and Task for `name`, sized from the prepared data's meta.json."""
    from trainlab import models, tasks

    cfg = getattr(params, name)
    n = meta["num_classes"]
    if name == "classifier":
        model = models.build_classifier(cfg, num_classes=n, in_channels=meta["channels"])
        head = model.head if cfg.head_lr is not None else None
        return tasks.classification_task(model, n, cfg.label_smoothing, cfg.augment, hflip=meta.get("hflip", False),
                                         head=head, head_lr=cfg.head_lr)
    if name == "segmenter":
        model = models.build_segmenter(cfg, num_classes=n, in_channels=meta["channels"])
        return tasks.segmentation_task(model, n, cfg.dice_weight, cfg.augment, cfg.label_smoothing)
    if name == "text":
        model = models.build_text_model(cfg, vocab_size=meta["vocab_size"], num_classes=n,
                                        max_length=meta["max_length"], pad_id=meta.get("pad_id", 0))
        return tasks.text_task(model, n, cfg.label_smoothing)
    raise ValueError(f"unknown task {name!r}")


def fingerprint(params: Params, name: str, data_dir: Path) -> str:
    """Identifies a training run's inputs: a checkpoint is resumed only when this matches."""
    h = hashlib.sha256(params.section_hash("base", name).encode())
    for f in sorted(data_dir.glob("*")):
        if f.is_file():
            h.update(f.name.encode())
            h.update(str(f.stat().st_size).encode())
            h.update(str(f.stat().st_mtime_ns).encode())
    return h.hexdigest()[:16]


def input_example(name: str, data: dict[str, torch.Tensor], task: Task) -> torch.Tensor:
    x, _ = task.prepare_batch({k: v[:2] for k, v in data.items()}, False, None)
    return x


def save_model(model: torch.nn.Module, model_dir: Path, extra_files: dict[str, Path] | None = None,
               extra_json: dict[str, dict] | None = None) -> None:
    """models/<task>/: model.safetensors (weights), config.json (architecture), plus extra files; atomic."""
    with atomic_dir(model_dir) as tmp:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        save_file(state, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(model.config, indent=2, sort_keys=True) + "\n")
        for name, data in (extra_json or {}).items():
            (tmp / name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        for name, src in (extra_files or {}).items():
            (tmp / name).write_bytes(Path(src).read_bytes())


def write_history(history: list[dict[str, float]], path: Path) -> None:
    """Per-epoch metrics as CSV (what `dvc plots` draws)."""
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(history[0]))
        writer.writeheader()
        for row in history:
            writer.writerow({k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()})


def train_task(name: str, params: Params, data_dir: Path, model_dir: Path, reports_dir: Path,
               runtime: Runtime | None = None) -> TrainOutcome:
    """The whole training stage for one task; writes model_dir and reports_dir only on success.
    Under torchrun every rank trains; only rank 0 tracks and writes."""
    from trainlab.data.prepared import load_meta, load_split
    from trainlab.tracking import NullTracker, start_run

    start = time.perf_counter()
    data_dir, model_dir, reports_dir = Path(data_dir), Path(model_dir), Path(reports_dir)
    cfg: TrainParams = getattr(params, name)
    seed = params.base.seed
    meta = load_meta(data_dir)
    splits = {s: load_split(data_dir, s) for s in ("train", "val", "test")}
    runtime = runtime or resolve_runtime(params.base)
    ctx = distributed.setup(params.base.distributed, runtime.device.type)
    if ctx.enabled and runtime.device.type == "cuda":
        runtime = dataclasses.replace(runtime, device=torch.device("cuda", ctx.local_rank))
    seed_everything(seed)
    task = build_task(name, params, meta)
    tracking = start_run(params, stage=f"train_{name}") if ctx.is_main else nullcontext(NullTracker())
    ckpt = CHECKPOINT_ROOT / name / "last.pt"

    with tracking as tracker:
        tracker.log_params({"base": params.base.model_dump(), name: cfg.model_dump(), "data_source":
                            meta.get("source", "unknown"), "world_size": ctx.world_size})
        tracker.set_tags({**runtime.describe(), "task": name})
        result = fit(task, splits["train"], splits["val"], cfg, runtime, seed, tracker=tracker,
                     checkpoint_path=ckpt, fingerprint=fingerprint(params, name, data_dir),
                     max_device_mb=params.base.data_on_device_max_mb, num_workers=params.base.num_workers,
                     eval_batch_size=2 * cfg.batch_size, sync_batchnorm=params.base.distributed.sync_batchnorm)
        test = scalars(evaluate(task, result.model, splits["test"], runtime, 2 * cfg.batch_size,
                                params.base.data_on_device_max_mb))
        seconds = time.perf_counter() - start
        if ctx.is_main:
            write_outputs(name, params, task, result, test, seconds, tracker, runtime, meta, splits["test"],
                          data_dir, model_dir, reports_dir)
    if ctx.is_main:
        ckpt.unlink(missing_ok=True)
    distributed.teardown()
    return TrainOutcome(test=test, fit=result, run_id=tracker.run_id, seconds=seconds)


def write_outputs(name: str, params: Params, task: Task, result: FitResult, test: dict[str, float], seconds: float,
                  tracker, runtime: Runtime, meta: dict, test_split: dict[str, torch.Tensor], data_dir: Path,
                  model_dir: Path, reports_dir: Path) -> None:
    """Model, metrics, history and timing files, and the same in MLflow (with the registered model)."""
    summary = {f"test_{k}": v for k, v in test.items()}
    summary.update({"params_total": result.params_total, "params_trainable": result.params_trainable,
                    "epochs": len(result.history)})
    # Timings vary run to run, so they live apart from the metrics (which are bitwise reproducible).
    timing = {"train_time_s": round(result.train_time_s, 3), "stage_time_s": round(seconds, 3),
              "samples_per_s": round(result.samples_per_s, 1)}
    extra_files = {"tokenizer.json": data_dir / "tokenizer.json"} if name == "text" else {}
    extra_json = {"info.json": {"task": name, "meta": meta, "test": test, "run_id": tracker.run_id,
                                "environment": environment(runtime.device), "runtime": runtime.describe()}}
    if name == "text":
        baseline = text_baseline(params, data_dir, meta)
        summary.update({"baseline_test_accuracy": baseline["accuracy"],
                        "baseline_test_macro_f1": baseline["macro_f1"]})
        extra_json["baseline.json"] = baseline
    tracker.log_params({"params_total": result.params_total, "params_trainable": result.params_trainable})
    tracker.log_metrics({k: float(v) for k, v in {**summary, **timing}.items()})

    save_model(result.model, model_dir, extra_files, extra_json)
    write_history(result.history, reports_dir / "history.csv")
    write_json(reports_dir / "metrics.json", summary)
    write_json(reports_dir / "timing.json", timing)
    tracker.log_artifact(reports_dir / "history.csv")
    tracker.log_artifact(model_dir / "config.json", "model_files")
    model = result.model.eval().float().cpu().to(memory_format=torch.contiguous_format)
    registered = f"trainlab-{name}" if params.tracking.register_models else None
    tracker.log_model(model, name=name, input_example=input_example(name, test_split, task).cpu(),
                      registered_model_name=registered)


def text_baseline(params: Params, data_dir: Path, meta: dict) -> dict:
    """The TF-IDF + logistic regression bar for the text model, on the same split."""
    from trainlab.baseline import tfidf_baseline

    t0 = time.perf_counter()
    result = tfidf_baseline(data_dir, params.text.baseline_max_features, params.text.baseline_C,
                            params.base.seed, meta["num_classes"])
    print(f"text baseline (TF-IDF + logistic regression): test accuracy {result['accuracy']:.4f}, "
          f"macro-F1 {result['macro_f1']:.4f} ({time.perf_counter() - t0:.1f} s)")
    return result
