"""Batch transforms on the device: uint8 images to normalised floats, and seeded, batched augmentations."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# Per-channel mean/std used to normalise uint8 images: a fixed 0.5/0.5 keeps it dataset-agnostic (saved with the
# model's preprocessing record, so predict and the MLflow model check it).
from trainlab.data.preprocessing import IMAGE_MEAN, IMAGE_STD


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


def random_resized_crop(images: torch.Tensor, gen: torch.Generator, hflip: bool,
                        scale: tuple[float, float] = (0.25, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> torch.Tensor:
    """torchvision's RandomResizedCrop (and RandomHorizontalFlip) for a batch of float images (N,C,H,W), batched in
    one grid_sample: per sample a window of `scale` of the area and `ratio` of aspect at a random place, resized back
    to H x W (bilinear), mirrored half the time when `hflip`."""
    n, device = images.shape[0], images.device
    draws = torch.rand(5, n, generator=gen, device=device)
    area = scale[0] + (scale[1] - scale[0]) * draws[0]
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])  # Python floats: no host-to-device copy
    aspect = torch.exp(log_lo + (log_hi - log_lo) * draws[1])
    width = torch.sqrt(area * aspect).clamp(max=1.0)  # fractions of the image's width and height
    height = torch.sqrt(area / aspect).clamp(max=1.0)
    cx = (1 - width) * (2 * draws[2] - 1)  # window centre in [-1, 1] coordinates, the window inside the image
    cy = (1 - height) * (2 * draws[3] - 1)
    mirror = torch.where(draws[4] < 0.5, -1.0, 1.0) if hflip else torch.ones_like(width)
    theta = torch.zeros(n, 2, 3, device=device, dtype=images.dtype)
    theta[:, 0, 0], theta[:, 0, 2] = width * mirror, cx
    theta[:, 1, 1], theta[:, 1, 2] = height, cy
    grid = F.affine_grid(theta, list(images.shape), align_corners=False)
    return F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)


def random_cutmix(images: torch.Tensor, labels: torch.Tensor, num_classes: int,
                  gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """CutMix (Yun et al. 2019, torchvision's v2.CutMix with alpha 1) per sample, batched: a box of a uniform
    random share of the area, at a random centre and clipped to the image, pasted from the next sample of the batch;
    the targets mixed by the share of pixels each image keeps. Returns the images and (N, num_classes) soft targets."""
    n, _, h, w = images.shape
    device = images.device
    draws = torch.rand(3, n, generator=gen, device=device)
    side = torch.sqrt(1 - draws[0])  # the box's sides as fractions: its area is 1 - lambda, lambda ~ Beta(1, 1)
    cy, cx = draws[1] * h, draws[2] * w
    rows = torch.arange(h, device=device) + 0.5
    cols = torch.arange(w, device=device) + 0.5
    in_rows = (rows >= cy[:, None] - side[:, None] * h / 2) & (rows < cy[:, None] + side[:, None] * h / 2)
    in_cols = (cols >= cx[:, None] - side[:, None] * w / 2) & (cols < cx[:, None] + side[:, None] * w / 2)
    box = in_rows[:, :, None] & in_cols[:, None, :]  # (N,H,W)
    mixed = torch.where(box[:, None], images.roll(1, 0), images)
    pasted = box.flatten(1).float().mean(1, keepdim=True)
    onehot = torch.zeros(n, num_classes, device=device).scatter_(1, labels[:, None], 1.0)  # no host sync on CUDA
    return mixed, onehot * (1 - pasted) + onehot.roll(1, 0) * pasted
