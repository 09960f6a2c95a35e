"""DDP: a 2-process gloo run ends with the same weights as a 1-process run with the same global batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.processes import free_port
from trainlab.core.config import DistributedParams
from trainlab.core.distributed import torchrun_command

WORKER = Path(__file__).with_name("ddp_worker.py")
REPO = Path(__file__).resolve().parents[2]


def run(cmd: list[str], tmp_path: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_two_gloo_processes_match_one_process(tmp_path):
    one, two = tmp_path / "one.pt", tmp_path / "two.pt"
    out1 = run([sys.executable, str(WORKER), str(one)], tmp_path)
    port = free_port()
    out2 = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
                "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}", str(WORKER), str(two)], tmp_path)
    assert "world_size=1" in out1 and "world_size=2" in out2
    a, b = torch.load(one, weights_only=True), torch.load(two, weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=0)
    # identical validation metrics: evaluation is sharded and all-reduced
    assert out1.split("val_accuracy=")[1].strip() == out2.split("val_accuracy=")[1].strip()


def test_torchrun_command_single_and_multi_node():
    single = torchrun_command(DistributedParams(nproc_per_node=2), "stages.train_text", ["a", "b"])
    assert "--standalone" in single and single[-3:] == ["stages.train_text", "a", "b"]
    multi = torchrun_command(DistributedParams(nproc_per_node=4, nnodes=2, node_rank=1, rdzv_endpoint="h:1"),
                             "stages.train_text", [])
    assert {"--nnodes=2", "--node_rank=1", "--rdzv_endpoint=h:1", "--nproc_per_node=4"} <= set(multi)

