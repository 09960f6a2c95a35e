"""The image classifier task: shift (and, where the data allows, mirror) augmentation, cross-entropy, accuracy;
its evaluation adds the misclassified test images and feature maps."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from trainlab.core.auto import resolve_model
from trainlab.core.config import ClassifierParams
from trainlab.engine.contract import Trainable
from trainlab.models.classifier import build_classifier
from trainlab.tasks.augment import random_cutmix, random_hflip, random_resized_crop, random_shift, to_float_images
from trainlab.tasks.base import TaskCode
from trainlab.tasks.metrics import METRICS, primary, validation_metrics

if TYPE_CHECKING:
    from trainlab.core.config import Params
    from trainlab.core.runtime import Runtime
    from trainlab.tasks.scoring import TaskInputs, TaskReport

FEATURE_CHANNELS = 4  # channels shown per feature-map layer


def classification_trainable(model: nn.Module, num_classes: int, label_smoothing: float = 0.0, augment: bool = True,
                        hflip: bool = False, head: nn.Module | None = None, head_lr: float | None = None,
                        photo: bool = False, cutmix: bool = False) -> Trainable:
    """`photo`: augment as torchvision's references do for photos (random resized crop, flips where `hflip`, and
    CutMix with `cutmix`: soft targets); else 2-pixel shifts (and flips where `hflip`), for small fixed-size images
    such as digits."""
    def prepare(batch, train, gen):
        images = batch["images"]
        if train and augment and gen is not None:
            if photo:
                images = random_resized_crop(to_float_images(images), gen, hflip)
                if cutmix:
                    return random_cutmix(images, batch["labels"], num_classes, gen)
                return images, batch["labels"]
            (images,) = random_shift([images], 2, gen)
            if hflip:
                (images,) = random_hflip([images], gen)
        return to_float_images(images), batch["labels"]

    def loss_fn(logits, labels):
        return F.cross_entropy(logits.float(), labels, label_smoothing=label_smoothing)

    def metrics():
        return validation_metrics(METRICS["classifier"], num_classes)

    return Trainable("classifier", model, loss_fn, metrics, prepare, primary(METRICS["classifier"]).name, conv=True,
                head=head, head_lr=head_lr)


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

    model.eval()
    x = to_float_images(images.to(device))
    layers = feature_layers(model, x)
    features = create_feature_extractor(model, layers)(x)
    return {name: features[name][:, :FEATURE_CHANNELS].float().cpu() for name in layers}


class ClassifierCode(TaskCode):
    spec_name = "classifier"
    params_type = ClassifierParams
    builder = staticmethod(build_classifier)
    pictures = {"misclassified": "misclassified.png", "feature_maps": "feature_maps.png"}

    def config_fields(self, fields: dict) -> dict:
        # a config.json saved before these keys existed describes the network of then, whatever today's default
        return {"stem_pool": 1, "stem_pool_first": False, **fields}

    def make_trainable(self, model: nn.Module, meta: dict, cfg: ClassifierParams | None = None) -> Trainable:
        if cfg is None:
            return classification_trainable(model, meta["num_classes"])
        cfg, _ = resolve_model("classifier", cfg, meta)
        head = model.head if cfg.head_lr is not None else None
        return classification_trainable(model, meta["num_classes"], cfg.label_smoothing, cfg.augments,
                                   hflip=meta.get("hflip", False), head=head, head_lr=cfg.head_lr,
                                   photo=cfg.augment == "photo", cutmix=cfg.cutmix is True)

    def evaluate(self, inputs: TaskInputs, runtime: Runtime, params: Params) -> TaskReport:
        from trainlab.tasks.scoring import FEW_EXAMPLES, evaluate_labels

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


CODE = ClassifierCode()
