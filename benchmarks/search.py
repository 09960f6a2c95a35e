"""Search: the same enqueued classifier trials searched with and without pruning (`python -m pipelines.search` in two
private copies of the repo on the default data: wall time, best validation accuracy), and the text model's weight
decay chosen on validation on every corpus (benchmarks.text_quality.weight_decay_choice)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import REPO, PartResult, fmt, log, table
from benchmarks.overhead import BIN, base_env, last_json
from pipelines.workspace import copy_worktree

# The default classifier (params.yaml) for fewer epochs; every trial is enqueued, so both searches run the same ones.
EPOCHS = 10
TRIALS = [  # the default first (the pruner's reference), then settings a search would try around it
    {"classifier.lr": 0.003, "classifier.weight_decay": 0.05, "classifier.batch_size": 64},
    {"classifier.lr": 0.0003, "classifier.weight_decay": 0.05, "classifier.batch_size": 64},
    {"classifier.lr": 0.001, "classifier.weight_decay": 0.01, "classifier.batch_size": 128},
    {"classifier.lr": 0.03, "classifier.weight_decay": 0.05, "classifier.batch_size": 64},
    {"classifier.lr": 0.002, "classifier.weight_decay": 0.1, "classifier.batch_size": 64},
    {"classifier.lr": 0.0001, "classifier.weight_decay": 0.001, "classifier.batch_size": 128},
    {"classifier.lr": 0.006, "classifier.weight_decay": 0.02, "classifier.batch_size": 256},
    {"classifier.lr": 0.0005, "classifier.weight_decay": 0.2, "classifier.batch_size": 256},
]
QUICK = {"epochs": 2, "trials": 3}
PRUNER = {"kind": "median", "startup_trials": 1, "warmup_epochs": 1}
MAX_WALL_RATIO, MAX_BEST_GAP_POINTS = 0.5, 0.5  # the targets
COMMAND_TIMEOUT_S = 3600  # one search; a busy shared machine stretches it several times


def space(pruner: dict[str, Any], trials: list[dict[str, Any]], epochs: int) -> dict[str, Any]:
    """A search space holding exactly `trials` (enqueued; the ranges only have to contain them)."""
    return {"objective": {"stage": "train_classifier", "metric": "val_accuracy", "direction": "maximize"},
            "sampler": {"startup_trials": 100, "seed": 0}, "pruner": pruner,
            "params": {"classifier.lr": {"low": 1.0e-5, "high": 0.1, "log": True},
                       "classifier.weight_decay": {"low": 1.0e-4, "high": 0.5, "log": True},
                       "classifier.batch_size": {"choices": [64, 128, 256]}},
            "fixed": {"classifier.epochs": epochs}, "enqueue": trials}


def prepared_copy(tmp: Path) -> Path:
    """A git + DVC copy of this repository (its own DVC cache and MLflow store) with the default data prepared."""
    root = tmp / "pruning" / "repo"
    root.mkdir(parents=True)
    copy_worktree(REPO, root)
    for leftover in ("dvc.lock", "mlflow.db", "optuna.db"):
        (root / leftover).unlink(missing_ok=True)
    env, logfile = base_env(root), tmp / "commands.log"
    for args in (["init", "--quiet"], ["add", "-A"], ["commit", "--quiet", "--no-verify", "-m", "bench copy"]):
        run_cmd(["git", *args], root, env, logfile)
    run_cmd([str(BIN / "dvc"), "repro", "prepare"], root, env, logfile)
    return root


def run_cmd(cmd: list[str], cwd: Path, env: dict[str, str], logfile: Path) -> tuple[float, str]:
    """Run a command, its output appended to `logfile`; (wall seconds, stdout). RuntimeError on failure."""
    wall, _, out = timed(cmd, cwd, env, logfile)
    return wall, out


def timed(cmd: list[str], cwd: Path, env: dict[str, str], logfile: Path) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the command and every process under it, stdout); RuntimeError on failure.
    The CPU time is what the work costs whatever else the machine runs: a shared machine stretches the wall time."""
    t0, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
                          stdin=subprocess.DEVNULL, check=False)
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(logfile, "a") as f:
        f.write(f"$ {' '.join(cmd)}  ({wall:.2f} s, exit {proc.returncode})\n{proc.stdout}\n{proc.stderr}\n")
    if proc.returncode != 0:
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        raise RuntimeError(f"`{' '.join(cmd[:4])}` exited with {proc.returncode}: " + " | ".join(lines[-6:]))
    return wall, cpu, proc.stdout


