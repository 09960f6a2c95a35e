"""Evaluate the three trained models on their test splits: TTA, torchmetrics metrics, confusion data, pictures."""

from __future__ import annotations

import copy
import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import (
    MulticlassAccuracy,
    MulticlassConfusionMatrix,
    MulticlassF1Score,
    MulticlassJaccardIndex,
    MulticlassPrecision,
    MulticlassRecall,
)

from trainlab.config import Params
from trainlab.engine.metrics import update_in_chunks
from trainlab.errors import CheckpointError, DataError
from trainlab.runtime import Runtime

# models/<task> -> data/prepared/<folder>
DATA_FOLDERS = {"classifier": "classification", "segmenter": "segmentation", "text": "text"}
REQUIRED_TENSORS = {"classifier": ("images", "labels"), "segmenter": ("images", "masks"), "text": ("tokens", "labels")}
FEW_EXAMPLES = 4  # segmentation overlays, attention maps and feature maps show at most this many test samples
FEATURE_CHANNELS = 4  # channels shown per feature-map layer

# Output files under reports/evaluate (declared one by one in dvc.yaml). metrics.json holds each model's headline
# numbers (what `dvc exp show` compares); the per-class figures are plot data, one CSV per task.
METRICS_FILE = "metrics.json"
CONFUSION_FILES = {"classifier": "classifier_confusion.csv", "text": "text_confusion.csv"}
PER_CLASS_FILES = {"classifier": "classifier_per_class.csv", "segmenter": "segmenter_per_class.csv",
                   "text": "text_per_class.csv"}
CONFUSION_MATRICES_FILE = "confusion_matrices.json"
PICTURE_FILES = {"misclassified": "misclassified.png", "segmentation": "segmentation_overlays.png",
                 "attention": "attention.png", "feature_maps": "feature_maps.png", "ngrams": "text_ngrams.png"}
TOP_NGRAMS = 12  # n-grams per class in the n-gram bag's picture
OUTPUT_FILES = (METRICS_FILE, *CONFUSION_FILES.values(), *PER_CLASS_FILES.values(), CONFUSION_MATRICES_FILE,
                *PICTURE_FILES.values())


# --------------------------------------------------------------------------------------------------------------------
# Loading and checking a task's model against its test data


@dataclass
class TaskInputs:
    """One task's trained model and test split, checked against each other."""

    name: str
    model: nn.Module
    config: dict
    info: dict
    meta: dict
    test: dict[str, torch.Tensor]  # on the CPU
    model_dir: Path
    data_dir: Path
    extra: dict[str, Any] = field(default_factory=dict)  # text: tokenizer vocab, baseline.json


def load_model(folder: Path, name: str, device: torch.device):
    """load_saved_model with every error naming a file inside `folder`."""
    from trainlab.saved import load_saved_model

    if not folder.is_dir():
        raise CheckpointError(f"{folder}: model folder not found (run `dvc repro train_{name}` first)")
    try:
        return load_saved_model(folder, name, device)
    except CheckpointError as exc:
        if str(folder) in str(exc):
            raise
        raise CheckpointError(f"{folder / 'config.json'}: {exc}") from None


def load_inputs(name: str, data_root: Path, models_root: Path, device: torch.device) -> TaskInputs:
    """Read models/<name> and the test split of its prepared data; a mismatch is a clear error naming the files."""
    from trainlab.data.prepared import load_meta, load_split, split_path

    data_dir, model_dir = Path(data_root) / DATA_FOLDERS[name], Path(models_root) / name
    meta = load_meta(data_dir)
    saved = load_model(model_dir, name, device)
    test = load_split(data_dir, "test")
    inputs = TaskInputs(name, saved.model, saved.config, saved.info, meta, test, model_dir, data_dir)
    check_model_matches_meta(inputs)
    check_test_tensors(inputs, split_path(data_dir, "test"))
    if name == "text":
        inputs.extra = load_text_extras(inputs)
    return inputs


def expected_config(name: str, meta: dict, meta_file: Path) -> dict[str, Any]:
    """The model config values that the prepared data's meta.json implies."""
    keys = {"num_classes": "num_classes"}
    keys.update({"vocab_size": "vocab_size", "max_length": "max_length"} if name == "text"
                else {"in_channels": "channels"})
    missing = [k for k in keys.values() if k not in meta]
    if missing:
        raise DataError(f"{meta_file}: missing {', '.join(missing)} (rerun `dvc repro prepare`)")
    return {config_key: meta[meta_key] for config_key, meta_key in keys.items()}


