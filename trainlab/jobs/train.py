"""Train one task end to end: load prepared data, build model and task, fit, test, save, and track it."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import importlib
import json
import os
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
from trainlab.core.errors import CheckpointError
from trainlab.core.fingerprint import run_fingerprint
from trainlab.core.provenance import environment
from trainlab.core.repro import seed_everything
from trainlab.core.runtime import Runtime, resolve_runtime
from trainlab.engine.contract import Trainable
from trainlab.engine.loop import FitHooks, FitOptions, FitResult, evaluate, fit, scalars
from trainlab.jobs.pruning import trial_sink  # a search trial's pruning (pipelines.search); off otherwise
from trainlab.tasks import get
from trainlab.tasks.base import TrainingExtras, check_prepared

CHECKPOINT_ROOT = Path("checkpoints")
TIMING_COLUMNS = ("samples_per_s",)  # per-epoch history values that differ run to run (MLflow keeps them)
RUN_RECORD = "run.json"  # reports/<task>/run.json: run id, timings, environment; git-ignored, not a DVC out
TRAIL_ARTIFACT = "trail.json"  # the MLflow run's fingerprint, trail and what a rerun needs (python -m trainlab.verify)
STOP_AFTER_EPOCHS_ENV = "TRAINLAB_STOP_AFTER_EPOCHS"  # stop (checkpoint kept) after that epoch: verify --epochs N


@dataclass
class TrainOutcome:
    test: dict[str, float]
    fit: FitResult
    run_id: str
    seconds: float


def build_trainable(name: str, params: Params, meta: dict, train: dict[str, torch.Tensor] | None = None,
               data_dir: Path | None = None) -> Trainable:
    """The model and Trainable for `name` (trainlab.tasks), sized from the prepared data's meta.json; with `train` and
    its prepared folder, the model's statistics of the training split are set (the text bags' NB ratios or idf)."""
    spec = get(name)
    return spec.load().build_trainable(getattr(params, spec.params_section), meta, train, data_dir)


def settle_auto_precision(runtime: Runtime, requested: str, task: Trainable, train: dict[str, torch.Tensor],
                          batch_size: int) -> Runtime:
    """`precision: auto` on CUDA by the size of the training step (trainlab.core.runtime.cuda_auto_precision): the FLOPs
    of one step at `batch_size`, counted on a CPU copy of the model. Anything else is returned unchanged."""
    from trainlab.core import auto

    if not auto.settles_on_cuda(requested, runtime.device.type):
        return runtime
    from trainlab.profiling.flops import flops_per_step

    gflop = flops_per_step(task, {k: v[:batch_size] for k, v in train.items()})["train"] / 1e9
    precision = auto.cuda_precision(gflop, torch.cuda.is_bf16_supported())
    print(f"{task.name}: precision auto -> {precision} ({gflop:,.0f} GFLOP per training step; bf16 from "
          f"{auto.CUDA_BF16_MIN_TRAIN_GFLOP:,.0f} on CUDA)", flush=True)
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


def input_example(data: dict[str, torch.Tensor], task: Trainable) -> torch.Tensor:
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


def curve_rows(history: list[dict[str, float]], metric: str) -> dict:
    """What the evaluate stage's training curves draw (info.json "history"): per validation the epoch, optimizer step,
    learning rate, both losses and the primary validation metric `metric`."""
    keys = ("epoch", "step", "lr", "train_loss", "val_loss", f"val_{metric}")
    return {"metric": metric, "rows": [{k: round(row[k], 6) if isinstance(row[k], float) else row[k]
                                        for k in keys if k in row} for row in history]}


def write_history(history: list[dict[str, float]], path: Path) -> None:
    """Per-epoch losses, metrics and learning rate as CSV (what `dvc plots` draws). Throughput columns are left
    out: the file is plot data in git and must be the same bytes for the same params and data."""
    fields = [k for k in history[0] if k not in TIMING_COLUMNS]
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for row in history:
            writer.writerow({k: round(v, 6) if isinstance(v, float) else v for k, v in row.items()})


def headline_metrics(summary: dict[str, float], task: Trainable) -> dict[str, float]:
    """What reports/<task>/metrics.json keeps, and so `dvc exp show` compares: the task's primary test metric (and a
    baseline's). Every test metric, the loss and the parameter counts are in info.json and in MLflow."""
    return {k: v for k, v in summary.items() if k == f"test_{task.primary_metric}" or k.startswith("baseline_")}


def model_md5(model_dir: Path) -> str:
    """The md5 of `model_dir`/model.safetensors (DVC's hash of it); training runs carry it as the `model_md5` tag,
    which is how a model restored from DVC's cache finds the MLflow run that trained it."""
    from trainlab.tracking.lineage import file_md5

    return file_md5(model_dir / "model.safetensors")


