"""Build the three prepared datasets (classification, segmentation, text) and their statistics in one folder."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from trainlab.core import auto
from trainlab.core.atomic import atomic_dir, write_json
from trainlab.core.config import Params
from trainlab.core.errors import DataError
from trainlab.data import sources, stats
from trainlab.data.bad_files import BadFiles
from trainlab.data.inputs import ImageInput, SegmentationInput, TextInput
from trainlab.data.prepared import save_meta
from trainlab.data.preprocessing import ImagePolicy, image_record, save_preprocessing, text_record
from trainlab.data.sources import require_mask_classes
from trainlab.data.splits import require_every_class
from trainlab.data.tokenizer import CLS_ID, PAD_ID, UNK_ID, Tokenizer
from trainlab.data.writing import (
    write_labeled_arrays,
    write_labeled_files,
    write_masked_arrays,
    write_masked_files,
    write_text_split,
)

TOKENIZER_FILE = "tokenizer.json"
Log = Callable[[str], None]


def split_counts_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{split} {n:,}" for split, n in counts.items() if split != "total")


def stored_policy(size: dict[str, int]) -> ImagePolicy:
    """The policy of a source whose images all come at one size (embedded, torchvision): kept as they are."""
    return ImagePolicy(size["channels"], size["height"], size["width"])


def save_image_preprocessing(folder: Path, task: str, policy: ImagePolicy, class_names: list[str]) -> None:
    """preprocessing.json: how a raw image becomes this data's stored image, and the one record of its size
    (trainlab.data.preprocessing; meta.json does not repeat it)."""
    save_preprocessing(folder, image_record(task, class_names, policy))


def folder_stats(report: sources.FolderReport | None, policy: ImagePolicy | None, bad: BadFiles) -> dict[str, Any]:
    """A user folder's files (found, skipped, unreadable) and the resize policy, for reports/data_stats.json."""
    if report is None:
        return {}
    return {"files": {**report.record(), "unreadable": bad.record()}, "resize": policy.to_dict() if policy else {}}


def folder_log(report: sources.FolderReport | None, bad: BadFiles, policy: ImagePolicy | None) -> str:
    if report is None:
        return ""
    skipped_bad = f", {len(bad.found):,} unreadable (data.bad_images: skip)" if bad.found else ""
    resize = "" if policy is None or policy.resize == "none" else f"; resized ({policy.resize})"
    return f"; {report.summary()}{skipped_bad}{resize}"


def classification_choices(params: Params, data: sources.ImageSplits) -> dict[str, dict[str, Any]]:
    """What the images are, decided once here and recorded in meta.json: the augmentation that keeps their labels
    (classifier.augment auto: photo or shift), whether a mirror keeps the label (data.classification.hflip), and the
    stored size (image_size auto, for an image folder). Each as {"value", "why"}."""
    cfg = params.data.classification
    if data.kind is not None:
        kind, why = data.kind
    elif cfg.source in sources.MIRROR_SAFE_SOURCES:
        kind, why = "fixed", f"{cfg.source}: small images of one size, whose classes a mirror keeps"
    else:
        kind, why = "fixed", f"{cfg.source}: digits (a mirror or a heavy crop can change the class)"
    size = (size_value(data.policy), data.size_why) if data.policy is not None else None
    return auto.classification_data(cfg.hflip, cfg.image_size, kind, why, cfg.source in sources.MIRROR_SAFE_SOURCES,
                                    size)


def size_value(policy: ImagePolicy) -> int | str:
    return policy.height if policy.height == policy.width else f"{policy.height}x{policy.width}"


def choices_text(choices: dict[str, dict[str, Any]]) -> str:
    return "; ".join(f"{key} auto -> {c['value']} ({c['why']})" for key, c in choices.items())