def check_model_matches_meta(inputs: TaskInputs) -> None:
    meta_file, config_file = inputs.data_dir / "meta.json", inputs.model_dir / "config.json"
    for key, want in expected_config(inputs.name, inputs.meta, meta_file).items():
        have = inputs.config.get(key)
        if have != want:
            raise CheckpointError(
                f"{config_file}: the model has {key}={have} but {meta_file} says {want}; the model was not "
                f"trained on this data (rerun `dvc repro train_{inputs.name}`)")


def check_test_tensors(inputs: TaskInputs, path: Path) -> None:
    """Required tensors are present, non-empty, shaped for the model, with labels inside the class range."""
    test, config = inputs.test, inputs.config
    missing = [k for k in REQUIRED_TENSORS[inputs.name] if k not in test]
    if missing:
        raise DataError(f"{path}: missing tensor(s) {', '.join(missing)} for the {inputs.name} (rerun prepare)")
    first, target = (test[k] for k in REQUIRED_TENSORS[inputs.name])
    if first.shape[0] == 0 or first.shape[0] != target.shape[0]:
        raise DataError(f"{path}: empty test split, or inputs and targets differ in length")
    if inputs.name == "text":
        if first.ndim != 2 or first.shape[1] > config["max_length"]:
            raise DataError(f"{path}: tokens {tuple(first.shape)} do not fit max_length {config['max_length']}")
        check_range(first, config["vocab_size"], path, "token ids", "vocab_size")
    elif first.ndim != 4 or first.shape[1] != config["in_channels"]:
        raise DataError(f"{path}: images {tuple(first.shape)} are not (N, {config['in_channels']}, H, W)")
    check_range(target, config["num_classes"], path, REQUIRED_TENSORS[inputs.name][1], "num_classes")


def check_range(values: torch.Tensor, limit: int, path: Path, what: str, limit_name: str) -> None:
    low, high = int(values.min()), int(values.max())
    if low < 0 or high >= limit:
        raise DataError(f"{path}: {what} range {low}..{high} does not fit the model's {limit_name} {limit}")


def load_text_extras(inputs: TaskInputs) -> dict[str, Any]:
    """The tokenizer vocabulary (checked against the model's copy) and the TF-IDF baseline's test results."""
    from trainlab.data.tokenizer import Tokenizer
    from trainlab.saved import read_json

    data_file, model_file = inputs.data_dir / "tokenizer.json", inputs.model_dir / "tokenizer.json"
    vocab = Tokenizer.load(data_file).vocab
    if model_file.is_file() and Tokenizer.load(model_file).vocab != vocab:
        raise CheckpointError(f"{model_file}: the model's vocabulary differs from {data_file}; the model was not "
                              "trained on this data (rerun `dvc repro train_text`)")
    baseline_file = inputs.model_dir / "baseline.json"
    baseline = read_json(baseline_file)
    if not all(isinstance(baseline.get(k), (int, float)) for k in ("accuracy", "macro_f1")):
        raise CheckpointError(f"{baseline_file}: expected numbers 'accuracy' and 'macro_f1'")
    return {"vocab": vocab, "baseline": baseline}


# --------------------------------------------------------------------------------------------------------------------
# Computing: predictions with optional TTA (flip or shift), metrics


def classification_metrics(num_classes: int) -> MetricCollection:
    """Accuracy, macro-F1, per-class precision/recall and the confusion matrix (rows actual, columns predicted)."""
    kw = {"num_classes": num_classes, "validate_args": False}
    return MetricCollection({
        "accuracy": MulticlassAccuracy(average="micro", **kw),
        "macro_f1": MulticlassF1Score(average="macro", **kw),
        "precision": MulticlassPrecision(average="none", **kw),
        "recall": MulticlassRecall(average="none", **kw),
        "confusion": MulticlassConfusionMatrix(**kw),
    })