@dataclass(frozen=True)
class TrainingJob:
    """One training stage: the model it trains, the params, the prepared data and where the outputs go."""

    name: str
    params: Params
    data_dir: Path
    model_dir: Path
    reports_dir: Path
    options: dict[str, Any] = dataclasses.field(default_factory=dict)  # the task's own stage options (TaskCode)
    extras: TrainingExtras | None = None  # TaskCode.training_extras, read with the prepared data (before training)
    auto: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # what each auto became, and why
    rerun: dict[str, Any] = dataclasses.field(default_factory=dict)  # what `python -m trainlab.verify` reruns

    @property
    def cfg(self) -> TrainParams:
        return getattr(self.params, get(self.name).params_section)

    @property
    def checkpoint(self) -> Path:
        return CHECKPOINT_ROOT / self.name / "last.pt"


@dataclass
class Trained:
    """What a training produced: the task it trained, fit's result, the test metrics, the runtime it ran on and the
    stage's seconds so far."""

    task: Trainable
    fit: FitResult
    test: dict[str, float]
    runtime: Runtime
    seconds: float
    chosen: dict[str, Any] = dataclasses.field(default_factory=dict)  # TaskCode.choose_model's record
    fingerprint: dict[str, str] = dataclasses.field(default_factory=dict)  # trainlab.core.fingerprint


def train_task(name: str, params: Params, data_dir: Path, model_dir: Path, reports_dir: Path,
               runtime: Runtime | None = None, **options: Any) -> TrainOutcome:
    """The whole training stage for one task; writes model_dir and reports_dir only on success.
    Under torchrun every rank trains; only rank 0 tracks and writes. `options`: the task's own stage options
    (TaskCode.add_arguments), such as the text model's `baseline` file."""
    start = time.perf_counter()
    job = TrainingJob(name, params, Path(data_dir), Path(model_dir), Path(reports_dir), options)
    meta, splits = load_prepared(job)
    given = params
    job = dataclasses.replace(job, rerun=rerun_record(name, given, job.data_dir, options))
    job = resolved(job, meta, len(next(iter(splits["train"].values()))))
    params = job.params
    # before training: a missing or bad text baseline fails here, not after the training
    job = dataclasses.replace(job, extras=get(name).load().training_extras(params, job.data_dir, meta, job.options))
    runtime = runtime or resolve_runtime(params.base)
    ctx = distributed.setup(params.base.distributed, runtime.device.type)
    if ctx.enabled and runtime.device.type == "cuda":
        runtime = dataclasses.replace(runtime, device=torch.device("cuda", ctx.local_rank))
    seed_everything(params.base.seed)
    task = build_trainable(name, params, meta, splits["train"], job.data_dir)
    runtime = settle_auto_precision(runtime, params.base.precision, task, splits["train"], job.cfg.batch_size)
    # torch.optim imports torch._dynamo (about 1 s) when the first optimizer is built: import it here, before the
    # tracking thread starts importing MLflow, so that the two imports do not take turns on the GIL. (Not `import
    # torch._dynamo`: that would make `torch` a local name of this whole function.)
    importlib.import_module("torch._dynamo")
    run_key = fingerprint(given, name, job.data_dir)  # the params as written (what auto resolves to follows from them)
    if params.tracking.enabled and not ctx.enabled:
        restored = _complete_spooled_run(name, run_key, job.model_dir, job.reports_dir, start)
        if restored is not None:
            job.checkpoint.unlink(missing_ok=True)
            return restored
    # Two trainings with the same params and data in one folder would resume from each other's checkpoint.
    lock = process_lock(f"checkpoint:{job.checkpoint.resolve()}:{run_key}", wait=False) if ctx.is_main \
        else nullcontext(True)
    with lock as own_checkpoint:
        if not own_checkpoint:
            raise CheckpointError(f"{job.checkpoint}: another training of the {name} with the same params and data "
                                  "is running in this folder and would resume from this checkpoint; wait for it to "
                                  "finish, or train in another folder")
        trained, run_id = train_tracked(job, meta, splits, task, runtime, run_key, start)
        if ctx.is_main:
            job.checkpoint.unlink(missing_ok=True)
    distributed.teardown()
    return TrainOutcome(test=trained.test, fit=trained.fit, run_id=run_id, seconds=trained.seconds)


def rerun_record(name: str, given: Params, data_dir: Path, options: dict[str, Any]) -> dict[str, Any]:
    """What `python -m trainlab.verify` needs to train this run again: the task, the params as written, the data
    folder and the stage's own options (paths made absolute)."""
    return {"task": name, "params": given.model_dump(mode="json"), "data_dir": str(data_dir.resolve()),
            "options": {k: str(Path(v).resolve()) if isinstance(v, Path) else v for k, v in options.items()}}


