"""A trained model folder (models/<task>/ or the copy inside an MLflow model) on raw images and texts: its saved
preprocessing checked against the model, the one raw-input path of trainlab.data.transforms, batched forwards."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainlab.core.errors import CheckpointError, DataError
from trainlab.core.runtime import Runtime
from trainlab.data.transforms import (
    PREPROCESSING_FILE,
    ImagePolicy,
    apply_policy,
    clean_text,
    decode_image,
    image_input,
    load_preprocessing,
)

IMAGE_TASKS = ("classifier", "segmenter")


def cpu_runtime(device: str = "cpu") -> Runtime:
    """fp32 on `device`, no compile: what the MLflow model runs with."""
    return Runtime(torch.device(device), "fp32", channels_last=False, compile=False, tf32=False, deterministic=False,
                   cudnn_benchmark=False)


@dataclass
class Rejected:
    """An input that could not be predicted, and why (the message names the file or row)."""

    index: int
    name: str
    message: str


@dataclass
class Batch:
    """Model outputs for the good inputs of one batch of raw inputs."""

    indices: list[int]  # positions of the good inputs among those given
    labels: torch.Tensor | None = None  # (n,) class indices (classifier, text)
    probabilities: torch.Tensor | None = None  # (n, classes) float32
    masks: list[np.ndarray] | None = None  # segmenter: (H, W) uint8 class indices at each image's original size
    images: list[np.ndarray] | None = None  # segmenter: the decoded (H, W, C) images, for overlays


class Predictor:
    """A saved model with its preprocessing, ready for raw inputs (image paths or bytes; texts)."""

    def __init__(self, folder: Path, task: str, model: torch.nn.Module, config: dict, record: dict[str, Any],
                 runtime: Runtime, policy: ImagePolicy | None = None, tokenizer: Any = None) -> None:
        self.folder, self.task, self.model, self.config, self.record = folder, task, model, config, record
        self.runtime, self.policy, self.tokenizer = runtime, policy, tokenizer
        self.class_names = [str(n) for n in record["class_names"]]
        from trainlab.tasks import get

        self.dense = get(task).load().dense

    # -- loading -------------------------------------------------------------------------------------------------
    @classmethod
    def load(cls, folder: str | Path, runtime: Runtime | None = None) -> Predictor:
        """Read and check `folder` (model.safetensors, config.json, preprocessing.json, tokenizer.json for text):
        a preprocessing record that does not fit the model is a CheckpointError naming the file (exit 4)."""
        from trainlab.tasks import names
        from trainlab.tasks.saved import load_saved_model, read_json

        folder = Path(folder)
        if not folder.is_dir():
            raise CheckpointError(f"{folder}: model folder not found")
        record = read_record(folder)
        task = record.get("task")
        if task not in names():
            raise CheckpointError(f"{folder / PREPROCESSING_FILE}: task {task!r} is not one of {', '.join(names())}")
        config = read_json(folder / "config.json")
        info = read_json(folder / "info.json") if (folder / "info.json").is_file() else {}
        policy, tokenizer = check_record(folder, task, record, config, info)
        runtime = runtime or cpu_runtime()
        saved = load_saved_model(folder, task, runtime.device)
        model = saved.model.eval()
        if task in IMAGE_TASKS and runtime.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return cls(folder, task, model, config, record, runtime, policy, tokenizer)

    # -- raw input -> model input --------------------------------------------------------------------------------
    def image(self, source: str | Path | bytes, name: str) -> np.ndarray:
        """One image file or its bytes as the stored (C, H, W) uint8 image: trainlab.data.transforms.image_input."""
        return image_input(source, self.policy, name)

    def image_at_full_size(self, source: str | Path | bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
        """The segmenter's input as prepare makes its segmentation images (decoded at full size, no JPEG draft,
        then the policy), and the decoded image (the mask goes back to its size; the overlay is drawn on it)."""
        pixels = decode_image(source, name)
        return apply_policy(pixels, self.policy, name), pixels

    def text(self, value: Any, name: str) -> str:
        """One raw text, cleaned as prepare cleans it (the tokenizer lowercases and cuts it)."""
        return clean_text(value, name)

    def tensors(self, prepared: Sequence[Any]) -> torch.Tensor:
        """Stored images (uint8 (N, C, H, W)) or token ids (int64 (N, max_length)) of prepared inputs."""
        if self.task in IMAGE_TASKS:
            return torch.from_numpy(np.stack(prepared))
        return self.tokenizer.encode(list(prepared))

    # -- the forward ---------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Float32 logits (N, classes[, H, W]) of model inputs, on the runtime's device and precision (no TTA)."""
        from trainlab.tasks.augment import to_float_images
        from trainlab.tasks.scoring import predict_logits

        x = x.to(self.runtime.device)
        if self.task in IMAGE_TASKS:
            x = to_float_images(x)
            if self.runtime.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
        with self.runtime.autocast():
            return predict_logits(self.model, x, "none", self.dense)

    def predict(self, items: Sequence[Any], names: Sequence[str]) -> tuple[Batch, list[Rejected]]:
        """Raw inputs (image paths or bytes; texts) of one batch -> outputs for the good ones and the rejected."""
        prepared, good, rejected, originals = [], [], [], []
        for i, (item, name) in enumerate(zip(items, names)):
            try:
                if self.dense:
                    stored, pixels = self.image_at_full_size(item, name)
                    prepared.append(stored)
                    originals.append(pixels)
                elif self.task in IMAGE_TASKS:
                    prepared.append(self.image(item, name))
                else:
                    prepared.append(self.text(item, name))
            except DataError as exc:
                rejected.append(Rejected(i, name, str(exc)))
                continue
            good.append(i)
        batch = Batch(good)
        if not good:
            return batch, rejected
        logits = self.forward(self.tensors(prepared))
        if self.dense:
            masks = logits.argmax(dim=1).to(torch.uint8).cpu().numpy()
            batch.masks = [self.original_size(mask, image) for mask, image in zip(masks, originals)]
            batch.images = originals
        else:
            batch.labels = logits.argmax(dim=1).cpu()
            batch.probabilities = logits.float().softmax(dim=1).cpu()
        return batch, rejected

    def original_size(self, mask: np.ndarray, image: np.ndarray) -> np.ndarray:
        """A (h, w) mask at the policy's size back at the (H, W) of the decoded image: the resize policy inverted
        (nearest neighbour; outside a centre crop, class 0)."""
        from PIL import Image

        from trainlab.data.transforms import CROP, crop_box

        height, width = image.shape[:2]
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

    def batches(self, items: Sequence[Any], names: Sequence[str], batch_size: int,
                progress: Callable[[int], None] | None = None) -> Iterable[tuple[int, Batch, list[Rejected]]]:
        """predict() over `items` in batches: (offset of the batch, its outputs, its rejected inputs)."""
        for start in range(0, len(items), batch_size):
            batch, rejected = self.predict(items[start:start + batch_size], names[start:start + batch_size])
            if progress is not None:
                progress(min(batch_size, len(items) - start))
            yield start, batch, rejected