def segmentation_metrics(num_classes: int) -> MetricCollection:
    """Mean and per-class IoU, mean and per-class Dice (pixel F1 over the whole split), pixel accuracy."""
    kw = {"num_classes": num_classes, "validate_args": False}
    return MetricCollection({
        "mean_iou": MulticlassJaccardIndex(average="macro", **kw),
        "iou": MulticlassJaccardIndex(average="none", **kw),
        "mean_dice": MulticlassF1Score(average="macro", **kw),
        "dice": MulticlassF1Score(average="none", **kw),
        "pixel_accuracy": MulticlassAccuracy(average="micro", **kw),
    })


SHIFTS = ((1, 0), (-1, 0), (0, 1), (0, -1))  # (dy, dx) one-pixel moves of the "shift" TTA


def tta_mode(meta: dict[str, Any], name: str) -> str:
    """The label-preserving TTA for this data: "flip" where meta.json allows mirroring, else "shift" (digits)."""
    return "none" if name == "text" else "flip" if meta.get("hflip") else "shift"


def predict_logits(model: nn.Module, x: torch.Tensor, tta: str = "none", dense: bool = False) -> torch.Tensor:
    """Float logits. `tta` "flip" averages in the horizontal mirror; "shift" the four one-pixel shifts (for data a
    mirror would relabel, like digits). Dense logits are moved back (un-flipped, un-shifted) before averaging."""
    logits = model(x).float()
    if tta == "flip":
        flipped = model(x.flip(-1)).float()
        return (logits + (flipped.flip(-1) if dense else flipped)) / 2
    if tta == "shift":
        for dy, dx in SHIFTS:
            moved = model(torch.roll(x, (dy, dx), (-2, -1))).float()
            logits = logits + (torch.roll(moved, (-dy, -dx), (-2, -1)) if dense else moved)
        return logits / (1 + len(SHIFTS))
    return logits


def eval_task(name: str, model: nn.Module, num_classes: int):
    """The engine Task for `name` (its batch transform turns uint8 images into normalised floats)."""
    from trainlab import tasks

    builders = {"classifier": tasks.classification_task, "segmenter": tasks.segmentation_task,
                "text": tasks.text_task}
    return builders[name](model, num_classes)


@dataclass
class Predictions:
    """What one pass over a test split gives: metric values (on the device) and the predictions kept."""

    metrics: dict[str, torch.Tensor]
    predicted: torch.Tensor  # (N,) labels for classifier/text; the first few (K, H, W) masks for the segmenter


@torch.inference_mode()
def run_test_split(inputs: TaskInputs, runtime: Runtime, batch_size: int, tta: bool,
                   max_device_mb: int = 2048, keep: int = FEW_EXAMPLES) -> Predictions:
    """Predict the whole test split batch by batch; metrics accumulate on the device (no per-batch sync)."""
    from trainlab.engine.batches import make_batches

    n_classes, dense = inputs.config["num_classes"], inputs.name == "segmenter"
    task = eval_task(inputs.name, inputs.model, n_classes)
    metrics = (segmentation_metrics if dense else classification_metrics)(n_classes).to(runtime.device)
    batches = make_batches(inputs.test, batch_size, runtime.device, seed=0, shuffle=False, drop_last=False,
                           max_device_mb=max_device_mb)
    inputs.model.eval()
    kept: list[torch.Tensor] = []
    for batch in batches.epoch(0):
        x, y = task.prepare_batch(batch, False, None)
        if task.conv and runtime.channels_last and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with runtime.autocast():
            logits = predict_logits(inputs.model, x, tta_mode(inputs.meta, inputs.name) if tta else "none", dense)
        predicted = task.predict(logits)
        update_in_chunks(metrics, predicted, y, n_classes)
        if not dense or sum(len(p) for p in kept) < keep:
            kept.append(predicted if not dense else predicted[:keep])
    predicted = torch.cat(kept)
    return Predictions(metrics.compute(), predicted[:keep] if dense else predicted)


# --------------------------------------------------------------------------------------------------------------------
# Computing: what the pictures show


