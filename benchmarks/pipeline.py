"""The default pipeline as a user first runs it: `dvc repro` of params.yaml in a private copy (tracking on, local
SQLite), its wall time and each stage's, and the test metrics against this CPU kind's floors."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from benchmarks.common import PartResult, fmt, log, table
from benchmarks.overhead import BIN, COMMAND_TIMEOUT_S, Workspace, stop_group

# The three 2-core CPU kinds (README, Figures) by what `precision: auto` can use; a CPU without native bf16
# (AVX2 only, AVX-512 without BF16, or one held to AVX2) computes in fp32 like the EPYC with AVX2 only
CPU_KINDS = {"xeon_amx": "AMX and AVX-512 BF16 (the Xeon): bf16",
             "avx512_bf16": "AVX-512 BF16 without AMX (the Zen 4): bf16",
             "fp32": "no native bf16 (the EPYC with AVX2 only, or a CPU held to AVX2): fp32"}
# issue 31: the default pipeline's test metrics on each kind when its speed work began; no lower after it
FLOORS = {"xeon_amx": {"classifier": 0.9850, "segmenter": 0.9323},
          "avx512_bf16": {"classifier": 0.9860, "segmenter": 0.9301},
          "fp32": {"classifier": 0.9850, "segmenter": 0.9266}}
TEXT_OVER_BASELINE_POINTS = 1.0
WALL_TARGET_S = 180.0
# --quick: the machinery only (copy, `dvc repro` streamed, stage times), tiny params, up to this stage
QUICK_TARGET = "prepare"

STAGE_LINE = re.compile(r"^Running stage '([^']+)':")


def cpu_kind(cpuinfo: str, native_bf16: bool) -> str:
    """The CPU kind of the floors: by the flags of /proc/cpuinfo and whether torch may use native bf16 here
    (trainlab.core.runtime.cpu_supports_bf16, False on a CPU held to AVX2)."""
    if not native_bf16:
        return "fp32"
    return "xeon_amx" if re.search(r"\bamx_bf16\b", cpuinfo) else "avx512_bf16"


def stage_seconds(events: Iterable[tuple[float, str]], end: float) -> dict[str, float]:
    """Each stage's wall seconds from timestamped lines of `dvc repro`'s output: from its "Running stage" line to
    the next one's (the last: to `end`), DVC's own work between them included."""
    starts = [(t, m.group(1)) for t, line in events if (m := STAGE_LINE.match(line))]
    bounds = [t for t, _ in starts[1:]] + [end]
    return {name: round(stop - t, 2) for (t, name), stop in zip(starts, bounds)}


def timed_repro(ws: Workspace) -> tuple[float, dict[str, float]]:
    """`dvc repro` in the workspace, its output streamed line by line to the log with the time each line came."""
    cmd = [str(BIN / "dvc"), "repro", *ws.target]
    events: list[tuple[float, str]] = []
    t0 = time.perf_counter()
    # its own process group, stopped whole: at the deadline a stage that hangs without printing stops too (and
    # closes the pipe), and an interrupted benchmark leaves no stage running
    with open(ws.log, "a") as logfile, subprocess.Popen(cmd, cwd=ws.root, env=ws.env, stdout=subprocess.PIPE,
                                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                        text=True, start_new_session=True) as proc:
        logfile.write(f"$ {' '.join(cmd)}\n")
        timed_out = threading.Event()
        timer = threading.Timer(COMMAND_TIMEOUT_S, lambda: (timed_out.set(), stop_group(proc.pid)))
        timer.start()
        try:
            for line in proc.stdout:
                events.append((time.perf_counter(), line.rstrip("\n")))
                logfile.write(line)
            code = proc.wait()
        finally:
            timer.cancel()
            stop_group(proc.pid)  # what is left of it: nothing after a normal end
    wall = time.perf_counter() - t0
    if timed_out.is_set():
        raise RuntimeError(f"`dvc repro` ran over {COMMAND_TIMEOUT_S} s and was stopped")
    if code != 0:
        tail = [line for _, line in events][-8:]
        raise RuntimeError(f"`dvc repro` exited with {code}: " + " | ".join(tail))
    return wall, stage_seconds(events, t0 + wall)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def results(root: Path, ran: Iterable[str]) -> dict[str, Any]:
    """The test metrics (reports/evaluate/metrics.json) and each training stage's own timing (reports/<task>/
    run.json) that the stages which ran wrote (the copy also holds the committed reports)."""
    ran = set(ran)
    metrics = read_json(root / "reports" / "evaluate" / "metrics.json") if "evaluate" in ran else None
    timing = {task: (read_json(root / "reports" / task / "run.json") or {}).get("timing")
              for task in ("classifier", "segmenter", "text") if f"train_{task}" in ran}
    return {"test": metrics or {}, "training_stage_timing": {k: v for k, v in timing.items() if v}}


def headline_figures(data: dict[str, Any]) -> dict[str, Any]:
    """Margins over this CPU kind's floors (>= 0 meets them) and the wall time; none for a --quick run."""
    if data.get("quick") or "wall_s" not in data:
        return {}
    floors, test = FLOORS[data["cpu_kind"]], data.get("test", {})
    out: dict[str, Any] = {"default_pipeline_s": round(data["wall_s"], 1)}
    classifier, segmenter, text = (test.get(k, {}) for k in ("classifier", "segmenter", "text"))
    if "accuracy" in classifier:
        out["default_classifier_accuracy_over_floor_points"] = round(
            100 * (classifier["accuracy"] - floors["classifier"]), 2)
    if "mean_iou" in segmenter:
        out["default_segmenter_iou_over_floor_points"] = round(100 * (segmenter["mean_iou"] - floors["segmenter"]), 2)
    if "accuracy" in text and "baseline_accuracy" in text:
        out["default_text_accuracy_over_baseline_points"] = round(
            100 * (text["accuracy"] - text["baseline_accuracy"]), 2)
    return out


