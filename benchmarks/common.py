"""Shared benchmark helpers: alternating timed contenders, medians and ratios, data, engine settings, tables, JSON."""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Self

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "reports" / "bench"
SEED = 42  # the data split seed (base.seed's default): the same split the pipeline prepares

Measurement = dict[str, Any]

# The text Transformer with the recipe docs/data.md gives for it (params.yaml's text default is the TF-IDF bag, which
# has almost no FLOPs: the speed and MFU parts measure the Transformer, the text model with compute in it)
TRANSFORMER_TEXT: dict[str, Any] = {
    "arch": "transformer", "optimizer": "adamw", "d_model": 128, "n_heads": 4, "n_layers": 2, "dim_feedforward": 256,
    "dropout": 0.1, "embedding_dropout": 0.1, "epochs": 4, "lr": 0.001, "batch_size": 128, "weight_decay": 0.01,
    "label_smoothing": 0.0, "warmup_epochs": 1}


def log(message: str) -> None:
    """Progress lines go to stderr, so stdout carries only the tables."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- alternating contenders --------------------------------------------------------------------------------------

@dataclass
class Comparison:
    """Per contender, one measurement dict per timed repeat (in the order they ran), plus the warm-up ones."""

    repeats: dict[str, list[Measurement]] = field(default_factory=dict)
    warmup: dict[str, Measurement] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # the run order, e.g. [A, B, C, A, B, C, ...]
    skipped: dict[str, str] = field(default_factory=dict)  # contender -> why

    def values(self, contender: str, key: str) -> list[float]:
        return [float(m[key]) for m in self.repeats.get(contender, []) if m.get(key) is not None]

    def median(self, contender: str, key: str) -> float | None:
        values = self.values(contender, key)
        return statistics.median(values) if values else None

    def spread(self, contender: str, key: str) -> float | None:
        """(max - min) / median of the repeats: how noisy the machine was."""
        values = self.values(contender, key)
        med = statistics.median(values) if values else 0.0
        return (max(values) - min(values)) / med if values and med else None

    def ratio(self, a: str, b: str, key: str) -> dict[str, float | None]:
        """a/b as the ratio of the medians, and as the median of the per-repeat ratios (a_i / b_i, same round)."""
        ma, mb = self.median(a, key), self.median(b, key)
        pairs = [x / y for x, y in zip(self.values(a, key), self.values(b, key)) if y]
        return {"ratio_of_medians": ma / mb if ma is not None and mb else None,
                "median_of_paired_ratios": statistics.median(pairs) if pairs else None}

    def summary(self, keys: Sequence[str]) -> dict[str, Any]:
        out: dict[str, Any] = {"order": self.order, "skipped": self.skipped, "warmup": self.warmup,
                               "repeats": self.repeats, "median": {}, "spread": {}}
        for name in self.repeats:
            out["median"][name] = {k: self.median(name, k) for k in keys}
            out["spread"][name] = {k: self.spread(name, k) for k in keys}
        return out


def alternate(contenders: Mapping[str, Callable[[int, bool], Measurement]], repeats: int,
              warmup: bool = True, what: str = "") -> Comparison:
    """Run the contenders A, B, C, A, B, C, ... `repeats` times each, after one warm-up call of each.

    Each contender is `fn(repeat, warmup) -> measurement dict`; `repeat` is 0.. for the timed calls (use it to vary
    the seed the same way for every contender) and -1 for the warm-up. A contender that raises
    `Skip` is dropped with its reason.
    """
    result = Comparison(repeats={name: [] for name in contenders})
    live = dict(contenders)
    if warmup:
        for name, fn in list(live.items()):
            try:
                t0 = time.perf_counter()
                result.warmup[name] = fn(-1, True)
                log(f"{what} warm-up {name}: {time.perf_counter() - t0:.1f} s")
            except Skip as why:
                result.skipped[name] = str(why)
                result.repeats.pop(name)
                live.pop(name)
                log(f"{what} {name}: skipped ({why})")
    for r in range(repeats):
        for name, fn in list(live.items()):
            t0 = time.perf_counter()
            try:
                m = fn(r, False)
            except Skip as why:
                result.skipped[name] = str(why)
                result.repeats.pop(name)
                live.pop(name)
                log(f"{what} {name}: skipped ({why})")
                continue
            result.repeats[name].append(m)
            result.order.append(name)
            shown = ", ".join(f"{k} {_short(v)}" for k, v in m.items() if isinstance(v, (int, float)))
            log(f"{what} repeat {r + 1}/{repeats} {name}: {shown} [{time.perf_counter() - t0:.1f} s]")
    return result


class Skip(Exception):
    """A contender that cannot run here (a package missing, no GPU): reported, not fatal."""


def _short(v: float) -> str:
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.4g}"
    return str(v)


@contextlib.contextmanager
def quiet_stderr() -> Iterator[io.StringIO]:
    """Swallow the engine's progress lines (a tqdm bar on a terminal) while a contender runs."""
    buffer = io.StringIO()
    with contextlib.redirect_stderr(buffer):
        yield buffer


class CpuClock:
    """Wall and process CPU seconds of a block: CPU time / wall time shows how much of the machine it got."""

    def __enter__(self) -> Self:
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0


# --- machine and settings ----------------------------------------------------------------------------------------

def device_name(device) -> str:
    from trainlab.jobs.profile import device_name as name

    return name(device)


