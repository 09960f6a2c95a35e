"""The input contract: raw input -> model input, one object per kind of input (an image to classify, an image to
segment, a text), built from the preprocessing record prepare writes (trainlab.data.preprocessing), each with the one
function that turns a raw file, its bytes or a string into what the model stores. prepare's writers, evaluate, the
predict command and the MLflow model all go through them, so what is served is what was trained."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np
from PIL import Image

from trainlab.core.errors import DataError
from trainlab.data.images import decode_image, read_mask, size_text
from trainlab.data.preprocessing import (
    CROP,
    IMAGE_TASKS,
    KEEP,
    PREPROCESSING_FILE,
    TEXT_CLEANING,
    TEXT_TASK,
    ImagePolicy,
    load_preprocessing,
)
from trainlab.data.tokenizer import Tokenizer

Source = Union[str, Path, bytes]  # an image file, or its encoded bytes


# --- the resize policy ---------------------------------------------------------------------------------------------

def crop_box(width: int, height: int, size: int) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    """For CROP: the resized (w, h) with the shorter side at `size`, and the centre size x size box in it."""
    if width <= height:
        new_w, new_h = size, max(size, round(height * size / width))
    else:
        new_w, new_h = max(size, round(width * size / height)), size
    left, top = (new_w - size) // 2, (new_h - size) // 2
    return (new_w, new_h), (left, top, left + size, top + size)


def apply_policy(pixels: np.ndarray, policy: ImagePolicy) -> np.ndarray:
    """Decoded (H, W, C) pixels -> the stored (C, height, width) uint8 image: channels to the policy's (gray repeated,
    RGB to luminance), then resized (bilinear, antialiased). An image already at the size is not resampled (so a
    stored image written back as PNG comes back bit for bit)."""
    pixels = match_channels(pixels, policy.channels)
    if pixels.shape[:2] != (policy.height, policy.width):
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


def where_of(source: Source, name: str | None) -> str:
    return name or (str(source) if not isinstance(source, bytes) else "image bytes")


# --- one object per kind of input ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImageInput:
    """An image to classify: decoded (a JPEG at a reduced DCT scale when the policy resizes it: libjpeg's draft mode,
    much faster on photos), then the resize policy."""

    policy: ImagePolicy

    def __call__(self, source: Source, name: str | None = None) -> np.ndarray:
        """The stored (C, height, width) uint8 image of an image file or its bytes; a DataError naming it."""
        where = where_of(source, name)
        draft = self.policy.height if self.policy.resize != KEEP else None
        return apply_policy(decode_image(source, where, draft_size=draft), self.policy)

    def describe(self) -> str:
        p = self.policy
        return f"{p.channels}x{p.height}x{p.width} images (resize {p.resize})"


@dataclass(frozen=True)
class SegmentationInput:
    """An image to segment: decoded at full size (no draft: masks are cut from the same pixels), then the resize
    policy; its mask the same way by nearest neighbour, and a predicted mask brought back to the image's size."""

    policy: ImagePolicy

    def __call__(self, source: Source, name: str | None = None) -> np.ndarray:
        return self.decode(source, name)[0]

    def decode(self, source: Source, name: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The stored (C, height, width) uint8 image and the decoded (H, W, C) pixels it came from."""
        pixels = decode_image(source, where_of(source, name))
        return apply_policy(pixels, self.policy), pixels

    def pair(self, image_path: Path, mask_path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
        """An image file and its mask file as stored: checked to match in size, the mask by nearest neighbour."""
        stored, pixels = self.decode(image_path, str(image_path))
        mask = read_mask(mask_path, num_classes)
        if mask.shape != pixels.shape[:2]:
            raise DataError(f"{mask_path}: mask size {size_text(mask.shape)} does not match image {image_path} size "
                            f"{size_text(pixels.shape[:2])}")
        return stored, resize_mask(mask, self.policy)

    def mask_to_original(self, mask: np.ndarray, height: int, width: int) -> np.ndarray:
        """A (h, w) mask at the policy's size back at an image's own (height, width): the policy inverted (nearest
        neighbour; outside a centre crop, class 0)."""
        if mask.shape == (height, width):
            return mask
        if self.policy.resize != CROP or self.policy.height != self.policy.width:  # resized whole (stretched)
            return np.asarray(Image.fromarray(mask).resize((width, height), Image.Resampling.NEAREST))
        (new_w, new_h), (left, top, right, bottom) = crop_box(width, height, self.policy.height)  # as prepare cut
        sx, sy = width / new_w, height / new_h
        box = (round(left * sx), round(top * sy), round(right * sx), round(bottom * sy))
        out = np.zeros((height, width), dtype=np.uint8)
        out[box[1]:box[3], box[0]:box[2]] = np.asarray(
            Image.fromarray(mask).resize((box[2] - box[0], box[3] - box[1]), Image.Resampling.NEAREST))
        return out

    def describe(self) -> str:
        p = self.policy
        return f"{p.channels}x{p.height}x{p.width} images (resize {p.resize})"


def clean_text(text: Any, where: str) -> str:
    """One raw text as the cleaning leaves it (whitespace runs to one space, stripped); an empty or non-string text is
    a DataError naming `where`. Cleaning a cleaned text changes nothing."""
    if not isinstance(text, str):
        raise DataError(f"{where}: expected a text (string), got {type(text).__name__} {text!r:.40}")
    cleaned = " ".join(text.split())
    if not cleaned:
        raise DataError(f"{where}: empty text (texts must contain at least one non-space character)")
    return cleaned


@dataclass(frozen=True, eq=False)
class TextInput:
    """A text: cleaned (clean_text), then token ids by the prepared tokenizer (lowercasing, vocabulary, max_length)."""

    tokenizer: Tokenizer

    def __call__(self, text: Any, name: str = "text") -> np.ndarray:
        """The stored (max_length,) int64 token ids of one raw text; a DataError naming it."""
        return self.encode([clean_text(text, name)])[0][0].numpy()

    def encode(self, texts: list[str]) -> tuple[Any, np.ndarray]:
        """Token ids (N, max_length) int64 of raw texts, cleaned here (prepare cleans them first, to drop duplicates:
        cleaning twice changes nothing), and each one's length in tokens before cutting."""
        return self.tokenizer.encode_with_lengths([clean_text(t, "text") for t in texts])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TextInput) and self.tokenizer.to_dict() == other.tokenizer.to_dict()

    def describe(self) -> str:
        t = self.tokenizer
        return f"texts tokenized to {t.max_length} ids from a vocabulary of {t.vocab_size} (lowercase {t.lowercase})"


