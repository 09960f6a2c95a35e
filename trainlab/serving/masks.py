"""Segmentation outputs as files: class-index mask PNGs, colour overlays, class pixel fractions; PNG bytes of
arrays."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

# Class 0 (background) is left uncoloured; the others cycle through these (tab10's colours).
PALETTE = np.array([(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
                    (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207)], dtype=np.uint8)
ALPHA = 0.5


def png_bytes(pixels: np.ndarray) -> bytes:
    """An (H, W) or (H, W, 1|3) uint8 array as PNG bytes (gray or RGB), losslessly."""
    if pixels.ndim == 3 and pixels.shape[2] == 1:
        pixels = pixels[:, :, 0]
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(pixels)).save(buffer, format="PNG")
    return buffer.getvalue()


def overlay(image: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The (H, W, C) image in RGB with each non-background class of the (H, W) mask blended in its colour."""
    rgb = np.repeat(image, 3, axis=2) if image.shape[2] == 1 else image
    colours = PALETTE[(mask.astype(np.int64) - 1) % len(PALETTE)]
    blended = (1 - ALPHA) * rgb.astype(np.float32) + ALPHA * colours.astype(np.float32)
    return np.where((mask > 0)[:, :, None], np.rint(blended), rgb).astype(np.uint8)


def pixel_fractions(mask: np.ndarray, num_classes: int) -> np.ndarray:
    """The fraction of the mask's pixels in each class, (num_classes,) float64."""
    counts = np.bincount(mask.ravel(), minlength=num_classes)[:num_classes]
    return counts / max(mask.size, 1)
