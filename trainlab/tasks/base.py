"""What a task's code provides (tasks.TaskSpec.load), with the defaults of a labelled task, and the one check of
prepared data against a task that training and evaluation share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainlab.core.auto import resolve_model
from trainlab.core.errors import CheckpointError, DataError
from trainlab.engine.contract import Trainable
from trainlab.tasks.spec import TaskSpec, get

if TYPE_CHECKING:
    from trainlab.core.config import Params, TrainParams
    from trainlab.core.runtime import Runtime
    from trainlab.engine.loop import FitResult
    from trainlab.tasks.scoring import TaskInputs, TaskReport


@dataclass
class TrainingExtras:
    """What a task adds to its training outputs: files copied into models/<task>, JSON files written there, and
    test metrics beside its own (a baseline's)."""

    files: dict[str, Path] = field(default_factory=dict)
    json: dict[str, dict] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


class TaskCode:
    """A task's code. Subclasses set `spec_name`, `params_type` and `builder` and override what differs."""

    spec_name: str
    params_type: type  # the TrainParams subclass of the task's params section
    builder: Callable[..., nn.Module]  # builder(params, **sizes) -> model with a .config dict
    pictures: dict[str, str] = {}  # picture kind (trainlab.jobs.pictures.DRAW) -> file in reports/evaluate
    confusion: bool = True  # labelled task: confusion rows and matrix in reports/evaluate
    dense = False  # per-pixel predictions (TTA moves them back)
    streamable = True  # its splits may be read from disk a batch at a time (fit_statistics needs none whole)

    @property
    def spec(self) -> TaskSpec:
        return get(self.spec_name)

    # building --------------------------------------------------------------------------------------------------
    def sizes(self, meta: dict) -> dict[str, Any]:
        """The builder's size arguments, read from the prepared data's meta.json."""
        return {"num_classes": meta["num_classes"], "in_channels": meta["channels"]}

    def build_model(self, cfg: TrainParams, meta: dict) -> nn.Module:
        return self.builder(cfg, **self.sizes(meta))

    def make_trainable(self, model: nn.Module, meta: dict, cfg: TrainParams | None = None) -> Trainable:
        """The engine Trainable around `model`; `cfg` None: the task as evaluation uses it (no training options)."""
        raise NotImplementedError

    def build_trainable(self, cfg: TrainParams, meta: dict, train: dict[str, torch.Tensor] | None = None,
                   data_dir: Path | None = None) -> Trainable:
        """The Trainable around a new model; with `train` (the training split) and the prepared folder it came from, the
        model's data statistics are set from them (`fit_statistics`)."""
        cfg, _ = resolve_model(self.spec.params_section, cfg, meta)
        model = self.build_model(cfg, meta)
        if train is not None:
            self.fit_statistics(model, train, data_dir)
        return self.make_trainable(model, meta, cfg)

    def fit_statistics(self, model: nn.Module, train: dict[str, torch.Tensor], data_dir: Path | None) -> None:
        """Set what a model computes from the training split (and the files prepared with it, such as a
        tokenizer) before training, saved with its weights; none here."""

    def from_config(self, config: dict) -> nn.Module:
        """Rebuild the architecture a saved model's config.json describes (fresh weights, no pretrained file)."""
        fields = {k: v for k, v in config.items() if k in self.params_type.model_fields}
        fields = self.config_fields(fields)
        kwargs = {k: v for k, v in config.items()
                  if k not in self.params_type.model_fields and k not in ("task", "arch")}
        name = self.spec_name
        try:
            model = self.builder(self.params_type(**fields), **kwargs)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"model config does not describe a {name} model: {exc}") from None
        if config.get("task", name) != name or config.get("arch", model.config["arch"]) != model.config["arch"]:
            raise CheckpointError(f"model config is for {config.get('task')}/{config.get('arch')}, not a {name} model")
        return model

    def config_fields(self, fields: dict) -> dict:
        """config.json values -> params fields, where a name differs."""
        return fields

    # checking --------------------------------------------------------------------------------------------------
    def expected_config(self, meta: dict) -> dict[str, Any]:
        """The model config.json values that the prepared data's meta.json implies."""
        return self.sizes(meta)

    def check_inputs(self, x: torch.Tensor, y: torch.Tensor, meta: dict, path: Path, meta_file: Path) -> None:
        """Task-specific shape checks of one split (images by default: (N, channels, H, W))."""
        if x.ndim != 4 or x.shape[1] != meta["channels"]:
            raise DataError(f"{path}: {self.spec.inputs} {tuple(x.shape)} are not (N, {meta['channels']}, H, W) as "
                            f"{meta_file} says")

    # training --------------------------------------------------------------------------------------------------
    def training_extras(self, params: Params, data_dir: Path, meta: dict, options: dict[str, Any]) -> TrainingExtras:
        """Extra outputs of training; `options`: the task's own stage options (stages/train_<task>.py)."""
        return TrainingExtras()

    def choose_model(self, task: Trainable, result: FitResult) -> tuple[Trainable, dict[str, Any]]:
        """After fit, before the test: where the model trained candidates side by side (the text bag's weight
        decays), `result.model` becomes the one the validation split chose; the task around the model kept and what
        was chosen (info.json, MLflow params), an empty record where nothing was."""
        return task, {}

    # evaluating ------------------------------------------------------------------------------------------------
    def tta(self, meta: dict) -> str:
        """The label-preserving test-time augmentation for this data (scoring.predict_logits)."""
        return "flip" if meta.get("hflip") else "shift"

    def eval_metrics(self, num_classes: int):
        from trainlab.tasks.metrics import evaluation_metrics

        return evaluation_metrics(self.spec.metrics, num_classes, confusion=self.confusion)

    def load_extras(self, inputs: TaskInputs) -> dict[str, Any]:
        """What evaluation needs beside the model and test split (read and checked from models/<task>)."""
        return {}

    def evaluate(self, inputs: TaskInputs, runtime: Runtime, params: Params) -> TaskReport:
        from trainlab.tasks.scoring import evaluate_labels

        return evaluate_labels(inputs, runtime, params)[0]


