"""The task registry: what each task is (data folder, tensors, meta keys, params, primary metric) and where its code
lives. Light on purpose (no torch): command lines and flows read it before anything heavy loads. The tasks' code
builds on trainlab.tasks.spec, not on this package: it sits on top and names that code by module path."""

from __future__ import annotations

from trainlab.tasks.metrics import METRICS
from trainlab.tasks.spec import REGISTRY, TaskSpec, build_from_config, get, names, register, unregister

__all__ = ["REGISTRY", "TaskSpec", "build_from_config", "get", "names", "register", "unregister"]

register(TaskSpec("classifier", "classification", "images", "labels", ("num_classes", "channels"),
                  METRICS["classifier"], "trainlab.tasks.classifier"))
register(TaskSpec("segmenter", "segmentation", "images", "masks", ("num_classes", "channels"),
                  METRICS["segmenter"], "trainlab.tasks.segmenter",
                  second_metric=("pixel_accuracy", "pixel accuracy"), label="mean IoU"))
register(TaskSpec("text", "text", "tokens", "labels", ("num_classes", "vocab_size", "max_length"),
                  METRICS["text"], "trainlab.tasks.text",
                  second_metric=("baseline_accuracy", "TF-IDF baseline accuracy")))
