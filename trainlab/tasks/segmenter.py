"""The segmentation task: random crops, shifts and the data's symmetries, cross-entropy plus soft Dice, mean IoU;
its evaluation adds per-class IoU and Dice and overlays of predicted masks."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from trainlab.core.auto import resolve_model
from trainlab.core.config import SegmenterParams
from trainlab.core.errors import DataError
from trainlab.engine.contract import Trainable
from trainlab.models.segmenter import build_segmenter
from trainlab.tasks.augment import random_crop, random_shift, random_symmetry, to_float_images
from trainlab.tasks.base import TaskCode
from trainlab.tasks.metrics import METRICS, primary, validation_metrics

if TYPE_CHECKING:
    from pathlib import Path

    from trainlab.core.config import Params
    from trainlab.core.runtime import Runtime
    from trainlab.tasks.scoring import TaskInputs, TaskReport


def soft_dice_loss(logits: torch.Tensor, masks: torch.Tensor, eps: float = 1.0) -> torch.Tensor:
    """1 - mean over classes of the soft Dice coefficient (sums only: deterministic on CUDA)."""
    probs = logits.float().softmax(dim=1)
    # one_hot's layout (N, H, W, C) from a comparison of bools: the same values and strides as F.one_hot's int64
    # (so the same sums to the bit), without its zero fill, scatter and 8-byte copy (a quarter of this loss)
    classes = torch.arange(probs.shape[1], device=masks.device)
    onehot = (masks.unsqueeze(-1) == classes).permute(0, 3, 1, 2).to(probs.dtype)
    inter = (probs * onehot).sum(dim=(0, 2, 3))
    total = probs.sum(dim=(0, 2, 3)) + onehot.sum(dim=(0, 2, 3))
    return 1 - ((2 * inter + eps) / (total + eps)).mean()


def segmentation_trainable(model: nn.Module, num_classes: int, dice_weight: float = 0.5, augment: bool = True,
                      label_smoothing: float = 0.0, crop_size: int | None = None, symmetries: str = "none",
                      class_names: list[str] | None = None) -> Trainable:
    """Training batches: random `crop_size` crops (when set, even without augment), then with augment a shift of up
    to 4 pixels and the data's `symmetries`.
    Val/test batches: whole images. Metrics: mean IoU, pixel accuracy, mean Dice and per-class IoU and Dice."""
    def prepare(batch, train, gen):
        images, masks = batch["images"], batch["masks"]
        if train:
            if crop_size:  # without a generator (augment off) the crops come from torch's seeded default one
                images, masks = random_crop([images, masks], crop_size, gen)
            if augment and gen is not None:
                images, masks = random_shift([images, masks], 4, gen)
                images, masks = random_symmetry([images, masks], symmetries, gen)
        return to_float_images(images), masks.long()

    def loss_fn(logits, masks):
        # reduction="none" then mean: mean-reduced NxCxHxW cross_entropy has no deterministic CUDA kernel.
        ce = F.cross_entropy(logits.float(), masks, reduction="none", label_smoothing=label_smoothing).mean()
        return ce + dice_weight * soft_dice_loss(logits, masks) if dice_weight else ce

    def metrics():
        return validation_metrics(METRICS["segmenter"], num_classes, class_names)

    return Trainable("segmenter", model, loss_fn, metrics, prepare, primary(METRICS["segmenter"]).name, conv=True)




def class_prior(masks, num_classes: int, max_masks: int = 4096) -> torch.Tensor:
    """Pixel frequency of each class in up to `max_masks` evenly spaced masks (a tensor, or a split read from disk),
    add-one smoothed so that a class never seen still has a finite log."""
    rows = torch.linspace(0, len(masks) - 1, min(len(masks), max_masks)).long()
    counts = torch.bincount(masks[rows].flatten().long(), minlength=num_classes)[:num_classes].double()
    return (counts + 1) / (counts.sum() + num_classes)


class SegmenterCode(TaskCode):
    spec_name = "segmenter"
    params_type = SegmenterParams
    builder = staticmethod(build_segmenter)
    pictures = {"segmentation": "segmentation_overlays.png"}
    confusion = False
    dense = True

    def config_fields(self, fields: dict) -> dict:
        # a config.json saved before these keys existed describes the U-Net of then, whatever today's default
        return {"full_res_convs": 2, "skip_merge": "concat", **fields}

    def make_trainable(self, model: nn.Module, meta: dict, cfg: SegmenterParams | None = None) -> Trainable:
        if cfg is None:
            return segmentation_trainable(model, meta["num_classes"])
        cfg, _ = resolve_model("segmenter", cfg, meta)
        return segmentation_trainable(model, meta["num_classes"], cfg.dice_weight, cfg.augment, cfg.label_smoothing,
                                 cfg.crop_size, meta.get("symmetries", "none"), meta.get("class_names"))

    def fit_statistics(self, model: nn.Module, train: dict[str, torch.Tensor], data_dir: Path | None) -> None:
        """The head's biases start at the log class frequencies of the training masks (RetinaNet's prior init): the
        first predictions are the class prior, not uniform over classes, and the first epochs learn shapes sooner."""
        model.head.bias.data.copy_(class_prior(train["masks"], model.head.out_channels).log())

    def check_inputs(self, x: torch.Tensor, y: torch.Tensor, meta: dict, path: Path, meta_file: Path) -> None:
        super().check_inputs(x, y, meta, path, meta_file)
        if tuple(y.shape[1:]) != tuple(x.shape[2:]):
            raise DataError(f"{path}: masks {tuple(y.shape)} do not match images {tuple(x.shape)}")

    def evaluate(self, inputs: TaskInputs, runtime: Runtime, params: Params) -> TaskReport:
        from trainlab.tasks.scoring import FEW_EXAMPLES, TaskReport, class_names, run_test_split, summarize

        cfg, n = params.evaluate, inputs.config["num_classes"]
        keep = min(FEW_EXAMPLES, cfg.n_examples)
        result = run_test_split(inputs, runtime, cfg.batch_size, cfg.tta, params.base.data_on_device_max_mb, keep)
        names = class_names(inputs.meta, n)
        metrics = summarize(result.metrics, self.spec.metrics, names, len(inputs.test["masks"]))
        pictures = {"segmentation": {"images": inputs.test["images"][:keep],
                                     "masks": inputs.test["masks"][:keep].long(),
                                     "predicted": result.predicted.cpu(), "class_names": names}}
        return TaskReport(metrics, pictures=pictures)


CODE = SegmenterCode()
