"""Model zoo: builders for the classifier, segmenter and text model, weight init, and rebuilding from a saved config."""

from __future__ import annotations

from torch import nn

from trainlab.config import ClassifierParams, SegmenterParams, TextParams
from trainlab.errors import CheckpointError
from trainlab.models.classifier import (
    backbone_parameters,
    build_classifier,
    head_parameters,
)
from trainlab.models.init import init_weights
from trainlab.models.segmenter import build_segmenter
from trainlab.models.text import build_text_model

__all__ = [
    "backbone_parameters", "build_classifier", "build_from_config", "build_segmenter", "build_text_model",
    "count_parameters", "head_parameters", "init_weights",
]

_BUILDERS = {
    "classifier": (ClassifierParams, build_classifier),
    "segmenter": (SegmenterParams, build_segmenter),
    "text": (TextParams, build_text_model),
}


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(total, trainable) parameter counts."""
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() for p in params if p.requires_grad)


def build_from_config(task: str, config: dict) -> nn.Module:
    """Rebuild the architecture described by a model's `config` dict (fresh weights, no pretrained file read)."""
    if task not in _BUILDERS:
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(_BUILDERS)}")
    params_type, build = _BUILDERS[task]
    fields = {k: v for k, v in config.items() if k in params_type.model_fields}
    if task == "text" and fields.get("arch") == "transformer_encoder":  # the config's name for text.arch transformer
        fields["arch"] = "transformer"
    kwargs = {k: v for k, v in config.items() if k not in params_type.model_fields and k not in ("task", "arch")}
    try:
        model = build(params_type(**fields), **kwargs)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"model config does not describe a {task} model: {exc}") from None
    if config.get("task", task) != task or config.get("arch", model.config["arch"]) != model.config["arch"]:
        raise CheckpointError(f"model config is for {config.get('task')}/{config.get('arch')}, not a {task} model")
    return model
