"""The three tasks as engine Tasks: batch transforms with on-device augmentation, losses and torchmetrics."""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from trainlab.engine import Task

# Per-channel mean/std used to normalise uint8 images: a fixed 0.5/0.5 keeps it dataset-agnostic.
IMAGE_MEAN, IMAGE_STD = 0.5, 0.5


def metric_collection(num_classes: int, *names: str, class_names: list[str] | None = None):
    """A torchmetrics MetricCollection of the named metrics (imported here: at the first evaluation, not start-up).
    "iou" and "dice" are per class: one scalar each, named ``iou_<class>`` / ``dice_<class>``."""
    from torchmetrics import MetricCollection
    from torchmetrics.classification import (
        MulticlassAccuracy,
        MulticlassF1Score,
        MulticlassJaccardIndex,
    )
    from torchmetrics.wrappers import ClasswiseWrapper

    keys = class_metric_keys(class_names, num_classes)
    made = {
        "accuracy": lambda: MulticlassAccuracy(num_classes, average="micro"),
        "pixel_accuracy": lambda: MulticlassAccuracy(num_classes, average="micro"),
        "macro_f1": lambda: MulticlassF1Score(num_classes, average="macro"),
        "mean_iou": lambda: MulticlassJaccardIndex(num_classes, average="macro"),
        "mean_dice": lambda: MulticlassF1Score(num_classes, average="macro"),
        "iou": lambda: ClasswiseWrapper(MulticlassJaccardIndex(num_classes, average="none"), keys, prefix="iou_"),
        "dice": lambda: ClasswiseWrapper(MulticlassF1Score(num_classes, average="none"), keys, prefix="dice_"),
    }
    return MetricCollection({name: made[name]() for name in names}, compute_groups=False)


def class_metric_keys(class_names: list[str] | None, num_classes: int) -> list[str]:
    """Metric-name-safe, unique class names (letters, digits, _ and -); class indices where names are missing."""
    names = [str(n) for n in class_names] if class_names and len(class_names) == num_classes else \
        [str(i) for i in range(num_classes)]
    keys: list[str] = []
    for i, name in enumerate(names):
        key = re.sub(r"[^\w\-]+", "_", name).strip("_") or str(i)
        keys.append(key if key not in keys else f"{key}_{i}")
    return keys


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


def random_crop(tensors: list[torch.Tensor], size: int, gen: torch.Generator | None) -> list[torch.Tensor]:
    """The same random size x size window of each sample of every tensor ((N,C,H,W) or (N,H,W)); batched, one
    offset per sample. Images smaller than `size` in a dimension are zero-padded to it first."""
    h, w = tensors[0].shape[-2], tensors[0].shape[-1]
    if h < size or w < size:
        tensors = [F.pad(t, (0, max(0, size - w), 0, max(0, size - h))) for t in tensors]
        h, w = max(h, size), max(w, size)
    n, device = tensors[0].shape[0], tensors[0].device
    # uniform offsets in [0, h - size] without a host sync: floor(rand * (h - size + 1))
    top = (torch.rand(n, generator=gen, device=device) * (h - size + 1)).long().clamp_(max=h - size)
    left = (torch.rand(n, generator=gen, device=device) * (w - size + 1)).long().clamp_(max=w - size)
    steps = torch.arange(size, device=device)
    rows = (top[:, None] + steps)[:, :, None]  # (N,size,1)
    cols = (left[:, None] + steps)[:, None, :]  # (N,1,size)
    batch = torch.arange(n, device=device)[:, None, None]
    out = []
    for t in tensors:
        if t.ndim == 3:
            out.append(t[batch, rows, cols])
        else:
            out.append(t.permute(0, 2, 3, 1)[batch, rows, cols].permute(0, 3, 1, 2))
    return out


def random_symmetry(tensors: list[torch.Tensor], symmetries: str, gen: torch.Generator) -> list[torch.Tensor]:
    """Per sample, a random label-preserving transform: "flips" = horizontal and vertical flips (4 outcomes);
    "dihedral" = those and a transpose, i.e. the 8 flips and 90-degree rotations of a square (square images
    only: a transpose would change the shape of a non-square batch, so those get flips only)."""
    if symmetries == "none":
        return tensors
    n, device = tensors[0].shape[0], tensors[0].device
    draws = torch.rand(3, n, generator=gen, device=device) < 0.5

    def where(flag, a, b):
        return torch.where(flag.view(-1, *[1] * (a.ndim - 1)), a, b)

    out = [where(draws[1], where(draws[0], t.flip(-1), t).flip(-2), where(draws[0], t.flip(-1), t)) for t in tensors]
    if symmetries == "dihedral" and out[0].shape[-1] == out[0].shape[-2]:
        out = [where(draws[2], t.transpose(-2, -1), t) for t in out]
    return out


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
                      label_smoothing: float = 0.0, crop_size: int | None = None, symmetries: str = "none",
                      class_names: list[str] | None = None) -> Task:
    """Training batches: random `crop_size` crops (when set, even without augment), then with augment a shift of up to 4 pixels and the data's `symmetries`.
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
        return metric_collection(num_classes, "mean_iou", "pixel_accuracy", "mean_dice", "iou", "dice",
                                 class_names=class_names)

    return Task("segmenter", model, loss_fn, metrics, prepare, primary_metric="mean_iou", conv=True)


def text_task(model: nn.Module, num_classes: int, label_smoothing: float = 0.0) -> Task:
    def prepare(batch, train, gen):
        return batch["tokens"], batch["labels"]

    def loss_fn(logits, labels):
        return F.cross_entropy(logits.float(), labels, label_smoothing=label_smoothing)

    def metrics():
        return metric_collection(num_classes, "accuracy", "macro_f1")

    return Task("text", model, loss_fn, metrics, prepare, primary_metric="accuracy", conv=False)
