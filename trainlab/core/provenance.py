"""What a run ran on: git state, package versions and the environment record, without loading torch (a flow or the
TF-IDF baseline never uses it); torch's part of the record comes from a process that has loaded it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

TRACKED_PACKAGES = ("torch", "torchvision", "torchmetrics", "numpy", "dvc", "prefect", "mlflow", "scikit-learn",
                    "pydantic", "trainlab")


DVC_STAGE_ENV = "DVC_STAGE"  # what DVC sets for a stage's command: the stage's name, or "<dvc.yaml path>:<name>"
DVC_ROOT_ENV = "DVC_ROOT"


@lru_cache(maxsize=8)
def git_state(cwd: str | None = None, stage: str | None = None) -> dict[str, str]:
    """Commit hash and dirty flag of the working tree ('unknown' outside git).

    Dirty means a git-tracked file differs from the commit. For a DVC stage (`stage`, or the one DVC runs this
    process for: $DVC_STAGE) only what the stage reads counts: dvc.yaml, its deps and params files, never its own
    outs. DVC deletes a stage's git-tracked `cache: false` outs before it runs it, and other stages' outs (and
    dvc.lock) change as `dvc repro` goes: none of that makes the code, params or data a stage ran on uncommitted."""
    cwd = cwd or os.getcwd()
    try:
        commit, top = _git(["rev-parse", "HEAD", "--show-toplevel"], cwd).splitlines()[:2]
        scope = stage_pathspecs(cwd, os.environ.get(DVC_STAGE_ENV, "").strip() or stage, top)
        changed = _git(["status", "--porcelain", "--untracked-files=no", *(["--", *scope] if scope else [])], cwd)
        return {"git_commit": commit, "git_dirty": str(bool(changed.strip())).lower()}
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": "unknown", "git_dirty": "unknown"}


def _git(args: list[str], cwd: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True).stdout


def stage_pathspecs(cwd: str, stage: str | None, top: str) -> list[str]:
    """Git pathspecs of what DVC stage `stage` reads (its dvc.yaml, deps, params files) less its outs, in the git
    work tree `top`; [] when there is no such stage in a dvc.yaml here (the whole tree is judged then)."""
    if not stage:
        return []
    import yaml

    path, _, name = stage.rpartition(":")
    for dvcfile in dict.fromkeys([Path(cwd) / "dvc.yaml", Path(cwd) / (path or "dvc.yaml"),
                                  Path(os.environ.get(DVC_ROOT_ENV) or cwd) / (path or "dvc.yaml")]):
        try:
            found = (yaml.safe_load(dvcfile.read_text()) or {}).get("stages", {}).get(name)
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        if isinstance(found, dict):
            return _pathspecs(dvcfile, found, Path(top).resolve())
    return []


def _pathspecs(dvcfile: Path, stage: dict[str, Any], top: Path) -> list[str]:
    wdir = (dvcfile.parent / str(stage.get("wdir", "."))).resolve()
    reads = [str(dvcfile.resolve()), *_paths(stage.get("deps"))]  # relative to wdir, as DVC reads them
    for entry in stage.get("params") or []:  # a key of params.yaml, or {other file: [its keys]}
        reads += [str(f) for f in entry] if isinstance(entry, dict) else ["params.yaml"]
    writes = [p for key in ("outs", "metrics", "plots") for p in _paths(stage.get(key))]
    if any("${" in p for p in reads + writes):  # templated: its paths are DVC's to resolve; judge the whole tree
        return []
    return [f":(literal){p}" for p in _inside(wdir, reads, top)] + [
        f":(exclude,literal){p}" for p in _inside(wdir, writes, top)]


def _inside(wdir: Path, paths: list[str], top: Path) -> list[str]:
    """`paths` (relative to `wdir`, or absolute) made absolute, less those outside the git tree `top`."""
    absolute = (Path(os.path.normpath(wdir / p)) for p in dict.fromkeys(paths))
    return [str(p) for p in absolute if p.is_relative_to(top)]


def _paths(entries: Any) -> list[str]:
    """The paths of a dvc.yaml list of deps or outs: plain strings, or one-key mappings {path: options}."""
    return [str(next(iter(e))) if isinstance(e, dict) else str(e) for e in entries or [] if e]


def package_versions() -> dict[str, str]:
    versions = {}
    for name in TRACKED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def loaded_torch() -> Any | None:
    """The torch module when this process has imported it, else None (it is not imported here: 1.2-1.7 s)."""
    return sys.modules.get("torch")


def environment(device: Any | None = None, stage: str | None = None) -> dict[str, str]:
    """What a run ran on: python, platform, packages, git state (of DVC stage `stage`: `git_state`); with torch
    loaded, its CPU capability, threads and CUDA, and the `device` (a torch.device) with its name."""
    env = {"python": sys.version.split()[0], "platform": platform.platform()}
    torch = loaded_torch()
    if torch is not None:
        env.update({"cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "torch_threads": str(torch.get_num_threads()),
                    "cuda_available": str(torch.cuda.is_available()).lower()})
        if device is not None:
            env["device"] = str(device)
            if device.type == "cuda":
                env["device_name"] = torch.cuda.get_device_name(device)
            else:
                env["device_name"] = platform.processor() or platform.machine()
    env.update({f"pkg_{k}": v for k, v in package_versions().items()})
    env.update(git_state(stage=stage))
    return env
