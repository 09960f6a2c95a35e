"""The MLflow server killed 10 s into a classifier training (once its run is open) and back at 40 s: wall time and
the run's content against an undisturbed run of the same params.
`python -m benchmarks.tracking_outage [--epochs 24] [--kill-at 10 --back-at 40]`
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.processes import REPO, MlflowServer, free_port, run_env, stage_command

EPOCH_KEYS = ("step", "train_loss", "lr", "val_loss", "val_accuracy", "val_macro_f1")


@dataclass(frozen=True)
class Outage:
    """When the server is killed and when it is back, in seconds from the disturbed training's start."""

    kill_at: float
    back_at: float


@dataclass(frozen=True)
class Workspace:
    """The temporary tree both trainings share: the MLflow server, their params.yaml (as a dict), the prepared data."""

    root: Path
    server: MlflowServer
    params: dict[str, Any]
    data: Path


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tracking_outage", description=__doc__)
    parser.add_argument("--epochs", type=int, default=24)
    parser.add_argument("--kill-at", type=float, default=10.0)
    parser.add_argument("--back-at", type=float, default=40.0)
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="trainlab-outage-"))
    try:
        space = set_up(root, args.epochs)
        results = {label: train(space, label, Outage(args.kill_at, args.back_at) if label == "disturbed" else None)
                   for label in ("undisturbed", "disturbed")}
        add_run_contents(space.server.uri, results, args.epochs)
        space.server.stop()
        report(results)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def set_up(root: Path, epochs: int) -> Workspace:
    """Start an MLflow server under `root` and prepare the data with params.yaml (`epochs` classifier epochs)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["classifier"]["epochs"] = epochs
    (root / "server").mkdir()
    server = MlflowServer(root / "server", free_port())
    server.start()
    params["tracking"]["uri"] = server.uri
    data = root / "data" / "prepared"
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    subprocess.run(stage_command("stages.prepare", str(data), str(root / "data_stats.json"), "--params",
                                 str(root / "params.yaml")), cwd=root, env=run_env(), check=True,
                   capture_output=True)
    return Workspace(root, server, params, data)


def train(space: Workspace, label: str, outage: Outage | None) -> dict[str, Any]:
    """Train the classifier in its own folder (with `outage`, the server cut meanwhile): exit, wall time, run id."""
    ws = space.root / label
    ws.mkdir()
    (ws / "params.yaml").write_text(yaml.safe_dump(space.params, sort_keys=False))
    cmd = stage_command("stages.train_classifier", str(space.data / "classification"), "models/classifier",
                        "reports/classifier")
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ws, env=run_env(OMP_NUM_THREADS="2"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    cut = cut_server(space.server, proc, started, outage) if outage is not None else {}
    output = proc.communicate()[0]
    wall = time.monotonic() - started
    record = ws / "reports/classifier/run.json"  # the run id and timings (git-ignored)
    run = json.loads(record.read_text()) if proc.returncode == 0 and record.exists() else {}
    result = {"exit": proc.returncode, "wall_s": round(wall, 1), "run_id": run.get("mlflow_run_id"),
              "train_time_s": run.get("timing", {}).get("train_time_s")}
    if outage is not None:
        result.update(cut, warned="MLflow server not answering" in output)
    if proc.returncode != 0:
        print(output[-3000:], file=sys.stderr)
    return result


def cut_server(server: MlflowServer, proc: subprocess.Popen, started: float, outage: Outage) -> dict[str, float]:
    """Kill the server at `outage.kill_at` once the run is open (a server gone while the run opens is another case,
    tests/reliability/test_outage.py's) and start it again at `outage.back_at`; when that happened."""
    while not _run_open(server.uri) and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(max(0.0, outage.kill_at - (time.monotonic() - started)))
    server.stop()
    killed = time.monotonic() - started
    time.sleep(max(0.0, outage.back_at - (time.monotonic() - started)))
    server.start()
    back = time.monotonic() - started
    return {"killed_at_s": round(killed, 1), "back_at_s": round(back, 1)}


def add_run_contents(uri: str, results: dict[str, dict[str, Any]], epochs: int) -> None:
    """Add what each training's MLflow run holds: status, whether every epoch metric has steps 1..epochs, the
    number of metrics and of logged models."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    for result in results.values():
        if not result["run_id"]:
            continue
        run = client.get_run(result["run_id"])
        result["status"] = run.info.status
        result["epoch_steps_complete"] = all(
            [m.step for m in client.get_metric_history(run.info.run_id, k)] == list(range(1, epochs + 1))
            for k in EPOCH_KEYS)
        result["metrics"] = len(run.data.metrics)
        result["models"] = len(client.search_logged_models([run.info.experiment_id],
                                                           filter_string=f"source_run_id = '{run.info.run_id}'"))


def report(results: dict[str, dict[str, Any]]) -> None:
    """Print the results as JSON and, when both trainings succeeded, the wall-time ratio."""
    a, b = results["undisturbed"], results["disturbed"]
    print(json.dumps(results, indent=2))
    if a["exit"] == 0 and b["exit"] == 0:
        print(f"disturbed / undisturbed wall time: {b['wall_s'] / a['wall_s']:.3f} "
              f"({b['wall_s']} s vs {a['wall_s']} s; server killed at {b['killed_at_s']} s, back at "
              f"{b['back_at_s']} s)")


def _run_open(uri: str) -> bool:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("trainlab")
    return experiment is not None and bool(client.search_runs([experiment.experiment_id],
                                                               filter_string="attributes.status = 'RUNNING'"))


if __name__ == "__main__":
    main(sys.argv[1:])
