"""The benchmark suite runs: contenders alternate, the cold-start hook fires, a quick part writes its reports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.__main__ import PARTS, check_targets, parse_args
from benchmarks.common import Skip, alternate

REPO = Path(__file__).resolve().parents[1]


def test_contenders_alternate_after_a_warm_up_and_ratios_pair_rounds():
    calls = []

    def contender(name, value):
        def run(repeat, warm):
            calls.append((name, repeat, warm))
            return {"samples_per_s": value * (repeat + 2)}
        return run

    def missing(repeat, warm):
        raise Skip("not installed")

    result = alternate({"a": contender("a", 2.0), "b": contender("b", 1.0), "c": missing}, repeats=3)

    assert calls[:2] == [("a", -1, True), ("b", -1, True)]
    assert [c[0] for c in calls[2:]] == ["a", "b"] * 3 and result.order == ["a", "b"] * 3
    assert result.skipped == {"c": "not installed"} and "c" not in result.repeats
    assert result.median("a", "samples_per_s") == 6.0
    assert result.ratio("a", "b", "samples_per_s") == {"ratio_of_medians": 2.0, "median_of_paired_ratios": 2.0}


def test_parts_and_targets():
    assert parse_args(["--only", "training,mfu"]).parts == ["classifier", "segmenter", "text", "mfu"]
    assert parse_args([]).parts == list(PARTS)
    with pytest.raises(SystemExit):
        parse_args(["--only", "nonsense"])
    rows = {r[0]: r[3] for r in check_targets({"classifier_engine_over_plain": 2.6, "noop_dvc_repro_s": 2.0})}
    assert rows["classifier: engine / plain loop throughput"] == "met"
    assert rows["no-op `dvc repro` (s)"] == "MISSED"
    assert rows["classifier: engine MFU (of the measured matmul peak)"] == "not measured"


def test_first_step_hook_records_the_first_training_step(tmp_path):
    (tmp_path / "tiny_stage.py").write_text(textwrap.dedent("""
        import torch
        import trainlab.engine.loop  # noqa: F401  (the hook is installed once this is imported)
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
        print("done")
    """))
    marks = tmp_path / "marks.json"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}", "BENCH_FIRST_STEP_FILE": str(marks)}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.first_step", "tiny_stage"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "done" in proc.stdout
    got = json.loads(marks.read_text())
    assert got["process_start"] <= got["import_start:torch"] <= got["first_forward"] <= got["first_step_end"]
    assert got["exit"] >= got["first_step_end"]


@pytest.mark.slow
def test_quick_classifier_and_mfu_parts_write_their_reports(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--only", "classifier,mfu", "--repeats",
                           "1", "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "## Training throughput" in proc.stdout and "## MFU" in proc.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["headline"]["classifier_engine_over_plain"] > 0
    assert 0 < summary["headline"]["classifier_engine_mfu"]
    speed = json.loads((tmp_path / "training_speed.json").read_text())["results"]["classifier"]
    assert set(speed["median"]) >= {"engine", "plain", "bare eager"}
    assert speed["skipped"]["bare graph"] == "a CUDA graph needs a CUDA device"
    assert summary["headline"]["classifier_engine_over_bare_eager_step"] > 0
    # scripts/gpu-check's table reads the same files (here without a GPU log or pipeline run)
    check = tmp_path / "check"
    shutil.copytree(tmp_path, check / "bench", ignore=shutil.ignore_patterns("check"))
    (check / "parts").mkdir()
    (check / "parts" / "tests_engine.json").write_text(json.dumps(
        {"part": "tests_engine", "status": "ok", "exit": 0, "seconds": 40.1, "cap_s": 60, "message": "12 passed"}))
    table = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "table", str(check)], cwd=REPO,
                           capture_output=True, text=True, timeout=60, check=False)
    assert table.returncode == 0, table.stderr
    assert "| tests_engine | ok | 40 | 60 | 12 passed |" in table.stdout
    assert "| classifier[bare eager] | " in table.stdout
    assert (check / "gpu_check.md").read_text().startswith("# GPU check")
    assert (tmp_path / "summary.md").read_text().startswith("# Benchmarks")
    assert (tmp_path / "top_ops_classifier_step.txt").is_file()


def test_the_pipeline_part_knows_the_cpu_kind_times_stages_and_checks_the_floors():
    from benchmarks import pipeline

    assert pipeline.cpu_kind("flags : fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile", native_bf16=True) == "xeon_amx"
    assert pipeline.cpu_kind("flags : fpu avx2 avx512f avx512_bf16", native_bf16=True) == "avx512_bf16"
    assert pipeline.cpu_kind("flags : fpu avx2 avx512_bf16 amx_bf16", native_bf16=False) == "fp32"  # held to AVX2
    lines = [(10.0, "Running stage 'prepare':"), (11.0, "> python -m stages.prepare ..."),
             (14.5, "Running stage 'train_text':"), (15.0, "Updating lock file 'dvc.lock'"),
             (40.0, "Running stage 'evaluate':")]
    assert pipeline.stage_seconds(lines, end=47.25) == {"prepare": 4.5, "train_text": 25.5, "evaluate": 7.25}
    test = {"classifier": {"accuracy": 0.9855}, "segmenter": {"mean_iou": 0.93},
            "text": {"accuracy": 0.766, "baseline_accuracy": 0.754}}
    figures = pipeline.headline_figures({"cpu_kind": "avx512_bf16", "wall_s": 190.0, "test": test})
    rows = {r[0].split(": ", 1)[1]: (r[1], r[3]) for r in check_targets(figures) if r[0].startswith("default")}
    assert rows["`dvc repro` of params.yaml in a fresh copy (s)"] == ("190", "MISSED")
    assert rows["classifier test accuracy over this CPU kind's floor (points)"] == ("-0.05", "MISSED")
    assert rows["segmenter test mean IoU over this CPU kind's floor (points)"] == ("-0.01", "MISSED")
    assert rows["text test accuracy over its TF-IDF baseline (points)"] == ("1.2", "met")
    fp32 = pipeline.headline_figures({"cpu_kind": "fp32", "wall_s": 170.0, "test": test})
    assert fp32["default_classifier_accuracy_over_floor_points"] == 0.05 and fp32["default_pipeline_s"] == 170.0


def test_the_pipeline_part_times_each_stage_of_a_real_dvc_repro_and_reads_only_what_ran(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from benchmarks import pipeline
    from benchmarks.overhead import base_env, run_cmd

    root = tmp_path / "repo"
    (root / "reports" / "evaluate").mkdir(parents=True)
    (root / "dvc.yaml").write_text(textwrap.dedent("""
        stages:
          prepare:
            cmd: sleep 0.4 && echo prepared > prepared.txt
            outs: [prepared.txt]
          train_text:
            cmd: mkdir -p reports/text && cp timing.json reports/text/run.json
            deps: [prepared.txt]
            outs: [reports/text/run.json]
          hangs:
            cmd: sleep 60
    """))
    (root / "reports" / "evaluate" / "metrics.json").write_text('{"classifier": {"accuracy": 0.5}}')  # committed
    (root / "timing.json").write_text('{"timing": {"train_time_s": 1.5}}')
    ws = SimpleNamespace(root=root, env=base_env(root), log=tmp_path / "commands.log", target=[])
    for cmd in (["git", "init", "-q"], [str(pipeline.BIN / "dvc"), "init", "-q"]):
        run_cmd(cmd, root, ws.env, ws.log)

    ws.target = ["train_text"]
    wall, stages = pipeline.timed_repro(ws)

    assert list(stages) == ["prepare", "train_text"] and stages["prepare"] >= 0.4
    assert wall >= sum(stages.values()) - 0.01
    found = pipeline.results(root, stages)
    assert found == {"test": {}, "training_stage_timing": {"text": {"train_time_s": 1.5}}}  # evaluate did not run
    ws.target = ["missing_stage"]
    with pytest.raises(RuntimeError, match="exited with"):
        pipeline.timed_repro(ws)
    ws.target = ["hangs"]  # silent: stopped at the deadline all the same
    monkeypatch.setattr(pipeline, "COMMAND_TIMEOUT_S", 2)
    with pytest.raises(RuntimeError, match="ran over 2 s"):
        pipeline.timed_repro(ws)


def test_the_bare_reference_step_trains_and_refuses_a_graph_without_cuda():
    import torch

    from benchmarks.bare import bare_step
    from tests.engine.test_loop import CFG, make_trainable, runtime, tiny_data

    task, data = make_trainable(dropout=0.0), tiny_data(64)
    rt = runtime(precision="fp32")
    with pytest.raises(ValueError, match="CUDA"):
        bare_step(task, task.model, CFG, rt, data, graph=True)
    step = bare_step(task, task.model, CFG, rt, data, graph=False, seed=0, lr_at=lambda k: 1.0)
    loss = lambda: float(torch.nn.functional.cross_entropy(task.model(data["images"].float() / 255), data["labels"]))
    before = loss()
    for _ in range(15):
        step()
    assert loss() < before * 0.8


def test_a_command_past_its_deadline_is_stopped_with_every_process_it_started(tmp_path, monkeypatch):
    import time

    from benchmarks import overhead

    monkeypatch.setattr(overhead, "COMMAND_TIMEOUT_S", 1)
    pid_file = tmp_path / "stage.pid"
    with pytest.raises(subprocess.TimeoutExpired):  # as `dvc repro` runs a stage: a child process of its own
        overhead.run_cmd(["bash", "-c", f"sleep 60 & echo $! > {pid_file}; wait"], tmp_path, dict(os.environ),
                         tmp_path / "log")
    stat = Path(f"/proc/{int(pid_file.read_text())}/stat")

    def running() -> bool:  # a zombie (killed, not yet reaped by whoever adopted it) runs no more
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False

    deadline = time.monotonic() + 10
    while running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(), "the command's child process outlived the command's deadline"


def test_the_trail_part_times_the_verify_trail_against_training(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--only", "trail", "--repeats", "1", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "## trail overhead" in proc.stdout and "the trail's own calls / training wall time" in proc.stdout
    headline = json.loads((tmp_path / "summary.json").read_text())["headline"]
    assert 0 < headline["trail_overhead_fraction"] < 1  # it recorded, and took less than the training it rode on
