"""What a run ran on: git state, package versions and the environment record, without loading torch (a flow or the
TF-IDF baseline never uses it); torch's part of the record comes from a process that has loaded it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from functools import lru_cache
from importlib import metadata
from typing import Any

TRACKED_PACKAGES = ("torch", "torchvision", "torchmetrics", "numpy", "dvc", "prefect", "mlflow", "scikit-learn",
                    "pydantic", "trainlab")


@lru_cache(maxsize=1)
def git_state(cwd: str | None = None) -> dict[str, str]:
    """Commit hash and dirty flag of the working tree ('unknown' outside git)."""
    cwd = cwd or os.getcwd()
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, timeout=10, check=True).stdout
        return {"git_commit": commit, "git_dirty": str(bool(status.strip())).lower()}
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": "unknown", "git_dirty": "unknown"}


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


def environment(device: Any | None = None) -> dict[str, str]:
    """What a run ran on: python, platform, packages, git state; with torch loaded, its CPU capability, threads and
    CUDA, and the `device` (a torch.device) with its name."""
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
    env.update(git_state())
    return env
