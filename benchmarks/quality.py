"""Default params on real data a user could bring: each data set's test figure, training time, speed and peak RSS.

    python -m benchmarks --only quality                              # every data set (about half an hour on 2 cores)
    python -m benchmarks.quality --only-sets cats_dogs,bbc_news      # some data sets
    python -m benchmarks.quality --quick                             # sliced data, few steps: the machinery only
    python -m benchmarks.quality --only-sets drive --slice 12 --max-steps 2 --keep-workspace
    python -m benchmarks.quality --only-sets cats_dogs --seeds 42,43,44     # the sets named: mean and spread of 3 seeds
    python -m benchmarks.quality --only-sets cats_dogs --set classifier.patience=5   # params.yaml with a change

params.yaml as it is, with only the data source and its path set (as a user would), on every data set of
../shared/data/quality/ (--data DIR or $QUALITY_DATA elsewhere; see its README) and on the embedded default data.
Each data set is prepared and trained in its own child process (`--one NAME`, in a temporary working folder, no
DVC, no MLflow), so that its peak RSS is its own. A data set that fails (or whose files are missing) is a FAILED
row and the others still run; the command exits 1 when a row FAILED, 0 when every row ran (the verdicts against
the targets are information).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import DEFAULT_OUT, REPO, PartResult, fmt, log, table, write_json

QUALITY_DATA = REPO.parent / "shared" / "data" / "quality"
DATA_ENV = "QUALITY_DATA"  # another folder of the same layout
RESULT_FILE = "result.json"  # what a child writes into its working folder
QUICK_SLICE, QUICK_STEPS = 16, 3  # --quick: at most 16 files per class, pairs or rows per label; 3 optimizer steps
MIB = 1024  # ru_maxrss is in KiB on Linux


@dataclass(frozen=True)
class DataSet:
    """One row: the task it trains, its files under the quality folder (None: the embedded default data) and, for
    the real images, the least test accuracy (classifier) or foreground Dice (segmenter) that meets its target."""

    task: str  # classifier | segmenter | text
    path: str | None
    target: float | None = None
    small: bool = False  # a test split of a few hundred samples or less: one seed (and its split) is one draw


SETS = {
    "fashion_mnist": DataSet("classifier", "FashionMNIST/raw", 0.94),
    "cats_dogs": DataSet("classifier", "cats_dogs", 0.78, small=True),
    "drive": DataSet("segmenter", "drive", 0.78, small=True),
    "crackforest": DataSet("segmenter", "crackforest", 0.55, small=True),
    "bbc_news": DataSet("text", "text/bbc_news.csv", small=True),
    "reuters_r8": DataSet("text", "text/reuters_r8.csv"),
    "embedded_classifier": DataSet("classifier", None),
    "embedded_segmenter": DataSet("segmenter", None),
    "embedded_text": DataSet("text", None),
}
PREPARED_FOLDER = {"classifier": "classification", "segmenter": "segmentation", "text": "text"}


def data_folder(given: Path | None = None) -> Path:
    """--data, else $QUALITY_DATA, else ../shared/data/quality beside the checkout."""
    return Path(given or os.environ.get(DATA_ENV) or QUALITY_DATA)


def missing_files(name: str, data_dir: Path) -> str | None:
    """Why the data set cannot be read here, or None."""
    path = SETS[name].path
    if path is None or (data_dir / path).exists():
        return None
    return f"missing: {data_dir / path} (--data DIR or ${DATA_ENV} names the folder of the quality data sets)"


def data_overrides(name: str, source: Path | None) -> dict[str, Any]:
    """The dotted params a user would set to train on `source` (the data set's files); none for embedded data."""
    if source is None:
        return {}
    task = SETS[name].task
    if task == "classifier" and name == "fashion_mnist":  # source is <root>/FashionMNIST/raw
        return {"data.classification.source": "fashion_mnist", "data.classification.root": str(source.parent.parent)}
    if task == "classifier":
        return {"data.classification.source": "image_folder", "data.classification.root": str(source)}
    if task == "segmenter":
        return {"data.segmentation.source": "paired_folders", "data.segmentation.root": str(source),
                "data.segmentation.num_classes": 2}
    return {"data.text.source": "csv", "data.text.path": str(source)}


# --- slices (--slice N): small copies of the data sets in the working folder --------------------------------------

def visible(folder: Path, dirs: bool = False) -> list[Path]:
    """The folder's sub-folders (or files) not hidden, sorted by name."""
    return sorted(p for p in folder.iterdir() if (p.is_dir() if dirs else p.is_file()) and not p.name.startswith("."))


def slice_class_folders(src: Path, dst: Path, n: int) -> dict[str, int]:
    """The first `n` files (by name) of each class folder of `src` copied to `dst`; files per class."""
    counts = {}
    for folder in visible(src, dirs=True):
        (dst / folder.name).mkdir(parents=True, exist_ok=True)
        files = visible(folder)[:n]
        for f in files:
            shutil.copy2(f, dst / folder.name / f.name)
        counts[folder.name] = len(files)
    return counts


def slice_pairs(src: Path, dst: Path, n: int) -> int:
    """The first `n` images (by name) of `src`/images and their masks (same stem) copied to `dst`; other folders
    (DRIVE's fov/) are left out. Returns the number of images copied."""
    from trainlab.data.folders import CLASS_NAMES_FILE, IMAGES_DIR, MASKS_DIR

    images = visible(src / IMAGES_DIR)[:n]
    masks = {f.stem: f for f in visible(src / MASKS_DIR)}
    for sub in (IMAGES_DIR, MASKS_DIR):
        (dst / sub).mkdir(parents=True, exist_ok=True)
    for image in images:
        shutil.copy2(image, dst / IMAGES_DIR / image.name)
        if image.stem in masks:  # a missing mask is left for prepare to report
            shutil.copy2(masks[image.stem], dst / MASKS_DIR / masks[image.stem].name)
    if (src / CLASS_NAMES_FILE).is_file():
        shutil.copy2(src / CLASS_NAMES_FILE, dst / CLASS_NAMES_FILE)
    return len(images)


def slice_csv(src: Path, dst: Path, n: int, label_column: str = "label", delimiter: str = ",") -> dict[str, int]:
    """The first `n` rows of each label of the CSV `src` written to `dst` in their order (every label kept);
    rows per label."""
    import pandas as pd

    rows = pd.read_csv(src, sep=delimiter, dtype=str, keep_default_na=False, encoding="utf-8")
    kept = rows.groupby(label_column, sort=False).head(n)
    dst.parent.mkdir(parents=True, exist_ok=True)
    kept.to_csv(dst, sep=delimiter, index=False)
    return {str(k): int(v) for k, v in kept[label_column].value_counts(sort=False).items()}


def read_idx_gz(path: Path):
    """A gzipped uint8 IDX file (MNIST's format) as a NumPy array."""
    import gzip

    import numpy as np

    raw = gzip.decompress(path.read_bytes())
    if raw[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path}: not a uint8 IDX file")
    ndim = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def write_idx_gz(path: Path, array) -> None:
    import gzip

    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    path.write_bytes(gzip.compress(header + array.tobytes(), mtime=0))


def slice_idx(src: Path, dst: Path, n: int) -> dict[str, int]:
    """Of each split's gzipped IDX pair in `src` (torchvision's raw MNIST layout), the first `n` samples of each
    label written to `dst` in their order (the first `n` alone may leave a class out); samples per split."""
    import numpy as np

    from trainlab.data.torchvision_raw import MNIST_FILES

    dst.mkdir(parents=True, exist_ok=True)
    counts = {}
    for split, (images_name, labels_name) in MNIST_FILES.items():
        labels = read_idx_gz(src / f"{labels_name}.gz")
        keep = np.sort(np.concatenate([np.flatnonzero(labels == c)[:n] for c in np.unique(labels)]))
        write_idx_gz(dst / f"{labels_name}.gz", labels[keep])
        write_idx_gz(dst / f"{images_name}.gz", read_idx_gz(src / f"{images_name}.gz")[keep])
        counts[split] = len(keep)
    return counts


def slice_data(name: str, source: Path, dst: Path, n: int, label_column: str, delimiter: str) -> Path:
    """A slice of the data set's files under `dst`, laid out like them; its path (what the params point at)."""
    task = SETS[name].task
    if name == "fashion_mnist":
        copy = dst / "FashionMNIST" / "raw"
        log(f"{name}: slice {slice_idx(source, copy, n)}")
    elif task == "classifier":
        copy = dst / name
        log(f"{name}: slice {slice_class_folders(source, copy, n)}")
    elif task == "segmenter":
        copy = dst / name
        log(f"{name}: slice {slice_pairs(source, copy, n)} image/mask pairs")
    else:
        copy = dst / source.name
        log(f"{name}: slice {slice_csv(source, copy, n, label_column, delimiter)}")
    return copy


# --- one data set, in the child process ---------------------------------------------------------------------------

def train_one(name: str, data_dir: Path, workdir: Path, slice_n: int | None, max_steps: int | None,
              changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Prepare and train the data set with the default params (and `changes`, dotted keys) in `workdir` (the current
    folder: train_task writes its checkpoints under ./checkpoints); the test figures, timings and what `auto`
    resolved to."""
    from trainlab.core.config import load_params
    from trainlab.jobs.prepare import prepare_classification, prepare_segmentation, prepare_text
    from trainlab.jobs.train import train_task

    spec, task = SETS[name], SETS[name].task
    overrides: dict[str, Any] = {"tracking.enabled": False, **(changes or {})}
    source = None
    if spec.path is not None:
        source = data_dir / spec.path
        if slice_n:
            text = load_params(REPO / "params.yaml", overrides).data.text
            source = slice_data(name, source, workdir / "data", slice_n, text.label_column, text.delimiter)
        overrides.update(data_overrides(name, source))
    if max_steps:
        overrides[f"{task}.max_steps"] = max_steps
    params = load_params(REPO / "params.yaml", overrides)

    prepared = workdir / "prepared" / PREPARED_FOLDER[task]
    say = lambda line: print(line, flush=True)  # noqa: E731
    if task == "classifier":
        stats = prepare_classification(params, prepared, allow_download=False, log=say)
    elif task == "segmenter":
        stats = prepare_segmentation(params, prepared, say)
    else:
        stats = prepare_text(params, prepared, say)
    row: dict[str, Any] = {"samples": stats["samples"]}  # (a batch larger than a slice: training resolves it)

    options: dict[str, Any] = {}
    if task == "text":  # the TF-IDF bar, fitted as the text_baseline stage fits it
        from trainlab.jobs.text_baseline import BASELINE_FILE, write_baseline

        baseline_dir = workdir / "models" / "text_baseline"
        row["baseline_accuracy"] = write_baseline(params, prepared, baseline_dir)["accuracy"]
        options["baseline"] = baseline_dir / BASELINE_FILE
    model_dir = workdir / "models" / task
    outcome = train_task(task, params, prepared, model_dir, workdir / "reports" / task, **options)
    info = json.loads((model_dir / "info.json").read_text())
    return {**row, "test": outcome.test, "train_time_s": outcome.fit.train_time_s,
            "samples_per_s": outcome.fit.samples_per_s, "epochs": info["epochs"],
            "device": info.get("runtime", {}).get("runtime_device"), "resolved": resolved(info),
            **({"stopping": info["stopping"]} if "stopping" in info else {})}


def resolved(info: dict[str, Any]) -> dict[str, Any]:
    """What the model's info.json records of the choices params left to `auto`: its "auto" record (or meta's; each
    entry {"value", "why"} or a plain value), else the prepared image size and the data's augmentation, flips or
    symmetries; and the precision and the text model's chosen weight decay."""
    meta = info.get("meta", {})
    auto = {**meta.get("auto", {}), **info.get("auto", {})}  # prepare's choices, then training's
    if auto:
        out = dict(auto)
    else:
        out = {"size": f"{meta['channels']}x{meta['height']}x{meta['width']}"} if "height" in meta else {}
        out.update({k: meta[k] for k in ("augment", "symmetries" if "symmetries" in meta else "hflip") if k in meta})
    if "runtime_precision" in info.get("runtime", {}):
        out["precision"] = info["runtime"]["runtime_precision"]
    if "weight_decay" in info.get("chosen", {}):
        out["weight_decay"] = info["chosen"]["weight_decay"]
    return out


def child_main(args: argparse.Namespace) -> int:
    """--one NAME: train it, write RESULT_FILE in the working folder (the error's first line if it failed)."""
    workdir = Path(args.workdir).resolve()
    try:
        result = train_one(args.one, data_folder(args.data), workdir, args.slice, args.max_steps, args.changes)
    except Exception as exc:  # noqa: BLE001 - the row says what failed; the parent runs the other data sets
        traceback.print_exc()
        first = (str(exc).strip().splitlines() or [""])[0]
        write_json(workdir / RESULT_FILE, {"error": f"{type(exc).__name__}: {first}"})
        return 1
    write_json(workdir / RESULT_FILE, result)
    return 0


# --- the parent: one child per data set, the table ------------------------------------------------------------------

def run_child(name: str, data_dir: Path, workdir: Path, slice_n: int | None, max_steps: int | None,
              changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """`python -m benchmarks.quality --one NAME` in `workdir`, its output streamed to stderr; its result with its
    peak RSS (the child's own, from wait4) and wall time."""
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.quality", "--one", name, "--workdir", str(workdir),
           "--data", str(data_dir)]
    cmd += [*(["--slice", str(slice_n)] if slice_n else []), *(["--max-steps", str(max_steps)] if max_steps else [])]
    cmd += [arg for key, value in (changes or {}).items() for arg in ("--set", f"{key}={json.dumps(value)}")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    tail: deque[str] = deque(maxlen=5)
    for line in proc.stdout:
        sys.stderr.write(f"  [{name}] {line}")
        sys.stderr.flush()
        if line.strip():
            tail.append(line.strip())
    proc.stdout.close()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    try:
        result = json.loads((workdir / RESULT_FILE).read_text())
    except (OSError, ValueError):
        result = {"error": f"exit {proc.returncode} without a result: {tail[-1] if tail else 'no output'}"}
    return {**result, "peak_rss_mib": round(usage.ru_maxrss / MIB, 1), "wall_s": round(time.perf_counter() - t0, 1),
            "exit_code": proc.returncode}


def repeated(name: str, data_dir: Path, workdir: Path, slice_n: int | None, max_steps: int | None,
             changes: dict[str, Any], seeds: list[int]) -> dict[str, Any]:
    """A data set once per seed (each seed draws its own split and initialisation): each test figure is the
    mean over the seeds, what the row is judged on; the judged figure of each seed and their spread beside it."""
    runs = [run_child(name, data_dir, workdir / f"seed{seed}", slice_n, max_steps, {**changes, "base.seed": seed})
            for seed in seeds]
    failed = next((run for run in runs if "error" in run), None)
    if failed is not None:
        return failed
    mean = lambda values: sum(values) / len(values)  # noqa: E731
    key = figure_key(name)
    each = [run["test"][key] for run in runs]
    row = {**runs[0], "test": {k: mean([run["test"][k] for run in runs]) for k in runs[0]["test"]},
           "seeds": dict(zip(map(str, seeds), each)), "spread": max(each) - min(each),
           "train_time_s": mean([run["train_time_s"] for run in runs]),
           "samples_per_s": mean([run["samples_per_s"] for run in runs]),
           "peak_rss_mib": max(run["peak_rss_mib"] for run in runs), "wall_s": sum(run["wall_s"] for run in runs)}
    if "baseline_accuracy" in runs[0]:
        row["baseline_accuracy"] = mean([run["baseline_accuracy"] for run in runs])
    return row


def cpu_description() -> str:
    """The CPU's model name and whether it has AMX and AVX-512 BF16 (what `precision: auto` can use)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    has = lambda flag: "yes" if re.search(rf"\b{flag}\b", cpuinfo) else "no"  # noqa: E731
    return (f"{model.group(1).strip() if model else 'unknown CPU'} (AMX {has('amx_bf16')}, "
            f"AVX-512 BF16 {has('avx512_bf16')}), {os.cpu_count()} CPUs")


def cpu_kind() -> str:
    """This CPU's kind for the embedded data's floors (benchmarks.pipeline)."""
    from benchmarks.pipeline import cpu_kind as kind
    from trainlab.core.runtime import cpu_supports_bf16

    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    return kind(cpuinfo, cpu_supports_bf16())


def target_text(name: str, kind: str) -> str:
    from benchmarks.pipeline import FLOORS, TEXT_OVER_BASELINE_POINTS

    spec = SETS[name]
    if spec.task == "text":
        return "accuracy >= TF-IDF baseline" + (f" + {TEXT_OVER_BASELINE_POINTS:g} point" if spec.path is None else "")
    if spec.path is None:
        return f"{figure_key(name)} >= {FLOORS[kind][spec.task]:.4f} (floor, {kind})"
    return f"{figure_key(name)} >= {spec.target:g}"


def figure_key(name: str) -> str:
    """The test metric a row is judged on."""
    spec = SETS[name]
    if spec.task == "segmenter":
        return "mean_iou" if spec.path is None else "dice_foreground"
    return "accuracy"


def threshold(name: str, row: dict[str, Any], kind: str) -> float:
    from benchmarks.pipeline import FLOORS, TEXT_OVER_BASELINE_POINTS

    spec = SETS[name]
    if spec.task == "text":
        return row["baseline_accuracy"] + (TEXT_OVER_BASELINE_POINTS / 100 if spec.path is None else 0.0)
    return FLOORS[kind][spec.task] if spec.path is None else spec.target


def verdict(name: str, row: dict[str, Any], kind: str, quick: bool) -> str:
    if "error" in row:
        return f"FAILED: {row['error']}"
    if quick:
        return "not judged (quick)"
    return "met" if row["test"][figure_key(name)] >= threshold(name, row, kind) else "MISSED"


def figure_text(name: str, row: dict[str, Any]) -> str:
    """The row's test figure(s), four decimals."""
    test = row.get("test")
    if not test:
        return "–"
    spec = SETS[name]
    if spec.task == "segmenter" and spec.path is not None:
        shown = f"Dice {test['dice_foreground']:.4f}, IoU {test['iou_foreground']:.4f}"
        return shown + (f"; mean of seeds {' / '.join(f'{v:.4f}' for v in row['seeds'].values())}"
                        if "seeds" in row else "")
    if spec.task == "segmenter":
        return f"mean IoU {test['mean_iou']:.4f}"
    if spec.task == "text":
        shown = f"accuracy {test['accuracy']:.4f} (TF-IDF {row['baseline_accuracy']:.4f})"
    else:
        shown = f"accuracy {test['accuracy']:.4f}"
    if "seeds" in row:
        shown += f"; mean of seeds {' / '.join(f'{v:.4f}' for v in row['seeds'].values())}"
    return shown


def resolved_text(row: dict[str, Any]) -> str:
    """The resolved values, without their reasons (quality.json keeps those)."""
    value = lambda v: v["value"] if isinstance(v, dict) and "value" in v else v  # noqa: E731
    shown = ", ".join(f"{k} {value(v)}" for k, v in row.get("resolved", {}).items())
    return shown or "–"


def markdown(data: dict[str, Any]) -> str:
    rows = [[r["name"], SETS[r["name"]].task, figure_text(r["name"], r), r["target"], r["verdict"],
             fmt(r.get("train_time_s")), fmt(r.get("samples_per_s")), fmt(r.get("peak_rss_mib")), resolved_text(r)]
            for r in data["rows"]]
    settings = data["settings"]
    sliced = (f"; sliced to {settings['slice']} per class / pairs / rows per label" if settings["slice"] else "") + \
             (f"; at most {settings['max_steps']} optimizer steps" if settings["max_steps"] else "") + \
             "".join(f"; {k}: {v}" for k, v in settings.get("changes", {}).items()) + \
             (f"; small sets over seeds {', '.join(map(str, settings['seeds']))}" if settings.get("seeds") else "")
    lines = ["## Quality on real data (default params)", "",
             f"{data['cpu']}; trained on {', '.join(data['devices']) or '–'}; {data['date']}; data {data['data']}"
             f"{sliced}.", ""]
    if settings["quick"]:
        lines += ["**quick: figures not comparable to the targets**", ""]
    lines += [table(["data set", "task", "test figure", "target", "verdict", "training (s)", "samples/s",
                     "peak RSS (MiB)", "resolved"], rows), ""]
    if data["failed"]:
        lines += [f"FAILED: {', '.join(data['failed'])}.", ""]
    return "\n".join(lines)


def measure(sets: list[str], data_dir: Path, slice_n: int | None = None, max_steps: int | None = None,
            quick: bool = False, keep: bool = False, changes: dict[str, Any] | None = None,
            seeds: list[int] | None = None, repeat: set[str] | None = None) -> dict[str, Any]:
    """Every data set of `sets` in its own child process (once per seed of `seeds` those of `repeat`, by default the
    small ones); the rows with their verdicts, and which ones failed."""
    changes = changes or {}
    kind = cpu_kind()
    if not data_dir.is_dir():
        log(f"quality: the quality data folder {data_dir} is not there: every data set but the embedded ones "
            f"FAILS (pass --data DIR or set {DATA_ENV})")
    workspace = Path(tempfile.mkdtemp(prefix="bench-quality-"))
    rows = []
    try:
        for name in sets:
            why = missing_files(name, data_dir)
            if why:
                row = {"error": why}
            else:
                log(f"quality {name}: training the default {SETS[name].task} ({workspace / name})")
                repeats = seeds and (name in repeat if repeat is not None else SETS[name].small)
                row = repeated(name, data_dir, workspace / name, slice_n, max_steps, changes, seeds) if repeats \
                    else run_child(name, data_dir, workspace / name, slice_n, max_steps, changes)
            row = {"name": name, **row, "target": target_text(name, kind)}
            row["verdict"] = verdict(name, row, kind, quick)
            log(f"quality {name}: {row['verdict']}" if "error" in row else
                f"quality {name}: {figure_text(name, row)}: {row['verdict']}")
            rows.append(row)
    finally:
        if keep:
            log(f"quality: kept the working folders in {workspace}")
        else:
            shutil.rmtree(workspace, ignore_errors=True)
    return {"cpu": cpu_description(), "cpu_kind": kind, "date": time.strftime("%Y-%m-%d"), "data": str(data_dir),
            "devices": sorted({r["device"] for r in rows if r.get("device")}),
            "settings": {"quick": quick, "slice": slice_n, "max_steps": max_steps, "sets": sets, "changes": changes,
                         "seeds": seeds},
            "rows": rows, "failed": [r["name"] for r in rows if "error" in r]}


def headline_figures(data: dict[str, Any]) -> dict[str, Any]:
    """Targets met out of the rows judged (a FAILED row counts as not met); none for a quick run."""
    if data["settings"]["quick"]:
        return {}
    return {"quality_targets_met": sum(r["verdict"] == "met" for r in data["rows"]),
            "quality_targets_total": len(data["rows"]), "quality_failed": len(data["failed"])}


def run(quick: bool, data_dir: Path | None = None, sets: list[str] | None = None, slice_n: int | None = None,
        max_steps: int | None = None, keep: bool = False, changes: dict[str, Any] | None = None,
        seeds: list[int] | None = None, repeat: set[str] | None = None) -> PartResult:
    """The part: every data set (or `sets`); --quick slices them small and stops after a few steps. A FAILED row
    (missing data included) makes the part fail (data["failed"])."""
    t0 = time.perf_counter()
    if quick:
        slice_n, max_steps = slice_n or QUICK_SLICE, max_steps or QUICK_STEPS
    data = measure(sets or list(SETS), data_folder(data_dir), slice_n, max_steps, quick, keep, changes, seeds, repeat)
    if data["failed"]:
        log(f"quality: FAILED: {', '.join(data['failed'])}")
    return PartResult("quality", data, markdown(data), headline_figures(data), time.perf_counter() - t0)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.quality", description=__doc__.splitlines()[0])
    parser.add_argument("--only-sets", default=None, help=f"comma-separated: {', '.join(SETS)} (default: all)")
    parser.add_argument("--data", type=Path, default=None,
                        help=f"the quality data folder (default: ${DATA_ENV}, else {QUALITY_DATA})")
    parser.add_argument("--quick", action="store_true", help=f"a development run: --slice {QUICK_SLICE} "
                        f"--max-steps {QUICK_STEPS} unless given; the figures are not judged")
    parser.add_argument("--slice", type=int, default=None, metavar="N", help="train on a copy of at most N files "
                        "per class folder, N image/mask pairs, N CSV rows per label, N Fashion-MNIST samples per "
                        "class and split")
    parser.add_argument("--max-steps", type=int, default=None, metavar="K",
                        help="stop each training after K optimizer steps (<task>.max_steps)")
    parser.add_argument("--keep-workspace", action="store_true", help="keep the working folders (data slices, "
                        "prepared data, models)")
    parser.add_argument("--set", dest="sets_params", action="append", default=[], metavar="KEY=VALUE",
                        help="a change to params.yaml for every row (a dotted key; the value read as YAML), e.g. "
                        "classifier.patience=5; repeatable")
    parser.add_argument("--seeds", default=None, metavar="S1,S2,...", help="train each small data set (cats_dogs, "
                        "drive, crackforest, bbc_news), or each set --only-sets names, once per seed, each with its "
                        "own split: judged on the mean")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where quality.json is written")
    parser.add_argument("--one", choices=list(SETS), help=argparse.SUPPRESS)  # the child: one data set
    parser.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.sets = [s.strip() for s in args.only_sets.split(",") if s.strip()] if args.only_sets else list(SETS)
    args.repeat = set(args.sets) if args.only_sets else None  # --seeds: the sets named, else the small ones
    unknown = [s for s in args.sets if s not in SETS]
    if unknown:
        parser.error(f"--only-sets: unknown data set(s) {', '.join(unknown)}; choose from {', '.join(SETS)}")
    for flag, value in (("--slice", args.slice), ("--max-steps", args.max_steps)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be at least 1")
    if args.one and not args.workdir:
        parser.error("--one needs --workdir")
    args.changes = {}
    for item in args.sets_params:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            parser.error(f"--set {item!r}: expected KEY=VALUE, e.g. classifier.patience=5")
        args.changes[key.strip()] = yaml.safe_load(value)
    try:
        args.seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    except ValueError:
        parser.error(f"--seeds {args.seeds!r}: expected whole numbers separated by commas, e.g. 42,43,44")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.one:
        return child_main(args)
    part = run(args.quick, args.data, args.sets, args.slice, args.max_steps, args.keep_workspace, args.changes,
               args.seeds, args.repeat)
    write_json(args.out / "quality.json", part.data)
    print(part.markdown)
    log(f"quality: wrote {args.out / 'quality.json'} ({part.seconds:.0f} s)")
    return 1 if part.data["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
