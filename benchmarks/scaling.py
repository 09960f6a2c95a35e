"""Scaling: classifier training-step throughput against batch size, and engine training with 1 vs 2 DDP processes."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, PartResult, alternate, engine_runtime, fmt, log, table
from benchmarks.processes import free_port

BATCH_SIZES = {"full": (32, 64, 128, 256, 512), "quick": (32, 128)}
STEP_TARGET_S = {"full": 1.0, "quick": 0.4}
DDP = {"full": {"epochs": 1, "samples": 0}, "quick": {"epochs": 1, "samples": 1024}}
DDP_TIMEOUT_S = 600


def batch_size_sweep(quick: bool, repeats: int, device: str) -> dict[str, Any]:
    """Engine step (bf16/channels_last where available) and the fp32 NCHW step (what the plain loop computes), per
    batch size, with the training comparison's recipe."""
    from benchmarks.mfu import model_batch, params, steps_for
    from benchmarks.training_speed import SCALES
    from trainlab.profiling.throughput import make_steps, time_step

    runtime = engine_runtime(device)
    fp32 = dataclasses.replace(runtime, precision="fp32", channels_last=False)
    p = params()
    cfg = SCALES["full"]["classifier"].train_params()  # the comparison's recipe: no augmentation, no clipping
    sizes = BATCH_SIZES["quick" if quick else "full"]
    target = STEP_TARGET_S["quick" if quick else "full"]
    task, batch = model_batch("classifier", max(sizes), runtime.device)
    contenders = {}
    for bs in sizes:
        sub = {k: v[:bs] for k, v in batch.items()}
        for label, setting in (("engine", runtime), ("fp32", fp32)):
            built = make_steps(task, setting, sub, cfg, p.base.seed)
            steps = steps_for(built.train, runtime.device, target)

            def measure(r, warm, built=built, steps=steps, bs=bs):
                t = time_step(built.train, runtime.device, steps=1 if warm else steps, warmup=0, repeats=1)
                return {"samples_per_s": bs / t.per_step[0], "step_s": t.per_step[0]}

            contenders[f"{label}@{bs}"] = measure
    comparison = alternate(contenders, repeats, what="batch sweep")
    rows = {}
    for bs in sizes:
        e, f = comparison.median(f"engine@{bs}", "samples_per_s"), comparison.median(f"fp32@{bs}", "samples_per_s")
        rows[bs] = {"engine_samples_per_s": e, "fp32_samples_per_s": f, "ratio": e / f if e and f else None,
                    "engine_spread": comparison.spread(f"engine@{bs}", "samples_per_s"),
                    "fp32_spread": comparison.spread(f"fp32@{bs}", "samples_per_s")}
    return {"engine_settings": runtime.describe(), "by_batch_size": rows, "order": comparison.order,
            "repeats": comparison.repeats}


def launch_ddp(nproc: int, quick: bool, workdir: Path, index: int) -> dict[str, Any]:
    """torchrun with `nproc` gloo processes on the CPU, the cores split evenly between them."""
    out = workdir / f"ddp_{nproc}_{index}.json"
    cfg = DDP["quick" if quick else "full"]
    threads = max(1, (os.cpu_count() or 1) // nproc)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
           "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{free_port()}", "-m", "benchmarks.ddp_worker",
           str(out), "--epochs", str(cfg["epochs"]), "--samples", str(cfg["samples"])]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=DDP_TIMEOUT_S,
                          check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"torchrun with {nproc} process(es) failed ({proc.returncode}): {proc.stderr[-2000:]}")
    result = json.loads(out.read_text())
    result["launch_wall_s"] = wall
    return result


def ddp_comparison(quick: bool, repeats: int) -> dict[str, Any]:
    """1 vs 2 processes (gloo, CPU), alternating launches after one warm-up launch of each."""
    with tempfile.TemporaryDirectory(prefix="bench-ddp-") as tmp:
        counter = iter(range(10_000))
        contenders = {f"{n}_process": (lambda r, warm, n=n: launch_ddp(n, quick, Path(tmp), next(counter)))
                      for n in (1, 2)}
        # Each launch already warms up in-process (3 steps); a separate warm-up launch would only cost time.
        comparison = alternate(contenders, repeats, warmup=False, what="ddp")
    one = comparison.median("1_process", "samples_per_s")
    two = comparison.median("2_process", "samples_per_s")
    return {"median": {k: comparison.median(k, "samples_per_s") for k in contenders},
            "spread": {k: comparison.spread(k, "samples_per_s") for k in contenders},
            "two_over_one": comparison.ratio("2_process", "1_process", "samples_per_s"),
            "scaling_efficiency": two / one / 2 if one and two else None,
            "order": comparison.order, "repeats": comparison.repeats}


def run(quick: bool, repeats: int, device: str) -> PartResult:
    t0 = time.perf_counter()
    log("scaling: batch sizes")
    sweep = batch_size_sweep(quick, repeats, device)
    log("scaling: 1 vs 2 DDP processes (torchrun, gloo, CPU)")
    try:
        ddp = ddp_comparison(quick, 1 if quick else repeats)  # quick: one launch each, a smoke test
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        ddp = {"error": str(exc)}
        log(f"scaling: DDP failed: {exc}")
    data = {"batch_size": sweep, "ddp": ddp}
    headline = {"ddp_two_over_one": ddp.get("two_over_one", {}).get("ratio_of_medians")}
    return PartResult("scaling", data, markdown(data), headline, time.perf_counter() - t0)


def markdown(data: dict[str, Any]) -> str:
    sweep = data["batch_size"]
    precision = sweep["engine_settings"]["runtime_precision"]
    rows = [[bs, fmt(r["engine_samples_per_s"]), fmt(r["fp32_samples_per_s"]), fmt(r["ratio"], "x"),
             f"{fmt(r['engine_spread'], 'pct')} / {fmt(r['fp32_spread'], 'pct')}"]
            for bs, r in sweep["by_batch_size"].items()]
    lines = ["## Scaling", "",
             "Classifier training step (trainlab.profiling.throughput.make_steps, the comparison's recipe) "
             "by batch size:",
             "",
             table(["batch", f"engine ({precision}, channels_last) samples/s", "fp32, NCHW samples/s",
                    "ratio", "spread (engine / fp32)"], rows), ""]
    ddp = data["ddp"]
    if "error" in ddp:
        lines.append(f"DDP: failed: {ddp['error'][:300]}")
    else:
        one, two = ddp["repeats"]["1_process"], ddp["repeats"]["2_process"]
        rows = [[n.replace("_", " "), reps[0]["threads_per_process"] if reps else "–", fmt(ddp["median"][n]),
                 fmt(ddp["spread"][n], "pct"), fmt(reps[0]["launch_wall_s"] if reps else None, "s")]
                for n, reps in (("1_process", one), ("2_process", two))]
        lines += ["Engine training of the classifier on the CPU, 1 vs 2 DDP processes (torchrun, gloo), "
                  "same global batch:",
                  "", table(["processes", "threads each", "samples/s (median)", "spread", "launch wall (first)"], rows),
                  "", (f"2 processes / 1 process: {fmt(ddp['two_over_one']['ratio_of_medians'], 'x')} (scaling "
                       f"efficiency {fmt(ddp['scaling_efficiency'], 'pct')} of linear).")]
    return "\n".join(lines) + "\n"