def run(quick: bool, keep: bool = False) -> PartResult:
    from trainlab.core.runtime import cpu_supports_bf16

    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    data: dict[str, Any] = {"workspace": str(tmp), "quick": quick, "cpu_kind": cpu_kind(cpuinfo, cpu_supports_bf16())}
    try:
        ws = Workspace(tmp, QUICK_TARGET if quick else None, tiny=quick)
        data["setup_s"] = ws.setup()
        log(f"pipeline: copied the repo to {ws.root} ({data['setup_s']:.1f} s); `dvc repro` of "
            f"{'tiny params up to ' + QUICK_TARGET if quick else 'params.yaml'} (CPU kind: {data['cpu_kind']})")
        data["wall_s"], data["stage_s"] = timed_repro(ws)
        data.update(results(ws.root, data["stage_s"]))
        log(f"pipeline: dvc repro {data['wall_s']:.1f} s")
    except (RuntimeError, OSError) as exc:
        data["error"] = str(exc)
        log(f"pipeline: failed: {exc}")
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    headline = headline_figures(data)
    return PartResult("pipeline", data, markdown(data), headline, time.perf_counter() - t0)


def markdown(data: dict[str, Any]) -> str:
    kind = data["cpu_kind"]
    lines = ["## Default pipeline", ""]
    if "error" in data:
        lines += [f"Failed: `{data['error'][:500]}`", ""]
    what = "tiny params up to `prepare` (a smoke run: no figure)" if data["quick"] else "params.yaml"
    lines.append(f"`dvc repro` of {what} in a fresh private copy (no dvc.lock: each stage runs; tracking on, local "
                 f"SQLite). CPU kind: {CPU_KINDS[kind]}.")
    lines.append("")
    timing = data.get("training_stage_timing", {})
    rows = [[name, fmt(seconds, "s"), fmt(timing.get(name.removeprefix("train_"), {}).get("train_time_s"), "s")
             if name.startswith("train_") else ""] for name, seconds in data.get("stage_s", {}).items()]
    if "wall_s" in data:
        rows.append(["**`dvc repro`**", fmt(data["wall_s"], "s"), ""])
        lines += [table(["stage", "wall (from DVC's output)", "of which training"], rows), ""]
    floors, test = FLOORS[kind], data.get("test", {})
    four = lambda value: "–" if value is None else f"{value:.4f}"  # noqa: E731 - the floors' precision
    if test:
        text = test.get("text", {})
        lines += [table(["test split", "measured", "floor on this CPU kind"], [
            ["classifier accuracy", four(test.get("classifier", {}).get("accuracy")), f"{floors['classifier']:.4f}"],
            ["segmenter mean IoU", four(test.get("segmenter", {}).get("mean_iou")), f"{floors['segmenter']:.4f}"],
            ["text accuracy", four(text.get("accuracy")),
             f"TF-IDF baseline {four(text.get('baseline_accuracy'))} + {TEXT_OVER_BASELINE_POINTS:g} point"],
        ]), ""]
    return "\n".join(lines) + "\n"
