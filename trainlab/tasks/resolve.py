"""`auto` training params resolved against the prepared data: each becomes a concrete value that the stage prints and
records with why (info.json "auto", MLflow params), and a budget that follows the data's size."""

from __future__ import annotations

import math
from typing import Any

from trainlab.core.config import TrainParams
from trainlab.tasks.spec import get

Choice = dict[str, Any]  # {"value": what an auto (or a budget) became, "why": one line}


def updates_per_epoch(cfg: TrainParams, train_count: int) -> int:
    """Optimizer steps in one epoch of `train_count` samples (the engine's batches: the last short batch dropped
    when there is a full one; `crops_per_image` crops of each image an epoch)."""
    samples = train_count * getattr(cfg, "crops_per_image", 1)
    batches = samples // cfg.batch_size if samples >= cfg.batch_size else 1
    return max(1, batches // cfg.accumulation_steps)


# min_steps auto (the classifier's; params.yaml's comments give the quality suite's figures):
MIN_STEPS = 480  # optimizer steps a small data set trains at least (the embedded digits' 9 epochs are 486)
CUTMIX_STEPS = 8  # ... times this with CutMix: mixed images train longer (torchvision's recipes: 600 epochs, not 90)


def resolve_training(name: str, cfg: TrainParams, meta: dict,
                     train_count: int) -> tuple[TrainParams, dict[str, Choice]]:
    """`cfg` with every auto of the task resolved for this data (TaskCode.resolve_auto), the batch size no larger
    than the training split, `min_steps` auto made a number, and epochs raised to reach it; and what changed, with
    why."""
    cfg, choices = get(name).load().resolve_auto(cfg, meta)
    if cfg.min_steps == "auto":
        mix = getattr(cfg, "cutmix", False) is True
        steps = MIN_STEPS * (CUTMIX_STEPS if mix else 1)
        choices["min_steps"] = {"value": steps, "why": f"with CutMix, {CUTMIX_STEPS}x {MIN_STEPS}: mixed images "
                                "train longer" if mix else "no images mixed"}
        cfg = cfg.model_copy(update={"min_steps": steps})
    if cfg.batch_size > train_count:
        choices["batch_size"] = {"value": train_count, "why": f"{name}.batch_size {cfg.batch_size} is more than the "
                                 f"{train_count:,} training samples: one batch of all of them"}
        cfg = cfg.model_copy(update={"batch_size": train_count})
    per_epoch = updates_per_epoch(cfg, train_count)
    if cfg.min_steps and cfg.epochs * per_epoch < cfg.min_steps:
        epochs = math.ceil(cfg.min_steps / per_epoch)
        choices["epochs"] = {"value": epochs, "why": f"{cfg.epochs} epochs of {per_epoch:,} steps are fewer than "
                             f"{name}.min_steps ({cfg.min_steps:,}): {epochs} epochs, {epochs * per_epoch:,} steps"}
        cfg = cfg.model_copy(update={"epochs": epochs})
    return cfg, choices


def choices_line(name: str, choices: dict[str, Choice]) -> str:
    return "; ".join(f"{name}.{key} -> {c['value']} ({c['why']})" for key, c in choices.items())


# Segmentation at the images' own resolution: images more than twice AUTO_CROP a side train on AUTO_CROP crops
# (thin structures keep every pixel; a crop still holds their context), and validation and test predict whole images
# up to AUTO_TILE a side, tiles of it beyond.
AUTO_CROP = 128
AUTO_TILE = 1024


def segmentation_autos(cfg, height: int, width: int) -> tuple[Any, dict[str, Choice]]:
    """The segmenter's crop_size, crops_per_image and inference_tile for stored images of height x width."""
    updates, choices = {}, {}
    side = max(height, width)
    if cfg.crop_size == "auto":
        crop = AUTO_CROP if side > 2 * AUTO_CROP else None
        updates["crop_size"] = crop
        choices["crop_size"] = {"value": crop, "why": f"images {height}x{width}: " + (
            f"trained on {crop}x{crop} crops at their own resolution" if crop else "trained whole")}
    crop = updates.get("crop_size", cfg.crop_size)
    if cfg.crops_per_image == "auto":
        count = max(1, round(height * width / crop**2)) if crop else 1
        updates["crops_per_image"] = count
        if crop:
            choices["crops_per_image"] = {"value": count, "why": f"an epoch covers each {height}x{width} image about "
                                          f"once in {crop}x{crop} crops"}
    if cfg.inference_tile == "auto":
        tile = AUTO_TILE if side > AUTO_TILE else None
        updates["inference_tile"] = tile
        if tile:
            choices["inference_tile"] = {"value": tile, "why": f"images {height}x{width}: predicted in overlapping "
                                         f"{tile}x{tile} tiles"}
    return (cfg.model_copy(update=updates) if updates else cfg), choices