@contextlib.contextmanager
def prefect_server(tmp: Path) -> Iterator[str]:
    """One `prefect server start` (its own home) for both searches, as a user with a server has: its start is
    nobody's search time."""
    from pipelines.local_prefect import started_server

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    saved = os.environ.get("PREFECT_HOME")
    os.environ["PREFECT_HOME"] = str(tmp / "prefect-server-home")
    try:
        with started_server(port, log):
            yield f"http://127.0.0.1:{port}/api"
    finally:
        os.environ.pop("PREFECT_HOME") if saved is None else os.environ.__setitem__("PREFECT_HOME", saved)


def search(root: Path, name: str, pruner: dict[str, Any], trials: list[dict[str, Any]], epochs: int,
           logfile: Path, api_url: str) -> dict[str, Any]:
    """`python -m pipelines.search` of `trials` in `root`: its summary, and its wall time from process start."""
    path = root.parent / f"{name}.yaml"
    path.write_text(yaml.safe_dump(space(pruner, trials, epochs), sort_keys=False))
    cmd = [sys.executable, "-m", "pipelines.search", str(path), "--trials", str(len(trials)), "--name", name,
           "--json"]
    load = os.getloadavg()[0]
    wall, cpu, out = timed(cmd, root, {**base_env(root), "PREFECT_API_URL": api_url}, logfile)
    summary = last_json(out)
    best = summary["best"]
    return {"wall_s": wall, "cpu_s": cpu, "search_s": summary["seconds"], "load_at_start": load,
            "load_at_end": os.getloadavg()[0], "counts": summary["counts"],
            "best_val_accuracy": best["value"], "best_trial": best["number"], "best_test": best["test"],
            "trials": [{k: r[k] for k in ("number", "state", "value", "last_epoch", "last_value", "seconds")}
                       for r in summary["rows"]]}


def measure(quick: bool, tmp: Path) -> dict[str, Any]:
    epochs = QUICK["epochs"] if quick else EPOCHS
    trials = TRIALS[:QUICK["trials"]] if quick else TRIALS
    t0 = time.perf_counter()
    first = prepared_copy(tmp)
    second = tmp / "no_pruning" / "repo"
    shutil.copytree(first, second, symlinks=True)  # its own DVC cache and stores: no result crosses over
    log(f"search: two prepared copies of the repo in {time.perf_counter() - t0:.0f} s; {len(trials)} enqueued "
        f"trials of {epochs} epochs each, without then with pruning")
    data: dict[str, Any] = {"epochs": epochs, "trials": trials, "pruner": PRUNER}
    with prefect_server(tmp) as api_url:
        data["no_pruning"] = search(second, "no-pruning", {"kind": "none"}, trials, epochs, tmp / "commands.log",
                                    api_url)
        log(f"search: without pruning {data['no_pruning']['wall_s']:.0f} s, best val accuracy "
            f"{data['no_pruning']['best_val_accuracy']:.4f}")
        data["pruning"] = search(first, "pruning", PRUNER, trials, epochs, tmp / "commands.log", api_url)
    log(f"search: with pruning {data['pruning']['wall_s']:.0f} s, best val accuracy "
        f"{data['pruning']['best_val_accuracy']:.4f}, {data['pruning']['counts']['PRUNED']} pruned")
    return data


def headline_figures(data: dict[str, Any]) -> dict[str, Any]:
    if "pruning" not in data or "no_pruning" not in data:
        return {}
    on, off = data["pruning"], data["no_pruning"]
    return {"search_pruning_wall_ratio": on["wall_s"] / off["wall_s"],
            "search_pruning_cpu_ratio": on["cpu_s"] / off["cpu_s"],
            "search_pruning_best_val_gap_points": 100 * (off["best_val_accuracy"] - on["best_val_accuracy"]),
            "search_pruned_trials": on["counts"]["PRUNED"]}


