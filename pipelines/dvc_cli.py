"""Run DVC commands as subprocesses (argument lists, never a shell) with the environment the stages need."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path


class DvcCommandError(Exception):
    """A DVC command failed for a reason that is not the stage's own (lock held, I/O, ...): worth a retry."""


@dataclass
class CommandResult:
    returncode: int
    lines: list[str]
    seconds: float

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


def dvc_executable() -> list[str]:
    """How to call DVC: the `dvc` script beside this interpreter, else `python -m dvc`."""
    script = Path(sys.executable).with_name("dvc")
    if script.is_file():
        return [str(script)]
    found = shutil.which("dvc")
    return [found] if found else [sys.executable, "-m", "dvc"]


def stage_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for DVC and its stages: this interpreter's bin first on PATH (so `python -m stages.x`
    runs in the same virtualenv), DVC analytics off (no network), unbuffered output, plus `extra`."""
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir] + [p for p in env.get("PATH", "").split(os.pathsep) if p != bin_dir])
    env.setdefault("DVC_NO_ANALYTICS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update({k: str(v) for k, v in (extra or {}).items() if v is not None})
    return env


def run_dvc(args: list[str], cwd: str | os.PathLike, env: Mapping[str, str] | None = None,
            on_line: Callable[[str], None] | None = None) -> CommandResult:
    """Run `dvc <args>` in `cwd`, streaming each output line (stdout and stderr merged) to `on_line`."""
    started = time.perf_counter()
    lines: list[str] = []
    with subprocess.Popen(dvc_executable() + list(args), cwd=str(cwd), env=dict(env or stage_env()),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          text=True, errors="replace", bufsize=1) as proc:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.rstrip("\n")
            lines.append(line)
            if on_line is not None and line.strip():
                on_line(line)
        returncode = proc.wait()
    return CommandResult(returncode, lines, time.perf_counter() - started)


def stage_changes(stage: str, cwd: str | os.PathLike, env: Mapping[str, str] | None = None) -> list:
    """What `dvc status` says changed for `stage` (its own deps, params, outs); [] when it is up to date."""
    result = run_dvc(["status", "--json", stage], cwd, env)
    if result.returncode != 0:
        raise DvcCommandError(f"`dvc status {stage}` failed (exit {result.returncode}): {_tail(result.lines)}")
    status = _last_json(result.lines)
    if status is None:
        raise DvcCommandError(f"`dvc status --json {stage}` printed no JSON: {_tail(result.lines)}")
    return list(status.get(stage) or [])


def cache_dir(root: str | os.PathLike) -> Path:
    """The absolute DVC cache folder of the repo at `root`."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        return Path(repo.cache.local_cache_dir).resolve()


def _last_json(lines: list[str]) -> dict | None:
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                return None
    return None


def _tail(lines: list[str], n: int = 5) -> str:
    return " | ".join(line.strip() for line in lines[-n:] if line.strip()) or "(no output)"
