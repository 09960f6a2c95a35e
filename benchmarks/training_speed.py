"""Training throughput and test quality: the engine vs a plain PyTorch loop (and Lightning for the classifier)."""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from dataclasses import dataclass
from typing import Any

from benchmarks.common import (
    SEED,
    Comparison,
    CpuClock,
    PartResult,
    Skip,
    TaskData,
    alternate,
    engine_runtime,
    fmt,
    fp32_runtime,
    log,
    quiet_stderr,
    reset_global_flags,
    synchronize,
    table,
    task_data,
)

MODELS = ("classifier", "segmenter", "text")
WARMUP_STEPS = 3
VAL_SAMPLES = 64  # the engine validates after each epoch (outside its timed training time): keep that short


@dataclass(frozen=True)
class ModelSetup:
    """One model's comparison: the training recipe shared by every contender and how much data it sees."""

    name: str
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    train_samples: int | None  # None: the whole train split
    test_samples: int | None = None
    lightning: bool = False
    init: str = "kaiming"  # params.yaml's init for the model

    def train_params(self):
        """The recipe every contender follows: AdamW with the engine's betas and a per-step cosine LR decay (no
        warm-up), no augmentation, no label smoothing, no clipping. Only the speed settings differ."""
        from trainlab.core.config import ClassifierParams, SegmenterParams, TextParams

        common = {"epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr,
                  "weight_decay": self.weight_decay, "augment": False, "label_smoothing": 0.0, "grad_clip": None,
                  "warmup_epochs": 0.0, "schedule": "cosine", "ema_decay": None, "optimizer": "adamw",
                  "init": self.init}
        if self.name == "text":  # the Transformer, not params.yaml's TF-IDF bag (almost no FLOPs to measure)
            return TextParams(**common, arch="transformer")
        kind = {"classifier": ClassifierParams, "segmenter": SegmenterParams}[self.name]
        return kind(**common)


ADAMW_BETAS = (0.9, 0.95)  # trainlab.engine.optim's betas; the plain contenders use the same, so only speed differs

# The models and batch sizes of params.yaml. Full: every classifier training sample (3,500) for 3 epochs;
# the segmenter and the text model on a prefix of their train split, to keep the whole suite near 10 minutes on
# a quiet 2-core CPU. Quick: a smoke version (the models stay far from trained: its test metrics mean nothing).
SCALES: dict[str, dict[str, ModelSetup]] = {
    "full": {
        "classifier": ModelSetup("classifier", epochs=3, batch_size=128, lr=3e-3, weight_decay=0.05,
                                 train_samples=None, lightning=True),
        "segmenter": ModelSetup("segmenter", epochs=1, batch_size=32, lr=3e-3, weight_decay=0.01,
                                train_samples=2048, test_samples=512),
        "text": ModelSetup("text", epochs=1, batch_size=128, lr=1e-3, weight_decay=0.01,
                           train_samples=8192, test_samples=4096, init="xavier"),
    },
    "quick": {
        "classifier": ModelSetup("classifier", epochs=1, batch_size=128, lr=3e-3, weight_decay=0.05,
                                 train_samples=1024, test_samples=500, lightning=True),
        "segmenter": ModelSetup("segmenter", epochs=1, batch_size=32, lr=3e-3, weight_decay=0.01,
                                train_samples=192, test_samples=128),
        "text": ModelSetup("text", epochs=1, batch_size=128, lr=1e-3, weight_decay=0.01,
                           train_samples=1536, test_samples=1024, init="xavier"),
    },
}


def build(setup: ModelSetup, data: TaskData, seed: int, cfg=None):
    """The pipeline's own Trainable for the model (same init for every contender given the same seed)."""
    from trainlab.core.config import Params
    from trainlab.core.repro import seed_everything
    from trainlab.jobs.train import build_trainable

    cfg = cfg or setup.train_params()
    seed_everything(seed)
    return build_trainable(setup.name, Params(**{setup.name: cfg}), data.meta)


def test_quality(task, model, data: TaskData, device) -> dict[str, float]:
    """The task's test metrics of `model`, evaluated the same way for every contender: fp32, eval mode."""
    from trainlab.engine.loop import evaluate, scalars

    return scalars(evaluate(task, model, data.test, fp32_runtime(device), batch_size=256))


def plain_tensors(task, data: dict[str, Any]):
    """Float inputs and targets for a TensorDataset, made once before timing (what most scripts do)."""
    return task.prepare_batch(data, False, None)


def engine_order_sampler(n: int, seed: int):
    """A sampler giving the engine's shuffle order (DeviceBatches.order: a permutation per epoch from the seed), so
    every contender sees the same batches and accuracy differences come from the arithmetic, not the order. It
    costs what shuffle=True's RandomSampler costs."""
    import torch

    from trainlab.core.repro import generator

    class EngineOrder(torch.utils.data.Sampler):
        def __init__(self):
            self.epoch = 0

        def __len__(self) -> int:
            return n

        def __iter__(self):
            idx = torch.randperm(n, generator=generator(seed, "shuffle", self.epoch))
            self.epoch += 1
            return iter(idx.tolist())

    return EngineOrder()


def plain_loader(task, data: TaskData, cfg, seed: int):
    """DataLoader(TensorDataset(float inputs, targets), batch_size, drop_last) in the engine's order."""
    from torch.utils.data import DataLoader, TensorDataset

    x, y = plain_tensors(task, data.train)
    return DataLoader(TensorDataset(x, y), batch_size=cfg.batch_size, sampler=engine_order_sampler(len(y), seed),
                      drop_last=True)


def cosine_schedule(optimizer, cfg, steps_per_epoch: int):
    """The engine's LR schedule (trainlab.engine.optim), per optimizer step."""
    from trainlab.engine.optim import build_scheduler

    total = cfg.epochs * steps_per_epoch
    return build_scheduler(optimizer, total, min(round(cfg.warmup_epochs * steps_per_epoch), total), cfg.schedule)


# --- contenders ------------------------------------------------------------------------------------------------------

def engine_contender(setup: ModelSetup, data: TaskData, runtime):
    from trainlab.engine.loop import FitOptions, fit

    def run(repeat: int, warm: bool) -> dict[str, Any]:
        seed = SEED + max(repeat, 0)
        cfg = setup.train_params()
        if warm:
            cfg = cfg.model_copy(update={"epochs": 1, "max_steps": WARMUP_STEPS})
        task = build(setup, data, seed, cfg)
        val = {k: v[:VAL_SAMPLES] for k, v in data.val.items()}
        with quiet_stderr(), CpuClock() as clock:
            result = fit(task, data.train, val, cfg, runtime, seed=seed, options=FitOptions(eval_batch_size=256))
        out = {"samples_per_s": result.samples_per_s, "train_s": result.train_time_s, "call_wall_s": clock.wall,
               "cpu_per_wall": clock.cpu / max(clock.wall, 1e-9)}
        if not warm:
            out.update({f"test_{k}": v for k, v in test_quality(task, result.model, data, runtime.device).items()})
        return out

    return run


def plain_contender(setup: ModelSetup, data: TaskData, device):
    """A DataLoader over a TensorDataset of float tensors, fp32, default memory layout, AdamW."""
    import torch

    def run(repeat: int, warm: bool) -> dict[str, Any]:
        reset_global_flags()
        seed = SEED + max(repeat, 0)
        cfg = setup.train_params()
        task = build(setup, data, seed, cfg)
        model = task.model.to(device)
        loader = plain_loader(task, data, cfg, seed)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=ADAMW_BETAS, weight_decay=cfg.weight_decay)
        scheduler = cosine_schedule(opt, cfg, len(loader))
        limit = WARMUP_STEPS if warm else None
        seen, steps = 0, 0
        with CpuClock() as clock:
            model.train()
            t0 = time.perf_counter()
            for _ in range(cfg.epochs):
                for xb, yb in loader:
                    xb, yb = xb.to(device), yb.to(device)
                    loss = task.loss_fn(model(xb), yb)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    scheduler.step()
                    seen += len(yb)
                    steps += 1
                    if limit and steps >= limit:
                        break
                if limit and steps >= limit:
                    break
            synchronize(device)
            train_s = time.perf_counter() - t0
        out = {"samples_per_s": seen / train_s, "train_s": train_s, "call_wall_s": clock.wall,
               "cpu_per_wall": clock.cpu / max(clock.wall, 1e-9)}
        if not warm:
            out.update({f"test_{k}": v for k, v in test_quality(task, model, data, device).items()})
        return out

    return run