def environment(device) -> dict[str, Any]:
    """What the figures depend on: device, threads, versions, load when the run started."""
    import torch

    env: dict[str, Any] = {
        "device": str(device), "device_name": device_name(device), "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "python": platform.python_version(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    with contextlib.suppress(OSError):
        env["load_average_at_start"] = os.getloadavg()
    from importlib import metadata

    with contextlib.suppress(metadata.PackageNotFoundError):
        env["lightning"] = metadata.version("lightning")
    return env


def engine_runtime(device: str = "auto", compile: bool = False):
    """The engine's best settings for the device: precision auto (bf16 where the hardware has it), channels_last,
    non-deterministic kernels allowed (cudnn.benchmark on CUDA), torch.compile only when asked."""
    from trainlab.core.config import BaseParams
    from trainlab.core.runtime import resolve_runtime

    return resolve_runtime(BaseParams(device=device, precision="auto", channels_last=True, deterministic=False,
                                      compile=compile))


def fp32_runtime(device):
    """fp32, default (contiguous) layout: how the plain contenders' models are evaluated and stepped."""
    import dataclasses

    runtime = engine_runtime(str(device))
    return dataclasses.replace(runtime, precision="fp32", channels_last=False, compile=False)


def reset_global_flags() -> None:
    """Undo the process-wide switches the engine's runtime sets (cudnn.benchmark), so plain contenders run with
    PyTorch's defaults as most scripts do."""
    import torch

    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = False


def synchronize(device) -> None:
    from trainlab.profiling.peaks import synchronize as sync

    sync(device)


# --- data ----------------------------------------------------------------------------------------------------------

@dataclass
class TaskData:
    """Train/val/test tensors of one task (uint8 images, int64 labels, uint8 masks, int64 token ids) and the meta
    dict the pipeline's `build_trainable` needs."""

    name: str
    train: dict[str, Any]
    val: dict[str, Any]
    test: dict[str, Any]
    meta: dict[str, Any]
    source: str

    def subset(self, train_samples: int | None, test_samples: int | None = None) -> TaskData:
        """The first samples of each split (the splits are stratified and shuffled, so a prefix is balanced)."""
        cut = lambda split, n: {k: v[:n] for k, v in split.items()} if n else split
        return TaskData(self.name, cut(self.train, train_samples), self.val, cut(self.test, test_samples),
                        self.meta, self.source)


def canonical(tensor):
    """The tensor with the standard strides of its shape, as `load_split` (safetensors) returns it. Arrays made by
    numpy's `x[:, None]` carry stride 1 on the size-1 channel axis, which PyTorch reads as channels_last: a
    1-channel conv net would then silently run channels_last even in a "default layout" setting."""
    import torch

    return tensor.clone(memory_format=torch.contiguous_format)


@cache
def task_data(name: str) -> TaskData:
    """The embedded default data of `name`, split exactly as `python -m stages.prepare` splits it (base.seed 42)."""
    import torch

    from trainlab.core.config import DataParams
    from trainlab.data import sources

    data = DataParams()
    if name == "classifier":
        s = sources.classification_splits(data, SEED)
        split = {k: {"images": canonical(torch.from_numpy(s.images[k])), "labels": torch.from_numpy(s.labels[k])}
                 for k in s.images}
        first = s.images["train"]
        meta = {"num_classes": len(s.class_names), "channels": first.shape[1]}
        return TaskData(name, split["train"], split["val"], split["test"], meta, s.description)
    if name == "segmenter":
        s = sources.segmentation_splits(data, SEED)
        split = {k: {"images": canonical(torch.from_numpy(s.images[k])),
                     "masks": canonical(torch.from_numpy(s.masks[k]))} for k in s.images}
        meta = {"num_classes": len(s.class_names), "channels": s.images["train"].shape[1]}
        return TaskData(name, split["train"], split["val"], split["test"], meta, s.description)
    if name == "text":
        from trainlab.data.tokenizer import PAD_ID, Tokenizer

        cfg = data.text
        labeled = sources.text_source(data)
        parts = sources.text_splits(labeled, data, SEED)
        texts = {k: [labeled.texts[i] for i in idx] for k, idx in parts.items()}
        tokenizer = Tokenizer.fit(texts["train"], cfg.vocab_size, cfg.min_frequency, cfg.max_length)
        split = {}
        for k in parts:
            tokens, _ = tokenizer.encode_with_lengths(texts[k])
            split[k] = {"tokens": tokens, "labels": torch.from_numpy(labeled.labels[parts[k]])}
        meta = {"num_classes": len(labeled.class_names), "vocab_size": tokenizer.vocab_size,
                "max_length": tokenizer.max_length, "pad_id": PAD_ID}
        return TaskData(name, split["train"], split["val"], split["test"], meta,
                        sources.text_description(labeled, data))
    raise ValueError(f"unknown task {name!r}")


# --- output ----------------------------------------------------------------------------------------------------------

def fmt(value: Any, kind: str = "") -> str:
    if value is None:
        return "–"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    if kind == "x":
        return f"{value:.2f}x"
    if kind == "s":
        return f"{value:.2f} s"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_json(path: Path, data: Any) -> None:
    """Atomically (temp file, then rename), so a killed run never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
    os.replace(tmp, path)


def write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


@dataclass
class PartResult:
    """What one benchmark part hands back: its JSON data, a markdown section and the headline figures."""

    name: str
    data: dict[str, Any]
    markdown: str
    headline: dict[str, Any] = field(default_factory=dict)  # figures checked against the targets
    seconds: float = 0.0
