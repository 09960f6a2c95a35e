"""Synthetic thin-structure segmentation data: Voronoi cell boundaries under blur and noise, like membrane micrographs.

Rules (deterministic from the seed):
- each image is ``size`` x ``size``, with 12..40 random cell centres (``cells`` range); every pixel belongs to its
  nearest centre (a Voronoi tessellation);
- the mask's class 1 ("boundary") marks pixels whose right or lower neighbour belongs to another cell, thickened by
  one pixel (about 2-3 pixels wide), class 0 is the rest ("cell");
- the image: each cell a random grey level with a smooth texture, boundaries darker by a random contrast, then a
  Gaussian blur (sigma 1-1.5) and Gaussian noise, as uint8 grey.
The pairs can be written as a paired-folders dataset (images/, masks/, classes.txt) for data.segmentation.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CLASS_NAMES = ["cell", "boundary"]


def voronoi_labels(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """(size, size) int map: the index of the nearest of `cells` random centres."""
    centres = rng.uniform(0, size, (cells, 2))
    yy, xx = np.mgrid[0:size, 0:size]
    d = (yy[..., None] - centres[:, 0]) ** 2 + (xx[..., None] - centres[:, 1]) ** 2
    return d.argmin(axis=-1)


def boundaries(labels: np.ndarray) -> np.ndarray:
    """Boolean map of cell borders, thickened by one pixel."""
    from scipy.ndimage import binary_dilation

    edge = np.zeros(labels.shape, bool)
    edge[:, :-1] |= labels[:, :-1] != labels[:, 1:]
    edge[:-1, :] |= labels[:-1, :] != labels[1:, :]
    return binary_dilation(edge, iterations=1)


def thin_structure_pair(rng: np.random.Generator, size: int, cells: tuple[int, int] = (12, 40)
                        ) -> tuple[np.ndarray, np.ndarray]:
    """One (image uint8 (size, size), mask uint8 (size, size)) pair."""
    from scipy.ndimage import gaussian_filter

    labels = voronoi_labels(rng, size, int(rng.integers(cells[0], cells[1] + 1)))
    edge = boundaries(labels)
    grey = rng.uniform(0.45, 0.8, labels.max() + 1)[labels]
    texture = gaussian_filter(rng.normal(0, 1, (size, size)), 4) * 0.15
    image = grey + texture - edge * rng.uniform(0.15, 0.35)
    image = gaussian_filter(image, rng.uniform(1.0, 1.5)) + rng.normal(0, rng.uniform(0.05, 0.1), (size, size))
    return (np.clip(image, 0, 1) * 255).round().astype(np.uint8), edge.astype(np.uint8)


def thin_structure_set(count: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`count` pairs: images (count, 1, size, size) uint8 and masks (count, size, size) uint8."""
    rng = np.random.default_rng([seed, 0x7A1])
    pairs = [thin_structure_pair(rng, size) for _ in range(count)]
    return np.stack([p[0] for p in pairs])[:, None], np.stack([p[1] for p in pairs])


def write_paired_folders(root: str | Path, count: int, size: int, seed: int) -> Path:
    """Write the set as PNGs under ``root/images`` and ``root/masks`` (same stems) with ``classes.txt``."""
    from PIL import Image

    root = Path(root)
    images, masks = thin_structure_set(count, size, seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    for i, (image, mask) in enumerate(zip(images, masks)):
        Image.fromarray(image[0]).save(root / "images" / f"cells_{i:03d}.png")
        Image.fromarray(mask).save(root / "masks" / f"cells_{i:03d}.png")
    (root / "classes.txt").write_text("\n".join(CLASS_NAMES) + "\n")
    return root
