"""The default pipeline stage by stage without DVC or MLflow (for a bare GPU machine), and scripts/gpu-check's
parts and table.

    python -m benchmarks.gpu_check run OUT [--budget S] [--device D] [--quick] [--serial]  # every part, then the table
    python -m benchmarks.gpu_check pipeline OUT   # every dvc.yaml stage in order, in a scratch copy, tracking off
    python -m benchmarks.gpu_check table OUT      # one markdown table of whatever OUT holds, failed parts included

`run` exits 1 naming the parts that failed, timed out or were skipped (benchmarks/gpu_parts.py: deadlines, the
failure injection GPU_CHECK_FAIL); the table is written (OUT/gpu_check.md) whatever happened to the parts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
COPIED = ("stages", "trainlab", "pipelines", "benchmarks", "data", "params.yaml", "dvc.yaml", "pyproject.toml")
# GPU_CHECK_STAGES=prepare,train_classifier runs only those stages (a quicker rehearsal on a CPU)
STAGES_ENV = "GPU_CHECK_STAGES"
# GPU_CHECK_TINY=1 runs them with the tiny params of the pipeline tests (benchmarks/tiny.py): a rehearsal of the
# mechanics
TINY_ENV = "GPU_CHECK_TINY"
# After the pipeline, `python -m trainlab.verify models/<task> --epochs N` twice per trained model: is CUDA training
# bitwise repeatable here? (0: the whole runs; the default, one epoch, keeps the part within its cap)
VERIFY_EPOCHS_ENV = "GPU_CHECK_VERIFY_EPOCHS"
VERIFY_TIMES = 2


def run_pipeline(out: Path) -> list[dict]:
    """Run each stage's `cmd` of dvc.yaml in file order (a dependency order) in a scratch copy of the repo with
    tracking.enabled false; record its wall time, exit code and, for training stages, the training time it reports."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="gpu-pipeline-") as tmp:
        work = Path(tmp)
        for name in COPIED:
            src = REPO / name
            if src.is_dir():
                shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__", "prepared"))
            elif src.exists():
                shutil.copy2(src, work / name)
        params = yaml.safe_load((work / "params.yaml").read_text())
        params["tracking"]["enabled"] = False
        if os.environ.get(TINY_ENV):
            from benchmarks.tiny import TINY_PARAMS

            for section, values in TINY_PARAMS.items():
                params.setdefault(section, {}).update(values)
        (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        started = time.perf_counter()
        only = [x for x in os.environ.get(STAGES_ENV, "").split(",") if x]
        for stage, spec in stages.items():
            if only and stage not in only:
                continue
            cmd = [sys.executable if part == "python" else part for part in shlex.split(spec["cmd"])]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            (out / f"stage_{stage}.log").write_text(proc.stdout + proc.stderr)
            rows.append({"stage": stage, "exit": proc.returncode, "wall_s": round(wall, 2),
                         "train_s": training_seconds(work, stage, proc.stdout + proc.stderr),
                         "setting": training_setting(work, stage, params),
                         "last_line": (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]})
            print(f"gpu-check: {stage}: exit {proc.returncode}, {wall:.1f} s", flush=True)
            keep_metrics(work, spec, out / "pipeline_metrics")
            _write_json(out / "pipeline.json", {"stages": rows, "total_s": round(time.perf_counter() - started, 2),
                                                "complete": False})  # on disk after every stage
            if proc.returncode:
                break
        total = time.perf_counter() - started
        checks = verify_twice(work, out, [s for s, r in zip(stages, rows) if s.startswith("train_") and not r["exit"]])
    _write_json(out / "pipeline.json", {"stages": rows, "total_s": round(total, 2), "complete": True,
                                        "verify": checks})
    return rows


def verify_twice(work: Path, out: Path, trained: list[str]) -> list[dict]:
    """`python -m trainlab.verify` VERIFY_TIMES times on each trained model of the pipeline in `work`: its exit
    code (0 identical, 10 differs, 11 could not rerun), verdict line and seconds; logs in OUT/verify_<task>_<n>.log."""
    epochs = os.environ.get(VERIFY_EPOCHS_ENV, "1")
    checks = []
    for stage in trained:
        task = stage.removeprefix("train_")
        for n in range(1, VERIFY_TIMES + 1):
            cmd = [sys.executable, "-m", "trainlab.verify", f"models/{task}", *(["--epochs", epochs] if epochs != "0"
                                                                              else [])]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
            (out / f"verify_{task}_{n}.log").write_text(proc.stdout + proc.stderr)
            last_error = (proc.stderr.strip().splitlines() or [""])[-1]
            verdict = next((line for line in proc.stdout.splitlines() if line.startswith("verify: ")
                            and ("IDENTICAL" in line or "DIFFERS" in line)), last_error)
            checks.append({"model": task, "run": n, "exit": proc.returncode, "verdict": verdict[:300],
                           "seconds": round(time.perf_counter() - t0, 1)})
            print(f"gpu-check: verify {task} ({n}): exit {proc.returncode}, {checks[-1]['seconds']} s", flush=True)
    return checks


def keep_metrics(work: Path, spec: dict, dest: Path) -> None:
    """Copy a stage's `metrics:` files out of the scratch copy (it is deleted at the end) into DEST, same paths."""
    for entry in spec.get("metrics", []):
        rel = next(iter(entry)) if isinstance(entry, dict) else entry
        if (work / rel).exists():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(work / rel, dest / rel)


def _write_json(path: Path, data) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(path)


def training_setting(work: Path, stage: str, params: dict) -> str | None:
    """A training stage's precision (as it settled: `auto` may pick fp32 where the benchmarks' engine uses bf16) and
    batch, from models/<task>/info.json and the params it ran with."""
    task = stage.removeprefix("train_")
    info = work / "models" / task / "info.json"
    if not stage.startswith("train_") or not info.exists():
        return None
    runtime = json.loads(info.read_text()).get("runtime", {})
    batch = (params.get(task) or {}).get("batch_size", "default")
    return f"{runtime.get('runtime_precision', '?')}, batch {batch}"


def training_seconds(work: Path, stage: str, output: str) -> float | None:
    """A training stage's training time: from its reports/<task>/run.json, else its closing line."""
    record = work / "reports" / stage.removeprefix("train_") / "run.json"
    if record.exists():
        return json.loads(record.read_text()).get("timing", {}).get("train_time_s")
    match = re.search(r"train(?:ing)? time ([\d.]+) s", output)
    return float(match.group(1)) if match else None


def table(out: Path) -> str:
    """One markdown report of whatever OUT holds: the preflight, each part's status (failures with their message),
    the GPU tests, stage times, engine vs the other contenders per model (precision and batch named), the MFU
    steps and the targets. A section that cannot be rendered says why; the others still are."""
    lines = ["# GPU check", ""]
    for section in (_header, _parts, _pipeline, _training, _mfu, _targets):
        try:
            lines += section(out)
        except Exception as exc:  # noqa: BLE001 - one unreadable file must not cost the rest of the table
            lines += [f"({section.__name__.strip('_')}: could not render: {type(exc).__name__}: {exc})", ""]
    return "\n".join(lines)


def _header(out: Path) -> list[str]:
    gpu = (out / "gpu.txt").read_text().strip() if (out / "gpu.txt").exists() else ""
    lines = [f"Device: {gpu.splitlines()[-1] if gpu else 'unknown'}", ""]
    pre = _load(out / "preflight.json")
    if pre:
        lines += [f"Preflight: {pre.get('verdict', '?')}", ""]
    return lines


def _parts(out: Path) -> list[str]:
    records = ([json.loads(p.read_text()) for p in sorted((out / "parts").glob("*.json"))]
               if (out / "parts").exists() else [])
    if not records:
        return []
    order = {name: i for i, name in enumerate(PART_ORDER)}
    records.sort(key=lambda r: order.get(r["part"], len(order)))
    lines = ["## Parts", "", "| part | status | s | cap s | message |", "|---|---|---|---|---|"]
    for r in records:
        message = str(r.get("message") or "").replace("|", "/").replace("\n", " ")[:400]
        lines.append(f"| {r['part']} | {r['status'].upper() if r['status'] != 'ok' else 'ok'} | {r['seconds']:.0f} | "
                     f"{r.get('cap_s', 0):.0f} | {message} |")
    return lines + [""]


PART_ORDER = ("tests_graphs", "tests_sync", "tests_compile", "tests_engine", "bench_classifier", "bench_mfu",
              "pipeline", "bench_text", "bench_segmenter")  # gpu_parts.plan's order


def _pipeline(out: Path) -> list[str]:
    pipe = _load(out / "pipeline.json")
    if not pipe:
        return []
    lines = ["## Default pipeline (tracking off, no DVC)", "",
             "| stage | exit | wall s | training s | precision, batch |", "|---|---|---|---|---|"]
    for r in pipe["stages"]:
        train = f"{r['train_s']:.1f}" if r.get("train_s") is not None else "–"
        lines.append(f"| {r['stage']} | {r['exit']} | {r['wall_s']:.1f} | {train} | {r.get('setting') or ''} |")
    done = "" if pipe.get("complete", True) else " (stopped before the end)"
    lines += [f"| all{done} | | {pipe['total_s']:.1f} | | |", ""]
    scores = _load(out / "pipeline_metrics" / "reports" / "evaluate" / "metrics.json")
    if scores:  # the test split's headline figures, as `dvc metrics show` would list them
        figures = [f"{model} {name} {value:.4f}" for model, values in scores.items() for name, value in values.items()
                   if name in ("accuracy", "mean_iou", "baseline_accuracy")]
        lines += ["Test split (evaluate stage): " + ", ".join(figures), ""]
    if pipe.get("verify"):
        lines += ["### python -m trainlab.verify, twice per model (exit 0 identical, 10 differs, 11 could not rerun)",
                  "", "| model | run | exit | s | verdict |", "|---|---|---|---|---|"]
        lines += [f"| {v['model']} | {v['run']} | {v['exit']} | {v['seconds']} | {v['verdict'].replace('|', '/')} |"
                  for v in pipe["verify"]]
        lines.append("")
    return lines


def _bench_files(out: Path, name: str) -> list[dict]:
    """Every `name`.json the benchmark parts wrote under OUT/bench (one folder per part, or the older flat one)."""
    return [json.loads(p.read_text()) for p in sorted((out / "bench").glob(f"**/{name}.json"))]


def _training(out: Path) -> list[str]:
    files = _bench_files(out, "training_speed")
    if not files:
        return []
    lines = ["## Training throughput (samples/s, medians)", "",
             "| model | engine | plain | Lightning | bare eager | bare graph | engine / each "
             "| engine precision, batch |",
             "|---|---|---|---|---|---|---|---|"]
    for speed in files:
        results = speed.get("results", {})
        if "error" in results:  # the part failed: its error, in place of its rows
            models = speed.get("settings", {}).get("parts", ["?"])
            lines.append(f"| {', '.join(models)} | FAILED: {str(results['error'])[:300]} | | | | | | |")
            continue
        for name, r in results.items():
            if not isinstance(r, dict):
                lines.append(f"| {name} | FAILED: {str(r)[:300]} | | | | | | |")
                continue
            med = r.get("median", {})
            cells = [_num(med.get(c, {}).get("samples_per_s")) for c in
                     ("engine", "plain", "lightning", "bare eager", "bare graph")]
            ratios = ", ".join(f"{k.split('/')[1]} {v['ratio_of_medians']:.2f}x" for k, v in r.get("ratios", {}).items()
                               if v.get("ratio_of_medians"))
            eng = r.get("engine_settings") or {}
            layout = ", channels_last" if str(eng.get("runtime_channels_last")) == "True" else ""
            setting = f"{eng.get('runtime_precision', '?')}{layout}, batch {r.get('setup', {}).get('batch_size', '?')}"
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratios} | {setting} |")
    return lines + [""]


