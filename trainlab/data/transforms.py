"""Raw input -> model input, one function per kind: an image file (or its bytes) to the stored uint8 tensor under a
resize policy, a text to token ids. prepare, evaluate, predict and the MLflow model all call these, and the settings
travel with the model (``preprocessing.json``), so what is served is what was trained."""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from trainlab.core.errors import DataError

PREPROCESSING_FILE = "preprocessing.json"
FORMAT = "trainlab-preprocessing-v1"

# Resize policies of the stored images (ImagePolicy.resize).
KEEP = "none"  # stored as decoded (prepare chose it because all had one size); another size is stretched to it
CROP = "shorter_side_center_crop"  # shorter side to the size, then the centre square (torchvision's Resize + CenterCrop)
STRETCH = "stretch"  # the whole image to height x width (segmentation: nothing is cut off, masks by nearest neighbour)
RESIZES = (KEEP, CROP, STRETCH)

# Normalisation of the uint8 images in the model's first step (tasks.augment.to_float_images): (x/255 - mean) / std.
IMAGE_MEAN, IMAGE_STD = 0.5, 0.5


@dataclass(frozen=True)
class ImagePolicy:
    """How a decoded image becomes a stored (C, height, width) uint8 image."""

    channels: int  # 1: gray, 3: RGB
    height: int
    width: int
    resize: str = KEEP

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mean": IMAGE_MEAN, "std": IMAGE_STD}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "preprocessing") -> ImagePolicy:
        try:
            policy = cls(int(data["channels"]), int(data["height"]), int(data["width"]), str(data["resize"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{where}: not an image preprocessing record ({exc!r})") from None
        if policy.resize not in RESIZES or policy.channels not in (1, 3) or min(policy.height, policy.width) < 1:
            raise DataError(f"{where}: unsupported image preprocessing {policy}")
        if (data.get("mean", IMAGE_MEAN), data.get("std", IMAGE_STD)) != (IMAGE_MEAN, IMAGE_STD):
            raise DataError(f"{where}: normalisation mean {data.get('mean')} / std {data.get('std')} differs from this "
                            f"code's {IMAGE_MEAN} / {IMAGE_STD}: the model was trained by another version")
        return policy


# --- decoding ------------------------------------------------------------------------------------------------------

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
    return Path(source).suffix.lower() in (".tif", ".tiff")


def decode_tiff(source: str | Path | bytes, where: str) -> np.ndarray:
    """TIFF through tifffile (any bit depth and sample format Pillow may not read), scaled to 8 bit like the rest."""
    import tifffile

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


# --- the resize policy ---------------------------------------------------------------------------------------------

def crop_box(width: int, height: int, size: int) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    """For CROP: the resized (w, h) with the shorter side at `size`, and the centre size x size box in it."""
    if width <= height:
        new_w, new_h = size, max(size, round(height * size / width))
    else:
        new_w, new_h = max(size, round(width * size / height)), size
    left, top = (new_w - size) // 2, (new_h - size) // 2
    return (new_w, new_h), (left, top, left + size, top + size)


def apply_policy(pixels: np.ndarray, policy: ImagePolicy, where: str) -> np.ndarray:
    """Decoded (H, W, C) pixels -> the stored (C, height, width) uint8 image: channels to the policy's (gray repeated,
    RGB to luminance), then resized (bilinear, antialiased). An image already at the size is not resampled (so a
    stored image written back as PNG comes back bit for bit). `where` names the image (for callers' messages)."""
    pixels = match_channels(pixels, policy.channels)
    height, width = pixels.shape[:2]
    if (height, width) != (policy.height, policy.width):
        pixels = resize_pixels(pixels, policy, Image.Resampling.BILINEAR)
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))


def resize_pixels(pixels: np.ndarray, policy: ImagePolicy, resample: Image.Resampling) -> np.ndarray:
    """(H, W, C) or (H, W) resized by the policy with Pillow (antialiased when shrinking)."""
    image = Image.fromarray(pixels[:, :, 0] if pixels.ndim == 3 and pixels.shape[2] == 1 else pixels)
    if policy.resize == CROP and policy.height == policy.width:
        new_size, box = crop_box(image.width, image.height, policy.height)
        image = image.resize(new_size, resample).crop(box)
    else:
        image = image.resize((policy.width, policy.height), resample)
    out = np.asarray(image)
    return out[:, :, None] if out.ndim == 2 and pixels.ndim == 3 else out


def resize_mask(mask: np.ndarray, policy: ImagePolicy) -> np.ndarray:
    """A (H, W) uint8 class-index mask resized like its image, by nearest neighbour (class indices survive)."""
    if mask.shape == (policy.height, policy.width):
        return mask
    return resize_pixels(mask, policy, Image.Resampling.NEAREST)


def match_channels(pixels: np.ndarray, channels: int) -> np.ndarray:
    if pixels.shape[2] == channels:
        return pixels
    if channels == 3:
        return np.repeat(pixels, 3, axis=2)
    return np.asarray(Image.fromarray(pixels).convert("L"))[:, :, None]  # ITU-R 601-2 luma, as PIL's "L"


def image_input(source: str | Path | bytes, policy: ImagePolicy, name: str | None = None) -> np.ndarray:
    """The one path from an image file or bytes to the model's stored input: decode, then the resize policy."""
    where = name or (str(source) if not isinstance(source, bytes) else "image bytes")
    draft = policy.height if policy.resize != KEEP else None
    return apply_policy(decode_image(source, where, draft_size=draft), policy, where)


# --- text ----------------------------------------------------------------------------------------------------------

def clean_text(text: Any, where: str) -> str:
    """One raw text as the text task's cleaning leaves it (whitespace runs to one space, stripped); an empty or
    non-string text is a DataError naming `where`."""
    if not isinstance(text, str):
        raise DataError(f"{where}: expected a text (string), got {type(text).__name__} {text!r:.40}")
    cleaned = " ".join(text.split())
    if not cleaned:
        raise DataError(f"{where}: empty text (texts must contain at least one non-space character)")
    return cleaned


# --- the record saved next to the model ----------------------------------------------------------------------------

def save_preprocessing(folder: str | Path, record: dict[str, Any]) -> Path:
    from trainlab.core.atomic import write_json

    path = Path(folder) / PREPROCESSING_FILE
    write_json(path, {"format": FORMAT, **record})
    return path


def load_preprocessing(folder: str | Path) -> dict[str, Any]:
    """``preprocessing.json`` of a prepared dataset or a model folder; missing or foreign is a DataError naming it."""
    path = Path(folder) / PREPROCESSING_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: missing (prepared data or a model from before preprocessing records; rerun "
                        "`dvc repro`)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DataError(f"{path}: not a {FORMAT} file")
    return data
