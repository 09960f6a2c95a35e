"""Each task's metrics, declared once (name, torchmetrics builder, direction, which one is primary, per class or
not, validated each epoch or only evaluated): validation, evaluation, the summary, compare and search read this
declaration. Light on purpose: torchmetrics is imported when a collection is built, not at start-up."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _kw(num_classes: int) -> dict[str, Any]:
    # no argument checks: the loss computed beside every update already fails on a label out of range, and the
    # checks cost 0.2 s per validation of the default segmenter (a third of its pass)
    return {"num_classes": num_classes, "validate_args": False}


def accuracy(num_classes: int):
    from torchmetrics.classification import MulticlassAccuracy

    return MulticlassAccuracy(average="micro", **_kw(num_classes))


def macro_f1(num_classes: int):
    from torchmetrics.classification import MulticlassF1Score

    return MulticlassF1Score(average="macro", **_kw(num_classes))


def mean_iou(num_classes: int):
    from torchmetrics.classification import MulticlassJaccardIndex

    return MulticlassJaccardIndex(average="macro", **_kw(num_classes))


def class_iou(num_classes: int):
    from torchmetrics.classification import MulticlassJaccardIndex

    return MulticlassJaccardIndex(average="none", **_kw(num_classes))


def class_f1(num_classes: int):
    from torchmetrics.classification import MulticlassF1Score

    return MulticlassF1Score(average="none", **_kw(num_classes))


def class_precision(num_classes: int):
    from torchmetrics.classification import MulticlassPrecision

    return MulticlassPrecision(average="none", **_kw(num_classes))


def class_recall(num_classes: int):
    from torchmetrics.classification import MulticlassRecall

    return MulticlassRecall(average="none", **_kw(num_classes))


@dataclass(frozen=True)
class Metric:
    """One metric of a task: `name` is its key in metrics.json, history.csv (val_<name>) and MLflow (test_<name>);
    `build(num_classes)` a torchmetrics Metric; a `per_class` one gives a value per class (``<name>_<class>``)."""

    name: str
    build: Callable[[int], Any]
    primary: bool = False  # what runs are ranked, pruned and promoted by
    higher_is_better: bool = True
    per_class: bool = False
    validation: bool = True  # measured at each validation (False: by evaluation only)


LABELS = (Metric("accuracy", accuracy, primary=True), Metric("macro_f1", macro_f1),
          Metric("precision", class_precision, per_class=True, validation=False),
          Metric("recall", class_recall, per_class=True, validation=False))
METRICS: dict[str, tuple[Metric, ...]] = {
    "classifier": LABELS,
    "segmenter": (Metric("mean_iou", mean_iou, primary=True), Metric("mean_dice", macro_f1),
                  Metric("pixel_accuracy", accuracy), Metric("iou", class_iou, per_class=True),
                  Metric("dice", class_f1, per_class=True)),
    "text": LABELS,
}


def primary(metrics: tuple[Metric, ...]) -> Metric:
    return next(m for m in metrics if m.primary)


def validation_metrics(metrics: tuple[Metric, ...], num_classes: int, class_names: list[str] | None = None):
    """The MetricCollection measured at each validation: scalars, and a scalar per class (``iou_<class>``)."""
    from torchmetrics import MetricCollection
    from torchmetrics.wrappers import ClasswiseWrapper

    keys = class_metric_keys(class_names, num_classes)
    made = {m.name: ClasswiseWrapper(m.build(num_classes), keys, prefix=f"{m.name}_") if m.per_class
            else m.build(num_classes) for m in metrics if m.validation}
    return MetricCollection(made, compute_groups=False)


def evaluation_metrics(metrics: tuple[Metric, ...], num_classes: int, confusion: bool = False):
    """The MetricCollection of evaluation: every metric (a per-class one as one vector), and the confusion matrix
    (rows actual, columns predicted) of a labelled task."""
    from torchmetrics import MetricCollection
    from torchmetrics.classification import MulticlassConfusionMatrix

    made = {m.name: m.build(num_classes) for m in metrics}
    if confusion:
        made["confusion"] = MulticlassConfusionMatrix(**_kw(num_classes))
    return MetricCollection(made)


def metric_collection(num_classes: int, *names: str, class_names: list[str] | None = None):
    """The validation collection of the named metrics, from the declarations above."""
    declared = {m.name: m for task in METRICS.values() for m in task}
    return validation_metrics(tuple(declared[n] for n in names), num_classes, class_names)


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
    """Evaluation of a labelled task: accuracy, macro-F1, per-class precision/recall and the confusion matrix."""
    return evaluation_metrics(METRICS["classifier"], num_classes, confusion=True)


def segmentation_metrics(num_classes: int):
    """Evaluation of the segmenter: mean and per-class IoU, mean and per-class Dice, pixel accuracy."""
    return evaluation_metrics(METRICS["segmenter"], num_classes)