def markdown(data: dict[str, Any], headline: dict[str, Any]) -> str:
    lines = ["## Search: pruning", ""]
    if "error" in data:
        lines += [f"Failed: `{data['error'][:500]}`", ""]
    if not headline:
        return "\n".join(lines)
    on, off = data["pruning"], data["no_pruning"]
    lines += [f"{len(data['trials'])} enqueued trials of the default classifier for {data['epochs']} epochs, searched "
              f"one at a time by `python -m pipelines.search` with pruning off and with the median pruner "
              f"({json.dumps(data['pruner'])}); each search in its own copy of the repo.", "",
              table(["", "without pruning", "with pruning", "target"], [
                  ["wall time (process)", fmt(off["wall_s"], "s"), fmt(on["wall_s"], "s"),
                   f"with / without {headline['search_pruning_wall_ratio']:.2f}x (≤ {MAX_WALL_RATIO}x)"],
                  ["CPU time (the search and every process under it)", fmt(off["cpu_s"], "s"), fmt(on["cpu_s"], "s"),
                   f"with / without {headline['search_pruning_cpu_ratio']:.2f}x"],
                  ["search time (the flow's own)", fmt(off["search_s"], "s"), fmt(on["search_s"], "s"), ""],
                  ["load average (1 min) at start / end", f"{off['load_at_start']:.1f} / {off['load_at_end']:.1f}",
                   f"{on['load_at_start']:.1f} / {on['load_at_end']:.1f}", ""],
                  ["best val accuracy", f"{off['best_val_accuracy']:.4f} (trial {off['best_trial']})",
                   f"{on['best_val_accuracy']:.4f} (trial {on['best_trial']})",
                   f"gap {headline['search_pruning_best_val_gap_points']:+.2f} pt (≤ {MAX_BEST_GAP_POINTS})"],
                  ["best trial's test figures", _test(off), _test(on), ""],
                  ["trials complete / pruned", f"{off['counts']['COMPLETE']} / {off['counts']['PRUNED']}",
                   f"{on['counts']['COMPLETE']} / {on['counts']['PRUNED']}", ""]]), "",
              "Per trial (with pruning): " + "; ".join(
                  f"{t['number']} {t['state'].lower()} at epoch {t['last_epoch']} ({t['last_value']:.3f}, "
                  f"{t['seconds']:.0f} s)" for t in on["trials"] if t["last_epoch"]), ""]
    return "\n".join(lines)


def _test(result: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in result["best_test"].items()) or "-"


def run(quick: bool = False, keep: bool = False) -> PartResult:
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench-search-"))
    data: dict[str, Any] = {"workspace": str(tmp)}
    try:
        data.update(measure(quick, tmp))
    except (RuntimeError, subprocess.TimeoutExpired, KeyError) as exc:
        data["error"] = str(exc)
        log(f"search: failed: {exc}")
    finally:
        if not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    headline = headline_figures(data)
    parts = [markdown(data, headline)]
    try:
        text = text_half(quick)
    except Exception as exc:  # noqa: BLE001 - the text half failing must not cost the pruning figures
        data["text"] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        parts.append(f"## text: weight decay chosen on validation\n\nFailed: `{data['text']['error'][:500]}`")
        log(f"search: the text half failed: {data['text']['error']}")
    else:
        if text is not None:
            data["text"] = text.data
            headline.update(text.headline)
            parts.append(text.markdown)
    return PartResult("search", data, "\n\n".join(parts), headline, time.perf_counter() - t0)


def text_half(quick: bool) -> PartResult | None:
    """The text model's weight decay chosen on validation, from benchmarks.text_quality (not in --quick)."""
    from benchmarks import text_quality

    choose = getattr(text_quality, "weight_decay_choice", None)
    if quick or choose is None:
        return None
    return choose()
