"""scripts/gpu-check's machinery on the CPU: test groups, part deadlines and records, failure injection, the table
of whatever exists (failed parts included), the preflight's module-to-wheel logic, the benchmarks' exit code."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

from benchmarks import gpu_parts
from benchmarks.gpu_check import table
from benchmarks.gpu_preflight import third_party_imports, wheel_modules, wheels_to_install

REPO = Path(__file__).resolve().parent.parent


def gpu_test_ids() -> list[str]:
    """Every test of tests/test_gpu.py with its parametrize ids, as `pytest -k` sees them."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "tests/test_gpu.py",
                           "-p", "no:cacheprovider"], cwd=REPO, capture_output=True, text=True, timeout=120)
    ids = [line.split("::", 1)[1] for line in proc.stdout.splitlines() if line.startswith("tests/test_gpu.py::")]
    assert ids, proc.stdout[-2000:] + proc.stderr[-2000:]
    return ids


def test_every_gpu_test_is_in_exactly_one_group():
    for test in gpu_test_ids():
        names = {test.lower(), test.split("[")[0].lower(), "test_gpu.py", "gpu"}
        hits = [group for group, expr in gpu_parts.TEST_GROUPS.items()
                if Expression.compile(expr).evaluate(lambda k: any(k.lower() in n for n in names))]
        assert len(hits) == 1, f"{test}: in groups {hits}"


def part(name: str, code: str, cap: float, **kw) -> gpu_parts.Part:
    return gpu_parts.Part(name, [sys.executable, "-c", code], cap, **kw)


def test_parts_run_under_their_deadlines_and_are_recorded_as_they_end(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_parts, "TABLE_RESERVE_S", 1)
    monkeypatch.setattr(gpu_parts, "MIN_PART_S", 3)
    monkeypatch.setattr(gpu_parts, "KILL_GRACE_S", 1)
    monkeypatch.setenv(gpu_parts.INJECT, "injected")
    parts = [part("fine", "print('figures')", 10),
             part("broken", "raise ValueError('no such kernel')", 10),
             part("injected", "print('would pass')", 10),
             # ignores SIGTERM: only the SIGKILL after the grace period stops it
             part("hangs", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)", 2),
             part("late", "print('never')", 10)]
    t0 = time.monotonic()
    records = {r["part"]: r for r in gpu_parts.run_parts(tmp_path, parts, budget_s=6)}
    assert time.monotonic() - t0 < 12
    assert records["fine"]["status"] == "ok"
    assert records["broken"]["status"] == "failed" and "ValueError: no such kernel" in records["broken"]["message"]
    assert records["injected"]["status"] == "failed" and "injected failure" in records["injected"]["message"]
    assert records["hangs"]["status"] == "timeout" and records["hangs"]["seconds"] < 5
    assert records["late"]["status"] == "skipped" and "no time left" in records["late"]["message"]
    for name in records:  # each on disk
        assert json.loads((tmp_path / "parts" / f"{name}.json").read_text())["status"] == records[name]["status"]


def test_a_pytest_group_is_summarised_from_its_junit_file(tmp_path):
    junit = tmp_path / "g.xml"
    junit.write_text('<testsuites><testsuite><testcase name="test_a"/><testcase name="test_b">'
                     '<failure message="CUDA error: operation not permitted when stream is capturing"/></testcase>'
                     '<testcase name="test_c"><skipped message="needs CUDA"/></testcase></testsuite></testsuites>')
    got = gpu_parts.junit_summary(junit)
    assert (got["passed"], got["failed"], got["skipped"]) == (1, 1, 1)
    assert got["line"].startswith("1 passed, 1 failed, 1 skipped; test_b: CUDA error: operation not permitted")


def test_the_table_renders_whatever_exists_with_failed_parts_as_error_rows(tmp_path):
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "bench_classifier.json").write_text(json.dumps(
        {"part": "bench_classifier", "status": "failed", "exit": 1, "seconds": 3, "cap_s": 50,
         "message": "RuntimeError: injected | failure"}))
    (tmp_path / "parts" / "tests_engine.json").write_text(json.dumps(
        {"part": "tests_engine", "status": "timeout", "exit": -9, "seconds": 60, "cap_s": 60, "message": "stopped"}))
    speed = tmp_path / "bench" / "classifier"
    speed.mkdir(parents=True)
    # what a failed training-speed part writes: the old table called .get on this error string and crashed
    (speed / "training_speed.json").write_text(json.dumps(
        {"environment": {"device": "cuda"}, "settings": {"parts": ["classifier"]}, "headline": {},
         "results": {"error": "RuntimeError: CUDA out of memory", "traceback": "..."}}))
    mfu = tmp_path / "bench" / "mfu"
    mfu.mkdir()
    (mfu / "mfu.json").write_text(json.dumps(
        {"environment": {"device": "cuda"}, "headline": {"classifier_engine_step_samples_per_s": 120_000.0},
         "results": {"models": {"classifier": {"precision": "bf16", "batch_size": 64, "cuda_graph": True,
                                               "median_step_s": 0.00053, "median_samples_per_s": 120_000.0,
                                               "mfu": 0.05}}}}))
    (tmp_path / "pipeline.json").write_text("{not json")
    report = table(tmp_path)
    assert "| bench_classifier | FAILED | 3 | 50 | RuntimeError: injected / failure |" in report
    assert "| tests_engine | TIMEOUT |" in report
    assert "| classifier | FAILED: RuntimeError: CUDA out of memory |" in report
    assert "| classifier | bf16 | 64 | True | 0.530 | 120,000 | 5.0% |" in report
    assert "(pipeline: could not render: JSONDecodeError" in report
    assert "| classifier: engine step samples/s" in report and "| met |" in report


