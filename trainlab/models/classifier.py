"""The image classifier of `classifier.arch`, from its task's table (trainlab.models.architectures), with the
options every architecture shares (a frozen backbone)."""

from __future__ import annotations

from torch import nn

from trainlab.models import architectures
from trainlab.models.resnet_small import BasicBlock, ResNetSmall, StridedPointwise  # noqa: F401 - re-exported
from trainlab.models.torchvision_nets import TorchvisionClassifier  # noqa: F401 - re-exported
from trainlab.models.weights import backbone_parameters, load_weights  # noqa: F401 - re-exported


def build_classifier(p, num_classes: int, in_channels: int) -> nn.Module:
    """The classifier `p.arch` (section `p`) for `in_channels`-channel images and `num_classes` classes, with a
    `head` attribute and a `config` dict."""
    model = architectures.build("classifier", p, num_classes=num_classes, in_channels=in_channels)
    if p.freeze_backbone:
        for param in backbone_parameters(model):
            param.requires_grad_(False)
    return model
