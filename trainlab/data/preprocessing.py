"""The preprocessing record (``preprocessing.json``) that prepare writes beside the prepared data and training copies
into the model folder: the one place the stored image size, channels, resize policy and normalisation (images), or the
tokenizer file and the cleaning (texts) are kept. trainlab.data.inputs builds the raw-input contract from it; meta.json
no longer repeats the size (trainlab.data.prepared.load_meta reads it from here)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainlab.core.atomic import write_json
from trainlab.core.errors import DataError

PREPROCESSING_FILE = "preprocessing.json"
FORMAT = "trainlab-preprocessing-v1"
IMAGE_TASKS = ("classifier", "segmenter")  # the record's "task": a task name (models/<task>), as in meta.json
TEXT_TASK = "text"

# Resize policies of the stored images (ImagePolicy.resize).
KEEP = "none"  # stored as decoded (prepare chose it because all had one size); another size is stretched to it
CROP = "shorter_side_center_crop"  # shorter side to the size, then the centre square (torchvision's Resize+CenterCrop)
STRETCH = "stretch"  # the whole image to height x width (segmentation: nothing is cut off, masks by nearest neighbour)
RESIZES = (KEEP, CROP, STRETCH)

# Normalisation of the uint8 images in the model's first step (tasks.augment.to_float_images): (x/255 - mean) / std.
IMAGE_MEAN, IMAGE_STD = 0.5, 0.5

TEXT_CLEANING = "whitespace"  # whitespace runs to one space, stripped (trainlab.data.inputs.clean_text)
SIZE_KEYS = ("channels", "height", "width")


@dataclass(frozen=True)
class ImagePolicy:
    """How a decoded image becomes a stored (C, height, width) uint8 image."""

    channels: int  # 1: gray, 3: RGB
    height: int
    width: int
    resize: str = KEEP

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "mean": IMAGE_MEAN, "std": IMAGE_STD}

    def size(self) -> dict[str, int]:
        return {"channels": self.channels, "height": self.height, "width": self.width}

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


def image_record(task: str, class_names: list[str], policy: ImagePolicy) -> dict[str, Any]:
    """The record of an image task's data: how a raw image becomes its stored image."""
    return {"task": task, "class_names": class_names, "image": policy.to_dict()}


def text_record(class_names: list[str], tokenizer_file: str) -> dict[str, Any]:
    """The record of the text data: the cleaning, and the tokenizer file (vocabulary, max_length, lowercasing)."""
    return {"task": TEXT_TASK, "class_names": class_names, "text": {"cleaning": TEXT_CLEANING,
                                                                     "tokenizer": tokenizer_file}}


def save_preprocessing(folder: str | Path, record: dict[str, Any]) -> Path:
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


def stored_size(folder: str | Path) -> dict[str, int]:
    """channels, height and width of the images a prepared folder stores, from its record; {} where there is no record
    or it is not an image task's."""
    if not (Path(folder) / PREPROCESSING_FILE).is_file():
        return {}
    record = load_preprocessing(folder)
    if record.get("task") not in IMAGE_TASKS:
        return {}
    return ImagePolicy.from_dict(record.get("image") or {}, str(Path(folder) / PREPROCESSING_FILE)).size()