def lightning_contender(setup: ModelSetup, data: TaskData, device):
    """Lightning's Trainer on the same model, data loader and AdamW: precision '32-true' (its default), no progress
    bar, logger or checkpointing. Timed from on_train_start to on_train_end (Trainer setup excluded)."""
    try:
        import lightning.pytorch as pl
    except ImportError:
        pl = None

    def run(repeat: int, warm: bool) -> dict[str, Any]:
        if pl is None:
            raise Skip("lightning is not installed (pip install -e '.[bench]')")
        reset_global_flags()
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            logging.getLogger(name).setLevel(logging.ERROR)
        seed = SEED + max(repeat, 0)
        cfg = setup.train_params()
        task = build(setup, data, seed, cfg)
        loader = plain_loader(task, data, cfg, seed)
        timer = lightning_timer(pl, device)
        trainer = pl.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=1,
                             precision="32-true", max_epochs=cfg.epochs, max_steps=WARMUP_STEPS if warm else -1,
                             enable_progress_bar=False, logger=False, enable_checkpointing=False,
                             enable_model_summary=False, num_sanity_val_steps=0, callbacks=[timer])
        module = lightning_module(pl, task, cfg, len(loader))
        with warnings.catch_warnings(), CpuClock() as clock:
            warnings.simplefilter("ignore")
            trainer.fit(module, train_dataloaders=loader)
        train_s = timer.t1 - timer.t0
        out = {"samples_per_s": timer.samples / train_s, "train_s": train_s, "call_wall_s": clock.wall,
               "cpu_per_wall": clock.cpu / max(clock.wall, 1e-9)}
        if not warm:  # Trainer.fit leaves the module on the CPU when it ends
            model = module.model.to(device)
            out.update({f"test_{k}": v for k, v in test_quality(task, model, data, device).items()})
        return out

    return run


def lightning_module(pl, task, cfg, steps_per_epoch: int):
    """The LightningModule wrapping the task's model and loss, with the plain loop's AdamW and per-step schedule."""
    import torch

    class LitTask(pl.LightningModule):
        def __init__(self, model, loss_fn):
            super().__init__()
            self.model, self.loss_fn = model, loss_fn

        def training_step(self, batch, batch_idx):
            x, y = batch
            return self.loss_fn(self.model(x), y)

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=cfg.lr, betas=ADAMW_BETAS, weight_decay=cfg.weight_decay)
            schedule = cosine_schedule(opt, cfg, steps_per_epoch)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    return LitTask(task.model, task.loss_fn)


def lightning_timer(pl, device):
    """A callback counting the samples trained and timing on_train_start to on_train_end (synchronised)."""

    class Timer(pl.Callback):
        def __init__(self):
            self.samples, self.t0, self.t1 = 0, 0.0, 0.0

        def on_train_start(self, trainer, module):
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.samples += len(batch[1])

        def on_train_end(self, trainer, module):
            synchronize(device)
            self.t1 = time.perf_counter()

    return Timer()


