"""What a task is (TaskSpec) and the table of registered tasks, looked up by name. Light on purpose (no torch),
and below the tasks' code: the package registers the tasks on top of it (trainlab/tasks/__init__.py)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from trainlab.tasks.metrics import Metric, primary


@dataclass(frozen=True)
class TaskSpec:
    name: str  # models/<name>, reports/<name>, the DVC stage train_<name>, the MLflow model trainlab-<name>
    data_folder: str  # data/prepared/<data_folder>
    inputs: str  # the prepared tensors: (inputs, targets) of every split
    targets: str
    meta_keys: tuple[str, ...]  # positive ints that meta.json must hold
    metrics: tuple[Metric, ...]  # its one declaration of metrics (trainlab.tasks.metrics), the primary one marked
    code: str  # the module whose CODE (a tasks.base.TaskCode) builds, trains and evaluates the task
    second_metric: tuple[str, str] = ("macro_f1", "macro-F1")  # the summary's second column: (key, label)
    label: str = ""  # the primary metric's name for people
    section: str = ""  # its section of params.yaml (default: its name)

    @property
    def primary_metric(self) -> str:
        """The metric runs are ranked, pruned and promoted by (a test metric as test_<name>)."""
        return primary(self.metrics).name

    @property
    def higher_is_better(self) -> bool:
        return primary(self.metrics).higher_is_better

    @property
    def params_section(self) -> str:
        return self.section or self.name

    @property
    def headline(self) -> tuple[str, str]:
        """The primary metric's key in reports/evaluate/metrics.json and its name for people."""
        return self.primary_metric, self.label or self.primary_metric.replace("_", " ")

    @property
    def stage(self) -> str:
        return f"train_{self.name}"

    def load(self) -> Any:  # a trainlab.tasks.base.TaskCode, which builds on this registry: not named here
        """The task's code (imported now: torch and the model code load with it)."""
        return importlib.import_module(self.code).CODE


REGISTRY: dict[str, TaskSpec] = {}


def register(spec: TaskSpec) -> TaskSpec:
    REGISTRY[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)


def get(name: str) -> TaskSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; expected one of {', '.join(REGISTRY)}") from None


def names() -> tuple[str, ...]:
    return tuple(REGISTRY)


def build_from_config(task: str, config: dict):
    """Rebuild the architecture a saved model's config.json describes (fresh weights); CheckpointError if it does
    not describe a model of `task`."""
    return get(task).load().from_config(config)