def check_prepared(spec: TaskSpec, data_dir: Path, meta: dict, splits: dict[str, dict[str, torch.Tensor]]) -> None:
    """The prepared data fits the task: meta.json keys, every split's tensors present, non-empty, of one length,
    shaped and typed as meta.json says, targets inside the classes; a DataError naming the file otherwise. (A batch
    size larger than the training split is no error: training resolves it, trainlab.core.auto.)"""
    from trainlab.data.prepared import split_path

    name, code = spec.name, spec.load()
    meta_file = data_dir / "meta.json"
    bad_meta = [k for k in spec.meta_keys if not isinstance(meta.get(k), int) or meta[k] < 1]
    if bad_meta:
        raise DataError(f"{meta_file}: missing or invalid {', '.join(bad_meta)} (rerun `dvc repro prepare`)")
    n = meta["num_classes"]
    inputs_key, target_key = spec.inputs, spec.targets
    for split, tensors in splits.items():
        path = split_path(data_dir, split)
        absent = [k for k in (inputs_key, target_key) if k not in tensors]
        if absent:
            raise DataError(f"{path}: missing tensor(s) {', '.join(absent)} for the {name} (rerun `dvc repro prepare`)")
        x, y = tensors[inputs_key], tensors[target_key]
        if x.shape[0] == 0:
            raise DataError(f"{path}: the {split} split is empty (0 samples)")
        if x.shape[0] != y.shape[0]:
            raise DataError(f"{path}: {x.shape[0]} {inputs_key} but {y.shape[0]} {target_key}; they must match")
        if x.is_floating_point() or y.is_floating_point() or y.dtype == torch.bool:
            raise DataError(f"{path}: {inputs_key} {x.dtype} / {target_key} {y.dtype}; the prepared format holds "
                            "uint8 images and integer labels, masks and token ids")
        code.check_inputs(x, y, meta, path, meta_file)
        low, high = int(y.min()), int(y.max())
        if low < 0 or high >= n:
            raise DataError(f"{path}: {target_key} {low}..{high} outside the {n} classes of {meta_file}")
