"""Build the three prepared datasets (classification, segmentation, text) and their statistics in one folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainlab.core.config import Params
from trainlab.data import sources, stats
from trainlab.data.prepared import save_jsonl, save_meta, save_split
from trainlab.data.tokenizer import CLS_ID, PAD_ID, UNK_ID, Tokenizer
from trainlab.data.transforms import ImagePolicy, save_preprocessing
from trainlab.core.errors import DataError

TOKENIZER_FILE = "tokenizer.json"
Log = Callable[[str], None]


def split_counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{split} {n:,}" for split, n in counts.items() if split != "total")


def stored_policy(size: dict[str, int]) -> ImagePolicy:
    """The policy of a source whose images all come at one size (embedded, torchvision): kept as they are."""
    return ImagePolicy(size["channels"], size["height"], size["width"])


def save_image_preprocessing(folder: Path, task: str, policy: ImagePolicy, class_names: list[str]) -> None:
    """preprocessing.json: how a raw image becomes this data's stored image (trainlab.data.transforms)."""
    save_preprocessing(folder, {"task": task, "class_names": class_names, "image": policy.to_dict()})


def prepare_classification(params: Params, folder: Path, allow_download: bool, log: Log) -> dict[str, Any]:
    """Write classification/{split}.safetensors (images uint8 N,C,H,W; labels int64) and meta.json."""
    data = sources.classification_splits(params.data, params.base.seed, allow_download)
    for split in sources.SPLITS:
        save_split(folder, split, {"images": torch.from_numpy(data.images[split]),
                                   "labels": torch.from_numpy(data.labels[split])})
    size = stats.image_size(data.images["train"])
    counts = stats.sample_counts({s: len(data.labels[s]) for s in sources.SPLITS})
    hflip = params.data.classification.source in sources.MIRROR_SAFE_SOURCES  # flips for augmentation and TTA
    save_image_preprocessing(folder, "classifier", data.policy or stored_policy(size), data.class_names)
    save_meta(folder, {"task": "classification", "source": data.description, "num_classes": len(data.class_names),
                       "class_names": data.class_names, **size, "counts": counts, "hflip": hflip})
    log(f"classification ({data.description}): {split_counts_text(counts)}; "
        f"{len(data.class_names)} classes, {size['channels']}x{size['height']}x{size['width']}")
    return {"num_classes": len(data.class_names), **size, "samples": counts,
            "per_class": {s: stats.class_counts(data.labels[s], data.class_names) for s in sources.SPLITS}}


def prepare_segmentation(params: Params, folder: Path, log: Log) -> dict[str, Any]:
    """Write segmentation/{split}.safetensors (images uint8 N,C,H,W; masks uint8 N,H,W) and meta.json."""
    data = sources.segmentation_splits(params.data, params.base.seed)
    for split in sources.SPLITS:
        save_split(folder, split, {"images": torch.from_numpy(data.images[split]),
                                   "masks": torch.from_numpy(data.masks[split])})
    size = stats.image_size(data.images["train"])
    counts = stats.sample_counts({s: len(data.masks[s]) for s in sources.SPLITS})
    symmetries = segmentation_symmetries(params)
    save_image_preprocessing(folder, "segmenter", data.policy or stored_policy(size), data.class_names)
    save_meta(folder, {"task": "segmentation", "source": data.description, "num_classes": len(data.class_names),
                       "class_names": data.class_names, **size, "counts": counts, "hflip": False,
                       "symmetries": symmetries})
    log(f"segmentation ({data.description}): {split_counts_text(counts)}; "
        f"{len(data.class_names)} classes, {size['channels']}x{size['height']}x{size['width']}; symmetries {symmetries}")
    return {"num_classes": len(data.class_names), **size, "samples": counts, **data.extra,
            "pixel_fraction": {s: stats.pixel_fractions(data.masks[s], data.class_names) for s in sources.SPLITS}}


