"""Profiling: throughput per setting, FLOPs, MFU against measured and datasheet peaks, memory, profiler traces."""

from trainlab.profiling.flops import count_flops, flops_per_step
from trainlab.profiling.memory import PeakMemory
from trainlab.profiling.peaks import DATASHEET_TFLOPS, datasheet_peak_flops, matmul_peak_flops
from trainlab.profiling.throughput import (
    autocast_precisions,
    make_steps,
    measure_throughput,
    setting_name,
    settings_matrix,
    time_step,
)

__all__ = [
    "DATASHEET_TFLOPS", "PeakMemory", "autocast_precisions", "count_flops", "datasheet_peak_flops",
    "flops_per_step", "make_steps", "matmul_peak_flops", "measure_throughput", "profile_models", "setting_name",
    "settings_matrix", "time_step",
]


def profile_models(*args, **kwargs):
    """The profile stage's core (trainlab.profiling.stage.profile_models), imported on first use."""
    from trainlab.profiling.stage import profile_models as run

    return run(*args, **kwargs)
