"""Pipeline overhead: no-op `dvc repro`, a training stage's cold start, and the Prefect flow's own time."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import REPO, PartResult, Skip, alternate, fmt, log, table
from benchmarks.tiny import TINY_PARAMS
from pipelines.overrides import deep_merge
from pipelines.workspace import copy_worktree

BIN = Path(sys.executable).parent
GIT_IDENTITY = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
                "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost"}
COMMAND_TIMEOUT_S = 1200
FULL_WORK_RUNS = 1  # flow runs of the whole tiny pipeline with every stage running

# --quick runs the pipeline only up to this stage (prepare + train_classifier), the full run every stage.
QUICK_TARGET = "train_classifier"
# The cold start runs the default classifier (params.yaml) for one optimizer step.
COLD_START_OVERRIDES = {task: {"epochs": 1, "max_steps": 1} for task in ("classifier", "segmenter", "text")}
COLD_START_STAGE = ("stages.train_classifier", "data/prepared/classification")
# Each training stage run to its end on params.yaml's model for one optimizer step: its start and its end.
STAGE_ENDS = {"classifier": ("stages.train_classifier", "data/prepared/classification"),
              "segmenter": ("stages.train_segmenter", "data/prepared/segmentation"),
              "text": ("stages.train_text", "data/prepared/text", "--baseline", "models/text_baseline/baseline.json")}
# A real run's end: two whole epochs, so that the last validation is not the first (whose imports, torchmetrics,
# land in epoch 1 of any real run); measured once per stage (one run each, after the alternated figures).
REAL_END_OVERRIDES = {task: {"epochs": 2, "max_steps": None} for task in ("classifier", "segmenter", "text")}
# The targets: start at most this much over `python -c "import torch"`; end at most this plus the test pass.
START_OVER_TORCH_S, END_S = 1.5, 1.0


def known_sections(params: dict, extra: dict) -> dict:
    """Only the sections params.yaml has (the profile section may not exist yet)."""
    return {k: v for k, v in extra.items() if k in params}


def base_env(root: Path) -> dict[str, str]:
    """This venv first on PATH, no analytics, MLflow and Prefect kept inside the temporary copy."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "TRAINLAB_PARENT_RUN_ID", "PYTHONPATH")}
    env.update({"PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", "DVC_NO_ANALYTICS": "1",
                "PREFECT_HOME": str(root.parent / "prefect-home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "DO_NOT_TRACK": "1", "PREFECT_SERVER_UI_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
                "PYTHONUNBUFFERED": "1", **GIT_IDENTITY})
    return env


def stop_group(pid: int) -> None:
    """SIGKILL a process group (a command started with start_new_session) and so every process it started."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def run_cmd(cmd: list[str], cwd: Path, env: dict[str, str], logfile: Path) -> tuple[float, str]:
    """Run a command, its output appended to `logfile`; returns (wall seconds, output). Raises on failure. At the
    deadline its whole process group is stopped: `dvc repro` stopped alone would leave its stage running."""
    t0 = time.perf_counter()
    with subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          stdin=subprocess.DEVNULL, start_new_session=True) as popen:
        try:
            stdout, stderr = popen.communicate(timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stop_group(popen.pid)
            popen.communicate()
            raise
        finally:
            stop_group(popen.pid)
    proc = subprocess.CompletedProcess(cmd, popen.returncode, stdout, stderr)
    wall = time.perf_counter() - t0
    with open(logfile, "a") as f:
        f.write(f"$ {' '.join(cmd)}  ({wall:.2f} s, exit {proc.returncode})\n{proc.stdout}\n{proc.stderr}\n")
    if proc.returncode != 0:
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        errors = [line for line in lines if line.startswith(("ERROR", "error:"))]
        raise RuntimeError(f"`{' '.join(cmd)}` exited with {proc.returncode}: " + " | ".join(errors[-3:] + lines[-5:]))
    return wall, proc.stdout


class Workspace:
    """A private git + DVC copy of this repository on tiny params (or params.yaml as it is), set up once for every
    overhead measurement."""

    def __init__(self, tmp: Path, target: str | None = None, tiny: bool = True):
        self.target = [target] if target else []
        self.tiny = tiny
        self.root = tmp / "repo"
        self.root.mkdir(parents=True)
        self.log = tmp / "commands.log"
        self.env = base_env(self.root)
        self.seed = 1000

    def setup(self) -> float:
        t0 = time.perf_counter()
        copy_worktree(REPO, self.root)
        for leftover in ("dvc.lock", "mlflow.db"):
            (self.root / leftover).unlink(missing_ok=True)
        if self.tiny:
            params = yaml.safe_load((self.root / "params.yaml").read_text())
            deep_merge(params, known_sections(params, TINY_PARAMS))
            (self.root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        cold = yaml.safe_load((REPO / "params.yaml").read_text())
        deep_merge(cold, COLD_START_OVERRIDES)
        (self.root.parent / "cold_params.yaml").write_text(yaml.safe_dump(cold, sort_keys=False))
        real = yaml.safe_load((REPO / "params.yaml").read_text())
        deep_merge(real, REAL_END_OVERRIDES)
        (self.root.parent / "real_params.yaml").write_text(yaml.safe_dump(real, sort_keys=False))
        for args in (["init", "--quiet"], ["add", "-A"], ["commit", "--quiet", "--no-verify", "-m", "bench copy"]):
            run_cmd(["git", *args], self.root, self.env, self.log)
        return time.perf_counter() - t0

    def dvc(self, *args: str) -> tuple[float, str]:
        return run_cmd([str(BIN / "dvc"), *args], self.root, self.env, self.log)

    def bump_seed(self) -> int:
        """A new base.seed: every stage is out of date, and never in DVC's run cache."""
        self.seed += 1
        params = yaml.safe_load((self.root / "params.yaml").read_text())
        params["base"]["seed"] = self.seed
        (self.root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        return self.seed

    def repro(self) -> tuple[float, str]:
        return self.dvc("repro", *self.target)

    def flow(self) -> dict[str, Any]:
        """`python -m pipelines.flow --json`: its wall time from process start and the summary it prints."""
        targets = [arg for t in self.target for arg in ("--target", t)]
        wall, out = run_cmd([sys.executable, "-m", "pipelines.flow", "--json", "--retries", "0", *targets],
                            self.root, self.env, self.log)
        summary = last_json(out)
        stages = summary.get("stages", [])
        stage_sum = sum(s.get("seconds", 0.0) for s in stages)
        return {"wall_s": wall, "flow_seconds": summary.get("seconds"), "stage_seconds_sum": stage_sum,
                "overhead_s": wall - stage_sum, "overhead_fraction": (wall - stage_sum) / wall,
                "in_flow_overhead_s": (summary.get("seconds") or 0.0) - stage_sum,
                "statuses": sorted({s.get("status", "?") for s in stages}), "stages": len(stages),
                "per_stage_s": {s["stage"]: s.get("seconds") for s in stages}}

    def import_torch(self) -> dict[str, Any]:
        """`python -c "import torch"`: the floor a stage's start is compared with."""
        wall, _ = run_cmd([sys.executable, "-c", "import torch"], self.root, self.env, self.log)
        return {"wall_s": wall}

    def stage_ends(self, task: str, index: int, real: bool = False) -> dict[str, Any]:
        """A training stage (default model, one optimizer step, or two epochs when `real`; tracking on with local
        SQLite) run to its end: spawn to the first training step, and the last step's end to the process's end, less
        the test-split pass."""
        module, data, *extra = STAGE_ENDS[task]
        params = self.root.parent / ("real_params.yaml" if real else "cold_params.yaml")
        out_dir = self.root.parent / f"ends-{task}{index}"
        marks_file = self.root.parent / f"ends-{task}{index}.json"
        env = {**self.env, "BENCH_FIRST_STEP_FILE": str(marks_file), "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-m", "benchmarks.first_step", module, data, str(out_dir / "models"),
               str(out_dir / "reports"), *extra, "--params", str(params)]
        spawned = time.time()
        run_cmd(cmd, self.root, env, self.log)
        ended = time.time()
        marks = json.loads(marks_file.read_text())
        missing = {"first_forward", "last_step_end", "fit_end", "test_eval_start", "test_eval_end"} - set(marks)
        if missing:
            raise RuntimeError(f"{module}: no {sorted(missing)} marks (marks: {sorted(marks)})")
        test_eval = marks["test_eval_end"] - marks["test_eval_start"]
        shutil.rmtree(out_dir, ignore_errors=True)
        return {"start_s": marks["first_forward"] - spawned, "test_eval_s": test_eval,
                "end_s": ended - marks["last_step_end"] - test_eval,
                "last_validation_s": marks["fit_end"] - marks["last_step_end"],
                "after_training_s": ended - marks["fit_end"] - test_eval,
                "import_torch_in_stage_s": marks["import_end:torch"] - marks["import_start:torch"]}

    def cold_start(self, index: int) -> dict[str, Any]:
        """Process spawn to the first training step of train_classifier (default model, data and tracking)."""
        module, data = COLD_START_STAGE
        out_dir = self.root.parent / f"cold{index}"
        marks_file = self.root.parent / f"cold{index}.json"
        env = {**self.env, "BENCH_FIRST_STEP_FILE": str(marks_file), "BENCH_EXIT_AFTER_FIRST_STEP": "1",
               "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, "-m", "benchmarks.first_step", module, data, str(out_dir / "models"),
               str(out_dir / "reports"), "--params", str(self.root.parent / "cold_params.yaml")]
        spawned = time.time()
        run_cmd(cmd, self.root, env, self.log)
        marks = json.loads(marks_file.read_text())
        if "first_forward" not in marks:
            raise RuntimeError(f"the stage ran no training step (marks: {sorted(marks)})")
        rel = {k: v - spawned for k, v in marks.items()}
        imports = {k.split(":", 1)[1]: rel[f"import_end:{k.split(':', 1)[1]}"] - v
                   for k, v in rel.items() if k.startswith("import_start:")}
        shutil.rmtree(out_dir, ignore_errors=True)
        return {"cold_start_s": rel["first_forward"], "first_step_end_s": rel.get("first_step_end"),
                "interpreter_s": rel["process_start"],
                "import_torch_s": imports.get("torch"), "import_mlflow_s": imports.get("mlflow"),
                "imports_s": dict(sorted(imports.items(), key=lambda kv: -kv[1])),
                "imported_at_s": {k.split(":", 1)[1]: v for k, v in rel.items() if k.startswith("import_start:")}}


def last_json(text: str) -> dict[str, Any]:
    """The JSON object a command printed last (the flow prints its summary with indent=2)."""
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if lines[i] == "{":
            try:
                return json.loads("\n".join(lines[i:]))
            except json.JSONDecodeError:
                continue
    raise RuntimeError(f"no JSON summary in the flow's output: {text[-500:]}")


def run(quick: bool, repeats: int, keep: bool = False) -> PartResult:
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    data: dict[str, Any] = {"workspace": str(tmp)}
    data["stages"] = QUICK_TARGET + " and what it needs" if quick else "all"
    try:
        ws = Workspace(tmp, QUICK_TARGET if quick else None)
        data["setup_s"] = ws.setup()
        log(f"overhead: copied the repo to {ws.root} ({data['setup_s']:.1f} s); first `dvc repro` (tiny params)")
        data["first_repro_s"], _ = ws.repro()
        log(f"overhead: first dvc repro {data['first_repro_s']:.1f} s")
        contenders: dict[str, Any] = {}

        def noop_repro(r, warm):
            wall, out = ws.repro()
            if "Running stage" in out:
                raise RuntimeError(f"`dvc repro` was not a no-op: {out[-500:]}")
            return {"wall_s": wall}

        contenders["noop_dvc_repro"] = noop_repro
        counter = iter(range(10_000))
        contenders["cold_start"] = lambda r, warm: ws.cold_start(next(counter))
        contenders["noop_flow"] = lambda r, warm: ws.flow()
        contenders["import_torch"] = lambda r, warm: ws.import_torch()
        for task in ["classifier"] if quick else STAGE_ENDS:  # --quick prepares and trains the classifier only
            contenders[f"ends_{task}"] = lambda r, warm, task=task: ws.stage_ends(task, next(counter))
        # quick: one timed run of each after the warm-up, a smoke test
        comparison = alternate(contenders, 1 if quick else repeats, what="overhead")
        data["noop"] = comparison.summary(["wall_s", "cold_start_s", "first_step_end_s", "import_torch_s",
                                           "import_mlflow_s", "overhead_s", "overhead_fraction",
                                           "stage_seconds_sum", "start_s", "end_s", "test_eval_s",
                                           "last_validation_s", "after_training_s",
                                           "import_torch_in_stage_s"])
        ends_keys = ["start_s", "end_s", "test_eval_s", "last_validation_s", "after_training_s",
                     "import_torch_in_stage_s"]
        real_ends = {f"ends_{task}": lambda r, warm, task=task: ws.stage_ends(task, next(counter), real=True)
                     for task in (["classifier"] if quick else STAGE_ENDS)}
        data["real_ends"] = alternate(real_ends, 1, warmup=False, what="stage ends, two epochs").summary(ends_keys)
        if not quick:
            # Every stage runs (a new seed, so nothing comes from DVC's run cache). One run: a tiny pipeline takes
            # a minute or more, and the no-op flow above, timed `repeats` times, carries the same overhead (measured
            # on a busy 2-core machine: 22.2 s no-op vs 21.2 s with every stage running).
            real = {"flow": lambda r, warm: (ws.bump_seed(), ws.flow())[1]}
            comparison = alternate(real, FULL_WORK_RUNS, warmup=False, what="full pipeline")
            data["full"] = comparison.summary(["wall_s", "overhead_s", "overhead_fraction", "stage_seconds_sum",
                                               "in_flow_overhead_s"])
        data["default_pipeline_s"] = default_pipeline_seconds()
    except (RuntimeError, subprocess.TimeoutExpired, Skip) as exc:
        data["error"] = str(exc)
        log(f"overhead: failed: {exc}")
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    headline = headline_figures(data)
    return PartResult("overhead", data, markdown(data, headline), headline, time.perf_counter() - t0)


def default_pipeline_seconds() -> dict[str, Any] | None:
    """The default pipeline's training time from the last real `dvc repro` in this repo (the git-ignored
    reports/<task>/run.json of each training stage), if every one has it."""
    from trainlab import tasks

    found = {}
    for name in tasks.names():
        path = REPO / "reports" / name / "run.json"
        try:
            found[name] = float(json.loads(path.read_text())["timing"]["stage_time_s"])
        except (ValueError, KeyError, TypeError, OSError):
            return None
    return {"training_stages_s": found, "sum_s": sum(found.values()),
            "source": "reports/<task>/run.json (timing.stage_time_s of the last default run)"}


def headline_figures(data: dict[str, Any]) -> dict[str, Any]:
    noop = data.get("noop", {}).get("median", {})
    out = {"noop_dvc_repro_s": noop.get("noop_dvc_repro", {}).get("wall_s"),
           "cold_start_s": noop.get("cold_start", {}).get("cold_start_s")}
    torch_s = noop.get("import_torch", {}).get("wall_s")
    for task in STAGE_ENDS:
        ends = noop.get(f"ends_{task}")
        real = data.get("real_ends", {}).get("median", {}).get(f"ends_{task}")
        if ends and torch_s is not None:
            out[f"stage_start_over_import_torch_s_{task}"] = ends["start_s"] - torch_s
            out[f"stage_end_one_step_s_{task}"] = ends["end_s"]
        if real:
            out[f"stage_end_s_{task}"] = real["end_s"]  # the target's figure: a real run's end
    full = data.get("full", {}).get("median", {}).get("flow")
    noop_flow = noop.get("noop_flow")
    if noop_flow:
        out["prefect_overhead_noop_flow_s"] = noop_flow["overhead_s"]
    if full:
        out["prefect_overhead_fraction_tiny_pipeline"] = full["overhead_fraction"]
    overhead = full["overhead_s"] if full else (noop_flow or {}).get("overhead_s")
    if overhead is not None:
        out["prefect_overhead_s"] = overhead
        default = data.get("default_pipeline_s")
        if default:
            out["prefect_overhead_fraction_default_pipeline"] = overhead / (default["sum_s"] + overhead)
    return out


def stage_end_rows(med: dict[str, Any], real: dict[str, Any]) -> list[list[str]]:
    """Per training stage: spawn to first step over `import torch`, and last step to exit less the test pass, in a
    two-epoch run (`real`) and in a one-step run."""
    torch_s = med.get("import_torch", {}).get("wall_s")
    rows = [["`python -c \"import torch\"`", fmt(torch_s, "s"), "", ""]] if torch_s is not None else []
    for task in STAGE_ENDS:
        e = med.get(f"ends_{task}")
        if e is None or torch_s is None:
            continue
        rows.append([f"train_{task}: spawn → first training step, over `import torch` (in the stage "
                     f"{fmt(e['import_torch_in_stage_s'], 's')})", f"{fmt(e['start_s'] - torch_s, 's')} (start "
                     f"{fmt(e['start_s'], 's')})", "", f"≤ {START_OVER_TORCH_S} s"])
        r = real.get(f"ends_{task}")
        if r is not None:
            rows.append([f"train_{task}, two epochs: last training step → exit, less the test-split pass (1 run)",
                         f"{fmt(r['end_s'], 's')} (test pass {fmt(r['test_eval_s'], 's')})", "", f"≤ {END_S} s"])
            rows.append(["… of which the last validation / outputs, MLflow model and exit",
                         f"{fmt(r['last_validation_s'], 's')} / {fmt(r['after_training_s'], 's')}", "", ""])
        rows.append([f"train_{task}, one step: last training step → exit, less the test-split pass",
                     f"{fmt(e['end_s'], 's')} (test pass {fmt(e['test_eval_s'], 's')})", "", ""])
        rows.append(["… of which the last validation (here the first: it imports torchmetrics) / outputs, MLflow "
                     "model and exit", f"{fmt(e['last_validation_s'], 's')} / {fmt(e['after_training_s'], 's')}",
                     "", ""])
    return rows


def markdown(data: dict[str, Any], headline: dict[str, Any]) -> str:
    lines = ["## Pipeline overhead", ""]
    if "error" in data:
        lines += [f"Failed: `{data['error'][:500]}`", ""]
    noop = data.get("noop", {})
    med, spread = noop.get("median", {}), noop.get("spread", {})
    rows = []
    if "noop_dvc_repro" in med:
        rows.append(["no-op `dvc repro` (everything up to date)", fmt(med["noop_dvc_repro"]["wall_s"], "s"),
                     fmt(spread["noop_dvc_repro"]["wall_s"], "pct"), "≤ 1.5 s"])
    if "cold_start" in med:
        c = med["cold_start"]
        rows.append(["train_classifier cold start: process spawn → first training step",
                     fmt(c["cold_start_s"], "s"), fmt(spread["cold_start"]["cold_start_s"], "pct"), "≤ 4 s"])
        rows.append(["… of which `import torch` / `import mlflow`",
                     f"{fmt(c['import_torch_s'], 's')} / {fmt(c['import_mlflow_s'], 's')}", "", ""])
        rows.append(["… first training step done", fmt(c["first_step_end_s"], "s"), "", ""])
    rows += stage_end_rows(med, data.get("real_ends", {}).get("median", {}))
    if "noop_flow" in med:
        f = med["noop_flow"]
        first = noop.get("warmup", {}).get("noop_flow", {}).get("wall_s")
        rows.append(["first Prefect flow run (fresh Prefect home: its database is created)", fmt(first, "s"), "", ""])
        rows.append(["no-op Prefect flow (every stage skipped): wall / Σ stages",
                     f"{fmt(f['wall_s'], 's')} / {fmt(f['stage_seconds_sum'], 's')}",
                     fmt(spread["noop_flow"]["wall_s"], "pct"), ""])
        rows.append(["Prefect overhead of the no-op flow (wall − Σ stages)", fmt(f["overhead_s"], "s"),
                     fmt(spread["noop_flow"]["overhead_s"], "pct"), ""])
    full = data.get("full", {})
    if full.get("median", {}).get("flow"):
        f = full["median"]["flow"]
        rows.append(["full tiny pipeline (every stage runs): Prefect flow wall / Σ stages",
                     f"{fmt(f['wall_s'], 's')} / {fmt(f['stage_seconds_sum'], 's')}",
                     "", ""])
        rows.append(["Prefect overhead, every stage running (flow wall − Σ stage times; 1 run)",
                     f"{fmt(f['overhead_s'], 's')} ({fmt(f['overhead_fraction'], 'pct')} of the tiny pipeline)",
                     "", "≤ 10% of the default pipeline"])
    if "prefect_overhead_s" in headline:
        share = headline.get("prefect_overhead_fraction_default_pipeline")
        default = data.get("default_pipeline_s")
        rows.append(["Prefect overhead as a share of the default pipeline",
                     f"{fmt(share, 'pct')} (of {fmt(default['sum_s'], 's')} training stages + overhead)" if share
                     is not None else "– (needs reports/<task>/run.json from a default `dvc repro`)", "", "≤ 10%"])
    lines += [table(["what", "median", "spread", "target"], rows), ""]
    lines.append(f"In a private copy of the repository (git + DVC, tiny params, embedded data; set up in "
                 f"{fmt(data.get('setup_s'), 's')}, first real `dvc repro` {fmt(data.get('first_repro_s'), 's')}). "
                 "Cold start: `python -m stages.train_classifier` with params.yaml's classifier (tracking on), timed "
                 "from the parent's spawn to the model's first training-mode forward, by benchmarks/first_step.py "
                 "(import hooks and a global optimizer-step hook; the stage is unchanged). Σ stages: the seconds the "
                 "flow reports per stage (its `dvc status` + `dvc repro --single-item` calls).")
    return "\n".join(lines) + "\n"
