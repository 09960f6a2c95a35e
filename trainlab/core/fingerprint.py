"""A training run's fingerprint: everything that can change its bits (library versions, CPU instruction set, GPU,
threads, precision and what `auto` became, determinism switches, the data's and params' hashes, the commit)."""

from __future__ import annotations

import hashlib
import os
import platform
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from trainlab.core.provenance import git_state, package_versions
from trainlab.core.runtime import ONEDNN_ISAS_WITHOUT_BF16, Runtime

# The /proc/cpuinfo flags that decide which kernels torch and oneDNN run (and so the bits of a CPU run).
KERNEL_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx512f", "avx2", "fma")
HELD_ISA_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
CODE_CHECKOUT = Path(__file__).resolve().parents[2]  # where this code is read from (verify reruns elsewhere)


@lru_cache(maxsize=1)
def cpu_info() -> tuple[str, frozenset[str]]:
    """The CPU's model name and its flags, from /proc/cpuinfo (the platform's processor name elsewhere)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), frozenset()
    fields = dict(line.split(":", 1) for line in text.splitlines()[:40] if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    return fields.get("model name", platform.machine()), frozenset(fields.get("flags", "").split())


def cpu_isa_kind() -> str:
    """The instruction set torch's CPU kernels use, as this project's CPU kinds are told apart: AMX, AVX-512 BF16,
    AVX-512, AVX2 (or torch's own name of a lesser one). A CPU held to a lower ISA (ATEN_CPU_CAPABILITY,
    ONEDNN_MAX_CPU_ISA) counts as that ISA."""
    capability = torch.backends.cpu.get_cpu_capability()
    _, flags = cpu_info()
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "ALL")).upper()
    if not capability.startswith("AVX512") or onednn in ONEDNN_ISAS_WITHOUT_BF16:
        return capability
    if "amx_bf16" in flags and (onednn == "ALL" or "AMX" in onednn):
        return "AMX"
    return "AVX-512 BF16" if "avx512_bf16" in flags else "AVX-512"


def files_digest(folder: Path) -> str:
    """A short sha256 of every file's relative path and bytes under `folder` (the prepared data)."""
    h = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        h.update(path.relative_to(folder).as_posix().encode() + b"\0")
        with open(path, "rb") as f:
            h.update(hashlib.file_digest(f, "sha256").digest())
    return h.hexdigest()[:16]


def gpu_description(device: torch.device) -> str:
    if device.type != "cuda":
        return "none"
    major, minor = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)} (sm_{major}{minor})"


def run_fingerprint(runtime: Runtime, data_dir: Path, params_hash: str, auto: dict[str, Any]) -> dict[str, str]:
    """The fingerprint of a training run on this machine, as flat strings (MLflow tags `fingerprint.<key>`)."""
    cpu_model, flags = cpu_info()
    versions = package_versions()
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    fingerprint = {
        "torch": str(torch.__version__), "torchvision": versions.get("torchvision", "none"),
        "cuda": torch.version.cuda or "none", "cudnn": str(cudnn or "none"),
        "cpu_model": cpu_model, "cpu_isa": cpu_isa_kind(),
        "cpu_flags": " ".join(f for f in KERNEL_FLAGS if f in flags),
        "held_isa": " ".join(f"{k}={os.environ[k]}" for k in HELD_ISA_ENV if os.environ.get(k)) or "none",
        "gpu": gpu_description(runtime.device), "threads": str(torch.get_num_threads()),
        **{k.removeprefix("runtime_"): v for k, v in runtime.describe().items()},
        **{f"auto.{k}": str(v) for k, v in sorted(auto.items())},
        "params_hash": params_hash, "data_hash": files_digest(data_dir),
    }
    state = git_state()
    if state["git_commit"] == "unknown":  # run outside a git work tree (verify's temporary workspace)
        state = git_state(str(CODE_CHECKOUT))
    fingerprint.update(state)
    return fingerprint
