"""User image folders: one folder per class (classification) and paired image/mask folders (segmentation)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainlab.data.images import list_image_files, read_images, read_mask, require_folder, size_text
from trainlab.core.errors import DataError

IMAGES_DIR = "images"
MASKS_DIR = "masks"
CLASS_NAMES_FILE = "classes.txt"


@dataclass
class LabeledImages:
    """uint8 images (N, C, H, W) with int64 labels indexing `class_names`."""

    images: np.ndarray
    labels: np.ndarray
    class_names: list[str]


@dataclass
class MaskedImages:
    """uint8 images (N, C, H, W) with uint8 class-index masks (N, H, W); class 0 is background."""

    images: np.ndarray
    masks: np.ndarray
    class_names: list[str]
    files: list[str]


def class_folders(root: Path) -> list[Path]:
    """The class folders under `root` (sorted; hidden ones ignored)."""
    require_folder(root, "image-folder dataset (data.classification.root)")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not folders:
        raise DataError(f"{root}: no class folders; expected {root}/<class name>/<image files>")
    return folders


def load_image_folder(root: str | Path) -> LabeledImages:
    """``<root>/<class>/<image>``: the class names are the folder names, sorted; an empty class is an error."""
    root = Path(root)
    paths, labels = [], []
    folders = class_folders(root)
    for label, folder in enumerate(folders):
        files = list_image_files(folder)
        if not files:
            raise DataError(f"{folder}: class {folder.name!r} has no samples (no PNG/JPEG/TIFF/BMP files)")
        paths += files
        labels += [label] * len(files)
    return LabeledImages(read_images(paths), np.array(labels, dtype=np.int64), [f.name for f in folders])


def files_by_stem(folder: Path) -> dict[str, Path]:
    """Image files of a folder keyed by file stem; two files with one stem are an error."""
    by_stem: dict[str, Path] = {}
    for path in list_image_files(folder):
        if path.stem in by_stem:
            raise DataError(f"{path}: same file stem as {by_stem[path.stem]}; images and masks are matched by stem")
        by_stem[path.stem] = path
    return by_stem


def matched_pairs(root: Path) -> list[tuple[Path, Path]]:
    """(image, mask) pairs matched by file stem; an image without a mask (or the reverse) is an error."""
    require_folder(root, "paired-folders dataset (data.segmentation.root)")
    images = files_by_stem(require_folder(root / IMAGES_DIR, "images"))
    masks = files_by_stem(require_folder(root / MASKS_DIR, "masks"))
    for stem, path in images.items():
        if stem not in masks:
            raise DataError(f"{path}: no mask with stem {stem!r} in {root / MASKS_DIR}")
    for stem, path in masks.items():
        if stem not in images:
            raise DataError(f"{path}: no image with stem {stem!r} in {root / IMAGES_DIR}")
    if not images:
        raise DataError(f"{root / IMAGES_DIR}: no image files (PNG, JPEG, TIFF or BMP)")
    return [(images[stem], masks[stem]) for stem in sorted(images)]


def segmentation_class_names(root: Path, num_classes: int) -> list[str]:
    """Names from ``<root>/classes.txt`` (one per line) if present, else background/foreground or class_<i>."""
    names_file = root / CLASS_NAMES_FILE
    if names_file.is_file():
        names = [line.strip() for line in names_file.read_text().splitlines() if line.strip()]
        if len(names) != num_classes:
            raise DataError(f"{names_file}: {len(names)} class names, "
                            f"but data.segmentation.num_classes is {num_classes}")
        return names
    if num_classes == 2:
        return ["background", "foreground"]
    return ["background", *(f"class_{i}" for i in range(1, num_classes))]


def load_paired_folders(root: str | Path, num_classes: int) -> MaskedImages:
    """``<root>/images/<stem>.*`` with ``<root>/masks/<stem>.*``: sizes must match and mask values be classes."""
    root = Path(root)
    pairs = matched_pairs(root)
    images = read_images([image for image, _ in pairs])
    masks = []
    for (image_path, mask_path), image in zip(pairs, images):
        mask = read_mask(mask_path, num_classes)
        if mask.shape != image.shape[1:]:
            raise DataError(f"{mask_path}: mask size {size_text(mask.shape)} does not match image {image_path} "
                            f"size {size_text(image.shape[1:])}")
        masks.append(mask)
    names = segmentation_class_names(root, num_classes)
    return MaskedImages(images, np.stack(masks), names, [image.name for image, _ in pairs])