def segmentation_symmetries(params: Params) -> str:
    """The label-preserving transforms the segmentation data allows: the user's data.segmentation.symmetries; none
    for the embedded digit canvases (a mirrored or rotated digit is another digit, or none)."""
    seg = params.data.segmentation
    if seg.source == "embedded" and seg.symmetries != "none":
        raise DataError(f"data.segmentation.symmetries is {seg.symmetries!r}, but the embedded digit canvases allow "
                        "no flips or rotations (a mirrored digit is not the same digit): set it to none")
    return seg.symmetries


def prepare_text(params: Params, folder: Path, log: Log) -> dict[str, Any]:
    """Write text/{split}.safetensors (tokens, labels), {split}.jsonl (cleaned text), tokenizer.json and meta.json."""
    cfg = params.data.text
    labeled = sources.text_source(params.data)
    parts = sources.text_splits(labeled, params.data, params.base.seed)
    split_texts = {s: [labeled.texts[i] for i in parts[s]] for s in sources.SPLITS}
    split_labels = {s: labeled.labels[parts[s]] for s in sources.SPLITS}
    tokenizer = Tokenizer.fit(split_texts["train"], cfg.vocab_size, cfg.min_frequency, cfg.max_length, cfg.lowercase,
                              cfg.oov_buckets)
    tokenizer.save(folder / TOKENIZER_FILE)
    save_preprocessing(folder, {"task": "text", "class_names": labeled.class_names,
                                "text": {"cleaning": "whitespace", "tokenizer": TOKENIZER_FILE,
                                         "max_length": cfg.max_length, "lowercase": cfg.lowercase}})
    lengths = {}
    for split in sources.SPLITS:
        tokens, lengths[split] = tokenizer.encode_with_lengths(split_texts[split])
        save_split(folder, split, {"tokens": tokens, "labels": torch.from_numpy(split_labels[split])})
        save_jsonl(folder / f"{split}.jsonl", [{"text": text, "label": int(label)}
                                               for text, label in zip(split_texts[split], split_labels[split])])
    counts = stats.sample_counts({s: len(split_labels[s]) for s in sources.SPLITS})
    description = sources.text_description(labeled, params.data)
    save_meta(folder, {"task": "text", "source": description, "num_classes": len(labeled.class_names),
                       "class_names": labeled.class_names, "vocab_size": tokenizer.vocab_size,
                       "max_length": cfg.max_length, "pad_id": PAD_ID, "unk_id": UNK_ID, "cls_id": CLS_ID,
                       "lowercase": cfg.lowercase, "oov_buckets": cfg.oov_buckets,
                       "counts": counts, "raw_rows": labeled.raw_rows,
                       "dropped_duplicates": labeled.dropped_duplicates})
    log(f"text ({description}): {labeled.raw_rows:,} rows, {labeled.dropped_duplicates:,} duplicates dropped -> "
        f"{split_counts_text(counts)}; vocabulary {len(tokenizer.vocab):,}"
        + (f" + {cfg.oov_buckets:,} hash buckets for other words" if cfg.oov_buckets else ""))
    return {"num_classes": len(labeled.class_names), "raw_rows": labeled.raw_rows,
            "dropped_duplicates": labeled.dropped_duplicates, "samples": counts,
            "per_class": {s: stats.class_counts(split_labels[s], labeled.class_names) for s in sources.SPLITS},
            "vocab_size": tokenizer.vocab_size, "max_length": cfg.max_length,
            "token_length": {s: stats.token_lengths(lengths[s], cfg.max_length) for s in sources.SPLITS}}


def prepare_all(params: Params, out_dir: str | Path, allow_download: bool = False, log: Log = print) -> dict[str, Any]:
    """Write ``<out_dir>/{classification,segmentation,text}`` and return the dataset statistics."""
    out_dir = Path(out_dir)
    return {
        "classification": prepare_classification(params, out_dir / "classification", allow_download, log),
        "segmentation": prepare_segmentation(params, out_dir / "segmentation", log),
        "text": prepare_text(params, out_dir / "text", log),
    }
