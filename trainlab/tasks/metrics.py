"""The torchmetrics collections of training (validation) and of evaluation, and metric-name-safe class keys."""

from __future__ import annotations

import re


def metric_collection(num_classes: int, *names: str, class_names: list[str] | None = None):
    """A torchmetrics MetricCollection of the named metrics (imported here: at the first evaluation, not start-up).
    "iou" and "dice" are per class: one scalar each, named ``iou_<class>`` / ``dice_<class>``."""
    from torchmetrics import MetricCollection
    from torchmetrics.classification import (
        MulticlassAccuracy,
        MulticlassF1Score,
        MulticlassJaccardIndex,
    )
    from torchmetrics.wrappers import ClasswiseWrapper

    keys = class_metric_keys(class_names, num_classes)
    # no argument checks: the loss computed beside every update already fails on a label out of range, and the
    # checks cost 0.2 s per validation of the default segmenter (a third of its pass)
    kw = {"num_classes": num_classes, "validate_args": False}
    made = {
        "accuracy": lambda: MulticlassAccuracy(average="micro", **kw),
        "pixel_accuracy": lambda: MulticlassAccuracy(average="micro", **kw),
        "macro_f1": lambda: MulticlassF1Score(average="macro", **kw),
        "mean_iou": lambda: MulticlassJaccardIndex(average="macro", **kw),
        "mean_dice": lambda: MulticlassF1Score(average="macro", **kw),
        "iou": lambda: ClasswiseWrapper(MulticlassJaccardIndex(average="none", **kw), keys, prefix="iou_"),
        "dice": lambda: ClasswiseWrapper(MulticlassF1Score(average="none", **kw), keys, prefix="dice_"),
    }
    return MetricCollection({name: made[name]() for name in names}, compute_groups=False)


def class_metric_keys(class_names: list[str] | None, num_classes: int) -> list[str]:
    """Metric-name-safe, unique class names (letters, digits, _ and -); class indices where names are missing."""
    names = [str(n) for n in class_names] if class_names and len(class_names) == num_classes else \
        [str(i) for i in range(num_classes)]
    keys: list[str] = []
    for i, name in enumerate(names):
        key = re.sub(r"[^\w\-]+", "_", name).strip("_") or str(i)
        keys.append(key if key not in keys else f"{key}_{i}")
    return keys


def classification_metrics(num_classes: int):
    """Evaluation: accuracy, macro-F1, per-class precision/recall and the confusion matrix (rows actual, columns
    predicted)."""
    from torchmetrics import MetricCollection
    from torchmetrics.classification import (
        MulticlassAccuracy,
        MulticlassConfusionMatrix,
        MulticlassF1Score,
        MulticlassPrecision,
        MulticlassRecall,
    )

    kw = {"num_classes": num_classes, "validate_args": False}
    return MetricCollection({
        "accuracy": MulticlassAccuracy(average="micro", **kw),
        "macro_f1": MulticlassF1Score(average="macro", **kw),
        "precision": MulticlassPrecision(average="none", **kw),
        "recall": MulticlassRecall(average="none", **kw),
        "confusion": MulticlassConfusionMatrix(**kw),
    })


def segmentation_metrics(num_classes: int):
    """Evaluation: mean and per-class IoU, mean and per-class Dice (pixel F1 over the whole split), pixel accuracy."""
    from torchmetrics import MetricCollection
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassJaccardIndex

    kw = {"num_classes": num_classes, "validate_args": False}
    return MetricCollection({
        "mean_iou": MulticlassJaccardIndex(average="macro", **kw),
        "iou": MulticlassJaccardIndex(average="none", **kw),
        "mean_dice": MulticlassF1Score(average="macro", **kw),
        "dice": MulticlassF1Score(average="none", **kw),
        "pixel_accuracy": MulticlassAccuracy(average="micro", **kw),
    })
