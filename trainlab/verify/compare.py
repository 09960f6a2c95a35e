"""Two runs' trails and fingerprints compared: where the bits part first, what in the fingerprints can explain it,
and how far the final metrics are apart."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

EPOCH_HASHES = ("weights", "optimizer", "ema")
STEP_VALUES = ("loss_sum", "grad_norm")


def same(a: Any, b: Any) -> bool:
    """Equal to the bit (floats as JSON keeps them: exactly), NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


@dataclass
class Parting:
    """Where two trails part: the epoch, the first recorded step that differs and the last one that agrees."""

    epoch: int | None = None  # the first epoch (1-based) whose end hashes differ
    epoch_what: list[str] = field(default_factory=list)
    step: int | None = None  # the first recorded step whose values differ
    step_values: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # name: (recorded, here)
    last_agreeing_step: int = 0


@dataclass
class Comparison:
    epochs: int  # epochs compared
    steps: int  # recorded steps compared
    parting: Parting
    model_md5_equal: bool | None = None  # a whole rerun: the saved weights' md5 against the recorded one

    @property
    def identical(self) -> bool:
        return self.epochs > 0 and self.parting.epoch is None and self.parting.step is None and \
            self.model_md5_equal is not False


def epoch_bounds(trail: dict[str, Any], epoch: int) -> tuple[int, int]:
    """The optimizer steps (first, last) of `epoch` (1-based) by the trail's epoch records."""
    ends = {e["epoch"]: e["step"] for e in trail.get("epochs", [])}
    return ends.get(epoch - 1, 0) + 1, ends.get(epoch, 1 << 62)


def part(recorded: dict[str, Any], here: dict[str, Any],
         steps: tuple[int, int] | None = None) -> tuple[Parting, int, int]:
    """Where `here` parts from `recorded`; the epochs and steps compared (only steps in `steps`, when given)."""
    parting = Parting()
    theirs = {e["epoch"]: e for e in recorded.get("epochs", [])}
    ours = {e["epoch"]: e for e in here.get("epochs", [])}
    common_epochs = sorted(set(theirs) & set(ours))
    for epoch in common_epochs:
        what = [k for k in EPOCH_HASHES if not same(theirs[epoch].get(k), ours[epoch].get(k))]
        if what:
            parting.epoch, parting.epoch_what = epoch, what
            break
    theirs_steps = {s["step"]: s for s in recorded.get("steps", [])}
    ours_steps = {s["step"]: s for s in here.get("steps", [])}
    common = sorted(n for n in set(theirs_steps) & set(ours_steps) if steps is None or steps[0] <= n <= steps[1])
    for n in common:
        values = {k: (theirs_steps[n].get(k), ours_steps[n].get(k)) for k in STEP_VALUES
                  if not same(theirs_steps[n].get(k), ours_steps[n].get(k))}
        if values:
            parting.step, parting.step_values = n, values
            break
        parting.last_agreeing_step = n
    return parting, len(common_epochs), len(common)


def compare(recorded: dict[str, Any], here: dict[str, Any], model_md5: tuple[str, str] | None = None) -> Comparison:
    parting, epochs, steps = part(recorded, here)
    md5_equal = None if model_md5 is None or not all(model_md5) else model_md5[0] == model_md5[1]
    return Comparison(epochs, steps, parting, md5_equal)


# The fingerprint's keys in the order a difference explains the most, each with what it changes.
EXPLANATIONS = {
    "cpu_isa": "{what}: {here} here, {recorded} recorded: {kernels} kernels differ",
    "held_isa": "{what}: {here} here, {recorded} recorded: other kernels",
    "cpu_flags": "{what}: {here} here, {recorded} recorded",
    "cpu_model": "{what}: {here} here, {recorded} recorded",
    "threads": "{what}: {here} here, {recorded} recorded: reductions are split differently",
    "gpu": "{what}: {here} here, {recorded} recorded: other kernels",
    "torch": "{what} {here} here, {recorded} recorded: its kernels may differ",
    "torchvision": "{what} {here} here, {recorded} recorded",
    "cuda": "{what} {here} here, {recorded} recorded: other kernels",
    "cudnn": "{what} {here} here, {recorded} recorded: other kernels",
    "device": "{what}: {here} here, {recorded} recorded",
    "precision": "{what}: {here} here, {recorded} recorded",
    "cuda_graphs": "{what}: {here} here, {recorded} recorded (graphed and eager steps differ in their bits)",
    "deterministic": "{what}: {here} here, {recorded} recorded",
    "cudnn_benchmark": "{what}: {here} here, {recorded} recorded",
    "tf32": "{what}: {here} here, {recorded} recorded",
    "channels_last": "{what}: {here} here, {recorded} recorded",
    "compile": "{what}: {here} here, {recorded} recorded",
    "params_hash": "{what}: {here} here, {recorded} recorded",
    "data_hash": "{what}: {here} here, {recorded} recorded",
    "git_commit": "{what}: {here} here, {recorded} recorded",
    "git_dirty": "{what}: {here} here, {recorded} recorded",
}
NAMES = {"cpu_isa": "CPU ISA", "held_isa": "instruction set held by the environment", "cpu_flags": "CPU kernel flags",
         "cpu_model": "CPU", "threads": "torch threads", "gpu": "GPU", "cuda": "CUDA", "cudnn": "cuDNN",
         "cuda_graphs": "CUDA graphs", "deterministic": "deterministic algorithms", "params_hash": "params hash",
         "data_hash": "data hash", "git_commit": "code (commit)", "git_dirty": "uncommitted changes"}
IGNORED = {"cpu_flags"}  # named only when the ISA they decide is the same (a held CPU)


def fingerprint_differences(recorded: dict[str, str], here: dict[str, str]) -> list[str]:
    """One line per fingerprint difference that can change the bits, the likeliest cause first."""
    return [line for _, line in keyed_differences(recorded, here)]


def keyed_differences(recorded: dict[str, str], here: dict[str, str]) -> list[tuple[str, str]]:
    """(key, line) per fingerprint difference that can change the bits, the likeliest cause first."""
    lines = []
    keys = [*EXPLANATIONS, *sorted(k for k in set(recorded) | set(here) if k.startswith("auto."))]
    for key in keys:
        theirs, ours = recorded.get(key), here.get(key)
        if theirs is None or ours is None or theirs == ours:
            continue
        if key in IGNORED and recorded.get("cpu_isa") != here.get("cpu_isa"):
            continue
        if key.startswith("auto."):
            lines.append((key, f"what auto became ({key[5:]}): {ours} here, {theirs} recorded"))
            continue
        kernels = "bf16 matmul" if "bf16" in (recorded.get("precision"), here.get("precision")) else \
            "vectorised fp32"
        lines.append((key, EXPLANATIONS[key].format(what=NAMES.get(key, key), here=ours, recorded=theirs,
                                                    kernels=kernels)))
    return lines


def metric_gaps(recorded: dict[str, Any], here: dict[str, Any]) -> list[str]:
    """`name: recorded, here (difference)` for every metric both rows hold that differs (all equal: says so)."""
    lines = []
    for key in sorted(set(recorded) & set(here)):
        a, b = recorded[key], here[key]
        if key in ("epoch", "step", "lr") or not isinstance(a, (int, float)) or not isinstance(b, (int, float)) \
                or same(float(a), float(b)):
            continue
        lines.append(f"{key} {a:.6g} recorded, {b:.6g} here (difference {abs(a - b):.3g})")
    return lines or ["all equal"]