def prepare_classification(params: Params, folder: Path, allow_download: bool, log: Log,
                           workers: int | None = None) -> dict[str, Any]:
    """Write classification/{split}.safetensors (or shards; images uint8 N,C,H,W; labels int64), meta.json and
    preprocessing.json; image files are decoded a shard at a time on all cores."""
    bad = BadFiles(params.data.bad_images, params.data.classification.root)
    data = sources.classification_splits(params.data, params.base.seed, allow_download, bad)
    labels = {}
    for split in sources.SPLITS:
        images = data.images[split]
        if isinstance(images, np.ndarray):
            written = write_labeled_arrays(folder, split, images, data.labels[split])
        else:
            written = write_labeled_files(folder, split, images, data.labels[split], ImageInput(data.policy), bad,
                                          workers)
        labels[split] = written.labels
    bad.check()
    for split in sources.SPLITS:  # what is left once unreadable files are skipped
        require_written(labels[split], data.class_names, folder, split, data.description)
    policy = data.policy or stored_policy(stats.image_size(data.images["train"]))
    size = policy.size()
    counts = stats.sample_counts({s: len(labels[s]) for s in sources.SPLITS})
    choices = classification_choices(params, data)
    hflip = choices["hflip"]["value"] if "hflip" in choices else params.data.classification.hflip
    save_image_preprocessing(folder, "classifier", policy, data.class_names)
    save_meta(folder, {"task": "classifier", "source": data.description, "num_classes": len(data.class_names),
                       "class_names": data.class_names, "counts": counts, "hflip": hflip,
                       "augment": choices["augment"]["value"], "auto": choices})
    log(f"classification ({data.description}): {split_counts_text(counts)}; "
        f"{len(data.class_names)} classes, {size['channels']}x{size['height']}x{size['width']}"
        + folder_log(data.folder, bad, data.policy))
    log(f"classification: {choices_text(choices)}")
    return {"num_classes": len(data.class_names), **size, "samples": counts,
            "per_class": {s: stats.class_counts(labels[s], data.class_names) for s in sources.SPLITS},
            **folder_stats(data.folder, data.policy, bad)}


def require_written(labels: np.ndarray, class_names: list[str], folder: Path, split: str, where: str) -> None:
    if len(labels) == 0:
        raise DataError(f"{where}: the {split} split is empty once unreadable files are left out")
    require_every_class(labels, class_names, f"{where} ({split} split, readable files)")


def prepare_segmentation(params: Params, folder: Path, log: Log, workers: int | None = None) -> dict[str, Any]:
    """Write segmentation/{split}.safetensors (or shards; images uint8 N,C,H,W; masks uint8 N,H,W), meta.json and
    preprocessing.json."""
    seg = params.data.segmentation
    bad = BadFiles(params.data.bad_images, seg.root)
    data = sources.segmentation_splits(params.data, params.base.seed, bad)
    num_classes = len(data.class_names)
    written = {}
    for split in sources.SPLITS:
        images = data.images[split]
        if isinstance(images, np.ndarray):
            written[split] = write_masked_arrays(folder, split, images, data.masks[split], num_classes)
        else:
            written[split] = write_masked_files(folder, split, images, SegmentationInput(data.policy), num_classes,
                                                bad, workers)
    bad.check()
    for split in sources.SPLITS:
        if written[split].count == 0:
            raise DataError(f"{data.description}: the {split} split is empty once unreadable files are left out")
    if data.folder is not None:
        require_mask_classes(sum(w.pixel_counts for w in written.values()), data.class_names, Path(seg.root))
    policy = data.policy or stored_policy(stats.image_size(data.images["train"]))
    size = policy.size()
    counts = stats.sample_counts({s: written[s].count for s in sources.SPLITS})
    symmetries = segmentation_symmetries(params)
    seg_choices = auto.segmentation_size(seg.image_size, (size_value(data.policy), data.size_why)
                                         if data.policy is not None else None)
    save_image_preprocessing(folder, "segmenter", policy, data.class_names)
    save_meta(folder, {"task": "segmenter", "source": data.description, "num_classes": num_classes,
                       "class_names": data.class_names, "counts": counts, "hflip": False,
                       "symmetries": symmetries, "auto": seg_choices})
    log(f"segmentation ({data.description}): {split_counts_text(counts)}; "
        f"{num_classes} classes, {size['channels']}x{size['height']}x{size['width']}; symmetries {symmetries}"
        + folder_log(data.folder, bad, data.policy))
    if seg_choices:
        log(f"segmentation: {choices_text(seg_choices)}")
    return {"num_classes": num_classes, **size, "samples": counts, **data.extra,
            "pixel_fraction": {s: stats.pixel_fractions_from_counts(written[s].pixel_counts, data.class_names)
                               for s in sources.SPLITS},
            **folder_stats(data.folder, data.policy, bad)}


def segmentation_symmetries(params: Params) -> str:
    """The label-preserving transforms the segmentation data allows: the user's data.segmentation.symmetries; none
    for the embedded digit canvases (a mirrored or rotated digit is another digit, or none)."""
    seg = params.data.segmentation
    if seg.source == "embedded" and seg.symmetries != "none":
        raise DataError(f"data.segmentation.symmetries is {seg.symmetries!r}, but the embedded digit canvases allow "
                        "no flips or rotations (a mirrored digit is not the same digit): set it to none")
    return seg.symmetries


