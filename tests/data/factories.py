"""Tiny test data made on the fly: image folders, paired PNG image/mask folders, CSV files, fake MNIST idx files."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

SEG_CLASSES = 3


def save_png(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)
    return path


def write_params(path: Path, data: dict | None = None, seed: int = 7, tracking: bool = False) -> Path:
    """A params file with the given `data` section (defaults fill the rest); MLflow tracking off unless asked."""
    path.write_text(yaml.safe_dump({"base": {"seed": seed}, "data": data or {}, "tracking": {"enabled": tracking}}))
    return path


def make_image_folder(root: Path, classes=("cat", "dog", "fox"), per_class: int = 5, size: int = 8) -> Path:
    rng = np.random.default_rng(0)
    for label, name in enumerate(classes):
        for i in range(per_class):
            save_png(root / name / f"{name}_{i}.png", rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
    return root


def make_paired_folders(root: Path, count: int = 8, size: int = 16, num_classes: int = SEG_CLASSES) -> Path:
    """Gray PNG images with masks holding every class 0..num_classes-1 (a square per class)."""
    rng = np.random.default_rng(1)
    for i in range(count):
        save_png(root / "images" / f"img_{i:02d}.png", rng.integers(0, 256, (size, size), dtype=np.uint8))
        mask = np.zeros((size, size), np.uint8)
        for c in range(1, num_classes):
            mask[c * 2:c * 2 + 3, i % 4:i % 4 + 3] = c
        save_png(root / "masks" / f"img_{i:02d}.png", mask)
    return root


def make_text_csv(path: Path, per_class: int = 6, delimiter: str = ",") -> Path:
    words = {"bad": "awful terrible sad", "good": "great lovely happy", "meh": "fine okay whatever"}
    lines = [f"review{delimiter}sentiment"]
    for label, vocab in words.items():
        for i in range(per_class):
            lines.append(f"\"{vocab} number {i} of {label} tag{label}{i}\"{delimiter}{label}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def user_data_section(root: Path) -> dict:
    """A `data` params section pointing every task at tiny user data under `root`."""
    return {
        "classification": {"source": "image_folder", "root": str(root / "classes")},
        "segmentation": {"source": "paired_folders", "root": str(root / "seg"), "num_classes": SEG_CLASSES},
        "text": {"source": "csv", "path": str(root / "texts.csv"), "text_column": "review",
                 "label_column": "sentiment", "min_frequency": 1, "vocab_size": 32, "max_length": 8},
    }


def write_idx(path: Path, array: np.ndarray) -> Path:
    """An uncompressed idx (MNIST) file of uint8 data."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">I", 0x0800 + array.ndim) + b"".join(struct.pack(">I", d) for d in array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())
    return path


def make_fake_mnist(root: Path, folder: str = "MNIST", train_per_class: int = 4, test_per_class: int = 1) -> Path:
    """torchvision's raw layout <root>/<folder>/raw/*-idx?-ubyte with random digits of every class."""
    rng = np.random.default_rng(2)
    raw = root / folder / "raw"
    for prefix, per_class in (("train", train_per_class), ("t10k", test_per_class)):
        labels = np.repeat(np.arange(10), per_class)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (len(labels), 28, 28)))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return root


def make_user_data(root: Path) -> Path:
    """`root` with a valid image folder (classes/), paired PNG folders (seg/) and a CSV (texts.csv)."""
    make_image_folder(root / "classes")
    make_paired_folders(root / "seg")
    make_text_csv(root / "texts.csv")
    return root


# --- real photos (scikit-learn's two sample photos), cut, scaled, rotated and re-encoded many ways --------------------

PHOTO_KINDS = ("jpeg", "jpeg_exif_rotated", "cmyk_jpeg", "palette_png", "rgba_png", "png16_gray", "tiff16",
               "webp", "gray_jpeg", "bmp")


def sample_photos() -> dict[str, np.ndarray]:
    """{"china": (427, 640, 3), "flower": (427, 640, 3)} uint8: the photos scikit-learn ships."""
    from sklearn.datasets import load_sample_image

    return {name: load_sample_image(f"{name}.jpg") for name in ("china", "flower")}


def write_photo(path: Path, pixels: np.ndarray, kind: str) -> Path:
    """`pixels` (H, W, 3) uint8 saved as `kind` (PHOTO_KINDS); the file decodes upright to about the same picture."""
    import tifffile

    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(pixels)
    if kind == "jpeg":
        image.save(path, "JPEG", quality=92)
    elif kind == "jpeg_exif_rotated":  # stored lying on its side; EXIF orientation 6 says: turn 90 degrees clockwise
        exif = Image.Exif()
        exif[0x0112] = 6
        image.transpose(Image.Transpose.ROTATE_90).save(path, "JPEG", quality=92, exif=exif)
    elif kind == "cmyk_jpeg":
        image.convert("CMYK").save(path, "JPEG", quality=92)
    elif kind == "palette_png":
        image.convert("P", palette=Image.Palette.ADAPTIVE, colors=256).save(path, "PNG")
    elif kind == "rgba_png":
        Image.fromarray(np.dstack([pixels, np.full(pixels.shape[:2], 128, np.uint8)])).save(path, "PNG")
    elif kind == "png16_gray":
        gray = np.asarray(image.convert("L")).astype(np.uint16) * 257
        Image.fromarray(gray).save(path, "PNG")
    elif kind == "tiff16":
        tifffile.imwrite(path, pixels.astype(np.uint16) * 257)
    elif kind == "webp":
        image.save(path, "WEBP", lossless=True)
    elif kind == "gray_jpeg":
        image.convert("L").save(path, "JPEG", quality=92)
    elif kind == "bmp":
        image.save(path, "BMP")
    else:
        raise ValueError(kind)
    return path


SUFFIX = {"jpeg": ".jpg", "jpeg_exif_rotated": ".jpg", "cmyk_jpeg": ".jpeg", "palette_png": ".png", "rgba_png": ".png",
          "png16_gray": ".png", "tiff16": ".tif", "webp": ".webp", "gray_jpeg": ".JPG", "bmp": ".bmp"}


def random_crop_of(photo: np.ndarray, rng: np.random.Generator, min_side: int = 48) -> np.ndarray:
    """A random window of a photo (varying size and aspect), scaled by a random factor."""
    h, w = photo.shape[:2]
    ch, cw = rng.integers(min_side * 2, h + 1), rng.integers(min_side * 2, w + 1)
    top, left = rng.integers(0, h - ch + 1), rng.integers(0, w - cw + 1)
    crop = Image.fromarray(photo[top:top + ch, left:left + cw])
    factor = rng.uniform(0.4, 1.0)
    return np.asarray(crop.resize((max(min_side, round(cw * factor)), max(min_side, round(ch * factor)))))


def make_photo_folder(root: Path, per_class: int = 20, seed: int = 0, kinds=PHOTO_KINDS) -> Path:
    """`root/<china|flower>/...`: crops of scikit-learn's two photos in every size, cycling through `kinds`."""
    rng = np.random.default_rng(seed)
    for name, photo in sample_photos().items():
        for i in range(per_class):
            kind = kinds[i % len(kinds)]
            write_photo(root / name / f"{name}_{i:03d}{SUFFIX[kind]}", random_crop_of(photo, rng), kind)
    return root