def resolved(job: TrainingJob, meta: dict, train_count: int) -> TrainingJob:
    """The job with its params section's auto values and budget resolved for the prepared data, printed with why."""
    from trainlab.core.auto import choices_line, resolve_training

    cfg, choices = resolve_training(get(job.name).params_section, job.cfg, meta, train_count)
    if choices and distributed.context().is_main:
        print(f"{job.name}: {choices_line(job.name, choices)}", flush=True)
    params = job.params.model_copy(update={get(job.name).params_section: cfg})
    return dataclasses.replace(job, params=params, auto=choices)


def load_prepared(job: TrainingJob) -> tuple[dict, dict[str, Any]]:
    """meta.json and the three splits, checked: each in memory up to base.data_on_device_max_mb, else streamed from
    disk a batch at a time."""
    from trainlab.data.prepared import load_meta
    from trainlab.data.shards import open_split

    spec = get(job.name)
    meta = load_meta(job.data_dir)
    max_mb = job.params.base.data_on_device_max_mb
    splits = {s: open_split(job.data_dir, s, max_mb, spec.load().streamable) for s in ("train", "val", "test")}
    check_prepared(spec, job.data_dir, meta, splits)
    return meta, splits


def train_tracked(job: TrainingJob, meta: dict, splits: dict[str, Any], task: Trainable, runtime: Runtime,
                  run_key: str, start: float) -> tuple[Trained, str]:
    """Fit and test inside the stage's MLflow run (rank 0; the other ranks get a null tracker), then write the
    outputs; what was trained and the run id."""
    from trainlab.jobs.outputs import keeper
    from trainlab.tracking.lineage import split_inputs
    from trainlab.tracking.queue import start_run_in_background
    from trainlab.tracking.tracker import NullTracker

    params, cfg, ctx = job.params, job.cfg, distributed.context()
    tracking = (start_run_in_background(params, stage=f"train_{job.name}", spool_key=run_key,
                                        keep_outputs=keeper(job.model_dir, job.reports_dir), logs_model=True,
                                        datasets=split_inputs(job.data_dir))
                if ctx.is_main else nullcontext(NullTracker()))
    with tracking as tracker:
        # A store that refuses the run (or a call) stops training at the next step (engine.contract.Tracker.failed);
        # not under DDP, where one rank stopping alone would leave the others waiting in a collective: there rank 0's
        # next log call raises and torchrun stops them all.
        stop = tracker.failed if not ctx.enabled else None
        auto = {**{f"data.{k}": c["value"] for k, c in meta.get("auto", {}).items()},
                **{f"{job.name}.{k}": c["value"] for k, c in job.auto.items()}}
        tracker.log_params({"base": params.base.model_dump(), job.name: cfg.model_dump(), "data_source":
                            meta.get("source", "unknown"), "world_size": ctx.world_size, "auto": auto})
        tracker.set_tags({**runtime.describe(), "task": job.name})
        fingerprint = run_fingerprint(runtime, job.data_dir, params.section_hash("base", get(job.name).params_section),
                                      auto)
        tracker.set_tags({f"fingerprint.{k}": v for k, v in fingerprint.items()})
        options = FitOptions.from_base(params.base, eval_batch_size=2 * cfg.batch_size,
                                       checkpoint_path=job.checkpoint, fingerprint=run_key,
                                       run_fingerprint=fingerprint)
        result = fit(task, splits["train"], splits["val"], cfg, runtime, params.base.seed, options,
                     FitHooks(tracker=trial_sink(tracker, job.name, job.checkpoint), stop=stop,
                              stop_after_epochs=int(os.environ.get(STOP_AFTER_EPOCHS_ENV) or 0) or None))
        tracker.set_tags({"runtime_cuda_graphs": str(result.cuda_graphs),
                          "fingerprint.cuda_graphs": str(result.cuda_graphs)})
        if result.stopping:  # the plateau schedule (epochs auto): where it stopped and where its weights are from
            stop = result.stopping
            print(f"{job.name}: stopped at epoch {stop['stopped_epoch']} (step {stop['stopped_step']:,}): "
                  f"{stop['why']}; the weights of epoch {stop['kept_epoch']} kept", flush=True)
            tracker.log_params({job.name: {"stopping": stop}})
        task, chosen = get(job.name).load().choose_model(task, result)  # e.g. the text bag's weight decay
        if chosen:
            tracker.log_params({job.name: {"chosen": chosen}})
        test = scalars(evaluate(task, result.model, splits["test"], runtime, 2 * cfg.batch_size,
                                params.base.data_on_device_max_mb))
        trained = Trained(task, result, test, runtime, time.perf_counter() - start, chosen,
                          result.trail.get("fingerprint", fingerprint))
        if ctx.is_main:
            record = write_outputs(job, meta, trained, tracker, splits["test"])
    if ctx.is_main and record["mlflow_run_id"] != tracker.run_id:  # a run opened late (an outage as it opened)
        write_json(job.reports_dir / RUN_RECORD, {**record, "mlflow_run_id": tracker.run_id})
    return trained, tracker.run_id


