"""The trail's overhead (trainlab/engine/trail.py): a small CNN trained with and without it, alternating, and the
seconds its own calls take (gradient norms, reads, epoch hashes) as a share of the training."""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import PartResult, alternate, fmt, log, table

SAMPLES, EPOCHS, BATCH = 2048, 3, 64  # 32 optimizer steps an epoch: a few seconds on a quiet 2-core CPU


class NullTrail:
    """No trail at all: what fit ran before trails."""

    def __init__(self, step, fingerprint=None, every=None):
        pass

    def after_update(self) -> None:
        pass

    def epoch_end(self, epoch: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, saved) -> None:
        pass


def timed_trail_class(spent: list[float]):
    """The Trail, with the seconds of its calls added to `spent[0]`."""
    from trainlab.engine.trail import Trail

    class TimedTrail(Trail):
        def _timed(self, method, *args):
            t0 = time.perf_counter()
            try:
                return method(*args)
            finally:
                spent[0] += time.perf_counter() - t0

        def _before_update(self, *args) -> None:
            self._timed(super()._before_update, *args)

        def after_update(self) -> None:
            self._timed(super().after_update)

        def epoch_end(self, epoch: int) -> None:
            self._timed(super().epoch_end, epoch)

    return TimedTrail


def small_cnn_task(width: int = 16):
    import torch
    import torch.nn.functional as F
    from torch import nn
    from torchmetrics import MetricCollection
    from torchmetrics.classification import MulticlassAccuracy

    from trainlab.engine.contract import Trainable

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Conv2d(2 * width, 4 * width, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * width, 10))

    def prepare(batch, train, gen):
        return batch["images"].float().div_(255), batch["labels"]

    return Trainable(name="trail_bench", model=model, loss_fn=lambda out, y: F.cross_entropy(out.float(), y),
                     make_metrics=lambda: MetricCollection({"accuracy": MulticlassAccuracy(num_classes=10)}),
                     prepare_batch=prepare, primary_metric="accuracy", conv=True)


def data(n: int, seed: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 10, (n,), generator=g)
    images = torch.randint(0, 80, (n, 1, 28, 28), generator=g, dtype=torch.uint8)
    for i, y in enumerate(labels.tolist()):  # learnable: the class lights one of ten bands
        images[i, 0, 2 * y + 4:2 * y + 7] += 150
    return {"images": images, "labels": labels}


def run(quick: bool, repeats: int, device: str) -> PartResult:
    from trainlab.core.config import BaseParams, TrainParams
    from trainlab.core.runtime import resolve_runtime
    from trainlab.engine import loop
    from trainlab.engine.trail import TRAIL_EVERY_STEPS

    started = time.perf_counter()
    samples = SAMPLES // 4 if quick else SAMPLES
    train, val = data(samples, 0), data(512, 1)
    cfg = TrainParams(epochs=EPOCHS, batch_size=BATCH, lr=1e-3, warmup_epochs=0.0, min_steps=None)
    runtime = resolve_runtime(BaseParams(device=device, precision="fp32"))
    spent: list[float] = [0.0]
    original = loop.Trail

    def contender(trail_class):
        def measure(repeat: int, warm: bool) -> dict[str, float]:
            spent[0] = 0.0
            loop.Trail = trail_class
            try:
                t0 = time.perf_counter()
                result = loop.fit(small_cnn_task(), train, val, cfg, runtime, seed=0)
                wall = time.perf_counter() - t0
            finally:
                loop.Trail = original
            steps = result.history[-1]["step"]
            return {"wall_s": wall, "trail_s": spent[0], "steps": steps,
                    "records": len(result.trail.get("steps", [])) if result.trail else 0}
        return measure

    comparison = alternate({"with_trail": contender(timed_trail_class(spent)), "without_trail": contender(NullTrail)},
                           repeats, what="trail")
    with_s, without_s = comparison.median("with_trail", "wall_s"), comparison.median("without_trail", "wall_s")
    own_s = comparison.median("with_trail", "trail_s")
    own_fraction = own_s / with_s
    wall_fraction = with_s / without_s - 1
    steps = comparison.repeats["with_trail"][0]["steps"]
    records = comparison.repeats["with_trail"][0]["records"]
    log(f"trail: {own_fraction:.2%} of training in its own calls ({records} records every {TRAIL_EVERY_STEPS} of "
        f"{steps} steps, {EPOCHS} epoch hashes); wall {with_s:.2f} s with, {without_s:.2f} s without")
    rows = [["training wall time with the trail (s, median)", fmt(with_s)],
            ["training wall time without it (s, median)", fmt(without_s)],
            ["wall-time difference (noisy at this size)", f"{wall_fraction:+.2%}"],
            ["the trail's own calls (s, median)", fmt(own_s)],
            ["the trail's own calls / training wall time", f"{own_fraction:.2%}"],
            ["records (every K steps) / optimizer steps / epochs", f"{records} (K={TRAIL_EVERY_STEPS}) / {steps} / "
                                                                   f"{EPOCHS}"]]
    markdown = "\n".join([f"## trail overhead ({runtime.device}, small CNN, {samples} samples, batch {BATCH})", "",
                          table(["figure", "value"], rows), ""])
    headline = {"trail_overhead_fraction": own_fraction, "trail_wall_difference_fraction": wall_fraction}
    return PartResult("trail", {"comparison": comparison.summary(["wall_s", "trail_s"]), "every": TRAIL_EVERY_STEPS,
                                "records": records, "steps": steps}, markdown, headline,
                      time.perf_counter() - started)