def bare_contender(setup: ModelSetup, data: TaskData, runtime, graph: bool):
    """The hand-written step (benchmarks.bare) in a loop over the data on the device, in the engine's order and
    precision; `graph`: the whole step captured as one CUDA graph. Timed from building the step (the capture
    included) to the last update, like the engine's training time."""
    import torch

    from benchmarks.bare import bare_step
    from trainlab.core.repro import generator
    from trainlab.engine.optim import warmup_cosine

    def run(repeat: int, warm: bool) -> dict[str, Any]:
        if graph and runtime.device.type != "cuda":
            raise Skip("a CUDA graph needs a CUDA device")
        seed = SEED + max(repeat, 0)
        cfg = setup.train_params()
        task = build(setup, data, seed, cfg)
        dev, size = runtime.device, cfg.batch_size
        model = task.model.to(dev)
        if task.conv and runtime.channels_last:
            model = model.to(memory_format=torch.channels_last)
        model.train()
        train = {k: v.to(dev) for k, v in data.train.items()}
        n = len(next(iter(train.values())))
        per_epoch = n // size
        total = cfg.epochs * per_epoch
        limit = WARMUP_STEPS if warm else total
        steps = 0
        synchronize(dev)
        with CpuClock() as clock:
            t0 = time.perf_counter()
            step = bare_step(task, model, cfg, runtime, {k: v[:size] for k, v in train.items()}, graph, seed,
                             warmup_cosine(total, 0, cfg.schedule))
            for epoch in range(cfg.epochs):
                idx = torch.randperm(n, generator=generator(seed, "shuffle", epoch)).to(dev)
                for i in range(min(per_epoch, limit - steps)):
                    sel = idx[i * size:(i + 1) * size]
                    step({k: v[sel] for k, v in train.items()})
                    steps += 1
            synchronize(dev)
            train_s = time.perf_counter() - t0
        out = {"samples_per_s": steps * size / train_s, "train_s": train_s, "call_wall_s": clock.wall,
               "cpu_per_wall": clock.cpu / max(clock.wall, 1e-9)}
        if not warm:
            out.update({f"test_{k}": v for k, v in test_quality(task, model, data, dev).items()})
        return out

    return run


# --- the part ----------------------------------------------------------------------------------------------------

def primary_metric(name: str) -> str:
    return {"classifier": "test_accuracy", "segmenter": "test_mean_iou", "text": "test_accuracy"}[name]


def compare_model(setup: ModelSetup, repeats: int, device: str, compile: bool = False) -> dict[str, Any]:
    """Engine, plain (and Lightning) alternating on one model; medians, spreads and engine/other ratios."""
    from trainlab.profiling.flops import flops_per_step

    data = task_data(setup.name).subset(setup.train_samples, setup.test_samples)
    runtime = engine_runtime(device, compile)
    contenders = {"engine": engine_contender(setup, data, runtime),
                  "plain": plain_contender(setup, data, runtime.device),
                  "bare eager": bare_contender(setup, data, runtime, graph=False),
                  "bare graph": bare_contender(setup, data, runtime, graph=True)}
    if setup.lightning:
        contenders["lightning"] = lightning_contender(setup, data, runtime.device)
    metric = primary_metric(setup.name)
    comparison: Comparison = alternate(contenders, repeats, what=setup.name)
    keys = ["samples_per_s", "train_s", "call_wall_s", "cpu_per_wall", metric]
    summary = comparison.summary(keys)
    summary["ratios"] = {f"engine/{other}": comparison.ratio("engine", other, "samples_per_s")
                         for other in comparison.repeats if other != "engine"}
    summary["metric_gap_points"] = {
        f"engine-{other}": (100 * (comparison.median("engine", metric) - comparison.median(other, metric))
                            if comparison.median(other, metric) is not None else None)
        for other in comparison.repeats if other != "engine"}
    task = build(setup, data, SEED)
    batch = {k: v[:setup.batch_size] for k, v in data.train.items()}
    flops = flops_per_step(task, batch)
    summary.update({
        "setup": dataclasses.asdict(setup), "metric": metric, "engine_settings": runtime.describe(),
        "train_samples": len(next(iter(data.train.values()))), "test_samples": len(next(iter(data.test.values()))),
        "data_source": data.source, "train_flop_per_sample": flops["train"] / setup.batch_size,
        "recipe": setup.train_params().model_dump(),
    })
    return summary


