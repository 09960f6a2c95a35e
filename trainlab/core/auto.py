"""Every `auto` of params.yaml resolved in one place: each rule takes the value as written and what is known of the
data (what prepare found, meta.json) or of the machine, and returns the concrete value with why. Prepare, training,
predict, search and the recorded `auto.*` params all read these; no other module compares a value with "auto"."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

AUTO = "auto"
Choice = dict[str, Any]  # {"value": what an auto (or a budget) became, "why": one line}


def choice(value: Any, why: str) -> Choice:
    return {"value": value, "why": why}


def choices_line(name: str, choices: dict[str, Choice]) -> str:
    return "; ".join(f"{name}.{key} -> {c['value']} ({c['why']})" for key, c in choices.items())


# ---- data (prepare) ------------------------------------------------------------------------------------------------

# image_size auto, classification: images that all share one size no larger than AUTO_KEEP_MAX a side are kept as
# they are; anything else (photos) is resized to AUTO_PHOTO_SIZE (shorter side, then the centre square).
# Segmentation keeps the images' own resolution (thin structures vanish when shrunk: training takes crops, inference
# whole images or tiles); only images that differ in size, or exceed AUTO_SEGMENTATION_MAX a side, are stretched.
AUTO_KEEP_MAX = 96
AUTO_PHOTO_SIZE = 96
AUTO_SEGMENTATION_MAX = 1024


def image_size(setting: Any, task: str, sizes: set[tuple[int, int]], sides: Sequence[int]) -> tuple[int, int, bool,
                                                                                                     str]:
    """data.<task>.image_size for image files of these (height, width) `sizes` (`sides`: each file's longer side):
    (height, width, keep: stored as decoded, why)."""
    if setting != AUTO:
        return int(setting), int(setting), False, "set in params"
    (height, width), one_size = max(sizes), len(sizes) == 1
    what = f"{len(sizes):,} image sizes" if not one_size else f"images of {height}x{width}"
    if task == "classifier":
        if one_size and max(height, width) <= AUTO_KEEP_MAX:
            return height, width, True, f"kept: every image is {height}x{width}"
        return AUTO_PHOTO_SIZE, AUTO_PHOTO_SIZE, False, \
            f"{AUTO_PHOTO_SIZE}: {what}, shorter side resized, centre square"
    if one_size and max(height, width) <= AUTO_SEGMENTATION_MAX:
        return height, width, True, f"kept at their own resolution: every image is {height}x{width}"
    side = min(AUTO_SEGMENTATION_MAX, int(statistics.median(sides)))
    return side, side, False, \
        f"{side}: {what}, stretched to one size (the median side, at most {AUTO_SEGMENTATION_MAX})"


def classification_data(hflip: Any, image_size_set: Any, kind: str, why: str, mirror_safe: bool,
                        size: tuple[Any, str] | None) -> dict[str, Choice]:
    """What prepare records of classification images in meta.json: the augmentation that keeps their labels
    (classifier.augment auto: photo or shift, by `kind`), whether a mirror keeps the label (data.classification.hflip
    auto: photos and `mirror_safe` sources), and the stored size of an image folder (`size`: value and why)."""
    choices = {"augment": choice("photo" if kind == "photo" else "shift", why)}
    if hflip == AUTO:
        choices["hflip"] = choice(kind == "photo" or mirror_safe, why)
    if size is not None and image_size_set == AUTO:
        choices["image_size"] = choice(*size)
    return choices


def segmentation_size(image_size_set: Any, size: tuple[Any, str] | None) -> dict[str, Choice]:
    """data.segmentation.image_size auto, as prepare recorded it for paired folders (`size`: value and why)."""
    return {"image_size": choice(*size)} if size is not None and image_size_set == AUTO else {}


# max_length auto: the training texts' length (tokens, [CLS] included) at this percentile, rounded up to a multiple of
# AUTO_LENGTH_STEP, at most AUTO_LENGTH_CAP: the prepared tokens (N x max_length int64), a bag's step (its features
# per text grow with the length) and a Transformer's attention (with its square) stay bounded on long documents
AUTO_LENGTH_PERCENTILE = 99
AUTO_LENGTH_STEP = 8
AUTO_LENGTH_CAP = 512


def auto_max_length(lengths: Sequence[int]) -> tuple[int, str]:
    """max_length auto for texts of these lengths in tokens ([CLS] included): the AUTO_LENGTH_PERCENTILE-th
    percentile rounded up to a multiple of AUTO_LENGTH_STEP, at most AUTO_LENGTH_CAP; with why, in one line."""
    import numpy as np

    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size == 0:
        raise ValueError("max_length auto needs at least one training text")
    at = int(np.percentile(lengths, AUTO_LENGTH_PERCENTILE, method="higher"))
    value = min(AUTO_LENGTH_CAP, -(-at // AUTO_LENGTH_STEP) * AUTO_LENGTH_STEP)
    cut = float((lengths > value).mean())
    capped = f", above the cap of {AUTO_LENGTH_CAP}" if value < at else \
        f", rounded up to a multiple of {AUTO_LENGTH_STEP}"
    why = (f"{AUTO_LENGTH_PERCENTILE}% of the {lengths.size:,} training texts have at most {at:,} tokens ([CLS] "
           f"included; median {int(np.median(lengths)):,}, longest {int(lengths.max()):,}){capped}; "
           f"{100 * cut:.1f}% of them are cut")
    return value, why


def max_length(setting: Any, lengths: Sequence[int]) -> tuple[int, str | None]:
    """data.text.max_length: as set (why None), or auto from the training texts' lengths."""
    return auto_max_length(lengths) if setting == AUTO else (int(setting), None)


# ---- training ------------------------------------------------------------------------------------------------------

MIN_STEPS = 480  # classifier.min_steps auto: epochs auto's lower bound in optimizer steps (the digits' 9 epochs)
CUTMIX_STEPS = 8  # ... times this with CutMix: mixed images train longer (torchvision's recipes: 600 epochs, not 90)
STEM_POOL_4_SIDE = 64  # classifier.stem_pool auto: 4 from this side on (torchvision's ResNets stride their stem by 4)
SMALL_STEM_POOL = 2  # ... and below it, or for a model built without data
# Segmentation at the images' own resolution: images more than twice AUTO_CROP a side train on AUTO_CROP crops
# (thin structures keep every pixel; a crop still holds their context), and validation and test predict whole images
# up to AUTO_TILE a side, tiles of it beyond.
AUTO_CROP = 128
AUTO_TILE = 1024
# text.weight_decay auto: the TF-IDF bag trains one head per candidate L2 coefficient of the per-sample objective
# (SGD's weight_decay; C = 1 / (wd * N)), a decade apart below 1e-5 and half a decade above, and the validation split
# chooses (its heads carry their own L2; the optimizer applies none); other archs take their documented value
WEIGHT_DECAY_CANDIDATES = (1e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3)
AUTO_WEIGHT_DECAY = {"transformer": 0.01, "ngram_bag": 0.0, "nb_bag": 0.0}
PRECISE_BN_BELOW_STEPS = 50  # precise_bn auto: recompute when an epoch has fewer optimizer steps than this


def classifier_model(cfg: Any, meta: dict) -> tuple[dict[str, Any], dict[str, Choice]]:
    """classifier.augment auto: what prepare found the images to be (meta.json "augment"); cutmix auto: with photo
    augmentation; stem_pool auto: by the images' side (2 for a model built without data)."""
    updates, choices = {}, {}
    if cfg.augment == AUTO:
        kind = meta.get("augment", "shift")
        why = meta.get("auto", {}).get("augment", {}).get("why", "prepared data without a record: shifts only")
        updates["augment"], choices["augment"] = kind, choice(kind, why)
    augment = updates.get("augment", cfg.augment)
    if cfg.cutmix == AUTO:
        mix = augment == "photo"
        updates["cutmix"] = mix
        choices["cutmix"] = choice(mix, "photo augmentation: photos mixed as torchvision's recipes mix them" if mix
                                   else f"{augment} augmentation: images not mixed")
    if getattr(cfg, "stem_pool", None) == AUTO:
        if "height" in meta:
            height, width = meta["height"], meta["width"]
            pool = 4 if min(height, width) >= STEM_POOL_4_SIDE else SMALL_STEM_POOL
            choices["stem_pool"] = choice(pool, f"{height}x{width} images: the residual stages at "
                                          f"{math.ceil(height / pool)}x{math.ceil(width / pool)}")
        else:
            pool = SMALL_STEM_POOL  # a model built without data (a test, a benchmark): the small images' value
        updates["stem_pool"] = pool
    return updates, choices


def segmenter_model(cfg: Any, meta: dict) -> tuple[dict[str, Any], dict[str, Choice]]:
    """crop_size, crops_per_image and inference_tile auto, by the stored images' height x width (none recorded:
    whole images)."""
    height, width = meta.get("height", 0), meta.get("width", 0)
    updates, choices = {}, {}
    side = max(height, width)
    if cfg.crop_size == AUTO:
        crop = AUTO_CROP if side > 2 * AUTO_CROP else None
        updates["crop_size"] = crop
        choices["crop_size"] = choice(crop, f"images {height}x{width}: " + (
            f"trained on {crop}x{crop} crops at their own resolution" if crop else "trained whole"))
    crop = updates.get("crop_size", cfg.crop_size)
    if cfg.crops_per_image == AUTO:
        count = max(1, round(height * width / crop**2)) if crop else 1
        updates["crops_per_image"] = count
        if crop:
            choices["crops_per_image"] = choice(count, f"an epoch covers each {height}x{width} image about once in "
                                                f"{crop}x{crop} crops")
    if cfg.inference_tile == AUTO:
        tile = AUTO_TILE if side > AUTO_TILE else None
        updates["inference_tile"] = tile
        if tile:
            choices["inference_tile"] = choice(tile, f"images {height}x{width}: predicted in overlapping "
                                               f"{tile}x{tile} tiles")
    return updates, choices


def text_model(cfg: Any, meta: dict) -> tuple[dict[str, Any], dict[str, Choice]]:
    """text.weight_decay auto: the TF-IDF bag's candidates (the validation split chooses), else the arch's value."""
    if cfg.weight_decay != AUTO:
        return {}, {}
    if cfg.arch == "tfidf_bag":
        return {"weight_decay": WEIGHT_DECAY_CANDIDATES}, {"weight_decay": choice(
            list(WEIGHT_DECAY_CANDIDATES), "one head per candidate; the validation split chooses")}
    decay = AUTO_WEIGHT_DECAY[cfg.arch]
    return {"weight_decay": decay}, {"weight_decay": choice(decay, f"the value {cfg.arch} is documented to want")}


MODEL_RULES = {"classifier": classifier_model, "segmenter": segmenter_model, "text": text_model}


def resolve_model(name: str, cfg: Any, meta: dict | None = None) -> tuple[Any, dict[str, Choice]]:
    """`cfg` (the params section `name`) with the autos that shape its model and batches resolved for the prepared
    data (meta.json; None: a model built without data), and what each became with why."""
    rules = MODEL_RULES.get(name)  # a section of a task registered with none: nothing to resolve
    updates, choices = rules(cfg, meta or {}) if rules else ({}, {})
    return (cfg.model_copy(update=updates) if updates else cfg), choices


def updates_per_epoch(cfg: Any, train_count: int) -> int:
    """Optimizer steps in one epoch of `train_count` samples (the engine's batches: the last short batch dropped
    when there is a full one; `crops_per_image` crops of each image an epoch)."""
    samples = train_count * getattr(cfg, "crops_per_image", 1)
    batches = samples // cfg.batch_size if samples >= cfg.batch_size else 1
    return max(1, batches // cfg.accumulation_steps)


def precise_bn(setting: Any, updates: int) -> bool:
    """precise_bn auto: recompute BatchNorm statistics when an epoch has fewer than PRECISE_BN_BELOW_STEPS steps."""
    return updates < PRECISE_BN_BELOW_STEPS if setting == AUTO else bool(setting)


# epochs auto: train until the primary validation metric stops improving (schedule plateau), at least the lower bound
# (min_steps optimizer steps, but at most LOWER_EPOCHS passes over the data: a set of 80 photos learns nothing from
# 3,840 passes that the plateau rule would not add while validation improves) and at most CEILING_OVER_MIN times
# that, or CEILING_EPOCHS epochs where that is more
LOWER_EPOCHS = 300
CEILING_OVER_MIN = 10
CEILING_EPOCHS = 100
TARGET_VALIDATIONS = 20  # validate_every auto: about this many validations in a run's lower bound (at least 1 epoch)


def epochs_and_cadence(name: str, cfg: Any, per_epoch: int) -> tuple[dict[str, Any], dict[str, Choice]]:
    """epochs auto: the lower bound (min_steps, at most LOWER_EPOCHS epochs) and the ceiling, trained with the plateau
    schedule; validate_every auto: whole epochs, about TARGET_VALIDATIONS of them in the lower bound (or in the epochs
    set). A number of epochs is trained exactly (min_steps does not apply)."""
    updates, choices = {}, {}
    if cfg.epochs == AUTO:
        lower = min(cfg.min_steps or per_epoch, LOWER_EPOCHS * per_epoch)
        ceiling = max(CEILING_OVER_MIN * lower, CEILING_EPOCHS * per_epoch)
        epochs = math.ceil(ceiling / per_epoch)
        updates.update(epochs=epochs, schedule="plateau", min_steps=lower)
        if lower < (cfg.min_steps or 0):
            choices["min_steps"] = choice(lower, f"{name}.min_steps {cfg.min_steps:,} would be more than "
                                          f"{LOWER_EPOCHS} epochs of {per_epoch:,} steps")
        choices["epochs"] = choice(f"auto, at most {epochs}", (
            f"until val_<primary metric> has not improved by more than its noise for {cfg.patience} validations"
            + cadence_note(cfg.validate_every, cfg.patience, per_epoch, epochs * per_epoch)
            + f", then a cooldown; at least {lower:,} steps, at most {epochs:,} epochs of {per_epoch:,} steps"))
    budget = updates["min_steps"] if cfg.epochs == AUTO else cfg.epochs * per_epoch
    if cfg.validate_every == AUTO:
        every = max(1, round(budget / TARGET_VALIDATIONS / per_epoch)) * per_epoch
        updates["validate_every"] = every
        if every > per_epoch:
            choices["validate_every"] = choice(every, f"every {every // per_epoch:,} epochs of {per_epoch:,} steps: "
                                               f"about {TARGET_VALIDATIONS} validations in {budget:,} steps")
    return updates, choices


def cadence_note(every: Any, patience: int, per_epoch: int, ceiling: int) -> str:
    """What a validate_every the user wrote means for epochs auto's patience: within an epoch, patience spans less
    than an epoch; so sparse that the ceiling comes first, the plateau is never seen."""
    if every == AUTO:
        return ""
    before = (ceiling - 1) // every  # the validation at the ceiling itself ends the run
    if before <= patience:
        return (f" (validate_every {every:,}: {before:,} validations before the ceiling's {ceiling:,} steps, too few "
                f"for a best and {patience} more without progress: this run trains to the ceiling; lower "
                "validate_every)")
    if every < per_epoch:
        return (f" (validate_every {every:,}: {patience} validations are {patience * every / per_epoch:.2g} "
                "epochs; raise patience to wait longer)")
    return ""


def resolve_training(name: str, cfg: Any, meta: dict, train_count: int) -> tuple[Any, dict[str, Choice]]:
    """`cfg` with every auto of the task resolved for this data (resolve_model), the batch size no larger than the
    training split, `min_steps` auto made a number, epochs auto the plateau schedule within its bounds, and the
    validation cadence; and what changed, with why."""
    cfg, choices = resolve_model(name, cfg, meta)
    if cfg.min_steps == AUTO:
        mix = getattr(cfg, "cutmix", False) is True
        steps = MIN_STEPS * (CUTMIX_STEPS if mix else 1)
        if cfg.epochs == AUTO:  # a number of epochs is trained exactly: min_steps is epochs auto's lower bound
            choices["min_steps"] = choice(steps, f"with CutMix, {CUTMIX_STEPS}x {MIN_STEPS}: mixed images train "
                                          "longer" if mix else "no images mixed")
        cfg = cfg.model_copy(update={"min_steps": steps})
    if cfg.batch_size > train_count:
        choices["batch_size"] = choice(train_count, f"{name}.batch_size {cfg.batch_size} is more than the "
                                       f"{train_count:,} training samples: one batch of all of them")
        cfg = cfg.model_copy(update={"batch_size": train_count})
    updates, more = epochs_and_cadence(name, cfg, updates_per_epoch(cfg, train_count))
    choices.update(more)
    return (cfg.model_copy(update=updates) if updates else cfg), choices


# ---- the machine ---------------------------------------------------------------------------------------------------

def device(setting: str, cuda: bool, mps: bool) -> str:
    """base.device auto: cuda where there is one, else mps, else cpu."""
    if setting != AUTO:
        return setting
    return "cuda" if cuda else "mps" if mps else "cpu"


def precision(setting: str, device_type: str, cuda_bf16: bool, cpu_bf16: bool) -> str:
    """base.precision before the model is known: bf16 where the hardware computes it natively (fp16 on a CUDA
    device without bf16), else fp32. On CUDA, auto is settled per model by its step's size (cuda_precision)."""
    if setting != AUTO:
        return setting
    if device_type == "cuda":
        return "bf16" if cuda_bf16 else "fp16"
    return "bf16" if device_type == "cpu" and cpu_bf16 else "fp32"


# On a GPU a small model's step is bound by kernel launches, not arithmetic, and autocast adds cast kernels: bf16
# was slower than fp32 (TF32) for the classifier at batch 128 (28 GFLOP per training step), the segmenter at 32
# (28 GFLOP) and the text model at 128 (11 GFLOP), and faster at 228 GFLOP (classifier, batch 1024) and 222 GFLOP
# (segmenter, batch 256); one H200, 2026-11-30, eager and graphed steps. Below this many GFLOP per training step
# `precision: auto` keeps fp32 on CUDA. A fixed rule, not a timing, so that the same params compute the same numbers.
CUDA_BF16_MIN_TRAIN_GFLOP = 100.0


def settles_on_cuda(setting: str, device_type: str) -> bool:
    """Whether base.precision is auto on CUDA, settled per model by cuda_precision."""
    return setting == AUTO and device_type == "cuda"


def cuda_precision(train_gflop_per_step: float, cuda_bf16: bool) -> str:
    """precision auto on CUDA for a training step of this many GFLOP (see CUDA_BF16_MIN_TRAIN_GFLOP)."""
    if train_gflop_per_step < CUDA_BF16_MIN_TRAIN_GFLOP:
        return "fp32"
    return "bf16" if cuda_bf16 else "fp16"


def cuda_graphs(setting: Any, device_type: str) -> tuple[bool | None, str | None]:
    """base.cuda_graphs on this device: (False, None) off, silently (off by request, or auto off CUDA); (False, why)
    asked for where it cannot be; (None, None) wanted on CUDA, if the step allows it."""
    if setting is False or setting == "false":
        return False, None
    if device_type != "cuda":
        return False, None if setting == AUTO else f"{device_type} is not a CUDA device"
    return None, None


def backend(setting: str, device_type: str) -> str:
    """base.distributed.backend auto: nccl on CUDA, gloo elsewhere."""
    return setting if setting != AUTO else ("nccl" if device_type == "cuda" else "gloo")


def validation_steps(setting: Any, per_epoch: int) -> int:
    """validate_every in optimizer steps: auto (unresolved: a loop run without resolve_training) every epoch; a number
    as written, within an epoch too."""
    return per_epoch if setting == AUTO else int(setting)