def read_record(folder: Path) -> dict[str, Any]:
    """A model folder's preprocessing.json; missing or foreign is a CheckpointError naming it."""
    try:
        return load_preprocessing(folder)
    except DataError as exc:
        raise CheckpointError(f"{exc}; a model folder needs the preprocessing record its training wrote") from None


def check_record(folder: Path, task: str, record: dict[str, Any], config: dict,
                 info: dict) -> tuple[ImagePolicy | None, Any]:
    """The preprocessing record fits the model (task, classes, channels and size, tokenizer and max length); the
    image policy or the tokenizer it describes. A mismatch is a CheckpointError naming the record."""
    path = folder / PREPROCESSING_FILE

    def mismatch(what: str) -> CheckpointError:
        return CheckpointError(f"{path}: {what}; this preprocessing is not the one the model was trained with "
                               "(rerun `dvc repro` so that the model and its record come from one training)")

    if config.get("task", task) != task or info.get("task", task) != task:
        raise mismatch(f"task {task!r} but {folder / 'config.json'} is a {config.get('task')!r} model")
    names = record.get("class_names")
    if not isinstance(names, list) or len(names) != config.get("num_classes"):
        count = len(names) if isinstance(names, list) else names
        raise mismatch(f"{count} class names but the model has num_classes={config.get('num_classes')}")
    if task in IMAGE_TASKS:
        try:
            policy = ImagePolicy.from_dict(record.get("image") or {}, str(path))
        except DataError as exc:
            raise CheckpointError(str(exc)) from None
        if policy.channels != config.get("in_channels"):
            raise mismatch(f"{policy.channels}-channel images but the model takes in_channels="
                           f"{config.get('in_channels')}")
        meta = info.get("meta") or {}
        trained = (meta.get("height"), meta.get("width"))
        if None not in trained and trained != (policy.height, policy.width):
            raise mismatch(f"images of {policy.width}x{policy.height} (WxH) but the model was trained on "
                           f"{trained[1]}x{trained[0]} ({folder / 'info.json'})")
        return policy, None
    from trainlab.data.tokenizer import Tokenizer

    text = record.get("text") or {}
    try:
        tokenizer = Tokenizer.load(folder / str(text.get("tokenizer", "tokenizer.json")))
    except DataError as exc:
        raise CheckpointError(str(exc)) from None
    if text.get("cleaning") != "whitespace":
        raise mismatch(f"text cleaning {text.get('cleaning')!r} is not this code's 'whitespace'")
    if text.get("max_length") != tokenizer.max_length or tokenizer.max_length != config.get("max_length"):
        raise mismatch(f"max_length {text.get('max_length')} (tokenizer {tokenizer.max_length}) but the model "
                       f"takes max_length={config.get('max_length')}")
    if bool(text.get("lowercase", True)) != tokenizer.lowercase:
        raise mismatch(f"lowercase {text.get('lowercase')} but the tokenizer says {tokenizer.lowercase}")
    if tokenizer.vocab_size != config.get("vocab_size"):
        raise mismatch(f"a tokenizer of {tokenizer.vocab_size} ids but the model has vocab_size="
                       f"{config.get('vocab_size')}")
    return None, tokenizer