CONTENDER_SETTINGS = {
    "engine": "{precision}{cl}, data on the device, foreach AdamW",
    "plain": "fp32, DataLoader(TensorDataset), default layout, for-loop AdamW",
    "lightning": "Trainer, precision 32-true, same DataLoader and AdamW",
    "bare eager": "hand-written step, {precision}{cl}, data on the device, fused AdamW (CUDA)",
    "bare graph": "hand-written step captured as one CUDA graph, {precision}{cl}, capturable fused AdamW",
}


def markdown(results: dict[str, dict[str, Any]]) -> str:
    rows = []
    for name, r in results.items():
        eng = r["engine_settings"]
        cl = ", channels_last" if eng["runtime_channels_last"] == "True" and name != "text" else ""
        compiled = ", compiled" if eng["runtime_compile"] == "True" else ""
        for contender in r["median"]:
            m, s = r["median"][contender], r["spread"][contender]
            ratio = r["ratios"].get(f"engine/{contender}", {}).get("ratio_of_medians")
            settings = CONTENDER_SETTINGS[contender].format(precision=eng["runtime_precision"], cl=cl + compiled)
            rows.append([name, contender, settings, fmt(m["samples_per_s"]), fmt(s["samples_per_s"], "pct"),
                         fmt(m[r["metric"]] and 100 * m[r["metric"]]), fmt(m["cpu_per_wall"]),
                         fmt(ratio, "x") if contender != "engine" else "–"])
        for contender, why in r["skipped"].items():
            rows.append([name, contender, f"skipped: {why}", "–", "–", "–", "–", "–"])
    header = ["model", "contender", "settings", "train samples/s (median)", "spread", "test metric %",
              "CPU s / wall s", "engine / this"]
    lines = ["## Training throughput: engine vs plain loop vs Lightning", "", table(header, rows), ""]
    for name, r in results.items():
        setup = r["setup"]
        n = len(r["repeats"].get("engine", []))
        lines.append(f"- {name}: {r['train_samples']:,} train samples × {setup['epochs']} epoch(s), batch "
                     f"{setup['batch_size']}, test metric {r['metric']} on {r['test_samples']:,} samples; "
                     f"{n} alternating repeats after a warm-up; paired ratios " + ", ".join(
                         f"{k} {fmt(v['median_of_paired_ratios'], 'x')}" for k, v in r["ratios"].items()) + ".")
    lines += ["", ("Test metric: evaluated identically for every contender (fp32, eval mode). Engine/this: ratio of "
                   "median throughputs. CPU s / wall s near the thread count means the process had the cores to "
                   "itself; much lower means the machine was busy and the figures are noisy.")]
    return "\n".join(lines) + "\n"


def run(quick: bool, repeats: int, device: str, models: tuple[str, ...] = MODELS,
        compile: bool = False, epochs: int = 0) -> PartResult:
    t0 = time.perf_counter()
    scale = SCALES["quick" if quick else "full"]
    results = {}
    for name in models:
        setup = dataclasses.replace(scale[name], epochs=epochs) if epochs else scale[name]
        log(f"training speed: {name}")
        results[name] = compare_model(setup, repeats, device, compile)
    headline = {}
    if "classifier" in results:
        r = results["classifier"]
        headline["classifier_engine_over_plain"] = r["ratios"].get("engine/plain", {}).get("ratio_of_medians")
        headline["classifier_engine_over_lightning"] = r["ratios"].get("engine/lightning", {}).get(
            "ratio_of_medians")
        gaps = [abs(v) for v in r["metric_gap_points"].values() if v is not None]
        headline["classifier_max_accuracy_gap_points"] = max(gaps) if gaps else None
        headline["classifier_engine_test_accuracy"] = r["median"].get("engine", {}).get("test_accuracy")
    for name, r in results.items():
        for other in ("bare eager", "bare graph", "lightning"):
            ratio = r["ratios"].get(f"engine/{other}", {}).get("ratio_of_medians")
            if ratio is not None:
                headline[f"{name}_engine_over_{other.replace(' ', '_')}"] = ratio
    return PartResult("training_speed", results, markdown(results), headline, time.perf_counter() - t0)
