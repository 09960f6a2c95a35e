"""Helpers for the reliability tests: tiny params, workspaces and DVC repo copies, stage subprocesses, checks."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from benchmarks.processes import BIN, REPO, run_env, stage_command, stop_group
from pipelines.overrides import deep_merge
from pipelines.workspace import copy_worktree

GIT_IDENTITY = {"GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@localhost",
                "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@localhost"}

# Small data for every task (the embedded sources, so no download); the classifier trains long enough (3 epochs
# of ~218 optimizer steps, a checkpoint every 5 steps) that a kill or a signal lands mid-epoch.
TINY = {
    "base": {"seed": 5, "deterministic": True, "num_workers": 0, "precision": "fp32"},
    "data": {"segmentation": {"canvases_per_digit": 0.06, "canvas_size": 32, "max_digits": 2},
             "text": {"vocab_size": 2000, "max_length": 32}},
    # width 8, not 4: a 4-wide classifier's channels_last backward hangs or crashes in oneDNN on AVX2-only CPUs
    # (torch 2.14.1, seen on this project's 2-core machine)
    "classifier": {"width": 8, "epochs": 3, "batch_size": 16, "lr": 0.01, "warmup_epochs": 0.0,
                   "checkpoint_every_steps": 5},
    "segmenter": {"base_channels": 4, "depth": 1, "epochs": 1, "max_steps": 2, "batch_size": 8, "warmup_epochs": 0.0},
    "text": {"d_model": 8, "n_heads": 1, "n_layers": 1, "dim_feedforward": 8, "epochs": 1, "max_steps": 2,
             "batch_size": 64, "warmup_epochs": 0.0, "baseline_max_features": 200},
    "tracking": {"enabled": False},
}
CLASSIFIER_ARGS = ["data/prepared/classification", "models/classifier", "reports/classifier"]
CHECKPOINT = Path("checkpoints/classifier/last.pt")
# What `git ls-files` lists but a DVC repo copy does not need (or must not inherit: state of this workspace).
SKIP_PREFIXES = ("tests/", "benchmarks/", "data/prepared/", "models/", "reports/", "checkpoints/", "mlartifacts/")
SKIP_FILES = {"dvc.lock", "mlflow.db"}


def tiny_params(*extra: dict) -> dict:
    """The repo's params.yaml with TINY and then each of `extra` merged in (so every other key keeps its default)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for overrides in (TINY, *extra):
        deep_merge(params, overrides)
    return params


def write_params(path: Path, params: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def git(args: list[str], cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={**os.environ, **GIT_IDENTITY}).stdout


def not_for_a_repo_copy(rel: str) -> bool:
    return rel.startswith(SKIP_PREFIXES) or rel in SKIP_FILES or "__pycache__" in rel


def make_dvc_repo(dst: Path, params: dict) -> Path:
    """A copy of this repo with `params` as params.yaml, in a fresh Git repo of one commit (no dvc.lock)."""
    copy_worktree(REPO, dst, skip=not_for_a_repo_copy)
    write_params(dst / "params.yaml", params)
    git(["init", "--quiet"], dst)
    git(["add", "-A"], dst)
    git(["commit", "--quiet", "--no-verify", "-m", "reliability test repo"], dst)
    return dst


def dvc(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """`dvc <args>` in its own process group, which is killed whole if the call fails or times out (so no stage
    it started outlives the test)."""
    proc = subprocess.Popen([str(BIN / "dvc"), *args], cwd=cwd, env=run_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        stop_group(proc)
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def run_stage(module: str, args: list[str], cwd: Path, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(stage_command(module, *args), cwd=cwd, capture_output=True, text=True, env=run_env(**env),
                          timeout=timeout, stdin=subprocess.DEVNULL)


def start(cmd: list[str], cwd: Path, log: Path, **env: str) -> subprocess.Popen:
    """Start `cmd` in its own session (so its whole process group can be signalled), output to `log`."""
    with open(log, "w") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=run_env(**env), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def read_checkpoint(path: Path) -> dict[str, Any] | None:
    """The checkpoint's state (a private copy is read: the stage replaces the file as it goes), or None."""
    import torch

    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    import io

    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001 - caught between write and rename on a slow disk: try again later
        return None


def wait_until(predicate: Callable[[], Any], proc: subprocess.Popen | None, log: Path | None, timeout: float = 300,
               what: str = "condition", interval: float = 0.05) -> Any:
    """Poll `predicate` until it returns something truthy; fail early if `proc` exits."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
            raise AssertionError(f"process exited ({proc.returncode}) before {what}:\n{tail}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def mid_epoch_checkpoint(path: Path, min_epoch: int = 0, min_update: int = 1,
                         max_step_in_epoch: int = 100) -> Callable[[], dict | None]:
    """A predicate: the checkpoint at `path` was written early in an epoch (not at its end: a signal or kill sent
    now lands mid-epoch even on a fast machine), past the given points."""
    def check() -> dict | None:
        state = read_checkpoint(path)
        if state and state["epoch"] >= min_epoch and 0 < state["step_in_epoch"] <= max_step_in_epoch \
                and state["update"] >= min_update:
            return state
        return None
    return check


def temp_files(*roots: Path) -> list[str]:
    """Leftovers of atomic writes (`.name.XXXX.tmp` files or folders) under `roots`."""
    return sorted(str(p) for root in roots if root.exists() for p in root.rglob(".*.tmp"))


def model_weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def same_weights(a: Path, b: Path) -> bool:
    import torch

    wa, wb = model_weights(a), model_weights(b)
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def file_hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def tree(folder: Path) -> list[str]:
    """Every path under `folder`, relative, sorted (to show that nothing was written)."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []
