"""Train one task end to end: load prepared data, build model and task, fit, test, save, and track it."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import importlib
import json
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from trainlab.core import distributed
from trainlab.core.atomic import atomic_dir, atomic_path, process_lock, write_json, writing
from trainlab.core.config import Params, TrainParams
from trainlab.engine.loop import FitResult, evaluate, fit, scalars
from trainlab.engine.contract import Task
from trainlab.core.errors import CheckpointError
from trainlab.core.repro import environment, seed_everything
from trainlab.core.runtime import Runtime, resolve_runtime
from trainlab.tasks import get
from trainlab.tasks.base import check_prepared

CHECKPOINT_ROOT = Path("checkpoints")
TIMING_COLUMNS = ("samples_per_s",)  # per-epoch history values that differ run to run (MLflow keeps them)
RUN_RECORD = "run.json"  # reports/<task>/run.json: run id, timings, environment; git-ignored, not a DVC out


@dataclass
class TrainOutcome:
    test: dict[str, float]
    fit: FitResult
    run_id: str
    seconds: float


def build_task(name: str, params: Params, meta: dict, train: dict[str, torch.Tensor] | None = None,
               data_dir: Path | None = None) -> Task:
    """The model and Task for `name` (trainlab.tasks), sized from the prepared data's meta.json; with `train` and
    its prepared folder, the model's statistics of the training split are set (the text bags' NB ratios or idf)."""
    spec = get(name)
    return spec.load().build_task(getattr(params, spec.params_section), meta, train, data_dir)


def settle_auto_precision(runtime: Runtime, requested: str, task: Task, train: dict[str, torch.Tensor],
                          batch_size: int) -> Runtime:
    """`precision: auto` on CUDA by the size of the training step (trainlab.core.runtime.cuda_auto_precision): the FLOPs
    of one step at `batch_size`, counted on a CPU copy of the model. Anything else is returned unchanged."""
    if requested != "auto" or runtime.device.type != "cuda":
        return runtime
    from trainlab.profiling.flops import flops_per_step
    from trainlab.core.runtime import CUDA_BF16_MIN_TRAIN_GFLOP, cuda_auto_precision

    gflop = flops_per_step(task, {k: v[:batch_size] for k, v in train.items()})["train"] / 1e9
    precision = cuda_auto_precision(gflop)
    print(f"{task.name}: precision auto -> {precision} ({gflop:,.0f} GFLOP per training step; bf16 from "
          f"{CUDA_BF16_MIN_TRAIN_GFLOP:,.0f} on CUDA)", flush=True)
    return dataclasses.replace(runtime, precision=precision)


def fingerprint(params: Params, name: str, data_dir: Path) -> str:
    """Identifies a training run's inputs: a checkpoint is resumed only when this matches."""
    h = hashlib.sha256(params.section_hash("base", get(name).params_section).encode())
    for f in sorted(data_dir.glob("*")):
        if f.is_file():
            h.update(f.name.encode())
            h.update(str(f.stat().st_size).encode())
            h.update(str(f.stat().st_mtime_ns).encode())
    return h.hexdigest()[:16]


def input_example(data: dict[str, torch.Tensor], task: Task) -> torch.Tensor:
    x, _ = task.prepare_batch({k: v[:2] for k, v in data.items()}, False, None)
    return x


