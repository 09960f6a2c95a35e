"""Image and mask files -> pixels: decoding any common encoding upright and 8-bit, probing a file's header (channels
and upright size, no decoding) and reading masks of class indices, with errors naming the file."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image, ImageOps, UnidentifiedImageError

from trainlab.core.errors import DataError

TIFF_SUFFIXES = (".tif", ".tiff")
GRAY_MODES = ("1", "L", "LA", "La", "I", "F", "I;16", "I;16B", "I;16L", "I;16N")
EXIF_ORIENTATION = 0x0112
TRANSPOSING_ORIENTATIONS = (5, 6, 7, 8)  # EXIF orientations that swap width and height


def decode_image(source: str | Path | bytes, name: str | None = None, draft_size: int | None = None) -> np.ndarray:
    """Pixels (H, W, 1) or (H, W, 3) uint8 of an image file or its encoded bytes, upright (EXIF orientation applied).

    Any format Pillow reads (PNG, JPEG incl. CMYK, WebP, TIFF, BMP, GIF...): palette and alpha images become RGB (alpha
    dropped), 16-bit and float images are scaled to 8 bit, gray stays one channel. `draft_size`: a JPEG may be decoded
    at 1/2, 1/4 or 1/8 scale as long as its shorter side stays at least that (libjpeg's DCT scaling: much faster for
    large photos). Unreadable or truncated data is a DataError naming `name` (or the path).
    """
    where = name or (str(source) if not isinstance(source, bytes) else "image bytes")
    if is_tiff(source):
        return decode_tiff(source, where)
    try:
        with Image.open(io.BytesIO(source) if isinstance(source, bytes) else source) as image:
            if draft_size and image.format == "JPEG":
                short = min(image.size)
                scale = max((s for s in (1, 2, 4, 8) if short // s >= draft_size), default=1)
                if scale > 1:
                    image.draft(image.mode, (image.size[0] // scale, image.size[1] // scale))
            image.load()
            return to_uint8_pixels(ImageOps.exif_transpose(image), where)
    except FileNotFoundError:
        raise DataError(f"{where}: file not found") from None
    except DataError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise DataError(f"{where}: unreadable or corrupt image ({type(exc).__name__}: {exc})") from None


def is_tiff(source: str | Path | bytes) -> bool:
    if isinstance(source, bytes):
        return source[:4] in (b"II*\x00", b"MM\x00*")
    return Path(source).suffix.lower() in TIFF_SUFFIXES


def decode_tiff(source: str | Path | bytes, where: str) -> np.ndarray:
    """TIFF through tifffile (any bit depth and sample format Pillow may not read), scaled to 8 bit like the rest."""
    try:
        array = np.asarray(tifffile.imread(io.BytesIO(source) if isinstance(source, bytes) else source))
    except FileNotFoundError:
        raise DataError(f"{where}: file not found") from None
    except (tifffile.TiffFileError, OSError, ValueError, IndexError) as exc:
        raise DataError(f"{where}: unreadable or corrupt image ({type(exc).__name__}: {exc})") from None
    if array.ndim == 3 and array.shape[0] in (3, 4) and array.shape[2] not in (1, 3, 4):
        array = array.transpose(1, 2, 0)  # planar (C, H, W) storage
    if array.ndim == 2:
        array = array[:, :, None]
    if array.ndim != 3 or array.shape[2] not in (1, 2, 3, 4):
        raise DataError(f"{where}: unsupported image shape {array.shape}; expected H x W (gray) or H x W x 3 (RGB)")
    array = array[:, :, :1] if array.shape[2] == 2 else array[:, :, :3]
    if array.dtype == np.bool_:
        return array.astype(np.uint8) * 255
    if array.dtype == np.uint8:
        return np.ascontiguousarray(array)
    if np.issubdtype(array.dtype, np.floating):
        return scale_to_uint8(array, "F")
    if array.dtype in (np.uint16, np.int16):
        return scale_to_uint8(array.astype(np.int64), "I;16")
    raise DataError(f"{where}: {array.dtype} pixels are not supported; use 8- or 16-bit integers or floats in 0..1")


def to_uint8_pixels(image: Image.Image, where: str) -> np.ndarray:
    """A loaded PIL image as (H, W, C) uint8, C 1 or 3."""
    mode = image.mode
    if mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
        array = np.asarray(image)
        return scale_to_uint8(array, mode)[:, :, None]
    if mode == "1":
        return (np.asarray(image, dtype=np.uint8) * 255)[:, :, None]
    if mode == "L":
        return np.asarray(image)[:, :, None]
    if mode in ("LA", "La"):
        return np.asarray(image.getchannel(0))[:, :, None]
    if mode == "P" and "transparency" not in image.info and image.palette is not None and image.palette.mode == "L":
        return np.asarray(image.convert("L"))[:, :, None]
    return np.asarray(image.convert("RGB"))


def scale_to_uint8(array: np.ndarray, mode: str) -> np.ndarray:
    """16-bit (0..65535) and 32-bit integer images to 0..255 by the full range of their type; float images in 0..1
    to 0..255 (clipped)."""
    if mode == "F":
        return np.clip(np.rint(array.astype(np.float64) * 255), 0, 255).astype(np.uint8)
    wide = array.astype(np.int64)
    if mode == "I" and wide.max(initial=0) > 65535:  # a 32-bit image: its own range
        return np.clip(wide >> 24, 0, 255).astype(np.uint8)
    return ((np.clip(wide, 0, 65535) * 255 + 32767) // 65535).astype(np.uint8)


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
