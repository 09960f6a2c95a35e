"""A full disk while a checkpoint, a model or a report is written, injected honestly: a file-size limit
(RLIMIT_FSIZE) on the writing process with SIGXFSZ ignored, so the write fails with EFBIG as on a full disk."""

from __future__ import annotations

import resource
import signal
import subprocess
import textwrap

import pytest

from benchmarks.processes import PYTHON
from tests.reliability.conftest import make_workspace
from tests.reliability.factories import (
    CHECKPOINT,
    CLASSIFIER_ARGS,
    file_hashes,
    mid_epoch_checkpoint,
    read_checkpoint,
    run_env,
    stage_command,
    start,
    temp_files,
    tiny_params,
    tree,
    wait_until,
)

pytestmark = pytest.mark.reliability


def file_size_limit(max_bytes: int):
    """A preexec_fn: files this process writes cannot grow past `max_bytes` (EFBIG, not a SIGXFSZ kill)."""
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return apply


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    [line] = [x for x in stderr.splitlines() if x.startswith("error: ")]
    return line


def test_full_disk_while_a_checkpoint_is_written_keeps_the_previous_one(tmp_path, prepared):
    # width 8: TINY's width 4 crashes in backward with torch 2.14.1 on this CPU
    params = tiny_params({"classifier": {"width": 8, "checkpoint_every_steps": 5}})
    ws = make_workspace(tmp_path / "ws", prepared, params)
    log = tmp_path / "first.log"
    proc = start(stage_command("stages.train_classifier", *CLASSIFIER_ARGS), ws, log)
    try:
        wait_until(mid_epoch_checkpoint(ws / CHECKPOINT, min_update=10), proc, log, what="a checkpoint")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=300) == 130, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    previous = (ws / CHECKPOINT).read_bytes()
    state = read_checkpoint(ws / CHECKPOINT)

    # resumed with every file capped one byte short of a checkpoint: its next checkpoint cannot be written
    second = subprocess.run(stage_command("stages.train_classifier", *CLASSIFIER_ARGS), cwd=ws, env=run_env(),
                            capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
                            preexec_fn=file_size_limit(len(previous) - 1))
    assert second.returncode == 7, second.stdout[-2000:] + second.stderr[-3000:]
    assert "resuming from" in second.stdout
    error = one_error_line(second.stderr)
    assert error.startswith(f"error: {CHECKPOINT}: could not be written (file too large")
    assert "the previous version is unchanged" in error
    assert (ws / CHECKPOINT).read_bytes() == previous  # the previous checkpoint, whole and loadable
    assert read_checkpoint(ws / CHECKPOINT)["update"] == state["update"]
    assert temp_files(ws) == [] and not (ws / "models").exists() and not (ws / "reports").exists()


WRITER = textwrap.dedent("""
    import sys
    from pathlib import Path

    import torch

    from trainlab.core.atomic import write_json
    from trainlab.core.cli import run_cli
    from trainlab.jobs.train import save_model

    def main(argv):
        kind, target = argv[0], Path(argv[1])
        if kind == "model":
            model = torch.nn.Linear(1000, 100)
            model.config = {"in": 1000, "out": 100}
            save_model(model, target)
        else:
            write_json(target, {"values": list(range(50000))})

    run_cli(main, sys.argv[1:])
""")


@pytest.mark.parametrize("kind, target, named", [
    ("model", "models/classifier", "models/classifier/model.safetensors"),
    ("report", "reports/evaluate/metrics.json", "reports/evaluate/metrics.json"),
])
def test_full_disk_while_a_model_or_report_is_written_names_it_and_keeps_the_previous_one(tmp_path, kind, target,
                                                                                           named):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    first = subprocess.run([PYTHON, str(script), kind, target], cwd=tmp_path, env=run_env(), capture_output=True,
                           text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    folder = tmp_path / target.split("/")[0]
    before = file_hashes(folder)
    listing = tree(folder)
    second = subprocess.run([PYTHON, str(script), kind, target], cwd=tmp_path, env=run_env(), capture_output=True,
                            text=True, timeout=300, preexec_fn=file_size_limit(64 * 1024))
    assert second.returncode == 7, second.stderr[-3000:]
    error = one_error_line(second.stderr)
    assert error.startswith(f"error: {named}: could not be written (file too large")
    assert "the previous version is unchanged" in error
    assert file_hashes(folder) == before and tree(folder) == listing  # nothing half-written, no temp file left
