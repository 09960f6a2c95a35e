"""The three tasks as engine Tasks: batch transforms with on-device augmentation, losses and torchmetrics."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from trainlab.engine import Task

# Per-channel mean/std used to normalise uint8 images: a fixed 0.5/0.5 keeps it dataset-agnostic.
IMAGE_MEAN, IMAGE_STD = 0.5, 0.5


def metric_collection(num_classes: int, *names: str):
    """A torchmetrics MetricCollection of the named metrics (imported here: at the first evaluation, not start-up)."""
    from torchmetrics import MetricCollection
    from torchmetrics.classification import (
        MulticlassAccuracy,
        MulticlassF1Score,
        MulticlassJaccardIndex,
    )

    made = {
        "accuracy": lambda: MulticlassAccuracy(num_classes, average="micro"),
        "pixel_accuracy": lambda: MulticlassAccuracy(num_classes, average="micro"),
        "macro_f1": lambda: MulticlassF1Score(num_classes, average="macro"),
        "mean_iou": lambda: MulticlassJaccardIndex(num_classes, average="macro"),
    }
    return MetricCollection({name: made[name]() for name in names})


def to_float_images(images: torch.Tensor) -> torch.Tensor:
    """uint8 (N,C,H,W) on the device -> normalised float32."""
    return images.float().div_(255).sub_(IMAGE_MEAN).div_(IMAGE_STD)


def random_shift(tensors: list[torch.Tensor], max_shift: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Translate each sample by its own integer offset (same offset for all `tensors`), zero-padded; batched."""
    n, h, w = tensors[0].shape[0], tensors[0].shape[-2], tensors[0].shape[-1]
    device = tensors[0].device
    dy = torch.randint(0, 2 * max_shift + 1, (n,), generator=gen, device=device)
    dx = torch.randint(0, 2 * max_shift + 1, (n,), generator=gen, device=device)
    rows = (torch.arange(h, device=device)[None, :] + dy[:, None])[:, :, None]  # (N,H,1)
    cols = (torch.arange(w, device=device)[None, :] + dx[:, None])[:, None, :]  # (N,1,W)
    batch = torch.arange(n, device=device)[:, None, None]
    out = []
    for t in tensors:
        squeeze = t.ndim == 3
        t4 = t.unsqueeze(1) if squeeze else t
        padded = F.pad(t4, (max_shift,) * 4)
        shifted = padded.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2)  # (N,C,H,W)
        out.append(shifted.squeeze(1) if squeeze else shifted)
    return out


def random_hflip(tensors: list[torch.Tensor], gen: torch.Generator) -> list[torch.Tensor]:
    flip = torch.rand(tensors[0].shape[0], generator=gen, device=tensors[0].device) < 0.5
    return [torch.where(flip.view(-1, *[1] * (t.ndim - 1)), t.flip(-1), t) for t in tensors]


def classification_task(model: nn.Module, num_classes: int, label_smoothing: float = 0.0, augment: bool = True,
                        hflip: bool = False, head: nn.Module | None = None, head_lr: float | None = None) -> Task:
    def prepare(batch, train, gen):
        images = batch["images"]
        if train and augment and gen is not None:
            (images,) = random_shift([images], 2, gen)
            if hflip:
                (images,) = random_hflip([images], gen)
        return to_float_images(images), batch["labels"]

    def loss_fn(logits, labels):
        return F.cross_entropy(logits.float(), labels, label_smoothing=label_smoothing)

    def metrics():
        return metric_collection(num_classes, "accuracy", "macro_f1")

    return Task("classifier", model, loss_fn, metrics, prepare, primary_metric="accuracy", conv=True,
                head=head, head_lr=head_lr)


def soft_dice_loss(logits: torch.Tensor, masks: torch.Tensor, eps: float = 1.0) -> torch.Tensor:
    """1 - mean over classes of the soft Dice coefficient (sums only: deterministic on CUDA)."""
    probs = logits.float().softmax(dim=1)
    onehot = F.one_hot(masks, probs.shape[1]).permute(0, 3, 1, 2).to(probs.dtype)
    inter = (probs * onehot).sum(dim=(0, 2, 3))
    total = probs.sum(dim=(0, 2, 3)) + onehot.sum(dim=(0, 2, 3))
    return 1 - ((2 * inter + eps) / (total + eps)).mean()


def segmentation_task(model: nn.Module, num_classes: int, dice_weight: float = 0.5, augment: bool = True,
                      label_smoothing: float = 0.0) -> Task:
    def prepare(batch, train, gen):
        images, masks = batch["images"], batch["masks"]
        if train and augment and gen is not None:
            images, masks = random_shift([images, masks], 4, gen)
        return to_float_images(images), masks.long()

    def loss_fn(logits, masks):
        # reduction="none" then mean: mean-reduced NxCxHxW cross_entropy has no deterministic CUDA kernel.
        ce = F.cross_entropy(logits.float(), masks, reduction="none", label_smoothing=label_smoothing).mean()
        return ce + dice_weight * soft_dice_loss(logits, masks) if dice_weight else ce

    def metrics():
        return metric_collection(num_classes, "mean_iou", "pixel_accuracy")

    return Task("segmenter", model, loss_fn, metrics, prepare, primary_metric="mean_iou", conv=True)


def text_task(model: nn.Module, num_classes: int, label_smoothing: float = 0.0) -> Task:
    def prepare(batch, train, gen):
        return batch["tokens"], batch["labels"]

    def loss_fn(logits, labels):
        return F.cross_entropy(logits.float(), labels, label_smoothing=label_smoothing)

    def metrics():
        return metric_collection(num_classes, "accuracy", "macro_f1")

    return Task("text", model, loss_fn, metrics, prepare, primary_metric="accuracy", conv=False)