def prepare_text(params: Params, folder: Path, log: Log) -> dict[str, Any]:
    """Write text/{split}.safetensors (tokens, labels), {split}.jsonl (cleaned text), tokenizer.json and meta.json;
    data.text.max_length auto is resolved here from the training split's lengths, printed and recorded (meta.json
    "auto"), and every later reader takes the resolved value from meta.json or tokenizer.json (the one the input
    contract, trainlab.data.inputs.TextInput, reads)."""
    cfg = params.data.text
    labeled = sources.text_source(params.data)
    parts = sources.text_splits(labeled, params.data, params.base.seed)
    split_texts = {s: [labeled.texts[i] for i in parts[s]] for s in sources.SPLITS}
    split_labels = {s: labeled.labels[parts[s]] for s in sources.SPLITS}
    tokenizer = Tokenizer.fit(split_texts["train"], cfg.vocab_size, cfg.min_frequency, cfg.max_length, cfg.lowercase,
                              cfg.oov_buckets)
    max_length = tokenizer.max_length  # data.text.max_length, or what its auto resolved to
    choices = ({"max_length": {"value": max_length, "why": tokenizer.max_length_why}}
               if tokenizer.max_length_why else {})
    tokenizer.save(folder / TOKENIZER_FILE)
    save_preprocessing(folder, text_record(labeled.class_names, TOKENIZER_FILE))
    contract = TextInput(tokenizer)  # the texts' one path to token ids: predict and the MLflow model take it too
    lengths = {s: write_text_split(folder, s, split_texts[s], split_labels[s], contract) for s in sources.SPLITS}
    counts = stats.sample_counts({s: len(split_labels[s]) for s in sources.SPLITS})
    description = sources.text_description(labeled, params.data)
    save_meta(folder, {"task": "text", "source": description, "num_classes": len(labeled.class_names),
                       "class_names": labeled.class_names, "vocab_size": tokenizer.vocab_size,
                       "max_length": max_length, "pad_id": PAD_ID, "unk_id": UNK_ID, "cls_id": CLS_ID,
                       "lowercase": cfg.lowercase, "oov_buckets": cfg.oov_buckets,
                       "counts": counts, "raw_rows": labeled.raw_rows,
                       "dropped_duplicates": labeled.dropped_duplicates, "auto": choices})
    log(f"text ({description}): {labeled.raw_rows:,} rows, {labeled.dropped_duplicates:,} duplicates dropped -> "
        f"{split_counts_text(counts)}; vocabulary {len(tokenizer.vocab):,}"
        + (f" + {cfg.oov_buckets:,} hash buckets for other words" if cfg.oov_buckets else ""))
    for key, choice in choices.items():
        log(f"text: {key} auto -> {choice['value']} ({choice['why']})")
    return {"num_classes": len(labeled.class_names), "raw_rows": labeled.raw_rows,
            "dropped_duplicates": labeled.dropped_duplicates, "samples": counts,
            "per_class": {s: stats.class_counts(split_labels[s], labeled.class_names) for s in sources.SPLITS},
            "vocab_size": tokenizer.vocab_size, "max_length": max_length,
            **({"auto": choices} if choices else {}),
            "token_length": {s: stats.token_lengths(lengths[s], max_length) for s in sources.SPLITS}}


def prepare_all(params: Params, out_dir: str | Path, allow_download: bool = False, log: Log = print,
                workers: int | None = None) -> dict[str, Any]:
    """Write ``<out_dir>/{classification,segmentation,text}`` and return the dataset statistics; image files are
    decoded on `workers` threads (default: every available core; the bytes written do not depend on it)."""
    out_dir = Path(out_dir)
    return {
        "classification": prepare_classification(params, out_dir / "classification", allow_download, log, workers),
        "segmentation": prepare_segmentation(params, out_dir / "segmentation", log, workers),
        "text": prepare_text(params, out_dir / "text", log),
    }


def log_line(message: str) -> None:
    print(f"prepare: {message}", flush=True)


def run(params: Params, out_dir: Path, stats_file: Path, allow_download: bool = False, log: Log = log_line
        ) -> dict[str, Any]:
    """The prepare stage: `out_dir` (replaced whole on success) and the statistics file, inside the stage's MLflow
    run (what it read: the data section and the seed; the statistics as metrics and an artifact)."""
    from trainlab.core.flatten import numbers
    from trainlab.tracking.runs import start_run

    started = time.perf_counter()
    with start_run(params, stage="prepare") as tracker:
        tracker.log_params({"data": params.data.model_dump(mode="json"), "base": {"seed": params.base.seed}})
        with atomic_dir(out_dir) as staging:
            stats = prepare_all(params, staging, allow_download=allow_download, log=log)
        write_json(stats_file, stats)
        seconds = time.perf_counter() - started
        tracker.log_metrics({**numbers(stats, safe_keys=True), "prepare_seconds": round(seconds, 3)})
        tracker.log_dict(stats, "data_stats.json")
    log(f"wrote {out_dir} and {stats_file} in {seconds:.1f} s")
    return stats
