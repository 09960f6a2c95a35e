"""Writing a split into the prepared format as it is produced: images made from files by the input contract
(trainlab.data.inputs, on all cores) or sliced from arrays, a shard at a time, so prepare never holds more than about
one shard whatever the data's size; texts as token ids and JSON lines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainlab.core.errors import DataError
from trainlab.data.bad_files import BadFiles
from trainlab.data.inputs import ImageInput, SegmentationInput, TextInput
from trainlab.data.ordered_map import map_in_order
from trainlab.data.prepared import SHARD_BYTES, ShardWriter, save_jsonl, save_split
from trainlab.data.preprocessing import ImagePolicy

ARRAY_CHUNK = 4096  # samples sliced from an in-memory array per write


@dataclass
class WrittenSplit:
    """What was written: the labels kept (after skipping bad files), and per-class mask pixel counts."""

    count: int
    labels: np.ndarray | None = None
    pixel_counts: np.ndarray | None = None


def image_bytes(policy: ImagePolicy) -> int:
    return policy.channels * policy.height * policy.width


def write_labeled_arrays(folder: Path, split: str, images: np.ndarray, labels: np.ndarray,
                         shard_bytes: int = SHARD_BYTES) -> WrittenSplit:
    """uint8 images (N, C, H, W) and int64 labels already in memory."""
    writer = ShardWriter(folder, split, int(np.prod(images.shape[1:])) + 8, shard_bytes)
    for start in range(0, len(images), ARRAY_CHUNK):
        writer.add({"images": torch.from_numpy(np.ascontiguousarray(images[start:start + ARRAY_CHUNK])),
                    "labels": torch.from_numpy(np.ascontiguousarray(labels[start:start + ARRAY_CHUNK]))})
    return WrittenSplit(writer.close(), labels)


def write_labeled_files(folder: Path, split: str, files: Sequence[Path], labels: np.ndarray, contract: ImageInput,
                        bad: BadFiles, workers: int | None = None, shard_bytes: int = SHARD_BYTES) -> WrittenSplit:
    """Image files made into stored images by `contract` (the one raw-image path: predict and the MLflow model call
    it too) in parallel, in order; unreadable ones go to `bad` (which raises in its "error" mode) and are left out."""
    writer = ShardWriter(folder, split, image_bytes(contract.policy) + 8, shard_bytes)
    chunk = max(64, min(writer.samples_per_shard, 1024))
    kept_labels: list[int] = []
    pending_images: list[np.ndarray] = []

    def flush() -> None:
        if pending_images:
            writer.add({"images": torch.from_numpy(np.stack(pending_images)),
                        "labels": torch.tensor(kept_labels[-len(pending_images):], dtype=torch.int64)})
            pending_images.clear()

    def decode(item: tuple[Path, int]) -> np.ndarray:
        return contract(item[0])

    for (path, label), result in map_in_order(zip(files, labels.tolist()), decode, workers, chunk,
                                              f"prepare {split}", len(files)):
        if isinstance(result, DataError):
            bad.add(result, path)
            continue
        pending_images.append(result)
        kept_labels.append(label)
        if len(pending_images) == chunk:
            flush()
    flush()
    return WrittenSplit(writer.close(), np.array(kept_labels, dtype=np.int64))


def write_masked_arrays(folder: Path, split: str, images: np.ndarray, masks: np.ndarray, num_classes: int,
                        shard_bytes: int = SHARD_BYTES) -> WrittenSplit:
    """uint8 images (N, C, H, W) and uint8 masks (N, H, W) already in memory."""
    writer = ShardWriter(folder, split, int(np.prod(images.shape[1:])) + int(np.prod(masks.shape[1:])), shard_bytes)
    for start in range(0, len(images), ARRAY_CHUNK):
        writer.add({"images": torch.from_numpy(np.ascontiguousarray(images[start:start + ARRAY_CHUNK])),
                    "masks": torch.from_numpy(np.ascontiguousarray(masks[start:start + ARRAY_CHUNK]))})
    counts = np.bincount(masks.ravel(), minlength=num_classes)[:num_classes]
    return WrittenSplit(writer.close(), pixel_counts=counts)


def write_masked_files(folder: Path, split: str, pairs: Sequence[tuple[Path, Path]], contract: SegmentationInput,
                       num_classes: int, bad: BadFiles, workers: int | None = None,
                       shard_bytes: int = SHARD_BYTES) -> WrittenSplit:
    """(image, mask) file pairs made into stored images and masks by `contract` in parallel, in order. An unreadable
    image goes to `bad`; a mask that is wrong (size, values) is always an error: skipping it would hide a labelling
    mistake."""
    policy = contract.policy
    writer = ShardWriter(folder, split, image_bytes(policy) + policy.height * policy.width, shard_bytes)
    chunk = max(64, min(writer.samples_per_shard, 1024))
    counts = np.zeros(num_classes, dtype=np.int64)
    images: list[np.ndarray] = []
    masks: list[np.ndarray] = []

    def flush() -> None:
        if images:
            writer.add({"images": torch.from_numpy(np.stack(images)), "masks": torch.from_numpy(np.stack(masks))})
            images.clear()
            masks.clear()

    for (image_path, mask_path), result in map_in_order(
            pairs, lambda pair: contract.pair(pair[0], pair[1], num_classes), workers, chunk, f"prepare {split}",
            len(pairs)):
        if isinstance(result, DataError):
            if str(result).startswith(f"{image_path}: unreadable"):
                bad.add(result, image_path)
                continue
            raise result
        image, mask = result
        images.append(image)
        masks.append(mask)
        counts += np.bincount(mask.ravel(), minlength=num_classes)[:num_classes]
        if len(images) == chunk:
            flush()
    flush()
    return WrittenSplit(writer.close(), pixel_counts=counts)


def write_text_split(folder: Path, split: str, texts: list[str], labels: np.ndarray, contract: TextInput) -> np.ndarray:
    """``<split>.safetensors`` (tokens by `contract`, labels) and ``<split>.jsonl`` (the cleaned texts, for the TF-IDF
    baseline); returns each text's length in tokens before cutting."""
    tokens, lengths = contract.encode(texts)
    save_split(folder, split, {"tokens": tokens, "labels": torch.from_numpy(np.asarray(labels, dtype=np.int64))})
    save_jsonl(folder / f"{split}.jsonl", [{"text": text, "label": int(label)} for text, label in zip(texts, labels)])
    return lengths
