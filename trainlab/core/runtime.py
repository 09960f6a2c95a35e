"""Device and speed settings resolved once per run: device, precision, channels_last, compile, TF32."""

from __future__ import annotations

import contextlib
import os
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import torch

from trainlab.core import auto
from trainlab.core.auto import CUDA_BF16_MIN_TRAIN_GFLOP  # noqa: F401 - re-exported
from trainlab.core.config import BaseParams
from trainlab.core.repro import configure_determinism

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    precision: str  # fp32 | bf16 | fp16
    channels_last: bool
    compile: bool
    tf32: bool
    deterministic: bool
    cudnn_benchmark: bool

    @property
    def amp_dtype(self) -> torch.dtype | None:
        return None if self.precision == "fp32" else DTYPES[self.precision]

    @property
    def needs_grad_scaler(self) -> bool:
        return self.precision == "fp16"

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def describe(self) -> dict[str, str]:
        return {f"runtime_{k}": str(v) for k, v in asdict(self).items()}


# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) below AVX512_CORE_BF16: no bf16 dot products
ONEDNN_ISAS_WITHOUT_BF16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


@lru_cache(maxsize=1)
def cpu_supports_bf16() -> bool:
    """True when the CPU has native bf16 (AVX-512 BF16 or AMX) and torch may use it, where bf16 autocast pays off.
    A CPU held to AVX2 (ATEN_CPU_CAPABILITY=avx2, or oneDNN's ONEDNN_MAX_CPU_ISA) computes bf16 through conversions,
    about 10x slower than fp32, so there it is False as on an AVX2-only CPU."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "ALL")).upper()
    if isa in ONEDNN_ISAS_WITHOUT_BF16 or not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_device(name: str) -> torch.device:
    name = auto.device(name, torch.cuda.is_available(), torch.backends.mps.is_available())
    if name == "cuda" and not torch.cuda.is_available():
        from trainlab.core.errors import ParamsError

        raise ParamsError("base.device: 'cuda' requested but no CUDA device is available (use 'auto' or 'cpu')")
    return torch.device(name)


def cuda_auto_precision(train_gflop_per_step: float) -> str:
    """What `precision: auto` means on CUDA for a step of this many GFLOP (trainlab.core.auto.cuda_precision)."""
    return auto.cuda_precision(train_gflop_per_step, torch.cuda.is_bf16_supported())


def resolve_precision(name: str, device: torch.device) -> str:
    """The precision for `name` before the model is known; on CUDA `auto` is settled per model by
    trainlab.jobs.train.settle_auto_precision (bf16 here is its answer for a large step)."""
    cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    return auto.precision(name, device.type, cuda_bf16, device.type == "cpu" and cpu_supports_bf16())


# glibc's malloc hands memory back to the system when more than its trim threshold lies free at the top of the heap,
# and serves blocks over its mmap threshold from fresh mappings: a training step that frees its activations and
# allocates them again at the next step then pays page faults every step (the segmenter: 17-20 s of system time in
# a 60 s training on the 2-core Zen 4; 1 s with these). The mmap threshold is glibc's maximum.
MALLOC_MMAP_THRESHOLD = 32 << 20
MALLOC_TRIM_THRESHOLD = 1 << 30


def keep_freed_memory() -> bool:
    """Make the C library's malloc keep freed memory for the next allocations (glibc's mallopt); False where the C
    library has no mallopt or refuses the settings."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    return bool(mallopt(m_mmap_threshold, MALLOC_MMAP_THRESHOLD)) and bool(mallopt(m_trim_threshold,
                                                                                 MALLOC_TRIM_THRESHOLD))


def resolve_runtime(base: BaseParams) -> Runtime:
    """Resolve the base params into concrete settings and apply the global switches (determinism, TF32, malloc's
    thresholds)."""
    keep_freed_memory()
    device = resolve_device(base.device)
    flags = configure_determinism(base.deterministic, compiling=base.compile)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = base.tf32
        torch.backends.cudnn.allow_tf32 = base.tf32
    return Runtime(
        device=device,
        precision=resolve_precision(base.precision, device),
        channels_last=base.channels_last,
        compile=base.compile,
        tf32=base.tf32 and device.type == "cuda",
        deterministic=flags["deterministic"],
        cudnn_benchmark=flags["cudnn_benchmark"],
    )