InputContract = Union[ImageInput, SegmentationInput, TextInput]


def contract_for(record: dict[str, Any], folder: Path) -> InputContract:
    """The contract a preprocessing record describes (`folder`: where it and its tokenizer file are)."""
    where = str(folder / PREPROCESSING_FILE)
    task = record.get("task")
    if task in IMAGE_TASKS:
        policy = ImagePolicy.from_dict(record.get("image") or {}, where)
        return ImageInput(policy) if task == "classifier" else SegmentationInput(policy)
    if task != TEXT_TASK:
        raise DataError(f"{where}: task {task!r} is not one of {', '.join((*IMAGE_TASKS, TEXT_TASK))}")
    text = record.get("text") or {}
    if text.get("cleaning") != TEXT_CLEANING:
        raise DataError(f"{where}: text cleaning {text.get('cleaning')!r} is not this code's {TEXT_CLEANING!r}")
    tokenizer = Tokenizer.load(folder / str(text.get("tokenizer", "tokenizer.json")))
    for key in ("max_length", "lowercase"):  # records written before the tokenizer file was their one place
        if key in text and text[key] != getattr(tokenizer, key):
            raise DataError(f"{where}: {key} {text[key]} but the tokenizer says {getattr(tokenizer, key)}")
    return TextInput(tokenizer)


def load_contract(folder: str | Path) -> InputContract:
    """The input contract of a prepared data folder or a model folder (its preprocessing.json)."""
    folder = Path(folder)
    return contract_for(load_preprocessing(folder), folder)