def feature_layers(model: nn.Module, x: torch.Tensor, count: int = 2) -> list[str]:
    """A few graph nodes of a classifier to show as feature maps: an early and a late activation with a spatial map."""
    from torchvision.models.feature_extraction import (
        create_feature_extractor,
        get_graph_node_names,
    )

    nodes = get_graph_node_names(model)[1][1:-1]  # eval graph, without the input and the logits
    shapes = {k: v.shape for k, v in create_feature_extractor(model, nodes)(x[:1]).items()}
    maps = [n for n in nodes if len(shapes[n]) == 4]
    spatial = [n for n in maps if min(shapes[n][-2:]) >= 3] or maps
    activations = [n for n in spatial if n.rsplit(".", 1)[-1].startswith("relu")] or spatial
    if len(activations) <= count:
        return activations
    picks = torch.linspace(0, len(activations) - 1, count).round().long().tolist()
    return [activations[i] for i in picks]


@torch.inference_mode()
def feature_maps(model: nn.Module, images: torch.Tensor, device: torch.device) -> dict[str, torch.Tensor]:
    """The classifier's intermediate feature maps for a few uint8 images: {node name: (K, C, h, w)} on the CPU."""
    from torchvision.models.feature_extraction import create_feature_extractor

    from trainlab.tasks import to_float_images

    model.eval()
    x = to_float_images(images.to(device))
    layers = feature_layers(model, x)
    features = create_feature_extractor(model, layers)(x)
    return {name: features[name][:, :FEATURE_CHANNELS].float().cpu() for name in layers}


@torch.inference_mode()
def attention_maps(model: nn.Module, tokens: torch.Tensor, pad_id: int, device: torch.device) -> list[torch.Tensor]:
    """The last layer's attention, averaged over heads, for each text: (length, length) over its real tokens."""
    model.eval()
    _, attentions = model(tokens.to(device), return_attention=True)
    last = attentions[-1].float().mean(dim=1).cpu()  # (K, L, L)
    lengths = (tokens != pad_id).sum(dim=1).clamp(min=1).tolist()
    return [att[:n, :n] for att, n in zip(last, lengths)]


def decode_tokens(ids: torch.Tensor, vocab: list[str], pad_id: int) -> list[str]:
    """Token strings of one id sequence, [CLS] and [UNK] kept, padding dropped; hashed words read ``<oov:k>``."""
    from trainlab.data.tokenizer import token_name

    return [token_name(vocab, i) for i in ids.tolist() if i != pad_id]


@torch.inference_mode()
def top_ngrams(model: nn.Module, tokens: torch.Tensor, vocab: list[str], class_count: int,
               top: int = TOP_NGRAMS) -> list[list[tuple[str, float]]]:
    """Per class, the n-grams of `tokens` (test texts) that add most to that class's logit in an n-gram bag, with
    their weights. N-grams are named by their words; two n-grams sharing a hash bucket share a weight."""
    from trainlab.data.tokenizer import token_name
    from trainlab.models.ngram_bag import ngram_ids

    model = copy.deepcopy(model).float().cpu().eval()  # a copy: the caller's model keeps its device and dtype
    tokens = tokens.cpu()
    bag = ngram_ids(tokens, model.vocab_size, model.ngrams, model.buckets, model.pad_id)
    names: dict[int, str] = {}
    length = tokens.size(1)
    for row, bag_row in zip(tokens.tolist(), bag.tolist()):
        # bag_row holds the words, then the 2-grams from each position, then the 3-grams, ... (see ngram_ids)
        offset = 0
        for n in range(1, model.ngrams + 1):
            width = length - n + 1
            for i in range(max(width, 0)):
                bag_id = bag_row[offset + i]
                if bag_id != model.pad_id and bag_id not in names:
                    names[bag_id] = " ".join(token_name(vocab, t) for t in row[i:i + n])
            offset += max(width, 0)
    ids = torch.tensor(sorted(names), dtype=torch.long)
    if len(ids) == 0:
        return [[] for _ in range(class_count)]
    scores = model.ngram_scores(ids)  # (K, classes)
    # what sets a class apart: its score minus the mean over classes (a constant shift of all classes changes nothing)
    contrast = scores - scores.mean(dim=1, keepdim=True)
    out = []
    for c in range(class_count):
        values, order = contrast[:, c].topk(min(top, len(ids)))
        out.append([(names[int(ids[i])], round(float(v), 4)) for v, i in zip(values, order)])
    return out


# --------------------------------------------------------------------------------------------------------------------
# Computing: JSON-ready summaries


def class_keys(names: list[str]) -> list[str]:
    """Metric-key-safe, unique names for the classes (letters, digits, _ and -)."""
    keys: list[str] = []
    for i, name in enumerate(names):
        key = re.sub(r"[^\w\-]+", "_", str(name)).strip("_") or str(i)
        keys.append(key if key not in keys else f"{key}_{i}")
    return keys


