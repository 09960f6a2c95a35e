"""Faults: `kill -9` mid-epoch under `dvc repro`, SIGINT/SIGTERM, NaN/inf loss; resume is exact, outputs never
half-written."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.reliability.conftest import TIMINGS, make_workspace
from tests.reliability.factories import (
    BIN,
    CHECKPOINT,
    CLASSIFIER_ARGS,
    dvc,
    file_hashes,
    make_dvc_repo,
    mid_epoch_checkpoint,
    read_checkpoint,
    same_weights,
    stage_command,
    start,
    stop_group,
    temp_files,
    tiny_params,
    tree,
    wait_until,
)

pytestmark = pytest.mark.reliability

RESUME_MESSAGE = "Run the same command (or `dvc repro`) again to resume."


def dvc_status(repo: Path, stage: str) -> list:
    proc = dvc(["status", "--json", stage], repo)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]).get(stage, [])


def test_kill_9_mid_epoch_then_dvc_repro_resumes_bitwise_equal(tmp_path, prepared, reference):
    """`kill -9` of the whole `dvc repro` process group in the middle of an epoch leaves no outputs (DVC removed the
    old ones, the stage writes only at the end) and no half file; DVC sees the stage changed and reruns it, the stage
    resumes from its last checkpoint and ends with metrics.json and weights bitwise-equal to an uninterrupted run."""
    repo = make_dvc_repo(tmp_path / "repo", tiny_params())
    log = tmp_path / "killed.log"
    started = time.perf_counter()
    proc = start([str(BIN / "dvc"), "repro", "train_classifier"], repo, log)
    try:
        # in the second epoch, between two checkpoints: neither at an epoch end nor at the start
        state = wait_until(mid_epoch_checkpoint(repo / CHECKPOINT, min_epoch=1), proc, log,
                           what="a mid-epoch checkpoint")
    finally:
        stop_group(proc, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert state["epoch"] == 1 and state["step_in_epoch"] > 0

    # nothing half-written: the stage's outputs do not exist at all; prepare's are complete
    assert not (repo / "models" / "classifier").exists(), tree(repo / "models")
    assert not (repo / "reports" / "classifier").exists(), tree(repo / "reports")
    assert file_hashes(repo / "data/prepared/classification") == file_hashes(prepared / "data/prepared/classification")
    assert read_checkpoint(repo / CHECKPOINT) is not None  # the last checkpoint is whole (written atomically)
    assert dvc_status(repo, "train_classifier"), "DVC must see the killed stage as changed"

    rerun = dvc(["repro", "train_classifier"], repo)
    TIMINGS["kill_9_test"] = time.perf_counter() - started
    output = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, output[-4000:]
    assert "Stage 'prepare' didn't change, skipping" in output
    assert "Running stage 'train_classifier'" in output
    resumed = re.search(r"classifier: resuming from checkpoints/classifier/last\.pt at epoch (\d+), "
                        r"optimizer step (\d+)", output)
    assert resumed and int(resumed[1]) == 2 and int(resumed[2]) >= state["update"], output[-3000:]

    assert (repo / "reports/classifier/metrics.json").read_bytes() == \
        (reference / "reports/classifier/metrics.json").read_bytes()
    assert same_weights(repo / "models/classifier", reference / "models/classifier")
    assert not (repo / CHECKPOINT).exists()  # removed after success
    assert temp_files(repo / "models", repo / "reports", repo / "data") == []
    assert dvc_status(repo, "train_classifier") == []


def test_sigint_then_sigterm_checkpoint_say_how_to_resume_and_resume_exactly(tmp_path, prepared, reference):
    """SIGINT, then SIGTERM on the resumed run: each time the stage finishes its optimizer step, writes a checkpoint,
    prints one line saying how to resume, exits 130 and leaves the previous outputs untouched; the third run resumes
    and ends bitwise-equal to the uninterrupted run."""
    ws = make_workspace(tmp_path / "ws", prepared, tiny_params())
    previous = {"models/classifier/model.safetensors": b"previous weights",
                "reports/classifier/metrics.json": b'{"previous": true}\n'}
    for rel, data in previous.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_bytes(data)
    command = stage_command("stages.train_classifier", *CLASSIFIER_ARGS)
    started = time.perf_counter()
    last_update = 0
    for attempt, sig in enumerate((signal.SIGINT, signal.SIGTERM)):
        log = tmp_path / f"run{attempt}.log"
        proc = start(command, ws, log)
        try:
            wait_until(mid_epoch_checkpoint(ws / CHECKPOINT, min_update=last_update + 10), proc, log,
                       what="a checkpoint past the last one")
            os.kill(proc.pid, sig)
            proc.wait(timeout=120)
        finally:
            stop_group(proc)
        output = log.read_text()
        assert proc.returncode == 130, output[-3000:]
        assert "Traceback" not in output
        errors = [line for line in output.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and errors[0].endswith(RESUME_MESSAGE), output[-2000:]
        stopped = int(re.search(r"stopped at optimizer step (\d+); checkpoint saved to checkpoints/classifier/last\.pt",
                                errors[0])[1])
        assert stopped > last_update and read_checkpoint(ws / CHECKPOINT)["update"] == stopped
        if last_update:
            assert f"optimizer step {last_update}" in output and "resuming from" in output
        assert {rel: (ws / rel).read_bytes() for rel in previous} == previous  # previous outputs untouched
        last_update = stopped

    final = start(command, ws, tmp_path / "final.log")
    assert final.wait(timeout=600) == 0, (tmp_path / "final.log").read_text()[-3000:]
    TIMINGS["signals_test"] = time.perf_counter() - started
    assert "resuming from checkpoints/classifier/last.pt at epoch" in (tmp_path / "final.log").read_text()
    assert (ws / "reports/classifier/metrics.json").read_bytes() == \
        (reference / "reports/classifier/metrics.json").read_bytes()
    assert same_weights(ws / "models/classifier", reference / "models/classifier")
    assert not (ws / CHECKPOINT).exists()
    assert temp_files(ws) == []


# --- NaN / inf loss ------------------------------------------------------------------------------------------------

def poison_loss(monkeypatch, at_step: int, value: float) -> None:
    """Make the classifier's training loss `value` from training forward pass `at_step` (1-based) on."""
    import trainlab.tasks.classifier as tasks

    real = tasks.classification_trainable

    def classification_trainable(model, *args, **kwargs):
        task = real(model, *args, **kwargs)
        calls = {"n": 0}
        loss_fn = task.loss_fn

        def poisoned(logits, labels):
            loss = loss_fn(logits, labels)
            if model.training:
                calls["n"] += 1
                if calls["n"] >= at_step:
                    return loss * value
            return loss

        task.loss_fn = poisoned
        return task

    monkeypatch.setattr(tasks, "classification_trainable", classification_trainable)


