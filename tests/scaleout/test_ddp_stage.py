"""`python -m stages.train_text` with base.distributed.nproc_per_node 2 relaunches itself under torchrun (gloo on
CPU) and ends with the weights of a 1-process run (same global batch, same data order), one MLflow run, one set of
outputs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import mlflow
import pytest
import torch
from safetensors.torch import load_file

from tests.pipelines.conftest import free_port
from tests.scaleout.conftest import files_under, run_stage, sqlite_store, timed, tiny_params, write_params

pytestmark = pytest.mark.slow

MODEL_FILES = ["baseline.json", "config.json", "info.json", "model.safetensors", "preprocessing.json", "tokenizer.json"]
REPORT_FILES = ["history.csv", "metrics.json", "run.json"]


def train_text(root: Path, prepared: Path, migrated_db: Path, nproc: int):
    """train_text in its own folder `root` with its own SQLite store; the stage's output and the MLflow client."""
    port = free_port()
    write_params(root / "params.yaml", tiny_params(
        {"base": {"distributed": {"nproc_per_node": nproc, "rdzv_endpoint": f"127.0.0.1:{port}",
                                  "backend": "gloo"}}}))
    uri = sqlite_store(root / "store", migrated_db)
    with timed(f"train_text, {nproc} process(es)"):
        proc = run_stage("stages.train_text", [str(prepared / "data" / "prepared" / "text"), "models/text",
                                               "reports/text", "--baseline",
                                               str(prepared / "models" / "text_baseline" / "baseline.json")],
                         root, MLFLOW_TRACKING_URI=uri)
    return proc, mlflow.MlflowClient(tracking_uri=uri)


def history(root: Path) -> list[dict[str, str]]:
    with open(root / "reports/text/history.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, prepared, migrated_db):
    base = tmp_path_factory.mktemp("ddp")
    return {n: (base / f"nproc{n}", *train_text(base / f"nproc{n}", prepared, migrated_db, n)) for n in (1, 2)}


def test_two_processes_end_with_the_weights_of_one(runs):
    one_root, one, _ = runs[1]
    two_root, two, _ = runs[2]
    assert "launching" not in one.stdout
    assert "text: launching 2 x 1 processes" in two.stdout and "torch.distributed.run" in two.stdout
    a = load_file(str(one_root / "models/text/model.safetensors"))
    b = load_file(str(two_root / "models/text/model.safetensors"))
    assert a.keys() == b.keys() and len(a) > 0
    for key in a:
        torch.testing.assert_close(b[key], a[key], atol=1e-5, rtol=0, msg=lambda m, key=key: f"{key}: {m}")
    # both trained (a run that changed nothing would match trivially), with the same per-epoch losses
    h1, h2 = history(one_root), history(two_root)
    assert [r["epoch"] for r in h2] == ["1", "2"] and float(h2[1]["train_loss"]) < float(h2[0]["train_loss"])
    for r1, r2 in zip(h1, h2):
        assert float(r2["train_loss"]) == pytest.approx(float(r1["train_loss"]), abs=1e-5)
    m1 = json.loads((one_root / "models/text/info.json").read_text())["test"]
    m2 = json.loads((two_root / "models/text/info.json").read_text())["test"]
    assert m1.keys() == m2.keys()
    for key in ("loss", "accuracy"):  # test metrics: sharded over the ranks, all-reduced
        assert m2[key] == pytest.approx(m1[key], abs=1e-4), key


def test_only_rank_0_writes_outputs(runs):
    for n in (1, 2):
        root = runs[n][0]
        written = [f for f in files_under(root) if not f.startswith("store/") and f != "params.yaml"]
        assert written == [f"models/text/{f}" for f in MODEL_FILES] + [f"reports/text/{f}" for f in REPORT_FILES], n
        assert not (root / "checkpoints" / "text").exists() or not any((root / "checkpoints" / "text").iterdir())


def test_one_mlflow_run_for_two_processes(runs):
    root, _, client = runs[2]
    experiments = [e for e in client.search_experiments() if e.name == "trainlab"]
    assert len(experiments) == 1
    found = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(found) == 1, [(r.info.run_name, r.data.tags.get("stage")) for r in found]
    run = found[0]
    assert run.info.status == "FINISHED" and run.data.tags["stage"] == "train_text"
    assert run.data.params["world_size"] == "2" and run.data.params["base.distributed.nproc_per_node"] == "2"
    assert json.loads((root / "reports/text/run.json").read_text())["mlflow_run_id"] == run.info.run_id
    epochs = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "epoch")]
    assert [value for _, value in epochs] == [1, 2]  # one validation an epoch, at the optimizer step of its end
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == [s for s, _ in epochs]
    versions = client.search_model_versions("name='trainlab-text'")
    assert [v.run_id for v in versions] == [run.info.run_id]
    # the 1-process run logged the same way: world size 1, same metric keys
    one = runs[1][2].search_runs([e.experiment_id for e in runs[1][2].search_experiments()])
    assert len(one) == 1 and one[0].data.params["world_size"] == "1"
    assert one[0].data.metrics.keys() == run.data.metrics.keys()
