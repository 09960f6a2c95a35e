"""Data at scale: prepare a generated photo-like JPEG folder of N and 8N images, and one epoch of classifier training
streamed from its shards (against the in-memory path), with wall time, images/s and each process's peak RSS.

    python -m benchmarks --only data_scale            # N = 2,000 and 16,000 JPEGs, stored at 128 px (about 4 minutes)
    python -m benchmarks --only data_scale --quick    # N = 250 and 2,000
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, PartResult, fmt, log, table

SIZES = {"full": 2000, "quick": 250}
IMAGE_SIZE = 128
TRAIN = {"width": 16, "epochs": 1, "batch_size": 64, "warmup_epochs": 0.0}  # a small model: the data path shows


def generate_folder(root: Path, count: int, seed: int = 0) -> Path:
    """`count` JPEGs in two class folders: crops of scikit-learn's two photos at random places, sizes (about 150 to
    400 px a side) and qualities, as a camera folder would hold them."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_sample_image

    rng = np.random.default_rng(seed)
    photos = {name: load_sample_image(f"{name}.jpg") for name in ("china", "flower")}
    for i in range(count):
        name = ("china", "flower")[i % 2]
        photo = photos[name]
        h, w = rng.integers(150, 420), rng.integers(150, 600)
        top, left = rng.integers(0, photo.shape[0] - h + 1), rng.integers(0, photo.shape[1] - w + 1)
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(photo[top:top + h, left:left + w]).save(folder / f"{i:06d}.jpg",
                                                                quality=int(rng.integers(75, 96)))
    return root


def child(kind: str, root: str, work: str, max_mb: str) -> None:
    """In its own process: prepare the folder, or train one epoch on it; prints one JSON line with the figures and
    this process's (and its DataLoader workers') peak RSS."""
    from trainlab.core.config import Params

    params = Params.model_validate({
        "base": {"seed": 42, "data_on_device_max_mb": int(max_mb), "num_workers": 2},
        "data": {"classification": {"source": "image_folder", "root": root, "image_size": IMAGE_SIZE}},
        "classifier": TRAIN, "tracking": {"enabled": False}})
    work_dir = Path(work)
    from trainlab.jobs.prepare import prepare_classification
    from trainlab.jobs.train import train_task

    started = time.perf_counter()  # after the imports (torch): the figures are the work's
    if kind == "prepare":
        stats = prepare_classification(params, work_dir / "classification", False, lambda message: None)
        figures = {"images": stats["samples"]["total"]}
    else:
        outcome = train_task("classifier", params, work_dir / "classification", work_dir / f"model_{kind}",
                             work_dir / f"reports_{kind}")
        figures = {"samples_per_s": outcome.fit.samples_per_s, "train_time_s": outcome.fit.train_time_s,
                   "test_accuracy": outcome.test.get("accuracy")}
    figures["seconds"] = time.perf_counter() - started
    figures["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    figures["workers_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print("RESULT " + json.dumps(figures), flush=True)


def run_child(kind: str, root: Path, work: Path, max_mb: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.data_scale", kind, str(root), str(work), str(max_mb)],
                          cwd=work, env=env, capture_output=True, text=True)  # cwd: its checkpoints/ go there
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise RuntimeError(f"data_scale {kind} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def run(quick: bool) -> PartResult:
    from benchmarks.common import environment  # noqa: F401 - the CPU is named in the summary's header

    n = SIZES["quick" if quick else "full"]
    rows, data = [], {}
    with tempfile.TemporaryDirectory(prefix="data_scale_") as tmp:
        for count in (n, 8 * n):
            data[count] = measure(Path(tmp), count, in_memory=count == n)
            for kind, fig in data[count].items():
                rate = fig.get("images_per_s", fig.get("samples_per_s"))
                rows.append([f"{count:,}", kind, fmt(fig["seconds"]), fmt(rate), fmt(fig["peak_rss_mb"]),
                             fmt(fig["workers_peak_rss_mb"])])
        small, large = data[n], data[8 * n]
    headline = {
        "prepare_rss_8n_over_n": large["prepare"]["peak_rss_mb"] / small["prepare"]["peak_rss_mb"],
        "streamed_rss_8n_over_n": large["streamed"]["peak_rss_mb"] / small["streamed"]["peak_rss_mb"],
        "streamed_over_in_memory": small["streamed"]["samples_per_s"] / small["in_memory"]["samples_per_s"],
        "prepare_images_per_s_per_core": min(d["prepare"]["images_per_s_per_core"] for d in data.values()),
    }
    return PartResult("data_scale", {str(k): v for k, v in data.items()}, markdown(n, rows, headline), headline)


def measure(tmp: Path, count: int, in_memory: bool) -> dict[str, dict[str, Any]]:
    """Generate `count` JPEGs under `tmp`, then time preparing them and one streamed epoch (and, with `in_memory`,
    one epoch with the data in memory), each in its own process."""
    from trainlab.data.ordered_map import available_cores

    root, work = tmp / f"raw_{count}", tmp / f"work_{count}"
    work.mkdir()
    log(f"data_scale: generating {count:,} JPEGs")
    generate_folder(root, count)
    log(f"data_scale: prepare {count:,} images")
    prep = run_child("prepare", root, work, 0)
    prep["images_per_s"] = prep["images"] / prep["seconds"]
    prep["images_per_s_per_core"] = prep["images_per_s"] / available_cores()
    log(f"data_scale: one streamed epoch on {count:,} images")
    streamed = run_child("streamed", root, work, 0)
    result = {"prepare": prep, "streamed": streamed}
    if in_memory:
        log(f"data_scale: one in-memory epoch on {count:,} images")
        result["in_memory"] = run_child("in_memory", root, work, 1 << 20)
    return result


def markdown(n: int, rows: list[list[str]], headline: dict[str, float]) -> str:
    """The part's report: what was measured, the figures per folder size and run, the headline against its targets."""
    from trainlab.data.ordered_map import available_cores

    return "\n".join([
        "## data_scale", "",
        f"Generated JPEG folders of {n:,} and {8 * n:,} photos (crops of scikit-learn's two photos, 150-600 px), "
        f"prepared at {IMAGE_SIZE} px (Pillow with libjpeg's DCT-domain downscaling, on "
        f"{available_cores()} threads); one epoch of a width-16 classifier streamed from the shards "
        "(data_on_device_max_mb 0, 2 workers) and, at N, in memory.", "",
        table(["images", "run", "seconds", "images/s or samples/s", "peak RSS MB", "children's peak RSS MB"],
              rows), "",
        "Peak RSS is the process's own (`ru_maxrss`); a child's (the DataLoader workers) counts the pages it shared "
        "with the parent when forked. Training samples/s include the first steps' warm-up.", "",
        table(["figure", "measured", "target"], [
            ["prepare peak RSS, 8N / N", fmt(headline["prepare_rss_8n_over_n"], "x"), "<= 1.3"],
            ["streamed training peak RSS, 8N / N", fmt(headline["streamed_rss_8n_over_n"], "x"), "<= 1.3"],
            ["streamed / in-memory samples/s", fmt(headline["streamed_over_in_memory"], "x"), ">= 0.8"],
            ["prepare images/s per core", fmt(headline["prepare_images_per_s_per_core"]), ">= 300"],
        ]),
    ])


if __name__ == "__main__":
    child(*sys.argv[1:])