def _mfu(out: Path) -> list[str]:
    files = _bench_files(out, "mfu")
    if not files:
        return []
    lines = ["## Training step (params.yaml recipe)", "",
             "| step | dtype | batch | CUDA graph | ms | samples/s | MFU |", "|---|---|---|---|---|---|---|"]
    for mfu in files:
        results = mfu.get("results", {})
        if "error" in results:
            lines.append(f"| mfu | FAILED: {str(results['error'])[:300]} | | | | | |")
            continue
        for label, m in results.get("models", {}).items():
            ms = m.get("median_step_s")
            lines.append(f"| {label} | {m.get('precision')} | {m.get('batch_size', '?')} | {m.get('cuda_graph')} | "
                         f"{_num(ms and 1e3 * ms, 3)} | {_num(m.get('median_samples_per_s'))} | "
                         f"{_num(m.get('mfu') and 100 * m['mfu'], 1)}% |")
    return lines + [""]


def _targets(out: Path) -> list[str]:
    """The targets of the device the benchmarks ran on, checked on the headline figures of every part that wrote
    one (each benchmark part runs in its own process, so no single summary.json holds them all)."""
    from benchmarks.__main__ import check_targets

    files = _bench_files(out, "training_speed") + _bench_files(out, "mfu")
    if not files:
        return []
    headline: dict = {}
    for f in files:
        headline.update(f.get("headline") or {})
    device = files[0].get("environment", {}).get("device", "cpu")
    rows = check_targets(headline, "cuda" if str(device).startswith("cuda") else "cpu")
    rows = [r for r in rows if r[0].split(":")[0] in ("classifier", "segmenter", "text")]  # what the parts measure
    return ["## Targets", "", "| figure | measured | target | verdict |", "|---|---|---|---|",
            *(f"| {' | '.join(str(c) for c in r)} |" for r in rows), ""]


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _num(value, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]) or not argv:
        print(__doc__, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "run":
        return run(argv[1:])
    if len(argv) != 2 or argv[0] not in ("pipeline", "table"):
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    if argv[0] == "pipeline":
        rows = run_pipeline(out)
        return int(any(r["exit"] for r in rows))
    print(write_table(out))
    return 0


def write_table(out: Path) -> str:
    report = table(out)
    _write_text(out / "gpu_check.md", report + "\n")
    return report


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def run(argv: list[str]) -> int:
    """Every part within the budget, the table, and an exit code: 1 naming the parts that did not pass."""
    from benchmarks import gpu_parts

    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check run")
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget", type=float, default=250, help="seconds for every part and the table")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="the benchmark parts' --quick --repeats 1")
    parser.add_argument("--only", default="", help="comma-separated parts (default: all)")
    parser.add_argument("--serial", action="store_true", help="the test groups one after another, not together")
    parser.add_argument("--cap-scale", type=float, default=1.0, help="multiply every part's cap (a CPU rehearsal: "
                        "its parts take longer than on the GPU)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    parts = gpu_parts.plan(args.out, args.device, args.quick, args.cap_scale)
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - {p.name for p in parts})
        if unknown:
            parser.error(f"--only: unknown part(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(p.name for p in parts)}")
        parts = [p for p in parts if p.name in wanted]
    started = time.monotonic()
    records = gpu_parts.run_parts(args.out, parts, args.budget, serial=args.serial)
    print(write_table(args.out))
    bad = [f"{r['part']} ({r['status']}{': ' + ' '.join(r['message'].split())[:120] if r['message'] else ''})"
           for r in records if r["status"] != "ok"]
    print(f"gpu-check: parts done in {time.monotonic() - started:.0f} s; "
          + (f"NOT OK: {'; '.join(bad)}" if bad else f"all {len(records)} parts ok"), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
