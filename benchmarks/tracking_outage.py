"""The MLflow server killed 10 s into a classifier training (once its run is open) and back at 40 s: wall time and the run's content against
an undisturbed run of the same params. `python -m benchmarks.tracking_outage [--epochs 24] [--kill-at 10 --back-at 40]`
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
EPOCH_KEYS = ("step", "train_loss", "lr", "val_loss", "val_accuracy", "val_macro_f1")


def main(argv: list[str]) -> None:
    from tests.reliability.factories import run_env, stage_command
    from tests.reliability.servers import MlflowServer
    from tests.reliability.test_tracking import free_port

    parser = argparse.ArgumentParser(prog="python -m benchmarks.tracking_outage", description=__doc__)
    parser.add_argument("--epochs", type=int, default=24)
    parser.add_argument("--kill-at", type=float, default=10.0)
    parser.add_argument("--back-at", type=float, default=40.0)
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="trainlab-outage-"))
    try:
        params = yaml.safe_load((REPO / "params.yaml").read_text())
        params["classifier"]["epochs"] = args.epochs
        (root / "server").mkdir()
        server = MlflowServer(root / "server", free_port())
        server.start()
        params["tracking"]["uri"] = server.uri
        data = root / "data" / "prepared"
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        subprocess.run(stage_command("stages.prepare", str(data), str(root / "data_stats.json"), "--params",
                                     str(root / "params.yaml")), cwd=root, env=run_env(), check=True,
                       capture_output=True)
        results = {}
        for label in ("undisturbed", "disturbed"):
            ws = root / label
            ws.mkdir()
            (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
            cmd = stage_command("stages.train_classifier", str(data / "classification"), "models/classifier",
                                "reports/classifier")
            started = time.monotonic()
            proc = subprocess.Popen(cmd, cwd=ws, env=run_env(OMP_NUM_THREADS="2"), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            if label == "disturbed":
                # killed once the run is open (a server gone while the run opens is another case: exit 6 at once)
                while not _run_open(server.uri) and proc.poll() is None:
                    time.sleep(0.2)
                time.sleep(max(0.0, args.kill_at - (time.monotonic() - started)))
                server.stop()
                killed = time.monotonic() - started
                time.sleep(max(0.0, args.back_at - (time.monotonic() - started)))
                server.start()
                back = time.monotonic() - started
            output = proc.communicate()[0]
            wall = time.monotonic() - started
            record = ws / "reports/classifier/run.json"  # the run id and timings (git-ignored)
            run = json.loads(record.read_text()) if proc.returncode == 0 and record.exists() else {}
            results[label] = {"exit": proc.returncode, "wall_s": round(wall, 1), "run_id": run.get("mlflow_run_id"),
                              "train_time_s": run.get("timing", {}).get("train_time_s")}
            if label == "disturbed":
                results[label].update(killed_at_s=round(killed, 1), back_at_s=round(back, 1),
                                      warned="MLflow server not answering" in output)
            if proc.returncode != 0:
                print(output[-3000:], file=sys.stderr)
        import mlflow

        client = mlflow.MlflowClient(tracking_uri=server.uri, registry_uri=server.uri)
        for label, result in results.items():
            if not result["run_id"]:
                continue
            run = client.get_run(result["run_id"])
            result["status"] = run.info.status
            result["epoch_steps_complete"] = all(
                [m.step for m in client.get_metric_history(run.info.run_id, k)] == list(range(1, args.epochs + 1))
                for k in EPOCH_KEYS)
            result["metrics"] = len(run.data.metrics)
            result["models"] = len(client.search_logged_models([run.info.experiment_id],
                                                               filter_string=f"source_run_id = '{run.info.run_id}'"))
        server.stop()
        a, b = results["undisturbed"], results["disturbed"]
        print(json.dumps(results, indent=2))
        if a["exit"] == 0 and b["exit"] == 0:
            print(f"disturbed / undisturbed wall time: {b['wall_s'] / a['wall_s']:.3f} "
                  f"({b['wall_s']} s vs {a['wall_s']} s; server killed at {b['killed_at_s']} s, back at "
                  f"{b['back_at_s']} s)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run_open(uri: str) -> bool:
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("trainlab")
    return experiment is not None and bool(client.search_runs([experiment.experiment_id],
                                                               filter_string="attributes.status = 'RUNNING'"))


if __name__ == "__main__":
    main(sys.argv[1:])
