"""A trained model folder (models/<task>/ or the copy inside an MLflow model) on raw images and texts: its input
contract (trainlab.data.inputs, built from the preprocessing.json training copied beside the weights) checked against
the model, the model inputs it makes, batched forwards."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainlab.core.errors import CheckpointError, DataError
from trainlab.core.runtime import Runtime
from trainlab.data.inputs import InputContract, SegmentationInput, TextInput, contract_for
from trainlab.data.preprocessing import IMAGE_TASKS, PREPROCESSING_FILE, load_preprocessing


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


@dataclass
class ModelInputs:
    """What the input contract made of one batch of raw inputs: the stored tensors of the good ones, stacked
    (uint8 (n, C, H, W) images or int64 (n, max_length) token ids; None when none was good)."""

    x: torch.Tensor | None
    good: list[int]  # positions of the good inputs among those given
    rejected: list[Rejected]
    originals: list[np.ndarray]  # segmenter: the decoded (H, W, C) images


class Predictor:
    """A saved model with its input contract, ready for raw inputs (image paths or bytes; texts)."""

    def __init__(self, folder: Path, task: str, model: torch.nn.Module, config: dict, record: dict[str, Any],
                 runtime: Runtime, contract: InputContract) -> None:
        self.folder, self.task, self.model, self.config, self.record = folder, task, model, config, record
        self.runtime, self.contract = runtime, contract
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
        contract = check_record(folder, task, record, config, info)
        runtime = runtime or cpu_runtime()
        saved = load_saved_model(folder, task, runtime.device)
        model = saved.model.eval()
        if task in IMAGE_TASKS and runtime.channels_last:
            model = model.to(memory_format=torch.channels_last)
        return cls(folder, task, model, config, record, runtime, contract)

    # -- raw input -> model input --------------------------------------------------------------------------------
    def model_inputs(self, items: Sequence[Any], names: Sequence[str]) -> ModelInputs:
        """Raw inputs (image paths or bytes; texts) -> what the model stores, by the input contract (prepare's own
        path); a segmenter also keeps each decoded image (its mask goes back to that size, the overlay on it)."""
        stored, good, rejected, originals = [], [], [], []
        for i, (item, name) in enumerate(zip(items, names)):
            try:
                if isinstance(self.contract, SegmentationInput):
                    sample, pixels = self.contract.decode(item, name)
                    originals.append(pixels)
                else:
                    sample = self.contract(item, name)
            except DataError as exc:
                rejected.append(Rejected(i, name, str(exc)))
                continue
            stored.append(sample)
            good.append(i)
        x = torch.from_numpy(np.stack(stored)) if stored else None
        return ModelInputs(x, good, rejected, originals)

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
        inputs = self.model_inputs(items, names)
        batch = Batch(inputs.good)
        if inputs.x is None:
            return batch, inputs.rejected
        logits = self.forward(inputs.x)
        if self.dense:
            masks = logits.argmax(dim=1).to(torch.uint8).cpu().numpy()
            batch.masks = [self.contract.mask_to_original(mask, *image.shape[:2])
                           for mask, image in zip(masks, inputs.originals)]
            batch.images = inputs.originals
        else:
            batch.labels = logits.argmax(dim=1).cpu()
            batch.probabilities = logits.float().softmax(dim=1).cpu()
        return batch, inputs.rejected

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


def check_record(folder: Path, task: str, record: dict[str, Any], config: dict, info: dict) -> InputContract:
    """The input contract the preprocessing record describes, checked to fit the model (task, classes, channels;
    tokenizer size and max length). A mismatch is a CheckpointError naming the record."""
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
    try:
        contract = contract_for(record, folder)
    except DataError as exc:
        raise CheckpointError(str(exc)) from None
    if not isinstance(contract, TextInput):
        if contract.policy.channels != config.get("in_channels"):
            raise mismatch(f"{contract.policy.channels}-channel images but the model takes in_channels="
                           f"{config.get('in_channels')}")
        return contract
    tokenizer = contract.tokenizer
    if tokenizer.max_length != config.get("max_length"):
        raise mismatch(f"a tokenizer of max_length {tokenizer.max_length} but the model takes max_length="
                       f"{config.get('max_length')}")
    if tokenizer.vocab_size != config.get("vocab_size"):
        raise mismatch(f"a tokenizer of {tokenizer.vocab_size} ids but the model has vocab_size="
                       f"{config.get('vocab_size')}")
    return contract
