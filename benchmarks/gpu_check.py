"""The default pipeline stage by stage without DVC or MLflow (for a bare GPU machine), and scripts/gpu-check's table.

    python -m benchmarks.gpu_check pipeline OUT   # every dvc.yaml stage in order, in a scratch copy, tracking off
    python -m benchmarks.gpu_check table OUT      # one markdown table of OUT's pytest log, pipeline and benchmarks
"""

from __future__ import annotations

import json
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
        (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        started = time.perf_counter()
        for stage, spec in stages.items():
            cmd = [sys.executable if part == "python" else part for part in shlex.split(spec["cmd"])]
            t0 = time.perf_counter()
            proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
            wall = time.perf_counter() - t0
            (out / f"stage_{stage}.log").write_text(proc.stdout + proc.stderr)
            rows.append({"stage": stage, "exit": proc.returncode, "wall_s": round(wall, 2),
                         "train_s": training_seconds(work, stage, proc.stdout + proc.stderr),
                         "last_line": (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]})
            print(f"gpu-check: {stage}: exit {proc.returncode}, {wall:.1f} s", flush=True)
            if proc.returncode:
                break
        total = time.perf_counter() - started
    result = {"stages": rows, "total_s": round(total, 2)}
    (out / "pipeline.json").write_text(json.dumps(result, indent=2) + "\n")
    return rows


def training_seconds(work: Path, stage: str, output: str) -> float | None:
    """A training stage's training time: from its reports/<task>/run.json, else its closing line."""
    record = work / "reports" / stage.removeprefix("train_") / "run.json"
    if record.exists():
        return json.loads(record.read_text()).get("timing", {}).get("train_time_s")
    match = re.search(r"train(?:ing)? time ([\d.]+) s", output)
    return float(match.group(1)) if match else None


def table(out: Path) -> str:
    """One markdown report: GPU tests, stage times, engine vs the other contenders per model, MFU, targets."""
    lines = ["# GPU check", ""]
    gpu = (out / "gpu.txt").read_text().strip() if (out / "gpu.txt").exists() else "unknown GPU"
    lines += [f"Device: {gpu.splitlines()[-1] if gpu else 'unknown'}", ""]
    log = (out / "pytest_gpu.log").read_text() if (out / "pytest_gpu.log").exists() else ""
    summary = [line for line in log.splitlines() if re.search(r"\d+ (passed|failed)", line)]
    lines += ["## pytest -m gpu", "", summary[-1] if summary else "(no pytest summary found)", ""]
    failed = [line for line in log.splitlines() if line.startswith("FAILED")]
    lines += failed + ([""] if failed else [])
    if (out / "pipeline.json").exists():
        pipe = json.loads((out / "pipeline.json").read_text())
        lines += ["## Default pipeline (tracking off, no DVC)", "", "| stage | exit | wall s | training s |",
                  "|---|---|---|---|"]
        for r in pipe["stages"]:
            train = f"{r['train_s']:.1f}" if r.get("train_s") is not None else "–"
            lines.append(f"| {r['stage']} | {r['exit']} | {r['wall_s']:.1f} | {train} |")
        lines += [f"| all | | {pipe['total_s']:.1f} | |", ""]
    bench = out / "bench"
    speed = _load(bench / "training_speed.json")
    if speed:
        lines += ["## Training throughput (samples/s, medians)", "",
                  "| model | engine | plain | Lightning | bare eager | bare graph | engine / each |", "|---|---|---|---|---|---|---|"]
        for name, r in speed["results"].items():
            med = r.get("median", {})
            cells = [_num(med.get(c, {}).get("samples_per_s")) for c in
                     ("engine", "plain", "lightning", "bare eager", "bare graph")]
            ratios = ", ".join(f"{k.split('/')[1]} {v['ratio_of_medians']:.2f}x" for k, v in r.get("ratios", {}).items()
                               if v.get("ratio_of_medians"))
            lines.append(f"| {name} | " + " | ".join(cells) + f" | {ratios} |")
        lines.append("")
    mfu = _load(bench / "mfu.json")
    if mfu:
        lines += ["## Training step (params.yaml recipe)", "", "| step | dtype | CUDA graph | ms | samples/s | MFU |",
                  "|---|---|---|---|---|---|"]
        for label, m in mfu["results"].get("models", {}).items():
            ms = m.get("median_step_s")
            lines.append(f"| {label} | {m['precision']} | {m.get('cuda_graph')} | {_num(ms and 1e3 * ms, 3)} | "
                         f"{_num(m.get('median_samples_per_s'))} | {_num(m.get('mfu') and 100 * m['mfu'], 1)}% |")
        lines.append("")
    summary_json = _load(bench / "summary.json")
    if summary_json:
        lines += ["## Targets", "", "| figure | measured | target | verdict |", "|---|---|---|---|"]
        lines += [f"| {t['what']} | {t['value']} | {t['target']} | {t['verdict']} |" for t in summary_json["targets"]]
        lines.append("")
    return "\n".join(lines)


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _num(value, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(argv) != 2 or argv[0] not in ("pipeline", "table"):
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    if argv[0] == "pipeline":
        rows = run_pipeline(out)
        return int(any(r["exit"] for r in rows))
    report = table(out)
    (out / "gpu_check.md").write_text(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
