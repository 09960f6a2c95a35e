"""Reproducibility: one seed for every RNG and the deterministic-algorithm switches."""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def derived_seed(seed: int, *keys: int | str) -> int:
    """A stable seed for a sub-stream (an epoch, a split, a worker) derived from the base seed."""
    h = seed
    for key in keys:
        k = key if isinstance(key, int) else int.from_bytes(str(key).encode()[:8].ljust(8, b"\0"), "little")
        h = (h * 1_000_003 + k + 0x9E3779B9) % (2**63 - 1)
    return h


def generator(seed: int, *keys: int | str, device: str | torch.device = "cpu") -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(derived_seed(seed, *keys))
    return g


def set_deterministic_algorithms(mode: bool, warn_only: bool = False, compiling: bool = False) -> None:
    """torch.use_deterministic_algorithms, without its import of torch._inductor (~1 s) when nothing compiles.

    The public function also sets the inductor's own `deterministic` flag, which matters only to torch.compile:
    it is called when compiling, or when the inductor is loaded already.
    """
    if compiling or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        torch._C._set_deterministic_algorithms(mode, warn_only=warn_only)


def configure_determinism(deterministic: bool, compiling: bool = False) -> dict[str, bool]:
    """Turn deterministic algorithms on (and cudnn.benchmark off), or allow the fast nondeterministic ones."""
    if deterministic:
        # cuBLAS needs this before its first use to be deterministic.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    set_deterministic_algorithms(deterministic, compiling=compiling)
    # Filling every new tensor with NaN costs ~15% of a CPU step; nothing here reads uninitialised memory.
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic
    return {"deterministic": deterministic, "cudnn_benchmark": not deterministic}