def _complete_spooled_run(name: str, run_key: str, model_dir: Path, reports_dir: Path,
                          start: float) -> TrainOutcome | None:
    """A run of these params and data that ended with its MLflow server gone (exit 6): log what it kept (no training
    again) and put its outputs back; its outcome, else None."""
    from trainlab.engine.loop import FitResult
    from trainlab.jobs.outputs import complete_spooled_stage

    run_id = complete_spooled_stage(f"train_{name}", run_key, [model_dir, reports_dir])
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


def write_outputs(job: TrainingJob, meta: dict, trained: Trained, tracker, test_split: dict[str, torch.Tensor]) -> dict:
    """Model, metrics and history files, and the same in MLflow (with the registered model); returns the record of
    the git-ignored reports/<task>/run.json (the run id, the weights' md5, timings, environment).

    The model folder and the reports hold only what the same params and data reproduce bit for bit; the run id,
    timings and environment go to MLflow and to run.json."""
    from trainlab.data.preprocessing import PREPROCESSING_FILE

    result, name = trained.fit, job.name
    counts = {"params_total": result.params_total, "params_trainable": result.params_trainable}
    epochs = int(result.history[-1]["epoch"]) if result.history else 0  # trained (history: one row a validation)
    summary = {**{f"test_{k}": v for k, v in trained.test.items()}, **counts, "epochs": epochs}
    timing = {"train_time_s": round(result.train_time_s, 3), "stage_time_s": round(trained.seconds, 3),
              "samples_per_s": round(result.samples_per_s, 1)}
    extras = job.extras
    summary.update(extras.metrics)
    tracker.log_params(counts)
    tracker.log_metrics({k: float(v) for k, v in {**summary, **timing}.items()})
    files = dict(extras.files)
    if (job.data_dir / PREPROCESSING_FILE).is_file():  # how raw inputs become model inputs: predict and MLflow read it
        files[PREPROCESSING_FILE] = job.data_dir / PREPROCESSING_FILE
    info = {"task": name, "meta": meta, "auto": job.auto, "test": trained.test, "runtime": trained.runtime.describe(),
            **counts,
            "epochs": epochs, **({"chosen": trained.chosen} if trained.chosen else {}),
            **({"stopping": result.stopping} if result.stopping else {}),
            "history": curve_rows(result.history, trained.task.primary_metric)}
    save_model(result.model, job.model_dir, files, {"info.json": info, **extras.json})
    weights_md5 = model_md5(job.model_dir)
    tracker.set_tags({"model_md5": weights_md5})
    write_history(result.history, job.reports_dir / "history.csv")
    write_json(job.reports_dir / "metrics.json", headline_metrics(summary, trained.task))
    reproduce = {"fingerprint": trained.fingerprint, "trail": result.trail, "rerun": job.rerun,
                 "history": [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in result.history],
                 "test": trained.test}
    record = {"mlflow_run_id": tracker.run_id, "model_md5": weights_md5, "timing": timing,
              "environment": environment(trained.runtime.device), **reproduce}
    write_json(job.reports_dir / RUN_RECORD, record)
    tracker.log_dict({**reproduce, "model_md5": weights_md5, "timing": timing}, TRAIL_ARTIFACT)
    log_model(job, trained, tracker, test_split)
    return record


def log_model(job: TrainingJob, trained: Trained, tracker, test_split: dict[str, torch.Tensor]) -> None:
    """The history and config as artifacts and the model in MLflow (registered when tracking.register_models): an
    MLflow pyfunc on raw inputs (trainlab.serving) where the task has one, with a few raw test inputs as its
    example."""
    from trainlab.serving.flavor import raw_example, served

    name = job.name
    tracker.log_artifact(job.reports_dir / "history.csv")
    tracker.log_artifact(job.model_dir / "config.json", "model_files")
    model = trained.fit.model.eval().float().cpu().to(memory_format=torch.contiguous_format)
    registered = f"trainlab-{name}" if job.params.tracking.register_models else None
    raw = served(name, job.model_dir)
    tracker.log_model(model, name=name, input_example=input_example(test_split, trained.task).cpu(),
                      registered_model_name=registered, model_dir=job.model_dir if raw else None,
                      raw_example=raw_example(name, test_split, job.data_dir) if raw else None,
                      tensor_model=job.params.tracking.log_tensor_model)