@pytest.mark.parametrize("value, at_step, checkpoint_every, last_good", [
    (float("nan"), 8, 5, 5),      # a checkpoint at step 5 was good; the NaN at step 8 is found at step 10
    (float("inf"), 2, 5, None),   # no checkpoint before the bad step: none is good
], ids=["nan-after-a-checkpoint", "inf-before-any-checkpoint"])
def test_nan_or_inf_loss_stops_naming_the_step_and_the_last_good_checkpoint(tmp_path, prepared, monkeypatch, capsys,
                                                                            value, at_step, checkpoint_every,
                                                                            last_good):
    from stages.train_classifier import main
    from trainlab.core.cli import run_cli
    from trainlab.core.errors import TrainingDiverged

    ws = make_workspace(tmp_path / "ws", prepared, tiny_params({"classifier": {
        "epochs": 1, "max_steps": 12, "checkpoint_every_steps": checkpoint_every}}))
    monkeypatch.chdir(ws)
    poison_loss(monkeypatch, at_step, value)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, CLASSIFIER_ARGS)
    assert exit_info.value.code == TrainingDiverged.exit_code == 5
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert f"error: classifier: loss became NaN/inf at optimizer step {at_step};" in err
    if last_good is None:
        assert "no good checkpoint was written" in err and not CHECKPOINT.exists()
    else:
        assert f"the last good checkpoint is {CHECKPOINT}" in err
        state = read_checkpoint(ws / CHECKPOINT)
        assert state["update"] == last_good
        assert all(t.isfinite().all() for t in state["model"].values() if t.is_floating_point())
    assert not (ws / "models").exists() and not (ws / "reports").exists()
