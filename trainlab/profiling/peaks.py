"""Peak matmul FLOP/s: measured with a square matmul in a given dtype, and datasheet peaks of known GPUs."""

from __future__ import annotations

import statistics
import time

import torch

# Dense (no sparsity) tensor-core peaks in TFLOP/s, matched by substring of torch.cuda.get_device_name(), first
# match wins (so the more specific names come first). "tf32" is what fp32 matmuls run at with TF32 allowed.
DATASHEET_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # H200 SXM
    ("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}),  # H100 SXM
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", {"bf16": 362.1, "fp16": 362.1, "tf32": 183.0, "fp32": 91.6}),
    ("L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    ("A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    ("V100", {"fp16": 125.0, "fp32": 15.7}),
    ("T4", {"fp16": 65.0, "fp32": 8.1}),
]

_TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def datasheet_key(precision: str, tf32: bool) -> str:
    """The datasheet column a setting runs at: fp32 matmuls count as tf32 when TF32 is allowed."""
    return "tf32" if precision == "fp32" and tf32 else precision


def datasheet_peak_for_name(device_name: str, key: str) -> float | None:
    """The datasheet dense peak FLOP/s for a GPU name (as torch.cuda.get_device_name gives it) and a datasheet
    key (bf16, fp16, tf32, fp32); None when the GPU or the key is not in the table."""
    for pattern, peaks in DATASHEET_TFLOPS:
        if pattern.lower() in device_name.lower():
            value = peaks.get(key)
            return value * 1e12 if value is not None else None
    return None


def datasheet_peak_flops(device: torch.device | str, precision: str, tf32: bool = False) -> float | None:
    """The datasheet dense peak FLOP/s of a known CUDA GPU in `precision`, or None (CPU, unknown GPU, no such dtype)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return datasheet_peak_for_name(torch.cuda.get_device_name(device), datasheet_key(precision, tf32))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def matmul_peak_flops(device: torch.device | str, dtype: torch.dtype | str, repeats: int = 5,
                      sizes: tuple[int, ...] | None = None, budget_s: float | None = None) -> float:
    """The best median FLOP/s of an n x n @ n x n matmul in `dtype` over `sizes` (each timed `repeats` times).

    Bigger sizes are tried only while one more size fits in `budget_s` seconds (estimated from the last one),
    so a slow CPU stops at 1024 or 2048 while a GPU goes on to 8192.
    """
    device = torch.device(device)
    if isinstance(dtype, str):
        dtype = _TORCH_DTYPES[dtype]
    gpu = device.type != "cpu"
    sizes = sizes or ((2048, 4096, 8192) if gpu else (512, 1024, 2048, 4096))
    budget_s = budget_s if budget_s is not None else 2.0
    per_timing = 10 if gpu else 1  # matmuls per timed call: amortises launch overhead on a GPU
    best, spent = 0.0, 0.0
    for n in sizes:
        gen = torch.Generator(device="cpu").manual_seed(n)
        a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
        t0 = time.perf_counter()
        for _ in range(2 if gpu else 1):  # warm-up (kernel selection, first-touch of the output)
            torch.mm(a, b)
        synchronize(device)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(per_timing):
                torch.mm(a, b)
            synchronize(device)
            times.append((time.perf_counter() - start) / per_timing)
        spent += time.perf_counter() - t0
        best = max(best, 2 * n**3 / statistics.median(times))
        # The next size costs about 8x this one: stop when that would overrun the budget.
        if spent + 8 * (time.perf_counter() - t0) > budget_s:
            break
    return best