def class_names(meta: dict, num_classes: int) -> list[str]:
    names = [str(n) for n in meta.get("class_names") or []]
    return names if len(names) == num_classes else [str(i) for i in range(num_classes)]


def per_class(values: torch.Tensor, keys: list[str]) -> dict[str, float]:
    return {k: round(float(v), 6) for k, v in zip(keys, values.tolist())}


def summarize(name: str, metrics: dict[str, torch.Tensor], keys: list[str], samples: int) -> dict[str, Any]:
    """The metrics.json section of one task: scalars, then per-class dicts, then the test size."""
    values = {k: v.detach().cpu() for k, v in metrics.items()}
    if name == "segmenter":
        scalars, vectors = ("mean_iou", "mean_dice", "pixel_accuracy"), ("iou", "dice")
    else:
        scalars, vectors = ("accuracy", "macro_f1"), ("precision", "recall")
    out: dict[str, Any] = {k: round(float(values[k]), 6) for k in scalars}
    out.update({k: per_class(values[k], keys) for k in vectors})
    out["test_samples"] = samples
    return out


def confusion_rows(actual: torch.Tensor, predicted: torch.Tensor, names: list[str]) -> list[dict[str, str]]:
    """One {actual, predicted} row per test sample, with class names (DVC's confusion template)."""
    return [{"actual": names[a], "predicted": names[p]} for a, p in zip(actual.tolist(), predicted.tolist())]


