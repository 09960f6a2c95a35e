"""Image and mask files on disk: listing a folder (what is skipped and why), probing a file's header (channels and
upright size, no decoding) and reading masks of class indices, with errors naming the file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image, UnidentifiedImageError

from trainlab.core.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".tif", ".tiff", ".bmp", ".gif")
TIFF_SUFFIXES = (".tif", ".tiff")
GRAY_MODES = ("1", "L", "LA", "La", "I", "F", "I;16", "I;16B", "I;16L", "I;16N")
EXIF_ORIENTATION = 0x0112
TRANSPOSING_ORIENTATIONS = (5, 6, 7, 8)  # EXIF orientations that swap width and height


@dataclass
class FolderListing:
    """The image files of a folder (sorted by name) and what was left out: hidden files, other files."""

    files: list[Path] = field(default_factory=list)
    hidden: list[Path] = field(default_factory=list)
    not_images: list[Path] = field(default_factory=list)

    def add(self, other: FolderListing) -> None:
        self.files += other.files
        self.hidden += other.hidden
        self.not_images += other.not_images


def list_images(folder: Path) -> FolderListing:
    """The files directly in `folder`: image files by suffix; hidden files (a leading dot: .DS_Store, ._x.jpg) and
    files of other suffixes are listed apart, to be counted, never read."""
    listing = FolderListing()
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            if path.is_file():
                listing.hidden.append(path)
        elif path.is_file():
            (listing.files if path.suffix.lower() in IMAGE_SUFFIXES else listing.not_images).append(path)
    return listing


def require_folder(folder: Path, what: str) -> Path:
    if not folder.exists():
        raise DataError(f"{folder}: {what} folder not found")
    if not folder.is_dir():
        raise DataError(f"{folder}: expected a folder ({what}), found a file")
    return folder


@dataclass(frozen=True)
class Probe:
    """What a file's header says: gray or colour, and its size once upright (EXIF orientation applied)."""

    channels: int
    height: int
    width: int


def probe_image(path: Path) -> Probe:
    """Channels and upright size from the header alone (no pixels decoded); a DataError naming the file if it is not
    an image Pillow (or tifffile) can open."""
    try:
        if path.suffix.lower() in TIFF_SUFFIXES:
            with tifffile.TiffFile(path) as tif:
                page = tif.pages[0]
                shape = page.shape
                samples = getattr(page, "samplesperpixel", 1)
                return Probe(1 if samples == 1 else 3, int(shape[0]), int(shape[1]))
        with Image.open(path) as image:
            width, height = image.size
            if image.getexif().get(EXIF_ORIENTATION) in TRANSPOSING_ORIENTATIONS:
                width, height = height, width
            gray = image.mode in GRAY_MODES
            return Probe(1 if gray else 3, height, width)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, tifffile.TiffFileError,
            Image.DecompressionBombError, IndexError) as exc:
        raise DataError(f"{path}: unreadable or corrupt image ({type(exc).__name__}: {exc})") from None


def read_array(path: Path, palette_as_indices: bool = False) -> np.ndarray:
    """The file's pixels (H, W) or (H, W, C) as stored (masks: no scaling, no orientation); unreadable or corrupt
    files are DataErrors naming the file. Palette images stay palette indices when `palette_as_indices`."""
    try:
        if path.suffix.lower() in TIFF_SUFFIXES:
            return np.asarray(tifffile.imread(path))
        with Image.open(path) as image:
            image.load()
            if not (image.mode == "P" and palette_as_indices) and image.mode not in GRAY_MODES + ("RGB",):
                image = image.convert("L" if image.mode in ("LA", "La") else "RGB")
            return np.asarray(image)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (UnidentifiedImageError, OSError, ValueError, tifffile.TiffFileError, SyntaxError) as exc:
        raise DataError(f"{path}: unreadable or corrupt image ({exc})") from None


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
