"""Reading image and mask files (PNG, JPEG, TIFF, BMP) into uint8 arrays, with errors naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tifffile
from PIL import Image, UnidentifiedImageError

from trainlab.core.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp")
TIFF_SUFFIXES = (".tif", ".tiff")


def list_image_files(folder: Path) -> list[Path]:
    """Image files directly in `folder`, sorted by name; hidden files and other suffixes are ignored."""
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_SUFFIXES)


def require_folder(folder: Path, what: str) -> Path:
    if not folder.exists():
        raise DataError(f"{folder}: {what} folder not found")
    if not folder.is_dir():
        raise DataError(f"{folder}: expected a folder ({what}), found a file")
    return folder


def read_array(path: Path, palette_as_indices: bool = False) -> np.ndarray:
    """The file's pixels (H, W) or (H, W, C); unreadable or corrupt files are DataErrors naming the file.

    Palette images become RGB, or stay palette indices when `palette_as_indices` (masks); alpha is dropped.
    """
    try:
        if path.suffix.lower() in TIFF_SUFFIXES:
            return np.asarray(tifffile.imread(path))
        with Image.open(path) as image:
            image.load()
            return np.asarray(_normalize_mode(image, palette_as_indices))
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (UnidentifiedImageError, OSError, ValueError, tifffile.TiffFileError, SyntaxError) as exc:
        raise DataError(f"{path}: unreadable or corrupt image ({exc})") from None


def _normalize_mode(image: Image.Image, palette_as_indices: bool) -> Image.Image:
    if image.mode == "P" and palette_as_indices:
        return image
    if image.mode in ("1", "L", "RGB", "I", "F") or image.mode.startswith("I;16"):
        return image
    return image.convert("L" if image.mode == "LA" else "RGB")


def as_uint8_image(array: np.ndarray, path: Path, channels: int) -> np.ndarray:
    """A (C, H, W) uint8 image from a decoded array, gray repeated to 3 channels when `channels` is 3."""
    if array.dtype == np.bool_:
        array = array.astype(np.uint8) * 255
    if array.dtype != np.uint8:
        raise DataError(f"{path}: {array.dtype} pixels; images must be 8-bit (convert it to 8-bit PNG/JPEG/TIFF)")
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4):
        raise DataError(f"{path}: unsupported image shape {array.shape}; expected H x W (gray) or H x W x 3 (RGB)")
    array = array[:, :, :3]
    if channels == 3 and array.shape[2] == 1:
        array = np.repeat(array, 3, axis=2)
    return np.ascontiguousarray(array.transpose(2, 0, 1))


def image_channels(array: np.ndarray) -> int:
    """1 for a gray image, 3 for colour (RGB or RGBA)."""
    return 1 if array.ndim == 2 or array.shape[2] == 1 else 3


def read_images(paths: list[Path]) -> np.ndarray:
    """All images as one uint8 (N, C, H, W) array: gray when every file is gray, else RGB; sizes must agree."""
    arrays = [read_array(path) for path in paths]
    channels = max((image_channels(a) for a in arrays), default=1)
    images = [as_uint8_image(a, path, channels) for a, path in zip(arrays, paths)]
    first_shape = images[0].shape[1:]
    for image, path in zip(images, paths):
        if image.shape[1:] != first_shape:
            raise DataError(f"{path}: image size {size_text(image.shape[1:])} differs from {size_text(first_shape)} "
                            f"of {paths[0]}; all images must have the same size")
    return np.stack(images)


def size_text(shape: tuple[int, ...]) -> str:
    """(H, W) as 'W x H' pixels, the way image viewers state sizes."""
    return f"{shape[1]}x{shape[0]} (WxH)"


def read_mask(path: Path, num_classes: int) -> np.ndarray:
    """A (H, W) uint8 mask of class indices; 0/255 masks become 0/1 when num_classes is 2; other values are errors."""
    array = read_array(path, palette_as_indices=True)
    if array.ndim == 3:
        if array.shape[2] == 1 or all(np.array_equal(array[:, :, 0], array[:, :, c]) for c in range(1, array.shape[2])):
            array = array[:, :, 0]
        else:
            raise DataError(f"{path}: colour mask; masks must be single-channel class indices (or 0/255 for binary)")
    if array.ndim != 2:
        raise DataError(f"{path}: unsupported mask shape {array.shape}; expected H x W class indices")
    if array.dtype == np.bool_:
        array = array.astype(np.uint8)
    if not np.issubdtype(array.dtype, np.integer):
        raise DataError(f"{path}: {array.dtype} mask; masks must hold integer class indices")
    values = np.unique(array)
    if num_classes == 2 and set(values.tolist()) <= {0, 255}:
        array = (array == 255)
        values = np.unique(array.astype(np.uint8))
    bad = values[(values < 0) | (values >= num_classes)]
    if bad.size:
        hint = " (for binary 0/255 masks set data.segmentation.num_classes: 2)" if 255 in bad.tolist() else ""
        raise DataError(f"{path}: mask values {bad.tolist()[:10]} outside the classes 0..{num_classes - 1} "
                        f"(data.segmentation.num_classes: {num_classes}){hint}")
    return array.astype(np.uint8)