def flat_metrics(metrics: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """Nested numeric metrics as dotted keys (the names `dvc metrics show` prints), for MLflow."""
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            flat.update(flat_metrics(value, dotted))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[dotted] = float(value)
    return flat


# --------------------------------------------------------------------------------------------------------------------
# The three tasks


@dataclass
class TaskReport:
    """One task's metrics section, confusion data and picture inputs."""

    metrics: dict[str, Any]
    confusion: dict[str, Any] | None = None  # {"labels", "matrix"[, "baseline_matrix"]}
    rows: list[dict[str, str]] | None = None
    pictures: dict[str, Any] = field(default_factory=dict)


def evaluate_labels(inputs: TaskInputs, runtime: Runtime, params: Params) -> tuple[TaskReport, torch.Tensor]:
    """Classifier or text model: metrics, confusion matrix and rows; also returns the predictions (CPU)."""
    cfg, n = params.evaluate, inputs.config["num_classes"]
    result = run_test_split(inputs, runtime, cfg.batch_size, cfg.tta, params.base.data_on_device_max_mb)
    names = class_names(inputs.meta, n)
    labels, predicted = inputs.test["labels"], result.predicted.cpu()
    report = TaskReport(summarize(inputs.name, result.metrics, class_keys(names), len(labels)),
                        {"labels": names, "matrix": result.metrics["confusion"].cpu().tolist()},
                        confusion_rows(labels, predicted, names))
    return report, predicted


def evaluate_classifier(inputs: TaskInputs, runtime: Runtime, params: Params) -> TaskReport:
    report, predicted = evaluate_labels(inputs, runtime, params)
    images, labels = inputs.test["images"], inputs.test["labels"]
    wrong = (predicted != labels).nonzero().flatten()
    shown = wrong[:params.evaluate.n_examples]
    few = images[:min(FEW_EXAMPLES, params.evaluate.n_examples)]
    report.pictures = {
        "misclassified": {"images": images[shown], "actual": labels[shown], "predicted": predicted[shown],
                          "indices": shown, "class_names": report.confusion["labels"], "total_wrong": len(wrong),
                          "total": len(labels)},
        "feature_maps": {"images": few, "features": feature_maps(inputs.model, few, runtime.device)},
    }
    return report


def evaluate_segmenter(inputs: TaskInputs, runtime: Runtime, params: Params) -> TaskReport:
    cfg, n = params.evaluate, inputs.config["num_classes"]
    keep = min(FEW_EXAMPLES, cfg.n_examples)
    result = run_test_split(inputs, runtime, cfg.batch_size, cfg.tta, params.base.data_on_device_max_mb, keep)
    names = class_names(inputs.meta, n)
    metrics = summarize("segmenter", result.metrics, class_keys(names), len(inputs.test["masks"]))
    pictures = {"segmentation": {"images": inputs.test["images"][:keep], "masks": inputs.test["masks"][:keep].long(),
                                 "predicted": result.predicted.cpu(), "class_names": names}}
    return TaskReport(metrics, pictures=pictures)


def evaluate_text(inputs: TaskInputs, runtime: Runtime, params: Params) -> TaskReport:
    report, predicted = evaluate_labels(inputs, runtime, params)
    baseline = inputs.extra["baseline"]
    report.metrics["baseline_accuracy"] = round(float(baseline["accuracy"]), 6)
    report.metrics["baseline_macro_f1"] = round(float(baseline["macro_f1"]), 6)
    if baseline.get("confusion_matrix") is not None:
        report.confusion["baseline_matrix"] = baseline["confusion_matrix"]
    keep = min(FEW_EXAMPLES, params.evaluate.n_examples)
    tokens, pad_id = inputs.test["tokens"][:keep], inputs.config.get("pad_id", 0)
    names = report.confusion["labels"]
    # each model shows what it has: attention maps (Transformer) or its most weighted n-grams (n-gram bag); the
    # other picture says why it is empty, so that both declared outputs exist whatever text.arch is
    if inputs.config.get("arch") == "ngram_bag":
        report.pictures = {
            "ngrams": {"class_names": names, "ngrams": top_ngrams(inputs.model, inputs.test["tokens"],
                                                                  inputs.extra["vocab"], len(names))},
            "attention": {"tokens": [], "attentions": [], "empty": "The n-gram bag model has no attention; "
                          "its most weighted n-grams per class are in text_ngrams.png."}}
        return report
    report.pictures = {"attention": {
        "tokens": [decode_tokens(t, inputs.extra["vocab"], pad_id) for t in tokens],
        "attentions": attention_maps(inputs.model, tokens, pad_id, runtime.device),
        "titles": [f"true {names[a]}, predicted {names[p]}"
                   for a, p in zip(inputs.test["labels"][:keep].tolist(), predicted[:keep].tolist())],
    }, "ngrams": {"class_names": names, "ngrams": [], "empty": "The Transformer has no n-gram weights; its "
                  "attention maps are in attention.png."}}
    return report


EVALUATORS = {"classifier": evaluate_classifier, "segmenter": evaluate_segmenter, "text": evaluate_text}


# --------------------------------------------------------------------------------------------------------------------
# The evaluate stage: load all, compute all, then write reports/evaluate whole and log one MLflow run


def write_rows(path: Path, rows: list[dict[str, str]]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["actual", "predicted"])
        writer.writeheader()
        writer.writerows(rows)


def write_pictures(folder: Path, pictures: dict[str, Any]) -> None:
    from trainlab import pictures as draw

    figures = {
        "misclassified": lambda p: draw.misclassified_grid(**p),
        "segmentation": lambda p: draw.segmentation_overlays(**p),
        "attention": lambda p: draw.attention_heatmaps(**p),
        "feature_maps": lambda p: draw.feature_map_grid(**p),
        "ngrams": lambda p: draw.ngram_bars(**p),
    }
    for key, data in pictures.items():
        draw.save_figure(figures[key](data), folder / PICTURE_FILES[key])


def headline(metrics: dict[str, Any]) -> dict[str, Any]:
    """A task's metrics without the per-class dicts: what metrics.json keeps."""
    return {k: v for k, v in metrics.items() if not isinstance(v, dict)}


def per_class_rows(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per class with its per-class figures (precision/recall, or IoU/Dice), for `dvc plots`."""
    vectors = {k: v for k, v in metrics.items() if isinstance(v, dict)}
    classes = list(next(iter(vectors.values()), {}))
    return [{"class": c, **{k: v[c] for k, v in vectors.items()}} for c in classes]


def write_reports(folder: Path, reports: dict[str, TaskReport]) -> dict[str, Any]:
    """metrics.json, the per-class and confusion CSVs, the matrices, and the PNGs, all into `folder`; returns
    every metric (per-class figures included)."""
    metrics = {name: report.metrics for name, report in reports.items()}
    (folder / METRICS_FILE).write_text(json.dumps({k: headline(v) for k, v in metrics.items()}, indent=2) + "\n")
    for name, filename in PER_CLASS_FILES.items():
        rows = per_class_rows(metrics[name])
        with open(folder / filename, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    matrices = {name: r.confusion for name, r in reports.items() if r.confusion is not None}
    (folder / CONFUSION_MATRICES_FILE).write_text(json.dumps(matrices, indent=2) + "\n")
    for name, filename in CONFUSION_FILES.items():
        write_rows(folder / filename, reports[name].rows)
    write_pictures(folder, {k: v for r in reports.values() for k, v in r.pictures.items()})
    return metrics


def lineage_tags(inputs: dict[str, TaskInputs], tracker: Any = None) -> dict[str, str]:
    """`<task>_model_md5` and `<task>_run_id` of each evaluated model: the newest training run in the tracker's
    experiment tagged with that md5 (it also finds the run of a model DVC restored from its cache), else the
    `run_id` an older models/<task>/info.json recorded, else 'unknown'."""
    from trainlab.tracking import file_md5

    tags: dict[str, str] = {}
    for name, item in inputs.items():
        md5 = file_md5(item.model_dir / "model.safetensors")
        run_id = _training_run(tracker, name, md5) if getattr(tracker, "run_id", "") else None
        tags[f"{name}_model_md5"] = md5
        tags[f"{name}_run_id"] = str(run_id or item.info.get("run_id") or "unknown")
    return tags


def _training_run(tracker: Any, name: str, md5: str) -> str | None:
    from trainlab.tracking import mlflow_client

    runs = mlflow_client(tracker.tracking_uri).search_runs(
        [tracker.experiment_id], filter_string=f"tags.model_md5 = '{md5}' and tags.stage = 'train_{name}'",
        order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0].info.run_id if runs else None


def log_evaluation(params: Params, folder: Path, metrics: dict[str, Any], inputs: dict[str, TaskInputs],
                   runtime: Runtime) -> str:
    """One MLflow run for the evaluation (the test splits as its dataset inputs), tagged with the training runs it
    evaluated; returns its id."""
    from trainlab.tracking import split_inputs, start_run

    datasets = [d for i in inputs.values() for d in split_inputs(i.data_dir, ("test",))]
    with start_run(params, stage="evaluate", device=str(runtime.device), datasets=datasets) as tracker:
        tracker.set_tags(lineage_tags(inputs, tracker))
        tracker.log_params({"evaluate": params.evaluate.model_dump(), "base.seed": params.base.seed})
        tracker.set_tags(runtime.describe())
        tracker.log_metrics(flat_metrics(metrics))
        for path in sorted(folder.iterdir()):
            tracker.log_artifact(path)
    return tracker.run_id


def run_evaluation(params: Params, data_root: str | Path, models_root: str | Path, out_dir: str | Path,
                   runtime: Runtime | None = None) -> dict[str, Any]:
    """The evaluate stage: every check before any output; `out_dir` is replaced whole only on success."""
    from trainlab.atomic import atomic_dir
    from trainlab.runtime import resolve_runtime

    runtime = runtime or resolve_runtime(params.base)
    inputs = {name: load_inputs(name, Path(data_root), Path(models_root), runtime.device) for name in EVALUATORS}
    reports = {name: EVALUATORS[name](inputs[name], runtime, params) for name in EVALUATORS}
    with atomic_dir(out_dir) as staging:
        metrics = write_reports(staging, reports)
        if params.tracking.enabled:
            log_evaluation(params, staging, metrics, inputs, runtime)
    return metrics


def describe(metrics: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    c, s, t = metrics["classifier"], metrics["segmenter"], metrics["text"]
    return "\n".join([
        f"classifier: accuracy {c['accuracy']:.4f}, macro-F1 {c['macro_f1']:.4f} ({c['test_samples']} test images)",
        f"segmenter: mean IoU {s['mean_iou']:.4f}, mean Dice {s['mean_dice']:.4f}, "
        f"pixel accuracy {s['pixel_accuracy']:.4f} ({s['test_samples']} test canvases)",
        f"text: accuracy {t['accuracy']:.4f}, macro-F1 {t['macro_f1']:.4f}; TF-IDF baseline accuracy "
        f"{t['baseline_accuracy']:.4f}, macro-F1 {t['baseline_macro_f1']:.4f} ({t['test_samples']} test texts)",
    ])