def test_the_preflight_finds_the_third_party_modules_the_parts_import():
    found = third_party_imports()
    assert {"torch", "yaml", "pydantic", "safetensors"} <= found
    assert not found & {"trainlab", "stages", "benchmarks", "tests", "json", "os"}


def test_the_preflight_installs_every_wheel_whose_modules_are_missing_and_none_the_machine_has(tmp_path):
    """A dependency no project file imports (pydantic's typing_inspection on the H100, 2026-12-05) is installed in
    the same pip call as the module that needs it; a wheel of a module this python has is never installed."""
    def wheel(name: str, files: list[str]) -> Path:
        path = tmp_path / f"{name}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(path, "w") as archive:
            for f in files + [f"{name}-1.0.dist-info/RECORD"]:
                archive.writestr(f, "")
        return path

    dependency = wheel("zz_absent_dependency", ["zz_absent_dependency/__init__.py", "zz_absent_dependency/x.py"])
    single = wheel("zz_absent_single", ["zz_absent_single.py"])
    extension = wheel("zz_absent_ext", ["zz_absent_ext.cpython-312-x86_64-linux-gnu.so"])
    present = wheel("yaml_again", ["yaml/__init__.py"])
    data_only = wheel("zz_data", ["zz_data-1.0.data/data/share/x.txt"])
    assert wheel_modules(dependency) == {"zz_absent_dependency"}
    assert wheel_modules(extension) == {"zz_absent_ext"}
    assert wheel_modules(data_only) == set()
    assert wheels_to_install([dependency, single, extension, present, data_only]) == [dependency, single, extension]


def test_a_wheel_pip_refuses_or_a_broken_file_costs_only_itself(tmp_path, monkeypatch):
    from benchmarks import gpu_preflight

    def wheel(name: str, tag: str) -> None:
        dist = f"{name}-1.0.dist-info"
        with zipfile.ZipFile(tmp_path / ".whl" / f"{name}-1.0-{tag}.whl", "w") as archive:
            archive.writestr(f"{name}/__init__.py", "")
            archive.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
            archive.writestr(f"{dist}/WHEEL",
                             f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n")
            archive.writestr(f"{dist}/RECORD", "")

    (tmp_path / ".whl").mkdir()
    wheel("zz_installable", "py3-none-any")
    wheel("zz_other_platform", "cp27-cp27m-win32")
    (tmp_path / ".whl" / "zz_cut_short-1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 cut")
    monkeypatch.setattr(gpu_preflight, "REPO", tmp_path)
    found = gpu_preflight.Findings()
    gpu_preflight.install_wheels(found, site=tmp_path / "site")
    assert (tmp_path / "site" / "zz_installable" / "__init__.py").exists()
    assert found.record["installed_from_whl"] == ["zz_installable"]
    assert len(found.problems) == 2
    assert "zz_cut_short" in found.problems[0] and "zz_other_platform" in found.problems[1]


def test_a_failed_benchmark_part_makes_the_run_exit_1_with_its_json_written(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "BENCH_INJECT_FAILURE": "mfu"}
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--only", "mfu", "--quick", "--repeats", "1",
                           "--device", "cpu", "--out", str(tmp_path)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "FAILED parts: mfu" in proc.stderr
    assert "injected failure" in json.loads((tmp_path / "mfu.json").read_text())["results"]["error"]


def test_the_gpu_tests_file_parses_and_names_its_groups_keywords():
    """The keywords of the groups name real tests (a renamed test would silently move to tests_engine)."""
    tree = ast.parse((REPO / "tests" / "test_gpu.py").read_text())
    names = " ".join(n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)) + " graphed"
    for word in ("graphed", "synchronises", "capturable", "compiled"):
        assert word in names, word


@pytest.mark.parametrize("script", ["scripts/gpu-check"])
def test_the_script_is_valid_bash(script):
    assert subprocess.run(["bash", "-n", str(REPO / script)]).returncode == 0


def test_the_pipeline_part_keeps_each_stages_metrics_and_the_table_shows_the_test_split(tmp_path):
    from benchmarks.gpu_check import keep_metrics

    work, out = tmp_path / "work", tmp_path / "out"
    (work / "reports" / "evaluate").mkdir(parents=True)
    (work / "reports" / "evaluate" / "metrics.json").write_text(json.dumps(
        {"classifier": {"accuracy": 0.9861, "test_samples": 1000}, "segmenter": {"mean_iou": 0.94371},
         "text": {"accuracy": 0.767, "baseline_accuracy": 0.754}}))
    spec = {"metrics": [{"reports/evaluate/metrics.json": {"cache": False}}, "reports/missing.json"]}
    keep_metrics(work, spec, out / "pipeline_metrics")
    (out / "pipeline.json").write_text(json.dumps(
        {"stages": [{"stage": "evaluate", "exit": 0, "wall_s": 4.0, "train_s": None}], "total_s": 4.0}))
    report = table(out)
    assert ("Test split (evaluate stage): classifier accuracy 0.9861, segmenter mean_iou 0.9437, text accuracy 0.7670, "
            "text baseline_accuracy 0.7540") in report
    assert not (out / "pipeline_metrics" / "reports" / "missing.json").exists()