def save_model(model: torch.nn.Module, model_dir: Path, extra_files: dict[str, Path] | None = None,
               extra_json: dict[str, dict] | None = None) -> None:
    """models/<task>/: model.safetensors (weights), config.json (architecture), plus extra files; atomic."""
    with atomic_dir(model_dir) as tmp:
        state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
        with writing(tmp / "model.safetensors"):  # safetensors removes its half file: name it in a full-disk error
            save_file(state, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(model.config, indent=2, sort_keys=True) + "\n")
        for name, data in (extra_json or {}).items():
            (tmp / name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        for name, src in (extra_files or {}).items():
            (tmp / name).write_bytes(Path(src).read_bytes())


def write_history(history: list[dict[str, float]], path: Path) -> None:
    """Per-epoch losses, metrics and learning rate as CSV (what `dvc plots` draws). Throughput columns are left
    out: the file is plot data in git and must be the same bytes for the same params and data."""
    fields = [k for k in history[0] if k not in TIMING_COLUMNS]
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for row in history:
            writer.writerow({k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()})


def headline_metrics(summary: dict[str, float], task: Task) -> dict[str, float]:
    """What reports/<task>/metrics.json keeps, and so `dvc exp show` compares: the task's primary test metric (and a
    baseline's). Every test metric, the loss and the parameter counts are in info.json and in MLflow."""
    return {k: v for k, v in summary.items() if k == f"test_{task.primary_metric}" or k.startswith("baseline_")}


def model_md5(model_dir: Path) -> str:
    """The md5 of `model_dir`/model.safetensors (DVC's hash of it); training runs carry it as the `model_md5` tag,
    which is how a model restored from DVC's cache finds the MLflow run that trained it."""
    from trainlab.tracking.lineage import file_md5

    return file_md5(model_dir / "model.safetensors")


def train_task(name: str, params: Params, data_dir: Path, model_dir: Path, reports_dir: Path,
               runtime: Runtime | None = None, **options: Any) -> TrainOutcome:
    """The whole training stage for one task; writes model_dir and reports_dir only on success.
    Under torchrun every rank trains; only rank 0 tracks and writes. `options`: the task's own stage options
    (TaskCode.add_arguments), such as the text model's `baseline` file."""
    from trainlab.data.prepared import load_meta
    from trainlab.data.shards import open_split
    from trainlab.tracking.lineage import split_inputs
    from trainlab.tracking.runs import PendingTracker, start_run_in_background
    from trainlab.tracking.tracker import NullTracker

    start = time.perf_counter()
    data_dir, model_dir, reports_dir = Path(data_dir), Path(model_dir), Path(reports_dir)
    spec = get(name)
    cfg: TrainParams = getattr(params, spec.params_section)
    seed = params.base.seed
    meta = load_meta(data_dir)
    # in memory up to base.data_on_device_max_mb a split, else streamed from disk a batch at a time
    splits = {s: open_split(data_dir, s, params.base.data_on_device_max_mb, spec.load().streamable)
              for s in ("train", "val", "test")}
    check_prepared(spec, data_dir, meta, splits, cfg.batch_size)
    runtime = runtime or resolve_runtime(params.base)
    ctx = distributed.setup(params.base.distributed, runtime.device.type)
    if ctx.enabled and runtime.device.type == "cuda":
        runtime = dataclasses.replace(runtime, device=torch.device("cuda", ctx.local_rank))
    seed_everything(seed)
    task = build_task(name, params, meta, splits["train"], data_dir)
    runtime = settle_auto_precision(runtime, params.base.precision, task, splits["train"], cfg.batch_size)
    # torch.optim imports torch._dynamo (about 1 s) when the first optimizer is built: import it here, before the
    # tracking thread starts importing MLflow, so that the two imports do not take turns on the GIL. (Not `import
    # torch._dynamo`: that would make `torch` a local name of this whole function.)
    importlib.import_module("torch._dynamo")

    ckpt = CHECKPOINT_ROOT / name / "last.pt"
    run_key = fingerprint(params, name, data_dir)
    if params.tracking.enabled and not ctx.enabled:
        restored = _complete_spooled_run(name, run_key, model_dir, reports_dir, start)
        if restored is not None:
            ckpt.unlink(missing_ok=True)
            return restored
    # Two trainings with the same params and data in one folder would resume from each other's checkpoint.
    lock = process_lock(f"checkpoint:{ckpt.resolve()}:{run_key}", wait=False) if ctx.is_main else nullcontext(True)
    with lock as own_checkpoint:
        if not own_checkpoint:
            raise CheckpointError(f"{ckpt}: another training of the {name} with the same params and data is running "
                                  "in this folder and would resume from this checkpoint; wait for it to finish, or "
                                  "train in another folder")
        tracking = (start_run_in_background(params, stage=f"train_{name}", spool_key=run_key,
                                            outputs=(model_dir, reports_dir), datasets=split_inputs(data_dir))
                    if ctx.is_main else nullcontext(NullTracker()))
        with tracking as tracker:
            # A run that cannot open stops training at the next step; not under DDP, where one rank stopping alone
            # would leave the others waiting in a collective: there rank 0's next log call raises and torchrun
            # stops them all.
            stop = tracker.failed if isinstance(tracker, PendingTracker) and not ctx.enabled else None
            tracker.log_params({"base": params.base.model_dump(), name: cfg.model_dump(), "data_source":
                                meta.get("source", "unknown"), "world_size": ctx.world_size})
            tracker.set_tags({**runtime.describe(), "task": name})
            result = fit(task, splits["train"], splits["val"], cfg, runtime, seed, tracker=tracker,
                         checkpoint_path=ckpt, fingerprint=run_key,
                         max_device_mb=params.base.data_on_device_max_mb, num_workers=params.base.num_workers,
                         eval_batch_size=2 * cfg.batch_size, sync_batchnorm=params.base.distributed.sync_batchnorm,
                         stop=stop, cuda_graphs=params.base.cuda_graphs)
            tracker.set_tags({"runtime_cuda_graphs": str(result.cuda_graphs)})
            test = scalars(evaluate(task, result.model, splits["test"], runtime, 2 * cfg.batch_size,
                                    params.base.data_on_device_max_mb))
            seconds = time.perf_counter() - start
            if ctx.is_main:
                write_outputs(name, params, task, result, test, seconds, tracker, runtime, meta, splits["test"],
                              data_dir, model_dir, reports_dir, options)
        if ctx.is_main:
            ckpt.unlink(missing_ok=True)
    distributed.teardown()
    return TrainOutcome(test=test, fit=result, run_id=tracker.run_id, seconds=seconds)


def _complete_spooled_run(name: str, run_key: str, model_dir: Path, reports_dir: Path,
                          start: float) -> TrainOutcome | None:
    """A run of these params and data that ended with its MLflow server gone (exit 6): log what it kept (no training
    again) and put its outputs back; its outcome, else None."""
    from trainlab.engine.loop import FitResult
    from trainlab.tracking.spool import complete_stage

    run_id = complete_stage(f"train_{name}", run_key, [model_dir, reports_dir])
    if run_id is None:
        return None
    record = reports_dir / RUN_RECORD
    timing = json.loads(record.read_text()).get("timing", {}) if record.exists() else {}
    with open(reports_dir / "history.csv", newline="") as f:
        history = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    info = json.loads((model_dir / "info.json").read_text())
    print(f"{name}: completed MLflow run {run_id} from the spool of the run whose server went away; outputs put "
          f"back from it, no training", flush=True)
    fit_result = FitResult(model=None, history=history, final=history[-1] if history else {},
                           params_total=int(info.get("params_total", 0)),
                           params_trainable=int(info.get("params_trainable", 0)),
                           train_time_s=timing.get("train_time_s", 0.0), samples_per_s=timing.get("samples_per_s", 0.0))
    return TrainOutcome(test=info.get("test", {}), fit=fit_result, run_id=run_id, seconds=time.perf_counter() - start)


def write_outputs(name: str, params: Params, task: Task, result: FitResult, test: dict[str, float], seconds: float,
                  tracker, runtime: Runtime, meta: dict, test_split: dict[str, torch.Tensor], data_dir: Path,
                  model_dir: Path, reports_dir: Path, options: dict[str, Any] | None = None) -> None:
    """Model, metrics and history files, and the same in MLflow (with the registered model).

    The model folder and the reports hold only what the same params and data reproduce bit for bit; the run id,
    timings and environment go to MLflow and to the git-ignored reports/<task>/run.json."""
    summary = {f"test_{k}": v for k, v in test.items()}
    summary.update({"params_total": result.params_total, "params_trainable": result.params_trainable,
                    "epochs": len(result.history)})
    timing = {"train_time_s": round(result.train_time_s, 3), "stage_time_s": round(seconds, 3),
              "samples_per_s": round(result.samples_per_s, 1)}
    extras = get(name).load().training_extras(params, data_dir, meta, options or {})
    extra_json = {"info.json": {"task": name, "meta": meta, "test": test, "runtime": runtime.describe(),
                                "params_total": result.params_total, "params_trainable": result.params_trainable,
                                "epochs": len(result.history)}, **extras.json}
    summary.update(extras.metrics)
    tracker.log_params({"params_total": result.params_total, "params_trainable": result.params_trainable})
    tracker.log_metrics({k: float(v) for k, v in {**summary, **timing}.items()})

    from trainlab.data.transforms import PREPROCESSING_FILE

    files = dict(extras.files)
    if (data_dir / PREPROCESSING_FILE).is_file():  # how raw inputs become model inputs: predict and MLflow read it
        files[PREPROCESSING_FILE] = data_dir / PREPROCESSING_FILE
    save_model(result.model, model_dir, files, extra_json)
    weights_md5 = model_md5(model_dir)
    tracker.set_tags({"model_md5": weights_md5})
    write_history(result.history, reports_dir / "history.csv")
    write_json(reports_dir / "metrics.json", headline_metrics(summary, task))
    write_json(reports_dir / RUN_RECORD, {"mlflow_run_id": tracker.run_id, "model_md5": weights_md5,
                                          "timing": timing, "environment": environment(runtime.device)})
    tracker.log_artifact(reports_dir / "history.csv")
    tracker.log_artifact(model_dir / "config.json", "model_files")
    model = result.model.eval().float().cpu().to(memory_format=torch.contiguous_format)
    registered = f"trainlab-{name}" if params.tracking.register_models else None
    # an MLflow pyfunc on raw inputs (trainlab.serving): the model folder, a few raw test inputs as its example
    from trainlab.serving.flavor import raw_example, served

    raw = served(name, model_dir)
    tracker.log_model(model, name=name, input_example=input_example(test_split, task).cpu(),
                      registered_model_name=registered, model_dir=model_dir if raw else None,
                      raw_example=raw_example(name, test_split, data_dir) if raw else None)

